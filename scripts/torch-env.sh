#!/usr/bin/env bash
# Prints the python of a cached virtualenv holding torch, transformers, numpy, gguf and
# accelerate (the last two for transformers' GGUF loader), and diffusers (the generation
# components), and peft (LoRA on the emulated GPU): the CPU torch reference
# (docs/src/guides/torch-probe.md) and the emulator's environment. Installs it from
# PyPI on first use into $VRAMLAB_TORCH_CACHE (default ~/.cache/vramlab-torch); later calls
# check a stamp and return at once. The versions are pinned so that committed results name
# what measured them.
#
# PyPI's Linux torch wheel is the CUDA build: it declares the CUDA runtime wheels as dependencies
# and `import torch` dlopens them (cuBLAS, cuDNN, NCCL...) even on CPU, so the full dependency set
# is installed. Progress goes to stderr; stdout is the python path alone.
#
#   scripts/torch-env.sh                    # the default stack (the pins below)
#   scripts/torch-env.sh --stack torch-2.2  # another pinned software stack, in a venv of its own
#   scripts/torch-env.sh --stack torch-1.10
#   scripts/torch-env.sh --stack vllm-0.33
#
# Stacks are an axis for the emulated GPU (docs/src/guides/emulator.md): the same program under
# an older PyTorch and transformers. torch-2.2: torch 2.2.2 (CUDA 12.1 build), transformers
# 4.39.3, peft 0.11.1, accelerate 0.32.1, diffusers 0.22.0 (the SDXL notebook's, October 2023;
# it imports huggingface_hub's cached_download, gone after 0.25) (about 2.5 GB more).
# torch-1.10: torch 1.10.2 (PyPI's CUDA 10.2 build, cuBLAS linked in), transformers 4.16.2, the
# stack of transformers' January 2022 single-GPU training guide, on CPython 3.9 from Debian 11's
# packages (torch 1.10 has no wheel for a newer Python); the CUDA 11 runtime and cuBLAS wheels
# are only the emulator's headers (about 2.8 GB more).
# vllm-0.33: vllm 0.33.0 with the torch it pins (2.14.0, CUDA 13.0 build) and the transformers
# it resolved (5.20.2), for vLLM's own engine startup on the emulated GPU (the guide's "vLLM's
# startup"); 172 s from cold on a 2-core machine, 9.5 GB (vLLM's kernels, flash attention,
# Triton, the CUDA 13 wheels and the serving stack).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
args_parse "--stack=" 0 0 "[--stack NAME]" "$@"
CACHE=${VRAMLAB_TORCH_CACHE:-$HOME/.cache/vramlab-torch}
STACK=${FLAG[stack]:-default}
case "$STACK" in
  default)
    PKGS=(torch==2.15.0 transformers==5.24.0 numpy==2.4.6 gguf==0.19.0 accelerate==1.15.0
          diffusers==0.42.1 peft==0.21.2)
    CHECK='import torch, transformers, numpy, gguf, accelerate, diffusers, peft'
    VENV=$CACHE/venv ;;
  torch-2.2)
    PKGS=(torch==2.2.2 transformers==4.39.3 peft==0.11.1 accelerate==0.32.1 numpy==1.26.4
          diffusers==0.22.0 huggingface_hub==0.25.2)
    CHECK='import torch, transformers, numpy, accelerate, peft, diffusers'
    VENV=$CACHE/stacks/torch-2.2/venv ;;
  torch-1.10)
    PKGS=(torch==1.10.2 transformers==4.16.2 numpy==1.23.5 setuptools==69.5.1
          nvidia-cuda-runtime-cu11==11.7.99 nvidia-cublas-cu11==11.10.3.66)
    CHECK='import torch, transformers, numpy'
    VENV=$CACHE/stacks/torch-1.10/venv ;;
  vllm-0.33)
    PKGS=(vllm==0.33.0 torch==2.14.0 transformers==5.20.2)
    CHECK='import torch, transformers, vllm'
    VENV=$CACHE/stacks/vllm-0.33/venv ;;
  *)
    die_usage "unknown stack '$STACK'" "known: default, torch-2.2, torch-1.10, vllm-0.33" ;;
esac
STAMP=$VENV/.vramlab-stamp
WANT="${PKGS[*]}"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
PY=${VRAMLAB_TORCH_PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "scripts/torch-env.sh: needs python >= 3.11 (set VRAMLAB_TORCH_PYTHON)" >&2
  exit 2
fi
t0=$(date +%s)
mkdir -p "$(dirname "$VENV")"
# A venv left by another pin set is updated in place: pip fetches only what changed. One with no
# stamp at all is an install that never finished (a full disk once left torch without torch._C,
# which pip then took as installed): it is made anew.
if [ -d "$VENV" ] && [ ! -f "$STAMP" ]; then
  echo "scripts/torch-env.sh: $VENV has no stamp (an unfinished install): installing it anew" >&2
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  rm -rf "$VENV"
  if [ "$STACK" = torch-1.10 ]; then
    # torch 1.10 has wheels up to CPython 3.9 only: the interpreter is Debian 11's (see
    # scripts/python39.sh), and pip is bootstrapped by this machine's pip.
    PY39="$("$(dirname "${BASH_SOURCE[0]}")/python39.sh" "$CACHE/python3.9")"
    "$PY39" -m venv --without-pip "$VENV" >&2
    "$PY" -m pip --python "$VENV/bin/python" install --quiet pip==24.3.1 >&2
  else
    "$PY" -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  fi
fi
"$VENV/bin/python" -m pip install --quiet "${PKGS[@]}" >&2
"$VENV/bin/python" -c "$CHECK; torch.ones(2) @ torch.ones(2)" >&2
echo "$WANT" > "$STAMP"
echo "scripts/torch-env.sh: installed into $VENV in $(( $(date +%s) - t0 )) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV/bin/python"
