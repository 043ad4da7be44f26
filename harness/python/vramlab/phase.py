"""Phase marks over PyTorch's CUDA allocator statistics.

PyTorch keeps one high-water mark per statistic. Nested or overlapping spans (a phase inside an
optimizer step, the whole run around both) therefore share it: at every boundary the current
high-water marks are folded into every open span, then reset. Each span's peak is the maximum
of the folds made while it was open, so no boundary loses a peak and no span sees another's.

The program's own view stays whole: once a recorder exists, `torch.cuda.memory_stats` (and so
`max_memory_allocated` and `max_memory_reserved`) report the peak since the program's own last
`reset_peak_memory_stats`, however many boundaries reset the allocator's marks in between.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import time
from typing import Iterator, List, Optional


@dataclasses.dataclass
class Span:
    """One measured interval: bytes from torch.cuda statistics (and the emulator's driver)."""

    name: str
    step: Optional[int] = None
    baseline_allocated: int = 0
    peak_allocated: int = 0
    end_allocated: int = 0
    baseline_reserved: int = 0
    peak_reserved: int = 0
    end_reserved: int = 0
    # Bytes held through cudaMalloc at most (the emulated driver's count; reserved plus anything
    # allocated outside PyTorch's caching allocator). None on a real GPU.
    peak_driver: Optional[int] = None
    elapsed_ms: float = 0.0
    _t0: float = 0.0

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("_t0")
        return d


def _emulator():
    """The emulated driver's statistics function, or None outside `vramlab emulate`."""
    try:
        lib = ctypes.CDLL(None)
        stats = lib.vramlab_emu_stats
        reset = lib.vramlab_emu_reset_peak
    except (AttributeError, OSError):
        return None
    u64 = ctypes.POINTER(ctypes.c_uint64)
    stats.argtypes = [u64] * 5
    stats.restype = None
    reset.argtypes = []
    reset.restype = None
    return stats, reset


def emulator_stats() -> Optional[dict]:
    """The emulated driver's bytes: now, at most since the last boundary, its capacity, and how
    many cudaMalloc calls failed. None outside `vramlab emulate`."""
    emu = _emulator()
    if emu is None:
        return None
    vals = [ctypes.c_uint64(0) for _ in range(5)]
    emu[0](*[ctypes.byref(v) for v in vals])
    keys = ("used", "peak", "capacity", "failed_mallocs", "mallocs")
    return {k: v.value for k, v in zip(keys, vals)}


# The program's peaks since its own last reset, folded in at every boundary (see above).
_SHADOW = {"allocated": 0, "reserved": 0}
_PATCHED = {"done": False}


def _raw(torch):
    """The allocator's own (current, peak) of allocated and reserved bytes, unpatched."""
    s = torch._C._cuda_memoryStats(torch.cuda.current_device())
    a, r = s["allocated_bytes"]["all"], s["reserved_bytes"]["all"]
    return a["current"], a["peak"], r["current"], r["peak"]


def _keep_program_peaks(torch) -> None:
    """Makes torch.cuda's peak statistics include the peaks a boundary reset away."""
    if _PATCHED["done"]:
        return
    _PATCHED["done"] = True
    mem = torch.cuda.memory
    stats, reset = mem.memory_stats, mem.reset_peak_memory_stats

    def memory_stats(device=None):
        d = stats(device)
        if d:
            for key, name in (("allocated_bytes.all.peak", "allocated"),
                              ("reserved_bytes.all.peak", "reserved")):
                d[key] = max(d.get(key, 0), _SHADOW[name])
        return d

    def reset_peak_memory_stats(device=None):
        # The spans keep what the program resets away: fold first, then start the program's
        # own peak again from the current figures.
        if _RECORDER is not None:
            _RECORDER.fold()
        reset(device)
        if torch.cuda.is_initialized():
            a, _, r, _ = _raw(torch)
            _SHADOW.update(allocated=a, reserved=r)

    for owner in (mem, torch.cuda):
        owner.memory_stats = memory_stats
        owner.reset_peak_memory_stats = reset_peak_memory_stats


class Recorder:
    """Keeps the spans of one process, closed in the order they closed."""

    def __init__(self) -> None:
        self.spans: List[Span] = []
        self._open: List[Span] = []
        self.run = Span("total")
        self._started = False
        self._emu = _emulator()
        # The optimizer step a phase belongs to, when something counts steps (the emulator).
        self.current_step: Optional[int] = None

    def _torch(self):
        import torch

        return torch

    def _start(self) -> None:
        if not self._started:
            self._started = True
            torch = self._torch()
            _keep_program_peaks(torch)
            self.run.baseline_allocated = torch.cuda.memory_allocated()
            self.run.baseline_reserved = torch.cuda.memory_reserved()
            self.run._t0 = time.perf_counter()

    def fold(self) -> None:
        """Folds the high-water marks into every open span and the run, then resets them."""
        torch = self._torch()
        _keep_program_peaks(torch)
        if not torch.cuda.is_initialized():
            return  # nothing allocated yet; the statistics start at zero
        torch.cuda.synchronize()
        _, a, _, r = _raw(torch)
        _SHADOW["allocated"] = max(_SHADOW["allocated"], a)
        _SHADOW["reserved"] = max(_SHADOW["reserved"], r)
        stats = emulator_stats() if self._emu else None
        d = stats["peak"] if stats is not None else None
        for s in self._open + [self.run]:
            s.peak_allocated = max(s.peak_allocated, a)
            s.peak_reserved = max(s.peak_reserved, r)
            if d is not None:
                s.peak_driver = max(s.peak_driver or 0, d)
        torch._C._cuda_resetPeakMemoryStats(torch.cuda.current_device())
        if self._emu:
            self._emu[1]()

    def open(self, name: str, step: Optional[int] = None) -> Span:
        torch = self._torch()
        if not torch.cuda.is_available():
            raise RuntimeError("vramlab.phase needs a CUDA device (a real one, or `vramlab emulate`)")
        self._start()
        self.fold()
        s = Span(name, self.current_step if step is None else step)
        s.baseline_allocated = s.peak_allocated = torch.cuda.memory_allocated()
        s.baseline_reserved = s.peak_reserved = torch.cuda.memory_reserved()
        s._t0 = time.perf_counter()
        self._open.append(s)
        return s

    def close(self, s: Span) -> Span:
        torch = self._torch()
        self.fold()
        s.end_allocated = torch.cuda.memory_allocated()
        s.end_reserved = torch.cuda.memory_reserved()
        s.elapsed_ms = (time.perf_counter() - s._t0) * 1e3
        self._open.remove(s)
        self.spans.append(s)
        return s

    def finish(self) -> Span:
        """Closes the run span (and any span left open) and returns it."""
        if not self._started:
            return self.run
        for s in list(self._open):
            self.close(s)
        torch = self._torch()
        self.fold()
        self.run.end_allocated = torch.cuda.memory_allocated()
        self.run.end_reserved = torch.cuda.memory_reserved()
        self.run.elapsed_ms = (time.perf_counter() - self.run._t0) * 1e3
        return self.run


    def write_csv(self, path, *, model_id: str, precision: str, mode: str = "train",
                  batch: int = 1, context: int = 0, param_count: int = 0) -> int:
        """Writes the closed phases (or, if none, the run) as rows of vramlab's CSV schema, the
        torch probe's columns: meter `torch-cuda` on a GPU, `torch-emulated` (and a device name
        ending in "(emulated)") under `vramlab emulate`. `precision` and `mode` are vramlab's
        words (f32, bf16, mixed-bf16, ...; infer, train). Returns the number of rows."""
        import datetime
        import os

        from .probe import csvout as p

        torch = self._torch()
        emulated = self._emu is not None
        name = torch.cuda.get_device_name() + (" (emulated)" if emulated else "")
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        base = dict(schema_version=p.SCHEMA_VERSION, run_id=f"recorder-{os.getpid():x}",
                    point_id=f"{model_id}/{mode}/{precision}/b{batch}/c{context}",
                    started_at=stamp, vramlab_version="vramlab.phase", backend="cuda",
                    device_name=name, cuda_version=str(torch.version.cuda), model_id=model_id,
                    mode=mode, precision=precision, batch=batch, context=context,
                    param_count=param_count,
                    optimizer="none", kernels="reference", attention="eager",
                    meter="torch-emulated" if emulated else "torch-cuda", status="ok")
        # The closed phases only: under `vramlab emulate` the step span that the last
        # optimizer step opened is still open here and covers no step.
        spans = self.spans or [self.finish()]
        w = p.Writer(__import__("pathlib").Path(path))
        for s in spans:
            w.write(dict(base, phase=s.name, step=s.step,
                         baseline_allocated=s.baseline_allocated,
                         peak_allocated=s.peak_allocated, end_allocated=s.end_allocated,
                         baseline_reserved=s.baseline_reserved, peak_reserved=s.peak_reserved,
                         elapsed_ms=s.elapsed_ms))
        return len(spans)


_RECORDER: Optional[Recorder] = None


def recorder() -> Recorder:
    """The process's recorder (one per process, as PyTorch's statistics are)."""
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = Recorder()
    return _RECORDER


@contextlib.contextmanager
def phase(name: str, step: Optional[int] = None) -> Iterator[Span]:
    """Measures the enclosed code as one phase: ``with vramlab.phase("backward"): ...``."""
    rec = recorder()
    s = rec.open(name, step)
    try:
        yield s
    finally:
        rec.close(s)
