"""The Python half of `vramlab emulate` (docs/src/guides/emulator.md).

Installed by the boot's sitecustomize in every Python process the emulated command starts:
- when torch is imported: cuDNN is switched off (the stub runtime has no cuDNN; convolutions
  take PyTorch's native CUDA path, whose buffers go through the caching allocator; SDPA chooses
  among its other backends), and an
  optimizer-step hook closes one `step_total` span per optimizer step;
- when transformers' masking utilities are imported: its packed-sequence check, a device read,
  takes every batch as unpacked (`_after_masking_utils`);
- with `--no-weights`, when transformers is imported: `from_pretrained` builds the model from its
  config on the `meta` device and materializes it on the emulated GPU, reading no weights;
- at exit: the spans, the run's peaks and the outcome (ok, out of memory, error) are written as
  JSON to $VRAMLAB_EMU_DIR/python-<pid>.json for vramlab to print and record, one file per
  Python process (spawned workers, torchrun's ranks and DataLoader workers each write their own);
- SIGUSR1 writes the stacks of every thread to $VRAMLAB_EMU_DIR/trace-<pid>.txt (vramlab sends
  it before it stops a program that ran past --timeout, to name where it was), and SIGTERM ends
  the process through its exit handlers, so that its report is still written.

The hook holds whatever order the imports come in: a `find_spec("torch")` probe (transformers,
accelerate and vLLM make one before they import torch) only looks; the hook stays until torch
itself is executed, by the program or by any package that imports it.
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib.abc
import importlib.util
import json
import os
import re
import signal
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

        def run(module):
            exec_module(module)
            # The hook is used up by the module's execution, not by a look at its spec.
            hook = _HOOKS.pop(name, None)
            if hook is not None:
                hook(module)

        loader.exec_module = run
        return spec


def _after_torch(torch) -> None:
    # The architectures this torch carries kernels for: the stubs answer a kernel's version as
    # the driver would load it (sm_86 code on an 8.9 card), which CUB's dispatch checks.
    # Asked at CUDA's lazy initialization, not at import: `_cuda_getArchFlags` registers torch's
    # fork handler, and a process forked after it may not use CUDA ("Cannot re-initialize CUDA
    # in forked subprocess"), which breaks vLLM's engine core, forked from a parent that never
    # initialized CUDA.
    arch_flags = getattr(torch._C, "_cuda_getArchFlags", None)

    def set_archs():
        if arch_flags is not None and arch_flags():
            os.environ["VRAMLAB_EMU_ARCHS"] = arch_flags()

    lazy = getattr(torch.cuda, "_lazy_call", None)
    if lazy is not None:
        lazy(set_archs)
    else:
        set_archs()
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
    span = Span("step_total", 1)
    _STEP["open"] = span
    rec._open.append(span)
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


def _after_masking_utils(mu) -> None:
    """transformers (4.53 on) checks whether a batch packs several sequences by reading its
    position ids on the device (`find_packed_sequence_indices`). Device data reads as zeros
    here, so the check would find packing in every batch without a mask and build a 4-D mask,
    which takes SDPA off flash and repeats K and V for grouped-query attention: memory that a
    GPU running the same batch never allocates. Emulated, a batch is unpacked, as the position
    ids transformers makes itself (an arange) always are; a note says so."""
    if not hasattr(mu, "find_packed_sequence_indices"):
        return

    def find_packed_sequence_indices(position_ids):
        note = ("transformers' packed-sequence check reads position ids on the device: "
                "taken as unpacked (one sequence per row)")
        if note not in _NOTES:
            _NOTES.append(note)
        return None

    mu.find_packed_sequence_indices = find_packed_sequence_indices


# vLLM's startup lines (vllm 0.33: v1/worker/gpu/model_runner.py and gpu_model_runner.py,
# v1/worker/gpu_worker.py, v1/core/kv_cache_utils.py), each matched once in the process that
# logged it and kept with the figures it prints. GiB figures stay as vLLM printed them (two
# decimals); the available KV bytes are also kept exactly, from the worker's own return value.
_VLLM_LINES = (
    ("weights_loaded",
     re.compile(r"Model loading took (?P<gib>[\d.]+) GiB memory and (?P<seconds>[\d.]+) seconds")),
    ("available_kv", re.compile(r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB")),
    ("kv_cache",
     re.compile(r"(?P<pool>\w+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens, Maximum "
                r"concurrency for (?P<max_model_len>[\d,]+) tokens per request: "
                r"(?P<concurrency>[\d.]+)x")),
    ("memory_profile",
     re.compile(r"Actual usage is (?P<consumed_gib>-?[\d.]+) GiB for consumed memory \(weights \+ "
                r"non-torch\), (?P<activation_gib>-?[\d.]+) GiB for peak activation, and "
                r"(?P<cudagraph_gib>-?[\d.]+) GiB for CUDAGraph memory")),
    ("graph_capture",
     re.compile(r"Graph capturing finished in (?P<seconds>[\d.]+) secs, took (?P<gib>-?[\d.]+) GiB")),
    ("graph_pool",
     re.compile(r"CUDA graph pool memory: (?P<gib>-?[\d.]+) GiB \(actual\), "
                r"(?P<estimated_gib>-?[\d.]+) GiB \(estimated\)")),
)
_VLLM: Dict[str, object] = {"lines": [], "available_kv_bytes": None, "block_size": None}


def _vllm_line(msg: str) -> None:
    for kind, pattern in _VLLM_LINES:
        m = pattern.search(msg)
        if m is None:
            continue
        line: Dict[str, object] = {"kind": kind, "text": msg.strip()}
        for key, value in m.groupdict().items():
            if key in ("tokens", "max_model_len"):
                line[key] = int(value.replace(",", ""))
            elif key == "pool":
                line[key] = value
            else:
                line[key] = value  # as printed: Rust reads the decimal
        lines = _VLLM["lines"]
        assert isinstance(lines, list)
        lines.append(line)
        return


def _after_vllm_logger(module) -> None:
    """Every INFO record of a `vllm.*` logger is matched against vLLM's startup lines, whatever
    handlers vLLM's logging configuration installs (it may install them again later)."""
    import logging

    if getattr(logging.Logger.callHandlers, "_vramlab", False):
        return
    original = logging.Logger.callHandlers

    def call_handlers(self, record):
        if record.name.startswith("vllm") and record.levelno == logging.INFO:
            try:
                _vllm_line(record.getMessage())
            except Exception:  # noqa: BLE001 (a line vramlab cannot read is not the program's error)
                pass
        elif record.name.startswith("uvicorn") and record.msg == _SERVER_UP:
            result = original(self, record)
            _stop_server()
            return result
        return original(self, record)

    call_handlers._vramlab = True  # type: ignore[attr-defined]
    logging.Logger.callHandlers = call_handlers  # type: ignore[method-assign]


