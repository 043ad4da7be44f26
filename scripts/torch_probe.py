#!/usr/bin/env python3
"""PyTorch reference for a vramlab scenario (issues 5, 9, 10; DESIGN.md §4-§5).

    scripts/torch_probe.py SCENARIO.toml --out FILE.csv [--device cuda:0|cpu]
                           [--torch-optim foreach|for-loop|fused] [--attention eager|sdpa]
    scripts/torch_probe.py SCENARIO.toml --dry-run

Reads the same scenario TOML as `vramlab sweep`, expands the same grid (the point ids are
identical to `vramlab sweep --dry-run`; harness/tests/torch_probe_ids.rs checks it), builds each
model with Hugging Face transformers from the same config.json (the real class of its
`model_type`, e.g. LlamaForCausalLM), with real weights where the scenario names them
(`hf:DIR` safetensors, `gguf:FILE` through transformers' GGUF loader, dequantized), runs the same
phases (load; prefill, decode every k steps, total; forward, backward, optimizer, step_total),
and writes the same CSV schema as harness/src/record.rs, feature_* columns included (so
`vramlab fit` reads it), with a manifest beside it whose runtime is `torch-X.Y+transformers-Z`.

Definitions that match the harness (issue 9): gradient accumulation runs micro-batches of
batch/n; attention is `eager` (scores materialized, as in our models) unless --attention sdpa;
`mixed-*` keeps f32 master weights and casts them to 16 bits inside the forward (autograd casts
the gradients back onto the f32 masters, so AdamW's state is f32), as harness's `to_dtype` does;
the parameter dtype is asserted after building.

Recorded in each row: `kernels` = `reference` (torch's own ops), `attention` = eager|sdpa,
`optimizer` = the optimizer and its torch implementation (`adamw-foreach`, `adamw-for-loop`, `adamw-fused`;
`sgd-…` likewise). torch's CPU optimizers default to the for-loop: the choice is always explicit.

Meters:
- `--device cuda:N` (meter `torch-caching`): baseline = memory_allocated / memory_reserved,
  reset_peak_memory_stats, run, synchronize, peak = max_memory_allocated / max_memory_reserved;
  device_used = total - free (mem_get_info), non_pool = device_used - reserved.
- `--device cpu` (meter `cpu-preload`): allocated = live heap bytes counted by
  libvramlab_preload.so (harness/preload), which must be in LD_PRELOAD (scripts/torch-cpu.sh
  does it); reserved = VmRSS, its peak VmHWM reset through /proc/self/clear_refs; device_used =
  MemTotal - MemAvailable; non_pool = RSS - allocated. Each point starts with malloc_trim(0).
  Each point first runs once unmeasured at its own shapes (oneDNN keeps per-shape state the
  first time a shape runs); --no-onednn turns oneDNN off.

Bad input (a scenario the probe cannot run, e.g. `kernels = "fused"`): one line, exit 2.
--dry-run imports neither torch nor transformers.
"""
import argparse
import csv
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import socket
import sys
import time
import tomllib
from pathlib import Path, PurePosixPath

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

ROOT = Path(__file__).resolve().parent.parent


class InputError(Exception):
    """Bad input: exit code 2, like vramlab."""


# ---------------------------------------------------------------- grid (mirror of grid.rs) --

def expand_env(s: str) -> str:
    """`${VAR}` from the environment; VRAMLAB_MODELS defaults to .cache/models (source.rs)."""
    out, rest = [], s
    while "${" in rest:
        i = rest.index("${")
        out.append(rest[:i])
        end = rest.find("}", i)
        if end < 0:
            raise InputError(f"unclosed `${{` in `{s}`")
        var = rest[i + 2:end]
        val = os.environ.get(var)
        if val is None:
            if var == "VRAMLAB_MODELS":
                val = ".cache/models"
            else:
                raise InputError(f"environment variable `{var}` is not set")
        out.append(val)
        rest = rest[end + 1:]
    out.append(rest)
    return "".join(out)


def parse_source(s: str) -> tuple[str, str]:
    if ":" not in s:
        raise InputError(f"model source `{s}` must be `hf:DIR`, `gguf:FILE` or `synthetic:CONFIG.json`")
    kind, path = s.split(":", 1)
    if kind not in ("hf", "gguf", "synthetic"):
        raise InputError(f"unknown model source kind `{kind}` in `{s}`")
    return kind, expand_env(path)


def _name(p: PurePosixPath) -> str:
    return p.name or str(p)


