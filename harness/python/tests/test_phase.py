"""``vramlab.phase`` (harness/python/vramlab/phase.py) without torch, a GPU or the vramlab binary.

A fake ``torch`` in sys.modules: ``torch._C`` keeps one high-water mark per statistic, as PyTorch's
caching allocator does, and ``torch.cuda.memory`` is built as PyTorch's is (``max_memory_allocated``
looks ``memory_stats`` up in the module's globals), so phase.py's patches act on it as on PyTorch.
The emulator's stubs are faked where phase.py opens them, ``ctypes.CDLL(None)``: emu.c's two exports
as real ctypes function pointers. Every expected figure comes from the fake device's history.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import json
import sys
import types
from typing import Dict, List, Optional, Tuple

import pytest

from vramlab.phase import Span

P = importlib.import_module("vramlab.phase")  # `vramlab.phase` the attribute is the function
MB = 1 << 20
SEG = 2 * MB  # the fake caching allocator reserves whole segments

# PyTorch's torch/cuda/memory.py, the parts phase.py and programs use, executed in a module.
MEMORY_PY = '''
import collections
def memory_stats_as_nested_dict(device=None):
    return torch._C._cuda_memoryStats(_get_device_index(device)) if is_initialized() else {}
def memory_stats(device=None):
    result = []
    def add(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                add(prefix + "." + k if prefix else k, v)
        else:
            result.append((prefix, obj))
    add("", memory_stats_as_nested_dict(device=device))
    return collections.OrderedDict(sorted(result))
def reset_peak_memory_stats(device=None):
    return torch._C._cuda_resetPeakMemoryStats(_get_device_index(device))
def reset_max_memory_allocated(device=None): return reset_peak_memory_stats(device=device)
def memory_allocated(device=None): return memory_stats(device=device).get("allocated_bytes.all.current", 0)
def max_memory_allocated(device=None): return memory_stats(device=device).get("allocated_bytes.all.peak", 0)
def memory_reserved(device=None): return memory_stats(device=device).get("reserved_bytes.all.current", 0)
def max_memory_reserved(device=None): return memory_stats(device=device).get("reserved_bytes.all.peak", 0)
'''


class Device:
    """One fake GPU: the caching allocator's bytes and high-water marks (torch._C's), and the
    emulated driver under it: cudaMalloc'd bytes are the reserved ones plus those held outside
    the allocator, with the driver's own peak."""

    def __init__(self) -> None:
        self.available, self.initialized = True, False
        self.allocated = self.reserved = self.outside = 0
        self.peak_allocated = self.peak_reserved = self.driver_peak = 0
        self.capacity, self.mallocs, self.failed = 24 * 1024 * MB, 0, 3
        # (allocated, reserved, driver used) after every change; [0] is the state at start.
        self.history: List[Tuple[int, int, int]] = [(0, 0, 0)]
        self.torch = fake_torch(self)

    @property
    def driver_used(self) -> int:
        return self.reserved + self.outside

    def now(self) -> int:
        return len(self.history) - 1

    def _changed(self) -> None:
        self.initialized = True
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.driver_peak = max(self.driver_peak, self.driver_used)
        self.history.append((self.allocated, self.reserved, self.driver_used))

    def alloc(self, n: int) -> None:
        self.allocated += n
        if self.allocated > self.reserved:
            self.reserved += -(-(self.allocated - self.reserved) // SEG) * SEG
            self.mallocs += 1
        self._changed()

    def free(self, n: int) -> None:
        self.allocated -= n
        self._changed()

    def empty_cache(self) -> None:
        self.reserved = -(-self.allocated // SEG) * SEG
        self._changed()

    def outside_alloc(self, n: int) -> None:
        """Bytes cudaMalloc'd (n > 0) or freed past PyTorch's allocator (a library's workspace)."""
        self.outside += n
        self.mallocs += n > 0
        self._changed()

    def stats(self, device: int) -> dict:
        assert device == 0
        a = dict(current=self.allocated, peak=self.peak_allocated)
        r = dict(current=self.reserved, peak=self.peak_reserved)
        return {"allocated_bytes": {"all": a, "large_pool": dict(a)},
                "reserved_bytes": {"all": r, "large_pool": dict(r)}, "num_ooms": 0}

    def reset_peak(self, device: int) -> None:
        assert device == 0
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def expect(self, i: int, j: int, driver: bool = True) -> Dict[str, Optional[int]]:
        """A span's figures when it opened at state i and closed at state j."""
        h = self.history[i : j + 1]
        return dict(baseline_allocated=h[0][0], peak_allocated=max(x[0] for x in h), end_allocated=h[-1][0],
                    baseline_reserved=h[0][1], peak_reserved=max(x[1] for x in h), end_reserved=h[-1][1],
                    peak_driver=max(x[2] for x in h) if driver else None)

    def peak_since(self, i: int, col: int) -> int:
        return max(x[col] for x in self.history[i:])


def fake_torch(dev: Device) -> types.ModuleType:
    torch = types.ModuleType("torch")
    C = types.ModuleType("torch._C")
    C._cuda_memoryStats, C._cuda_resetPeakMemoryStats = dev.stats, dev.reset_peak  # type: ignore[attr-defined]
    mem = types.ModuleType("torch.cuda.memory")
    mem.__dict__.update(torch=torch, is_initialized=lambda: dev.initialized,
                        _get_device_index=lambda d: 0 if d is None else d)
    exec(MEMORY_PY, mem.__dict__)
    cuda = types.ModuleType("torch.cuda")
    for name in [n for n in vars(mem) if "memory" in n]:  # torch/cuda/__init__.py: `from .memory import *`
        setattr(cuda, name, getattr(mem, name))
    cuda.__dict__.update(memory=mem, is_available=lambda: dev.available, is_initialized=lambda: dev.initialized,
                         current_device=lambda: 0, synchronize=lambda device=None: None,
                         get_device_name=lambda device=None: "Fake GPU 24GB")
    torch.__dict__.update(_C=C, cuda=cuda, version=types.SimpleNamespace(cuda="12.4"))
    return torch


class FakeStub:
    """What ctypes.CDLL(None) finds in a process under `vramlab emulate`: emu.c's two exports."""

    def __init__(self, dev: Device) -> None:
        self.dev, self.resets = dev, 0
        u64 = ctypes.POINTER(ctypes.c_uint64)
        self.vramlab_emu_stats = ctypes.CFUNCTYPE(None, u64, u64, u64, u64, u64)(self._stats)
        self.vramlab_emu_reset_peak = ctypes.CFUNCTYPE(None)(self._reset)

    def _stats(self, used, peak, capacity, failed, mallocs) -> None:  # emu.c's argument order
        d = self.dev
        for p, v in zip((used, peak, capacity, failed, mallocs), (d.driver_used, d.driver_peak, d.capacity,
                                                                  d.failed, d.mallocs)):
            p[0] = v

    def _reset(self) -> None:
        self.resets += 1
        self.dev.driver_peak = self.dev.driver_used


@pytest.fixture
def dev(monkeypatch: pytest.MonkeyPatch) -> Device:
    """A fake torch over a fake device, and phase.py's process state as a fresh process has it."""
    d = Device()
    t = d.torch
    for name, mod in (("torch", t), ("torch._C", t._C), ("torch.cuda", t.cuda), ("torch.cuda.memory", t.cuda.memory)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(P, "_RECORDER", None)
    monkeypatch.setattr(P, "_PATCHED", {"done": False})
    monkeypatch.setattr(P, "_SHADOW", {"allocated": 0, "reserved": 0})
    return d


def install_stub(monkeypatch: pytest.MonkeyPatch, lib: object) -> None:
    """ctypes.CDLL(None), the process's own symbols, finds `lib` (or raises it)."""
    real = ctypes.CDLL

    def cdll(name, *args, **kwargs):
        if name is None and isinstance(lib, Exception):
            raise lib
        return lib if name is None else real(name, *args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", cdll)


@pytest.fixture
def stub(dev: Device, monkeypatch: pytest.MonkeyPatch) -> FakeStub:
    s = FakeStub(dev)
    install_stub(monkeypatch, s)
    return s


def figures(span: Span) -> Dict[str, object]:
    return {k: getattr(span, k) for k in ("baseline_allocated", "peak_allocated", "end_allocated",
                                          "baseline_reserved", "peak_reserved", "end_reserved", "peak_driver")}


def test_nested_and_overlapping_spans_each_get_their_own_peak(dev: Device, stub: FakeStub) -> None:
    rec = P.recorder()
    marks: Dict[str, List[int]] = {}

    def mark(name: str) -> None:  # the state at a span's open, then at its close
        marks.setdefault(name, []).append(dev.now())

    dev.alloc(MB)  # on the device before any span: the run's baseline
    with P.phase("outer") as outer:
        mark("outer")
        dev.alloc(9 * MB)
        dev.outside_alloc(5 * MB)  # the driver's peak, before "inner" opens
        dev.outside_alloc(-5 * MB)
        dev.free(6 * MB)
        with P.phase("inner") as inner:
            mark("inner")
            dev.alloc(3 * MB + 123)
            dev.free(3 * MB + 123)
            dev.alloc(MB // 2)
        mark("inner")
        a = rec.open("a")
        mark("a")
        dev.alloc(4 * MB)  # seen by "a" and "outer"
        b = rec.open("b")
        mark("b")
        dev.free(4 * MB)
        dev.empty_cache()
        rec.close(a)
        mark("a")
        dev.alloc(8 * MB + 7)  # after "a" closed: seen by "b" and "outer" alone, the outer's peak
        dev.free(7 * MB)
        rec.close(b)
        mark("b")
    mark("outer")
    dev.alloc(20 * MB)  # after every span closed
    run = rec.finish()

    assert [s.name for s in rec.spans] == ["inner", "a", "b", "outer"]  # in the order they closed
    for s in (outer, inner, a, b):
        assert figures(s) == dev.expect(marks[s.name][0], marks[s.name][1]), s.name
    assert figures(run) == dev.expect(1, dev.now())
    # The history, spelled out: the outer span saw the peak of "b" inside it (and the driver's before
    # "inner"); "inner" did not see the peak (10 MB) made before it opened.
    assert outer.peak_allocated == b.peak_allocated == 12 * MB + MB // 2 + 7 and outer.peak_reserved == 14 * MB
    assert inner.peak_allocated == 7 * MB + 123 < 10 * MB
    assert (inner.peak_driver, outer.peak_driver) == (10 * MB, 10 * MB + 5 * MB)
    assert a.peak_allocated == 4 * MB + MB // 2 + 4 * MB and b.end_allocated == 5 * MB + MB // 2 + 7
    assert run.peak_allocated == 25 * MB + MB // 2 + 7 and run.baseline_allocated == MB
    assert stub.resets == 9  # one per boundary, so a driver peak is never counted twice


def test_finish_closes_what_is_left_open_and_needs_no_torch_before_a_span(
    dev: Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails: finish must not need it
    rec = P.recorder()
    assert rec.finish() is rec.run and figures(rec.run) == figures(Span("total")) and rec.spans == []
    monkeypatch.setitem(sys.modules, "torch", dev.torch)
    dev.alloc(3 * MB)
    left = rec.open("left open")
    i = dev.now()
    dev.alloc(5 * MB)
    run = rec.finish()
    assert rec.spans == [left] and figures(left) == dev.expect(i, dev.now(), driver=False)
    assert run.baseline_allocated == 3 * MB and run.end_allocated == run.peak_allocated == 8 * MB
    assert run.peak_driver is left.peak_driver is None  # no emulator here


def test_the_program_s_own_peaks_stay_whole_across_boundaries(dev: Device) -> None:
    cuda = dev.torch.cuda
    dev.alloc(7 * MB)
    dev.free(7 * MB)  # the program's peak, before any span
    with P.phase("small"):
        dev.alloc(MB)
        dev.free(MB)
    with P.phase("smaller"):
        dev.alloc(1000)
    assert dev.peak_allocated < 7 * MB  # the boundaries did reset the allocator's marks
    assert cuda.max_memory_allocated() == cuda.memory.max_memory_allocated() == dev.peak_since(0, 0) == 7 * MB
    assert cuda.max_memory_reserved() == dev.peak_since(0, 1) == 8 * MB
    assert cuda.memory_stats()["allocated_bytes.all.peak"] == 7 * MB
    assert cuda.memory_stats()["allocated_bytes.all.current"] == cuda.memory_allocated() == 1000

    # The program resets its own peak inside a span: the span keeps what the reset took away.
    with P.phase("reset inside") as s:
        i = dev.now()
        dev.alloc(3 * MB)
        dev.free(3 * MB)
        cuda.reset_peak_memory_stats()
        since = dev.now()
        assert cuda.max_memory_allocated() == 1000
        dev.alloc(2 * MB)
        dev.free(2 * MB)
    assert figures(s) == dev.expect(i, dev.now(), driver=False) and s.peak_allocated == 3 * MB + 1000
    assert cuda.max_memory_allocated() == dev.peak_since(since, 0) == 2 * MB + 1000

    with P.phase("again") as t:
        dev.alloc(MB)
        dev.free(MB)
        cuda.memory.reset_max_memory_allocated()  # the older name, through torch.cuda.memory
    assert t.peak_allocated == MB + 1000 and cuda.max_memory_allocated() == 1000
    assert cuda.max_memory_reserved() == dev.reserved == 8 * MB


def test_driver_counters_through_the_stub(dev: Device, stub: FakeStub) -> None:
    dev.alloc(3 * MB)
    dev.outside_alloc(MB)
    stats = P.emulator_stats()
    assert stats == dict(used=4 * MB + MB, peak=5 * MB, capacity=dev.capacity, failed_mallocs=3, mallocs=2)
    assert P.recorder()._emu is not None
    with P.phase("p") as s:
        i = dev.now()
        dev.outside_alloc(6 * MB)
        dev.outside_alloc(-6 * MB)
    assert s.peak_driver == dev.expect(i, dev.now())["peak_driver"] == 11 * MB
    assert s.peak_reserved == 4 * MB  # the workspace is the driver's alone
    # Each boundary reset the driver's peak: what is left is the peak since the last one.
    assert P.emulator_stats() == dict(stats, used=5 * MB, peak=5 * MB, mallocs=3)


def test_without_the_emulator_there_is_no_driver_peak(dev: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    if hasattr(ctypes.CDLL(None), "vramlab_emu_stats"):
        pytest.skip("this pytest runs under `vramlab emulate`")
    assert P._emulator() is None and P.emulator_stats() is None
    with P.phase("p") as s:
        dev.alloc(MB)
    assert s.peak_driver is None and s.as_dict()["peak_driver"] is None and s.peak_allocated == MB
    half = types.SimpleNamespace(vramlab_emu_stats=FakeStub(dev).vramlab_emu_stats)  # no reset export
    for lib in (OSError("no such library"), half):
        install_stub(monkeypatch, lib)
        assert P._emulator() is None and P.emulator_stats() is None


def test_steps(dev: Device) -> None:
    rec = P.recorder()
    with P.phase("load") as load:
        pass
    rec.current_step = 4
    with P.phase("forward") as fwd, P.phase("backward", step=0) as bwd, P.phase("optimizer", 9) as opt:
        pass
    assert (load.step, fwd.step, bwd.step, opt.step) == (None, 4, 0, 9)
    assert [s.name for s in rec.spans] == ["load", "optimizer", "backward", "forward"]


def test_needs_a_device_and_starts_at_zero_before_cuda_initializes(dev: Device) -> None:
    dev.available = False
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        P.recorder().open("p")
    dev.available = True
    with P.phase("before init") as s:
        assert not dev.initialized
    assert figures(s) == figures(Span("x"))
    with P.phase("after init") as t:
        dev.alloc(MB)
    assert (t.baseline_allocated, t.peak_allocated, t.end_reserved) == (0, MB, SEG)


def test_as_dict_and_elapsed(dev: Device, stub: FakeStub, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([10.0, 10.5, 12.25, 13.0, 20.0])
    monkeypatch.setattr(P, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    rec = P.recorder()
    with P.phase("forward", step=2) as s:  # run starts at 10.0, the span at 10.5
        dev.alloc(MB)
    assert s.elapsed_ms == pytest.approx(1750.0)  # closed at 12.25
    assert rec.finish().elapsed_ms == pytest.approx(3000.0)  # 13.0
    d = s.as_dict()
    assert list(d) == [f.name for f in dataclasses.fields(P.Span) if f.name != "_t0"]
    assert d == dict(figures(s), name="forward", step=2, elapsed_ms=s.elapsed_ms)
    assert s._t0 == 10.5 and json.loads(json.dumps(d)) == d


@pytest.mark.parametrize("emulated", [False, True])
def test_write_csv(dev: Device, monkeypatch: pytest.MonkeyPatch, tmp_path, emulated: bool) -> None:
    rows: List[dict] = []  # what the probe's CSV writer (vramlab/probe/csvout.py) is given
    csvout = types.SimpleNamespace(SCHEMA_VERSION=99, Writer=lambda path: types.SimpleNamespace(write=rows.append))
    monkeypatch.setattr(importlib.import_module("vramlab.probe"), "csvout", csvout)
    if emulated:
        install_stub(monkeypatch, FakeStub(dev))
    rec = P.recorder()
    rec.current_step = 1
    with P.phase("forward") as fwd:
        dev.alloc(3 * MB)
    with P.phase("backward") as bwd:
        dev.alloc(MB)
        dev.free(2 * MB)
    assert rec.write_csv(tmp_path / "rows.csv", model_id="m", precision="bf16", batch=2, context=64) == 2
    assert [r["phase"] for r in rows] == ["forward", "backward"]
    for r, s in zip(rows, (fwd, bwd)):
        want = {k: v for k, v in figures(s).items() if k not in ("end_reserved", "peak_driver")}
        assert {k: r[k] for k in want} == want and (r["step"], r["elapsed_ms"]) == (1, s.elapsed_ms)
    r = rows[0]
    assert (r["schema_version"], r["point_id"], r["cuda_version"]) == (99, "m/train/bf16/b2/c64", "12.4")
    assert (r["batch"], r["context"], r["mode"], r["status"]) == (2, 64, "train", "ok")
    assert (r["meter"], r["device_name"]) == (
        ("torch-emulated", "Fake GPU 24GB (emulated)") if emulated else ("torch-cuda", "Fake GPU 24GB")
    )
    # No phase: one row, the run.
    rows.clear()
    assert P.Recorder().write_csv(tmp_path / "run.csv", model_id="m", precision="f32") == 1
    assert [(r["phase"], r["peak_allocated"]) for r in rows] == [("total", 0)]
    # A phase still open (the emulator's span of a step that never comes) is not written.
    rows.clear()
    rec = P.Recorder()
    fwd = rec.open("forward")
    dev.alloc(MB)
    rec.close(fwd)
    rec.open("step_total")
    assert rec.write_csv(tmp_path / "open.csv", model_id="m", precision="f32") == 1
    assert [r["phase"] for r in rows] == ["forward"]