# uvicorn's line once vLLM's API server (`vllm serve`) has started: its engine's startup lines
# are all out by then.
_SERVER_UP = "Application startup complete."


def _stop_server() -> None:
    """Startup alone is the measurement: the server is stopped as Ctrl-C would (uvicorn shuts
    down, and vLLM shuts its engine core down), rather than left serving requests that would
    wait on device values (zeros here) forever."""
    _NOTES.append("vLLM's API server was stopped after its startup (SIGINT): startup is the "
                  "measurement")
    os.kill(os.getpid(), signal.SIGINT)


def _after_vllm_gpu_worker(module) -> None:
    """The worker's available KV cache memory, exactly (the log line rounds it to 0.01 GiB), and
    the block size it is divided into."""
    worker = getattr(module, "Worker", None)
    original = getattr(worker, "determine_available_memory", None)
    if worker is None or original is None:
        return

    def determine_available_memory(self, *args, **kwargs):
        available = original(self, *args, **kwargs)
        _VLLM["available_kv_bytes"] = int(available)
        _VLLM["block_size"] = getattr(getattr(self, "cache_config", None), "block_size", None)
        return available

    worker.determine_available_memory = determine_available_memory


def _vllm_forked() -> None:
    """A forked child reports the lines it logs itself, not its parent's."""
    _VLLM.update(lines=[], available_kv_bytes=None, block_size=None)


class _ForkMark:
    """Kept alive so that multiprocessing's after-fork registry (weak references) holds it."""


_FORK_MARK = _ForkMark()


def _after_multiprocessing_util(util) -> None:
    """A child that multiprocessing forks leaves through `os._exit` (`Popen._launch`), past the
    exit handlers: its report is written by a multiprocessing finalizer instead, registered in
    the child after the registry is cleared (vLLM's engine core, forked workers)."""

    def in_child(_mark):
        util.Finalize(None, _write_report, exitpriority=-1000)

    util.register_after_fork(_FORK_MARK, in_child)


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