def model_id(source: str) -> str:
    """Source::model_id() of harness/src/model/source.rs; the raw string if it does not parse."""
    try:
        kind, path = parse_source(source)
    except InputError:
        return source
    p = PurePosixPath(path)
    if kind == "hf":
        return _name(p)
    if kind == "gguf":
        return p.stem or _name(p)
    base = _name(p.parent) if p.name == "config.json" else (p.stem or _name(p))
    return f"synthetic-{base}"


def as_list(v):
    return v if isinstance(v, list) else [v]


def load_spec(path: Path) -> tuple[dict, str]:
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"{path}: cannot read scenario: {e}") from e
    try:
        spec = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: {e}") from e
    for key in ("name", "model", "sweep"):
        if key not in spec:
            raise InputError(f"{path}: missing field `{key}`")
    return spec, text


def expand(spec: dict) -> list[dict]:
    """grid::expand: each `[sweep]` / `[[sweep]]` table in turn; within one, model-major, then
    precision, mode, batch, context, the mode's axes (KV kind for infer; optimizer ×
    checkpointing × grad_accum × trainable for train), repeat."""
    out = []
    for s in as_list(spec["sweep"]):
        out.extend(expand_one(spec, s))
    return out


def expand_one(spec: dict, s: dict) -> list[dict]:
    decode_steps = s.get("decode_steps", 16)
    decode_every = s.get("decode_every", 8)
    repeats = s.get("repeats", 1)
    prompt_len = s.get("prompt_len")
    # As grid.rs: the default window adds nothing to an id, `full` adds `/kv-full`.
    infer_axes = [(kv if w == "model" else f"{kv}/kv-full", kv, w, None)
                  for kv in s.get("kv_cache", ["preallocated"])
                  for w in s.get("kv_window", ["model"])]
    encode_axes = [("", "preallocated", "model", None)]
    train_axes = []
    for opt in s.get("optimizer", ["adamw"]):
        for ckpt in s.get("checkpointing", ["none"]):
            for n in s.get("grad_accum", [1]):
                for tr in s.get("trainable", ["full"]):
                    train_axes.append((f"{opt}/{ckpt}/ga{n}/{tr}", "preallocated", "model",
                                       dict(optimizer=opt, checkpointing=ckpt, grad_accum=n,
                                            trainable=tr, steps=s.get("train_steps", 1),
                                            lr=s.get("lr", 1e-4))))
    default_train = dict(optimizer="adamw", checkpointing="none", grad_accum=1, trainable="full",
                         steps=s.get("train_steps", 1), lr=s.get("lr", 1e-4))
    ops_k, ops_a = s.get("kernels", ["reference"]), s.get("attention", ["eager"])
    points = []
    for source in as_list(s.get("source", spec["model"]["source"])):
        mid = model_id(source)
        # As grid.rs: a quantized precision (GGUF blocks kept, issue 15) runs once per compute
        # dtype and qmatmul path, and its id says them (`native-f32`, `native-f32-dequantize`).
        # The probe only lists such points (--dry-run); running one is refused.
        tagged = [(p, f"{p}-{c}" + ("-dequantize" if q == "dequantize" else "")
                   if p in QUANTIZED else p)
                  for p in s["precision"]
                  for c in (s.get("compute", ["f32"]) if p in QUANTIZED else [None])
                  for q in (s.get("qmatmul", ["auto"]) if p in QUANTIZED else [None])]
        for precision, precision_tag in tagged:
            for mode in s["mode"]:
                axes = {"train": train_axes, "encode": encode_axes}.get(mode, infer_axes)
                for batch in s["batch"]:
                    for context in s["context"]:
                        for tag, kv, window, train, kernels, attention in [
                                (*a, k, t) for a in axes for k in ops_k for t in ops_a]:
                            for repeat in range(repeats):
                                pid = f"{mid}/{mode}/{precision_tag}/b{batch}/c{context}"
                                if tag:
                                    pid += f"/{tag}"
                                # As grid.rs: ids of the default ops carry no suffix.
                                if kernels != "reference":
                                    pid += f"/{kernels}"
                                if attention != "eager":
                                    pid += f"/{attention}"
                                if repeats > 1:
                                    pid += f"/r{repeat}"
                                points.append(dict(
                                    id=pid, source=source, model_id=mid, mode=mode,
                                    precision=precision, batch=batch, context=context,
                                    prompt_len=prompt_len if prompt_len is not None
                                    else max(context - decode_steps, 0),
                                    decode_steps=decode_steps, decode_every=decode_every,
                                    kv_cache=kv, kv_window=window, repeat=repeat,
                                    train=train or default_train))
    return points


