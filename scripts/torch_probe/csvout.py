"""Rows in harness/src/record.rs's CSV schema."""
import csv
from pathlib import Path

from .common import EMU_CONV_NOTE, emulated

SCHEMA_VERSION = 6
# The Record columns of harness/src/record.rs, in order.
COLUMNS = [
    "schema_version", "run_id", "point_id", "started_at", "vramlab_version", "git_rev",
    "backend", "device_name", "driver_version", "cuda_version", "candle_version",
    "model_id", "architecture", "param_count", "weight_source",
    "mode", "precision", "compute", "qmatmul", "batch", "context", "prompt_len", "decode_steps",
    "kv_cache", "kv_window", "optimizer", "checkpointing", "grad_accum",
    "trainable", "kernels", "attention", "pool_release",
    "resolution", "frames", "cfg", "vae_decode", "vae_precision",
    "scenario_hash", "meter",
    "phase", "component", "peak_phase", "step", "kv_tokens",
    "baseline_allocated", "peak_allocated", "end_allocated", "baseline_reserved",
    "peak_reserved", "device_used", "non_pool",
    "feature_weight_bytes", "feature_kv_bytes", "feature_act_bytes", "feature_logits_bytes",
    "feature_optimizer_bytes",
    "elapsed_ms", "status", "message",
]


class Writer:
    def __init__(self, path: Path, append: bool = False):
        """A new CSV with its header; `append`: rows after those of an existing one (a worker
        of `vramlab sweep`, whose parent wrote the header)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        header = not append or not path.exists() or path.stat().st_size == 0
        self.f = open(path, "a" if append else "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS, lineterminator="\n")
        if header:
            self.w.writeheader()
        self.f.flush()

    def write(self, row: dict):
        if row.get("mode") == "generate" and emulated() and row.get("status") == "ok":
            # Every emulated generation row says how its convolutions ran.
            row = dict(row, message="; ".join(filter(None, (row.get("message"), EMU_CONV_NOTE))))
        out = {}
        for c in COLUMNS:
            v = row.get(c)
            if v is None:
                out[c] = ""
            elif isinstance(v, float):
                out[c] = f"{v:.3f}"
            else:
                out[c] = v
        self.w.writerow(out)
        self.f.flush()
