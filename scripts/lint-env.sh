#!/usr/bin/env bash
# Prints the bin directory of a cached virtualenv holding the Python lint and test tools
# (ruff, pytest, mypy), pinned: `$(scripts/lint-env.sh)/ruff check`. Installs them from PyPI on first
# use into $VRAMLAB_LINT_CACHE (default ~/.cache/vramlab-lint; a few seconds and about 100 MB);
# later calls check a stamp and return at once. Needs python3 >= 3.11 with venv and pip (the
# torch environments' own floor, scripts/torch-env.sh). Progress goes to stderr; stdout is the
# bin directory alone.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 0 0 "" "$@"
CACHE=${VRAMLAB_LINT_CACHE:-$HOME/.cache/vramlab-lint}
PKGS=(ruff==0.17.6 pytest==9.2.0 mypy==1.15.0)
VENV=$CACHE/venv
STAMP=$VENV/.vramlab-stamp
WANT="${PKGS[*]}"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/ruff" ] && [ -x "$VENV/bin/pytest" ]; then
  echo "$VENV/bin"
  exit 0
fi
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "scripts/lint-env.sh: needs python3 >= 3.11" >&2
  exit 2
fi
echo "scripts/lint-env.sh: installing ${PKGS[*]} into $VENV" >&2
rm -rf "$VENV"
mkdir -p "$CACHE"
python3 -m venv "$VENV" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PKGS[@]}" >&2
echo "$WANT" >"$STAMP"
echo "$VENV/bin"
