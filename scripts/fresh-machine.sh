#!/usr/bin/env bash
# Runs the README's two commands the way a new machine would: in a fresh clone at
# another path, with an empty CARGO_HOME, an empty HOME (so ~/.cache, pip's cache and every
# vramlab cache default to empty folders) and no VRAMLAB_* variables, keeping only the rustup
# toolchain (RUSTUP_HOME). The commands are read from the README's first ```sh block, so the
# two can never disagree. Prints each command's wall time and exit status, and the disk that
# the fresh CARGO_HOME and caches took.
#
#   scripts/fresh-machine.sh [--twice] [--keep] [--dir DIR]
#
#   --twice    then run the README's test command a second time with the caches now warm:
#              it must do no CUDA toolchain work ("cached") and finish within CI's limit
#   --keep     leave the clone, HOME and CARGO_HOME in place for inspection (about 30 GB: the
#              torch stacks, target/, the CUDA toolchain). By default they are removed after
#              the summary and only the log stays: CI runs on this same disk after a session
#              stops, and a run left behind once filled it (pip: "No space left on device").
#   --dir DIR  where to make the clone, the empty CARGO_HOME and HOME (default: a new
#              folder under /tmp)
#
# It also checks the CUDA toolchain's cudarc lookup from an empty CARGO_HOME (it must fetch
# cudarc through cargo, not find it in a warm registry). That needs the network.
# Clones what is committed (HEAD of this repository), not the working tree.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "--twice --keep --dir=" 0 0 "[--twice] [--keep] [--dir DIR]" "$@"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TWICE=${FLAG[twice]:-0}
KEEP=${FLAG[keep]:-0}
BASE=${FLAG[dir]:-}
[ -n "$BASE" ] || BASE="$(mktemp -d /tmp/vramlab-fresh.XXXXXX)"
mkdir -p "$BASE"
CLONE="$BASE/clone with space/vramlab"
FRESH_HOME="$BASE/home"
FRESH_CARGO="$BASE/cargo-home"
LOG="$BASE/fresh-machine.log"
RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
[ -d "$RUSTUP_HOME" ] || { echo "fresh-machine: no rustup toolchain at $RUSTUP_HOME" >&2; exit 2; }
# The rustup proxies (cargo, rustc) stay on PATH; CARGO_HOME only moves the registry and caches.
CARGO_BIN="$(dirname "$(command -v cargo)")"

say() { printf 'fresh-machine: %s\n' "$*" | tee -a "$LOG" >&2; }

# The README's commands: every line of its first ```sh block, without the trailing comment.
mapfile -t COMMANDS < <(awk '/^```sh$/{on=1; next} on && /^```/{exit} on' "$ROOT/README.md" \
  | sed -E 's/[[:space:]]+#.*$//' | grep -v '^[[:space:]]*$')
[ "${#COMMANDS[@]}" -eq 2 ] || { say "expected 2 commands in README.md's first sh block, found ${#COMMANDS[@]}"; exit 2; }

rm -rf "$CLONE" "$FRESH_HOME" "$FRESH_CARGO"
mkdir -p "$(dirname "$CLONE")" "$FRESH_HOME" "$FRESH_CARGO"
git clone --quiet "$ROOT" "$CLONE"
say "clone of $(git -C "$CLONE" rev-parse --short=12 HEAD) at $CLONE"
say "CARGO_HOME=$FRESH_CARGO HOME=$FRESH_HOME RUSTUP_HOME=$RUSTUP_HOME"

# A clean environment: what a login on a new machine has, plus long variables (paths and
# environment must not change any measured figure).
fresh_env() {
  env -i \
    PATH="$CARGO_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    HOME="$FRESH_HOME" CARGO_HOME="$FRESH_CARGO" RUSTUP_HOME="$RUSTUP_HOME" \
    XDG_CACHE_HOME="$FRESH_HOME/.cache" PIP_CACHE_DIR="$FRESH_HOME/.cache/pip" \
    LANG=C.UTF-8 TERM=dumb USER="${USER:-root}" \
    VRAMLAB_FRESH_LONG_1="$(printf 'x%.0s' $(seq 1 2000))" \
    VRAMLAB_FRESH_LONG_2="$(printf '/a/long/path%.0s' $(seq 1 300))" \
    "$@"
}

results=()
status=0
run_cmd() {
  local label="$1" cmd="$2" t0 rc
  say "$label: $cmd"
  t0=$SECONDS
  set +e
  (cd "$CLONE" && fresh_env bash -c "$cmd") >>"$LOG" 2>&1
  rc=$?
  set -e
  local dt=$((SECONDS - t0))
  results+=("$(printf '%-10s exit %3d  %4dm%02ds  %s' "$label" "$rc" $((dt / 60)) $((dt % 60)) "$cmd")")
  say "$label: exit $rc after ${dt}s"
  [ "$rc" -eq 0 ] || status=1
}

run_cmd "command 1" "${COMMANDS[0]}"
run_cmd "command 2" "${COMMANDS[1]}"
if [ "$TWICE" = 1 ]; then
  run_cmd "warm rerun" "${COMMANDS[1]}"
  if grep -q 'cuda-toolchain: cached' "$LOG"; then
    say "warm rerun: the CUDA toolchain reported cached"
  else
    say "warm rerun: FAIL: the CUDA toolchain did not report cached"; status=1
  fi
fi

# The cudarc lookup from an empty CARGO_HOME, after the README's commands (so that they ran
# truly cold): cargo must fetch cudarc itself.
LOOKUP_CARGO="$BASE/cargo-home-lookup"
rm -rf "$LOOKUP_CARGO"
mkdir -p "$LOOKUP_CARGO"
set +e
found="$(cd "$CLONE" && FRESH_CARGO="$LOOKUP_CARGO" fresh_env VRAMLAB_CUDA_CACHE="$BASE/cuda-lookup" \
  scripts/cuda-toolchain.sh --find-cudarc 2>>"$LOG")"
set -e
case "$found" in
  "$LOOKUP_CARGO"/registry/src/*/cudarc-*)
    if [ -d "$found/src/driver/sys" ]; then
      results+=("cudarc lookup from an empty CARGO_HOME: ok ($found)")
    else
      results+=("cudarc lookup from an empty CARGO_HOME: FAIL (no sources in $found)"); status=1
    fi ;;
  *) results+=("cudarc lookup from an empty CARGO_HOME: FAIL (got '$found')"); status=1 ;;
esac
rm -rf "$LOOKUP_CARGO" "$BASE/cuda-lookup"

du_of() { du -sh "$1" 2>/dev/null | cut -f1; }
{
  echo
  echo "fresh-machine summary (log: $LOG)"
  printf '  %s\n' "${results[@]}"
  echo "  disk: CARGO_HOME $(du_of "$FRESH_CARGO"), HOME caches $(du_of "$FRESH_HOME"), clone incl. target/ and .cache/ $(du_of "$CLONE")"
  for d in "$FRESH_HOME"/.cache/* "$CLONE/.cache"/* "$CLONE/target"; do
    [ -e "$d" ] && echo "    $(du_of "$d")	${d#"$BASE"/}"
  done
} | tee -a "$LOG"
if [ "$KEEP" = 1 ]; then
  say "kept: $BASE (remove it before the session stops: CI shares this disk)"
else
  rm -rf "$CLONE" "$FRESH_HOME" "$FRESH_CARGO"
  say "removed the clone, HOME and CARGO_HOME (--keep keeps them); the log stays: $LOG"
fi
exit "$status"