# ------------------------------------------------------------------------ measurement --

def now_rfc3339() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def short_hash(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:16]


def git_rev() -> str:
    head = ROOT / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (ROOT / ".git" / ref[5:]).read_text().strip()[:12]
        return ref[:12]
    except OSError:
        return ""


class CudaMeter:
    """torch's caching allocator, read the way DESIGN.md §4 reads candle's pool."""
    kind = "torch-caching"

    def __init__(self, torch, device):
        self.torch, self.device = torch, device

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


class Writer:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS, lineterminator="\n")
        self.w.writeheader()
        self.f.flush()

    def write(self, row: dict):
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


def make_cache(transformers, kind, config, batch, context, dtype, device):
    """A KV cache: `preallocated` = StaticCache (capacity `context`), `growing` = DynamicCache.
    StaticCache's constructor changed across transformers releases; try the known forms."""
    if kind == "growing":
        return transformers.DynamicCache()
    S = transformers.StaticCache
    attempts = [
        dict(config=config, max_batch_size=batch, max_cache_len=context, device=device, dtype=dtype),
        dict(config=config, batch_size=batch, max_cache_len=context, device=device, dtype=dtype),
        dict(config=config, max_cache_len=context),
    ]
    last = None
    for kw in attempts:
        try:
            return S(**kw)
        except TypeError as e:
            last = e
    raise RuntimeError(f"cannot build a StaticCache with this transformers: {last}")


def logits_kw(model) -> dict:
    import inspect
    params = inspect.signature(model.forward).parameters
    if "logits_to_keep" in params:
        return {"logits_to_keep": 1}
    if "num_logits_to_keep" in params:
        return {"num_logits_to_keep": 1}
    return {}


def cache_kw(model, cache) -> dict:
    """The KV cache argument: `cache` in newer transformers, `past_key_values` before."""
    import inspect
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


# ------------------------------------------------------------------ features (features.rs) --

PRECISION_BYTES = {"f32": (4, 4), "f16": (2, 2), "bf16": (2, 2), "mixed-bf16": (4, 2), "mixed-f16": (4, 2)}


def shape_of(config) -> dict:
    """hidden, layers, vocab and KV bytes per token per weight byte, from the HF config (the
    fields harness/src/model/config.rs normalizes)."""
    c = config
    hidden = getattr(c, "hidden_size", None) or c.n_embd
    layers = getattr(c, "num_hidden_layers", None) or c.n_layer
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    return dict(hidden=hidden, layers=layers, vocab=c.vocab_size, kv_per_token=2 * layers * kv_heads * head_dim)


def features(shape: dict, p: dict, phase: str, kv_tokens: int, params: int, trainable: int) -> dict:
    """features::infer / features::train of harness/src/features.rs, from the built model's
    parameter counts (`params` includes LoRA adapters; `trainable` what the optimizer updates)."""
    wb, cb = PRECISION_BYTES[p["precision"]]
    f = dict(feature_weight_bytes=params * wb)
    if phase == "load":
        return f
    b, hl = p["batch"], shape["hidden"] * shape["layers"]
    if p["mode"] == "train":
        s = p["context"]
        t = p["train"]
        f.update(feature_kv_bytes=0, feature_act_bytes=b * s * hl * cb,
                 feature_logits_bytes=b * s * shape["vocab"] * cb,
                 feature_optimizer_bytes=2 * trainable * wb if t["optimizer"] == "adamw" else 0)
        return f
    held = p["context"] if p["kv_cache"] == "preallocated" else kv_tokens
    s = 1 if phase == "decode" else p["prompt_len"]
    f.update(feature_kv_bytes=shape["kv_per_token"] * wb * held * b, feature_act_bytes=b * s * hl * wb,
             feature_logits_bytes=b * shape["vocab"] * wb, feature_optimizer_bytes=0)
    return f


# ------------------------------------------------------------------------------ running --

