"""The probe's meters: torch's caching allocator on a (real or emulated) GPU, the preload
meter on CPU, and a meter that measures nothing for unmeasured rehearsals."""
import time
from pathlib import Path

from .common import InputError, emulated


class CudaMeter:
    """torch's caching allocator, read the way ARCHITECTURE.md §3 reads candle's pool."""
    kind = "torch-cuda"

    def __init__(self, torch, device):
        self.torch, self.device = torch, device
        if emulated():
            self.kind = "torch-emulated"

    def trim(self):
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.empty_cache()

    def start(self):
        t = self.torch
        t.cuda.synchronize(self.device)
        base = (t.cuda.memory_allocated(self.device), t.cuda.memory_reserved(self.device))
        t.cuda.reset_peak_memory_stats(self.device)
        return base, time.perf_counter()

    def finish(self, started):
        (base_alloc, base_res), t0 = started
        t = self.torch
        t.cuda.synchronize(self.device)
        free, total = t.cuda.mem_get_info(self.device)
        reserved = t.cuda.memory_reserved(self.device)
        used = total - free
        return dict(
            baseline_allocated=base_alloc,
            peak_allocated=t.cuda.max_memory_allocated(self.device),
            end_allocated=t.cuda.memory_allocated(self.device),
            baseline_reserved=base_res,
            peak_reserved=t.cuda.max_memory_reserved(self.device),
            device_used=used,
            non_pool=max(used - reserved, 0),
        ), (time.perf_counter() - t0) * 1e3


def proc_kb(path: str, keys: tuple) -> list[int]:
    vals = {}
    for line in Path(path).read_text().splitlines():
        k, _, v = line.partition(":")
        if k in keys:
            vals[k] = int(v.split()[0]) * 1024
    return [vals[k] for k in keys]


class PreloadMeter:
    """The CPU meter (`cpu-preload`): libvramlab_preload.so's live/peak heap bytes for
    allocated, RSS/HWM for reserved, as harness/src/meter/cpu.rs reads candle."""
    kind = "cpu-preload"

    def __init__(self):
        import ctypes
        lib = ctypes.CDLL(None)
        try:
            self.live, self.peak, self.reset = lib.vramlab_live, lib.vramlab_peak, lib.vramlab_reset_peak
        except AttributeError:
            raise InputError("--device cpu needs the preload meter: run through scripts/torch-cpu.sh "
                             "(LD_PRELOAD=libvramlab_preload.so)") from None
        self.live.restype = self.peak.restype = ctypes.c_uint64
        self.malloc_trim = lib.malloc_trim

    def trim(self):
        self.malloc_trim(0)

    def start(self):
        Path("/proc/self/clear_refs").write_text("5")
        self.reset()
        rss, = proc_kb("/proc/self/status", ("VmRSS",))
        return (self.live(), rss), time.perf_counter()

    def finish(self, started):
        (base_alloc, base_rss), t0 = started
        peak, end = self.peak(), self.live()
        rss, hwm = proc_kb("/proc/self/status", ("VmRSS", "VmHWM"))
        total, avail = proc_kb("/proc/meminfo", ("MemTotal", "MemAvailable"))
        return dict(
            baseline_allocated=base_alloc, peak_allocated=peak, end_allocated=end,
            baseline_reserved=base_rss, peak_reserved=max(hwm, rss),
            device_used=total - avail, non_pool=max(rss - end, 0),
        ), (time.perf_counter() - t0) * 1e3


class NullMeter:
    """Measures nothing: for the unmeasured rehearsal of a point."""
    kind = "none"

    def start(self):
        return time.perf_counter()

    def finish(self, started):
        keys = ("baseline_allocated", "peak_allocated", "end_allocated", "baseline_reserved",
                "peak_reserved", "device_used", "non_pool")
        return dict.fromkeys(keys, 0), (time.perf_counter() - started) * 1e3


def span(first: dict, rest: list[dict]) -> dict:
    allm = [first] + rest
    last = rest[-1] if rest else first
    return dict(
        baseline_allocated=first["baseline_allocated"],
        baseline_reserved=first["baseline_reserved"],
        peak_allocated=max(m["peak_allocated"] for m in allm),
        peak_reserved=max(m["peak_reserved"] for m in allm),
        end_allocated=last["end_allocated"],
        device_used=last["device_used"],
        non_pool=last["non_pool"],
    )