def _run_dir() -> Optional[str]:
    return os.environ.get("VRAMLAB_EMU_DIR") or None


def _unhooked_run(torch) -> Optional[dict]:
    """The run's peaks when the import hook never ran (torch was imported in a way no finder
    saw): PyTorch's own statistics since the start, which nothing reset."""
    s = torch.cuda.memory_stats()
    if not s:
        return None
    _NOTES.append("the import hook did not run: cuDNN was left on, and no phases or steps were "
                  "marked (the figures are PyTorch's peaks over the whole run)")
    get = lambda k: int(s.get(k, 0))  # noqa: E731
    return Span("total", None, 0, get("allocated_bytes.all.peak"), get("allocated_bytes.all.current"),
                0, get("reserved_bytes.all.peak"), get("reserved_bytes.all.current"),
                (emulator_stats() or {}).get("peak")).as_dict()


def _write_report() -> None:
    folder = _run_dir()
    if not folder or _WRITTEN.get(os.getpid()):
        return
    _WRITTEN[os.getpid()] = True
    path = os.path.join(folder, f"python-{os.getpid()}.json")
    torch = sys.modules.get("torch")
    report = {
        "version": 2,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": list(sys.argv),
        "torch": getattr(torch, "__version__", None),
        "cuda": getattr(getattr(torch, "version", None), "cuda", None),
        "cuda_initialized": bool(torch and torch.cuda.is_initialized()),
        "phases": [],
        "steps": [],
        "run": None,
        "driver": emulator_stats(),
        "notes": _NOTES,
        "vllm": _VLLM if _VLLM["lines"] or _VLLM["available_kv_bytes"] is not None else None,
        **_OUTCOME,
    }
    if torch is not None and torch.cuda.is_initialized():
        report["device"] = torch.cuda.current_device()
        report["device_name"] = torch.cuda.get_device_name(report["device"])
        if "torch" in _HOOKS:
            report["run"] = _unhooked_run(torch)
        else:
            rec = recorder()
            tail = _STEP["open"]
            run = rec.finish()
            report["phases"] = [s.as_dict() for s in rec.spans
                                if s is not tail and s not in _STEPS]
            report["steps"] = [s.as_dict() for s in _STEPS]
            report["run"] = run.as_dict()
    report["cudnn"] = bool(torch and torch.backends.cudnn.enabled)
    tmp = path + ".part"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, path)  # whole or not at all: vramlab never reads half a report


def _trace_on_signal() -> None:
    """SIGUSR1 dumps every thread's stack to trace-<pid>.txt in the run folder (a forked child
    gets a file of its own)."""
    folder = _run_dir()
    if not folder or not hasattr(signal, "SIGUSR1"):
        return
    f = open(os.path.join(folder, f"trace-{os.getpid()}.txt"), "w")  # noqa: SIM115 (lives on)
    _TRACE["file"] = f
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)


_TRACE: Dict[str, object] = {}
_WRITTEN: Dict[int, bool] = {}


def _on_sigterm(signum, frame) -> None:
    _OUTCOME.update(outcome="terminated", message="stopped by SIGTERM")
    sys.exit(128 + signum)


def install() -> None:
    if "torch" in sys.modules:  # imported before the boot (a sitecustomize of the environment)
        _after_torch(sys.modules["torch"])
    else:
        _HOOKS["torch"] = _after_torch
    _HOOKS["transformers.masking_utils"] = _after_masking_utils
    _HOOKS["vllm.logger"] = _after_vllm_logger
    _HOOKS["vllm.v1.worker.gpu_worker"] = _after_vllm_gpu_worker
    if "multiprocessing.util" in sys.modules:
        _after_multiprocessing_util(sys.modules["multiprocessing.util"])
    else:
        _HOOKS["multiprocessing.util"] = _after_multiprocessing_util
    if os.environ.get("VRAMLAB_EMU_NO_WEIGHTS") == "1":
        _HOOKS["transformers.modeling_utils"] = _after_modeling_utils
    sys.meta_path.insert(0, _AfterImport())
    sys.excepthook = _excepthook
    atexit.register(_write_report)
    _trace_on_signal()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_trace_on_signal)
        os.register_at_fork(after_in_child=_vllm_forked)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # not the main thread of the main interpreter
            pass