# vramlab's quantized precisions (harness/src/vocab.rs `Precision`): GGUF blocks kept.
QUANTIZED = {"native", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4k", "q5k", "q6k", "q8k"}
SWEEP_KEYS = {"source", "mode", "precision", "batch", "context", "kv_cache", "decode_steps",
              "prompt_len", "decode_every", "repeats", "optimizer", "checkpointing", "grad_accum",
              "trainable", "train_steps", "lr", "kernels", "attention"}
# Our fused kernels and flash attention are candle ops; the probe's attention is --attention.
RUNNABLE = {"mode": {"infer", "train"}, "precision": set(PRECISION_BYTES),
            "kernels": {"reference"}, "attention": {"eager"},
            "checkpointing": {"none", "layer"}, "optimizer": {"adamw", "sgd"}}


def check_runnable(path: Path, spec: dict):
    """What the probe cannot run is refused before anything is measured (exit 2)."""
    for s in as_list(spec["sweep"]):
        for k, v in s.items():
            if k not in SWEEP_KEYS:
                raise InputError(f"{path}: the torch probe cannot run `{k} = {json.dumps(v)}`")
            bad = [x for x in as_list(v) if k in RUNNABLE and x not in RUNNABLE[k]]
            if bad:
                raise InputError(f"{path}: the torch probe cannot run `{k} = {json.dumps(bad[0])}`")
        mixed = [x for x in s.get("precision", []) if x.startswith("mixed-")]
        if mixed and "train" in s.get("mode", []) and "layer" in s.get("checkpointing", []):
            # train_forward's 16-bit casts live for the forward only; a checkpointed layer's
            # recomputation in backward would meet the f32 masters.
            raise InputError(f"{path}: the torch probe cannot run `precision = \"{mixed[0]}\"` "
                             "with `checkpointing = \"layer\"`")
        for tr in s.get("trainable", []):
            if tr not in ("full", "frozen-embeddings") and not re.fullmatch(r"lora-r[1-9][0-9]*", tr):
                raise InputError(f"{path}: the torch probe cannot run `trainable = \"{tr}\"`")


def build_model(torch, transformers, kind: str, path: str, dtype, attention: str, device):
    """The real transformers class of the config's model_type, with the source's weights:
    `hf:DIR` from_pretrained, `gguf:FILE` transformers' GGUF loader (dequantizes),
    `synthetic:CONFIG` from_config (random values, real shapes)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
    kw = dict(dtype=dtype, attn_implementation=attention)
    if kind == "gguf":
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{path}: no such GGUF file")
        config = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
        # Dense weights in the point's dtype, as vramlab's GGUF loader makes them (transformers
        # could also keep the blocks packed behind its own matmul kernels).
        dense = transformers.GgufConfig(gguf_file=str(p), dequantize=True)
        model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name,
                                                     quantization_config=dense, **kw)
        return config, model.to(device)
    cfg_path = Path(path) / "config.json" if (kind == "hf" or Path(path).is_dir()) else Path(path)
    if not cfg_path.is_file():
        raise InputError(f"{cfg_path}: no such config.json")
    config = AutoConfig.from_pretrained(str(cfg_path))
    # Encoders train as masked LMs (BertForMaskedLM), as vramlab's bert does.
    auto = AutoModelForMaskedLM if config.model_type == "bert" else AutoModelForCausalLM
    if kind == "hf":
        model = auto.from_pretrained(str(cfg_path.parent), config=config, **kw).to(device)
    else:
        with torch.device(device):
            model = auto.from_config(config, **kw)
    return config, model


def optimizer_label(p: dict, impl: str) -> str:
    return f"{p['train']['optimizer']}-{impl}" if p["mode"] == "train" else "none"


def run(args) -> int:
    spec, text = load_spec(args.scenario)
    check_runnable(args.scenario, spec)
    points = expand(spec)
    cpu = args.device == "cpu"
    meter = PreloadMeter() if cpu else None
    import torch
    import transformers

    if cpu:
        device = torch.device("cpu")
        # oneDNN (bf16/f16 matmuls on CPU) keeps per-shape state: megabytes retained the first
        # time each shape runs. Each point's unmeasured rehearsal creates it; --no-onednn turns
        # oneDNN off (bf16 matmuls then take torch's slow reference kernels).
        torch.backends.mkldnn.enabled = not args.no_onednn
        dev_name, drv, cuda_v = platform.processor() or platform.machine(), "", ""
        pool = {"meter": meter.kind, "allocator": "glibc malloc via libvramlab_preload.so",
                "onednn": not args.no_onednn}
        gpu = None
    else:
        if not torch.cuda.is_available():
            print("error: torch sees no CUDA device", file=sys.stderr)
            return 1
        device = torch.device(args.device)
        torch.cuda.set_device(device)
        meter = CudaMeter(torch, device)
        props = torch.cuda.get_device_properties(device)
        dev_name, cuda_v = props.name, str(torch.version.cuda)
        drv = ""
        try:
            drv = Path("/proc/driver/nvidia/version").read_text().split("Kernel Module")[1].split()[0]
        except (OSError, IndexError):
            pass
        pool = {"meter": meter.kind, "allocator": torch.cuda.get_allocator_backend(),
                "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
        gpu = dict(name=props.name, total_memory=props.total_memory,
                   compute_capability=f"{props.major}.{props.minor}")
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
              "mixed-bf16": torch.float32, "mixed-f16": torch.float32}
    runtime = f"torch-{torch.__version__}+transformers-{transformers.__version__}"
    started_at = now_rfc3339()
    run_id = f"{re.sub('[:-]', '', started_at)}-torch-{os.getpid():x}"
    shash = short_hash(text.encode())
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    manifest_path = out.with_name(out.stem + ".manifest.json")
    manifest = dict(
        schema_version=SCHEMA_VERSION, run_id=run_id, started_at=started_at, finished_at=None,
        csv=str(out), scenario_path=str(args.scenario), scenario_hash=shash, scenario_text=text,
        backend="cpu" if cpu else "cuda", device=args.device, device_name=dev_name,
        pool=pool, runtime=runtime, attention=args.attention, torch_optim=args.torch_optim,
        versions=dict(vramlab="torch_probe", git_rev=git_rev(), python=platform.python_version(),
                      torch=torch.__version__, transformers=transformers.__version__,
                      cuda_driver=drv, cuda_runtime=cuda_v),
        gpu=gpu, host=dict(hostname=socket.gethostname(), os=platform.release(), cpus=os.cpu_count(),
                           torch_threads=torch.get_num_threads()),
        points=len(points), status_counts={},
    )

    def write_manifest():
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")

    write_manifest()
    writer = Writer(out)
    counts: dict[str, int] = {}
    print(f"torch_probe {spec['name']}: {len(points)} points -> {out} ({runtime}, {meter.kind}, "
          f"attention {args.attention}, optimizer {args.torch_optim})", file=sys.stderr)

    i = 0
    while i < len(points):
        src, prec = points[i]["source"], points[i]["precision"]
        n = 0
        while i + n < len(points) and points[i + n]["source"] == src and points[i + n]["precision"] == prec:
            n += 1
        group, i = points[i:i + n], i + n
        kind, path = parse_source(src)
        base = dict(
            schema_version=SCHEMA_VERSION, run_id=run_id, vramlab_version="torch_probe",
            git_rev=git_rev(), backend="cpu" if cpu else "cuda", device_name=dev_name,
            driver_version=drv, cuda_version=cuda_v, candle_version="",
            weight_source={"hf": "safetensors", "gguf": "gguf", "synthetic": "synthetic"}[kind],
            kernels="reference", attention=args.attention, pool_release="", scenario_hash=shash,
            meter=meter.kind,
        )
        dtype = dtypes[prec]
        model = None
        try:
            meter.trim()
            started = meter.start()
            config, model = build_model(torch, transformers, kind, path, dtype, args.attention, device)
            model.eval()
            load_mem, load_ms = meter.finish(started)
            load_err = None
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - recorded per point, the sweep goes on
            oom = not cpu and isinstance(e, torch.cuda.OutOfMemoryError)
            load_err = ("oom" if oom else "error", " ".join(str(e).split())[:300])
        if load_err:
            for p in group:
                writer.write(dict(base, **point_cols(p, args.torch_optim), phase="load", status=load_err[0],
                                  message=load_err[1]))
                counts[load_err[0]] = counts.get(load_err[0], 0) + 1
            model = None
            meter.trim()
            continue
        wrong = {str(q.dtype) for q in model.parameters() if q.dtype != dtype}
        if wrong:
            raise RuntimeError(f"{src}: parameters built as {sorted(wrong)}, not {dtype}")
        nparams = sum(q.numel() for q in model.parameters())
        shape = shape_of(model.config)
        base.update(architecture=model.config.model_type, param_count=nparams)
        lkw = logits_kw(model)
        warm_up(torch, transformers, model, group, device, lkw)
        for p in group:
            cols = dict(base, **point_cols(p, args.torch_optim), started_at=now_rfc3339())
            meter.trim()
            load_f = features(shape, p, "load", 0, nparams + adapter_count(model, p), 0)
            writer.write(dict(cols, phase="load", kv_tokens=0, status="ok", elapsed_ms=load_ms,
                              message="weights built once per (model, precision); shared by the group",
                              **load_mem, **load_f))
            try:
                # An unmeasured rehearsal at the point's own shapes first: torch's CPU kernels
                # (oneDNN) keep per-shape state the first time a shape runs.
                if p["mode"] == "train":
                    train_point(torch, model, p, device, NullMeter(), args.torch_optim, rehearse=True)
                    rows = train_point(torch, model, p, device, meter, args.torch_optim)
                else:
                    infer_point(torch, transformers, model, model.config, p, dtype, device, NullMeter(), lkw)
                    rows = infer_point(torch, transformers, model, model.config, p, dtype, device, meter, lkw)
                for r in rows:
                    f = features(shape, p, r["phase"], r.get("kv_tokens") or 0,
                                 r.pop("params", nparams), r.pop("trainable", 0))
                    writer.write(dict(cols, **r, **f, status="ok"))
                status = "ok"
            except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                oom = not cpu and isinstance(e, torch.cuda.OutOfMemoryError)
                msg = " ".join(str(e).split())[:300]
                m = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", str(e))
                first = "forward" if p["mode"] == "train" else "prefill"
                status = "oom" if oom else "error"
                writer.write(dict(cols, phase=first, status=status,
                                  message=(f"requested {m.group(1)}: " if m else "") + msg))
            counts[status] = counts.get(status, 0) + 1
            print(f"  {p['id']}: {status}", file=sys.stderr)
        del model
        meter.trim()

    manifest["finished_at"] = now_rfc3339()
    manifest["status_counts"] = counts
    write_manifest()
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f" -> {out}", file=sys.stderr)
    return 1 if counts.get("error") else 0


def warm_up(torch, transformers, model, group, device, lkw):
    """One-off costs (oneDNN/BLAS buffers, cuBLAS handles, lazily built kernels) land outside
    every measured phase: a prefill and decode at the group's largest inference shape, and a
    forward + backward at its largest training micro-batch shape."""
    infer = [p for p in group if p["mode"] == "infer"]
    train = [p for p in group if p["mode"] == "train"]
    if infer:
        b = max(p["batch"] for p in infer)
        s = max(max(p["prompt_len"] for p in infer), 1)
        with torch.no_grad():
            ids = torch.zeros((b, s), dtype=torch.long, device=device)
            cache = transformers.DynamicCache()
            out = model(ids, use_cache=True, **cache_kw(model, cache), **lkw)
            model(out.logits[:, -1:].argmax(-1), use_cache=True, **cache_kw(model, cache), **lkw)
            del ids, cache, out
    if train:
        b = max(p["batch"] // p["train"]["grad_accum"] for p in train)
        s = max(p["context"] for p in train)
        g = torch.Generator(device="cpu").manual_seed(7)
        model.train()
        for _ in range(2):
            ids = torch.randint(0, model.config.vocab_size, (max(b, 1), s), generator=g).to(device)
            train_forward(torch, model, ids, compute_dtype(torch, train[0]["precision"])).backward()
            model.zero_grad(set_to_none=True)
            del ids
        model.eval()


def point_cols(p: dict, impl: str) -> dict:
    if p["mode"] == "train":
        t = p["train"]
        return dict(point_id=p["id"], model_id=p["model_id"], mode="train", precision=p["precision"],
                    batch=p["batch"], context=p["context"], optimizer=optimizer_label(p, impl),
                    checkpointing=t["checkpointing"], grad_accum=t["grad_accum"],
                    trainable=t["trainable"])
    cols = dict(point_id=p["id"], model_id=p["model_id"], mode=p["mode"],
                precision=p["precision"], batch=p["batch"], context=p["context"], optimizer="none")
    if p["mode"] == "encode":
        return cols
    return dict(cols, prompt_len=p["prompt_len"], decode_steps=p["decode_steps"],
                kv_cache=p["kv_cache"], kv_window=p["kv_window"])


def infer_point(torch, transformers, model, config, p, dtype, device, meter, lkw):
    """Prefill, then decode steps; rows as harness/src/workload/inference.rs makes them."""
    rows = []
    b, plen = p["batch"], p["prompt_len"]
    g = torch.Generator(device="cpu").manual_seed(42)
    with torch.no_grad():
        started = meter.start()
        ids = torch.randint(0, config.vocab_size, (b, plen), generator=g).to(device)
        cache = make_cache(transformers, p["kv_cache"], config, b, p["context"], dtype, device)
        pos = torch.arange(plen, device=device)
        out = model(ids, **cache_kw(model, cache), use_cache=True, cache_position=pos, **lkw)
        nxt = out.logits[:, -1:].argmax(-1)
        del ids, out
        mem, ms = meter.finish(started)
        total, total_t0 = mem, time.perf_counter() - ms / 1e3
        rows.append(dict(phase="prefill", step=0, kv_tokens=plen, elapsed_ms=ms, **mem))
        window = None
        for t in range(1, p["decode_steps"] + 1):
            if window is None:
                window = meter.start()
            cur = plen + t - 1
            out = model(nxt, **cache_kw(model, cache), use_cache=True,
                        cache_position=torch.tensor([cur], device=device), **lkw)
            nxt = out.logits[:, -1:].argmax(-1)
            del out
            if t % p["decode_every"] == 0 or t == p["decode_steps"]:
                mem, ms = meter.finish(window)
                window = None
                total = span(total, [mem])
                rows.append(dict(phase="decode", step=t, kv_tokens=cur + 1, elapsed_ms=ms, **mem))
        kv_tokens = plen + p["decode_steps"]
        del cache, nxt
        rows.append(dict(phase="total", step=p["decode_steps"], kv_tokens=kv_tokens,
                         elapsed_ms=(time.perf_counter() - total_t0) * 1e3, **total))
    return rows


LORA_ALPHA = 8.0  # PEFT's default, as in harness/src/model/nn.rs
LORA_TARGETS = {"gpt2": ("c_attn",), "bert": ("query", "value")}  # others: q_proj, v_proj


def lora_modules(model):
    targets = LORA_TARGETS.get(model.config.model_type, ("q_proj", "v_proj"))
    return [(n, m) for n, m in model.named_modules() if n.split(".")[-1] in targets]


def lora_dims(mod) -> tuple[int, int]:
    """(fan_in, fan_out): transformers' GPT-2 Conv1D stores (in, out); nn.Linear (out, in)."""
    w = mod.weight
    return (w.shape[0], w.shape[1]) if type(mod).__name__ == "Conv1D" else (w.shape[1], w.shape[0])


def adapter_count(model, p: dict) -> int:
    """Parameters a `lora-rN` point adds (features.rs adapter_params): rank · (in + out) each."""
    tr = p["train"]["trainable"] if p["mode"] == "train" else "full"
    if not tr.startswith("lora-r"):
        return 0
    r = int(tr[len("lora-r"):])
    return sum(r * sum(lora_dims(m)) for _, m in lora_modules(model))


def add_lora(torch, model, rank: int) -> list:
    """Rank-`rank` LoRA on the attention's query and value projections, as vramlab's
    `lora-rN` (PEFT's defaults without PEFT): every base weight frozen, A (r, in) Kaiming-
    uniform, B (out, r) zero, y += alpha/r · x Aᵀ Bᵀ through a forward hook. Returns what
    remove_lora undoes."""
    for q in model.parameters():
        q.requires_grad_(False)
    added = []
    for _, mod in lora_modules(model):
        w = mod.weight
        fan_in, fan_out = lora_dims(mod)
        bound = 1.0 / fan_in ** 0.5
        a = torch.nn.Parameter(torch.empty(rank, fan_in, dtype=w.dtype, device=w.device)
                               .uniform_(-bound, bound))
        b = torch.nn.Parameter(torch.zeros(fan_out, rank, dtype=w.dtype, device=w.device))
        mod.register_parameter("lora_A", a)
        mod.register_parameter("lora_B", b)
        scale = LORA_ALPHA / rank

        def hook(m, inp, out):
            return out + (inp[0] @ m.lora_A.t().to(inp[0].dtype)
                          @ m.lora_B.t().to(inp[0].dtype)) * scale
        added.append((mod, mod.register_forward_hook(hook)))
    return added


def remove_lora(added: list):
    for mod, handle in added:
        handle.remove()
        del mod.lora_A, mod.lora_B


def compute_dtype(torch, precision: str):
    """The 16-bit compute dtype of a `mixed-*` precision; None for pure ones."""
    return {"mixed-bf16": torch.bfloat16, "mixed-f16": torch.float16}.get(precision)


def train_forward(torch, model, ids, compute):
    """The training loss. `compute` (mixed-*): the parameters are f32 masters, and the model
    runs on their 16-bit casts (torch.func.functional_call), so that autograd brings the
    gradients back onto the masters in f32, as the harness's `to_dtype` does."""
    if compute is None:
        return model(ids, labels=ids, use_cache=False).loss
    cast = {k: v.to(compute) for k, v in model.named_parameters()}
    return torch.func.functional_call(model, cast, (ids,), dict(labels=ids, use_cache=False)).loss


def make_optimizer(torch, params, kind: str, impl: str, lr: float):
    """The optimizer with its implementation chosen explicitly (torch picks the for-loop on
    CPU when left to itself)."""
    flags = {"foreach": dict(foreach=True), "for-loop": dict(foreach=False),
             "fused": dict(fused=True)}[impl]
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, **flags)
    return torch.optim.SGD(params, lr=lr, **flags)


