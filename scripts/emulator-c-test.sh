#!/usr/bin/env bash
# The emulator's C tests (harness/emulator/tests/emu_test.c): built against the stubs of a torch
# environment (scripts/emulator-build.sh, cached) and run on an emulated 1 GiB device: the
# properties read back, cudaMalloc against the capacity, and the stream-ordered pool's rules
# (granules, release at a sync, trim, out of memory); then ranks_test.c on two such devices
# (pointers' devices, the emulated NCCL). Seconds; a step of scripts/test.sh.
#
#   scripts/emulator-c-test.sh [PYTHON]     # PYTHON defaults to scripts/torch-env.sh's
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "" 0 1 "[PYTHON]" "$@"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STUBS="$("$ROOT/scripts/emulator-build.sh" ${ARGS[0]:+"${ARGS[0]}"})"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cc -O1 -Wall -Werror "$ROOT/harness/emulator/tests/emu_test.c" -o "$tmp/emu_test" \
  "$STUBS/libvramlab_emu.so" -Wl,-rpath,"$STUBS"
cc -O1 -Wall -Werror "$ROOT/harness/emulator/tests/ranks_test.c" -o "$tmp/ranks_test" \
  "$STUBS/libvramlab_emu.so" "$STUBS/libnccl.so.2" -Wl,-rpath,"$STUBS"
# A small device, so that the out-of-memory case is cheap: 1 GiB, a 100 MiB context.
gpu=(VRAMLAB_EMU_NAME="vramlab test GPU" VRAMLAB_EMU_TOTAL=$((1 << 30))
  VRAMLAB_EMU_CONTEXT=$((100 << 20)) VRAMLAB_EMU_CC_MAJOR=9 VRAMLAB_EMU_CC_MINOR=0
  VRAMLAB_EMU_SMS=132 VRAMLAB_EMU_L2=$((50 << 20)) VRAMLAB_EMU_SMEM_OPTIN=232448
  VRAMLAB_EMU_SMEM_PER_SM=233472 VRAMLAB_EMU_THREADS_PER_SM=2048)
env -u VRAMLAB_EMU_DIR "${gpu[@]}" "$tmp/emu_test"
# Two of them, for the tensor-parallel ranks' calls.
env -u VRAMLAB_EMU_DIR "${gpu[@]}" VRAMLAB_EMU_DEVICES=2 "$tmp/ranks_test"
