"""The Python half of `vramlab emulate` (docs/src/guides/emulator.md).

Installed by the boot's sitecustomize in every Python process the emulated command starts:
- when torch is imported: cuDNN is switched off (the stub runtime has no cuDNN; convolutions
  take PyTorch's native CUDA path, whose buffers go through the caching allocator; SDPA chooses
  among its other backends), and an
  optimizer-step hook closes one `step_total` span per optimizer step;
- with `--no-weights`, when transformers is imported: `from_pretrained` builds the model from its
  config on the `meta` device and materializes it on the emulated GPU, reading no weights;
- at exit: the spans, the run's peaks and the outcome (ok, out of memory, error) are written as
  JSON to $VRAMLAB_EMU_REPORT for vramlab to print and record.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import sys
import traceback
from typing import Callable, Dict, List, Optional

from .phase import Span, emulator_stats, recorder

_STEPS: List[Span] = []
_STEP: Dict[str, Optional[Span]] = {"open": None}
_OUTCOME: Dict[str, str] = {"outcome": "ok", "message": ""}
_NOTES: List[str] = []
_HOOKS: Dict[str, Callable] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a hook right after a named module has executed (its first import)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _HOOKS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        hook = _HOOKS.pop(name)

        def run(module):
            exec_module(module)
            hook(module)

        loader.exec_module = run
        return spec


def _after_torch(torch) -> None:
    torch.backends.cudnn.enabled = False
    _NOTES.append(
        "convolutions: PyTorch's native CUDA path (cuDNN is off under emulation; "
        "cuDNN's workspace is not counted)"
    )
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        # SDPA's cuDNN backend needs cuDNN too: SDPA picks among flash, memory-efficient and
        # math, as on a GPU where cuDNN attention is unavailable.
        torch.backends.cuda.enable_cudnn_sdp(False)
        _NOTES.append("attention: SDPA's cuDNN backend is off (flash, memory-efficient or math)")
    rec = recorder()
    rec._started = True  # nothing is on the device before torch: the run's baselines are 0
    from .phase import _keep_program_peaks

    _keep_program_peaks(torch)
    _STEP["open"] = Span("step_total", 1)
    rec._open.append(_STEP["open"])
    rec.current_step = 1
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:
        return
    register_optimizer_step_post_hook(_after_step)


def _after_step(optimizer, args, kwargs) -> None:
    rec = recorder()
    cur = _STEP["open"]
    if cur is None:
        return
    rec.close(cur)
    _STEPS.append(cur)
    rec.current_step = (cur.step or 0) + 1
    _STEP["open"] = rec.open("step_total", rec.current_step)


def materialize(model, device):
    """A model built on `meta`, its parameters and buffers allocated on `device` once each, in
    module order, values left unset (on the emulated GPU they are not read). Tied tensors stay
    one tensor, as from_pretrained leaves them: `to_empty` unties them (the tied embedding is
    allocated twice, and tying again frees one into the cache), and building on the device
    allocates the tied head before tying frees it. Either way the caching allocator keeps a
    block no real load leaves."""
    import torch

    made = {}
    for mod in model.modules():
        for table in (mod._parameters, mod._buffers):
            for name, t in list(table.items()):
                if t is None:
                    continue
                if id(t) not in made:
                    new = torch.empty_like(t, device=device)
                    if isinstance(t, torch.nn.Parameter):
                        new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
                    made[id(t)] = new
                table[name] = made[id(t)]
    return model


def _after_modeling_utils(mu) -> None:
    """`--no-weights`: from_pretrained builds from config.json on the emulated device."""
    import torch

    original = mu.PreTrainedModel.from_pretrained.__func__

    def from_pretrained(cls, name_or_path, *args, **kwargs):
        from transformers import AutoConfig

        config = kwargs.pop("config", None)
        if config is None or isinstance(config, (str, os.PathLike)):
            config = AutoConfig.from_pretrained(
                config or name_or_path, trust_remote_code=kwargs.get("trust_remote_code", False)
            )
        dtype = kwargs.get("torch_dtype", kwargs.get("dtype"))
        if dtype == "auto" or dtype is None:
            dtype = getattr(config, "torch_dtype", None) if dtype == "auto" else None
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        with torch.device("meta"):
            model = cls._from_config(config, torch_dtype=dtype) if dtype else cls._from_config(config)
        model = materialize(model, "cuda")
        model.eval()
        params = sum(p.numel() for p in model.parameters())
        _NOTES.append(f"--no-weights: {name_or_path} built from its config ({params} parameters)")
        return model

    mu.PreTrainedModel.from_pretrained = classmethod(from_pretrained)
    mu.PreTrainedModel._vramlab_original_from_pretrained = classmethod(original)


def _excepthook(kind, value, tb):
    name = kind.__name__
    message = str(value).strip()
    if name == "OutOfMemoryError" or "CUDA out of memory" in message:
        _OUTCOME.update(outcome="oom", message=message)
    else:
        last = traceback.extract_tb(tb)[-1] if tb else None
        where = f" ({last.filename}:{last.lineno})" if last else ""
        _OUTCOME.update(outcome="error", message=f"{name}: {message}{where}")
    sys.__excepthook__(kind, value, tb)


def _write_report() -> None:
    path = os.environ.get("VRAMLAB_EMU_REPORT")
    if not path:
        return
    torch = sys.modules.get("torch")
    report = {
        "version": 1,
        "torch": getattr(torch, "__version__", None),
        "cuda": getattr(getattr(torch, "version", None), "cuda", None),
        "cuda_initialized": bool(torch and torch.cuda.is_initialized()),
        "phases": [],
        "steps": [],
        "run": None,
        "driver": emulator_stats(),
        "notes": _NOTES,
        **_OUTCOME,
    }
    if torch is not None and torch.cuda.is_initialized():
        rec = recorder()
        tail = _STEP["open"]
        run = rec.finish()
        report["phases"] = [s.as_dict() for s in rec.spans if s is not tail and s not in _STEPS]
        report["steps"] = [s.as_dict() for s in _STEPS]
        report["run"] = run.as_dict()
        report["device_name"] = torch.cuda.get_device_name(0)
    with open(path, "w") as f:
        json.dump(report, f)


def install() -> None:
    _HOOKS["torch"] = _after_torch
    if os.environ.get("VRAMLAB_EMU_NO_WEIGHTS") == "1":
        _HOOKS["transformers.modeling_utils"] = _after_modeling_utils
    sys.meta_path.insert(0, _AfterImport())
    sys.excepthook = _excepthook
    atexit.register(_write_report)