def train_point(torch, model, p, device, meter, impl: str, rehearse: bool = False):
    """Training steps as harness/src/workload/training.rs measures them: forward, backward,
    optimizer and step_total rows per step; micro-batches of batch/grad_accum, their forward and
    backward merged into one span each; `mixed-*` through train_forward. `rehearse`: one
    micro-batch's forward and backward, no optimizer."""
    t = p["train"]
    compute = compute_dtype(torch, p["precision"])
    vocab = model.config.vocab_size
    n = t["grad_accum"]
    micro = p["batch"] // n
    steps = t["steps"]
    if rehearse:
        n = steps = 1
    g = torch.Generator(device="cpu").manual_seed(42)
    rows = []
    model.train()
    if t["checkpointing"] == "layer":
        model.gradient_checkpointing_enable()
    if t["trainable"] == "frozen-embeddings":
        model.get_input_embeddings().weight.requires_grad_(False)
    lora = []
    if t["trainable"].startswith("lora-r"):
        lora = add_lora(torch, model, int(t["trainable"][len("lora-r"):]))
    params = [q for q in model.parameters() if q.requires_grad]
    n_params = sum(q.numel() for q in model.parameters())
    n_train = sum(q.numel() for q in params)

    opt = None
    try:
        for step in range(1, steps + 1):
            fwd, bwd = [], []
            started_step = time.perf_counter()
            fwd_ms = bwd_ms = 0.0
            for _ in range(n):
                started = meter.start()
                ids = torch.randint(0, vocab, (micro, p["context"]), generator=g).to(device)
                loss = train_forward(torch, model, ids, compute) / t["grad_accum"]
                del ids
                m, ms = meter.finish(started)
                fwd.append(m)
                fwd_ms += ms
                started = meter.start()
                loss.backward()
                del loss
                m, ms = meter.finish(started)
                bwd.append(m)
                bwd_ms += ms
            if rehearse:
                model.zero_grad(set_to_none=True)
                break
            started = meter.start()
            if opt is None:
                opt = make_optimizer(torch, params, t["optimizer"], impl, t["lr"])
            opt.step()
            opt.zero_grad(set_to_none=True)
            opt_mem, opt_ms = meter.finish(started)
            f, b = span(fwd[0], fwd[1:]), span(bwd[0], bwd[1:])
            extra = dict(params=n_params, trainable=n_train)
            for phase, m, ms in (("forward", f, fwd_ms), ("backward", b, bwd_ms),
                                 ("optimizer", opt_mem, opt_ms)):
                rows.append(dict(phase=phase, step=step, elapsed_ms=ms, **m, **extra))
            rows.append(dict(phase="step_total", step=step,
                             elapsed_ms=(time.perf_counter() - started_step) * 1e3,
                             **span(fwd[0], fwd[1:] + bwd + [opt_mem]), **extra))
    finally:
        del opt, params
        model.zero_grad(set_to_none=True)
        remove_lora(lora)
        for q in model.parameters():
            q.requires_grad_(True)
        if t["checkpointing"] == "layer":
            model.gradient_checkpointing_disable()
        model.eval()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--out", type=Path, help="output CSV (manifest beside it)")
    ap.add_argument("--device", default="cuda:0", help="cuda:N (torch's caching allocator) or cpu "
                    "(the preload meter; use scripts/torch-cpu.sh)")
    ap.add_argument("--torch-optim", choices=["foreach", "for-loop", "fused"], default="foreach",
                    help="the optimizer implementation (recorded in the optimizer column)")
    ap.add_argument("--attention", choices=["eager", "sdpa"], default="eager",
                    help="attention implementation (recorded in the kernels column); eager "
                    "materializes the scores like vramlab's models")
    ap.add_argument("--no-onednn", action="store_true",
                    help="cpu: turn oneDNN off (no per-shape kernel state; bf16 much slower)")
    ap.add_argument("--dry-run", action="store_true", help="print the point ids and exit")
    args = ap.parse_args(argv)
    try:
        if args.dry_run:
            spec, _ = load_spec(args.scenario)
            for p in expand(spec):
                print(p["id"])
            return 0
        if args.out is None:
            spec, _ = load_spec(args.scenario)
            args.out = Path("results") / f"{spec['name']}-torch.csv"
        if args.out.suffix != ".csv":
            raise InputError(f"--out {args.out}: must end in .csv")
        if args.device != "cpu" and not re.fullmatch(r"cuda(:[0-9]+)?", args.device):
            raise InputError(f"--device {args.device}: must be cpu or cuda:N")
        return run(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
