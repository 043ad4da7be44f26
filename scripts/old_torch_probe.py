#!/usr/bin/env python3
"""PyTorch reference for a vramlab scenario (docs/src/guides/torch-probe.md; ARCHITECTURE.md §3-§4).

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

Definitions that match the harness: gradient accumulation runs micro-batches of
batch/n; attention is `eager` (scores materialized, as in our models) unless --attention sdpa;
`mixed-*` keeps f32 master weights and casts them to 16 bits inside the forward (autograd casts
the gradients back onto the f32 masters, so AdamW's state is f32), as harness's `to_dtype` does;
the parameter dtype is asserted after building.

Recorded in each row: `kernels` = `reference` (torch's own ops), `attention` = eager|sdpa,
`optimizer` = the optimizer and its torch implementation (`adamw-foreach`, `adamw-for-loop`, `adamw-fused`;
`sgd-…` likewise). torch's CPU optimizers default to the for-loop: the choice is always explicit.

Meters:
- `--device cuda:N` (meter `torch-cuda`): baseline = memory_allocated / memory_reserved,
  reset_peak_memory_stats, run, synchronize, peak = max_memory_allocated / max_memory_reserved;
  device_used = total - free (mem_get_info), non_pool = device_used - reserved.
- `--device cpu` (meter `cpu-preload`): allocated = live heap bytes counted by
  libvramlab_preload.so (harness/preload), which must be in LD_PRELOAD (scripts/torch-cpu.sh
  does it); reserved = VmRSS, its peak VmHWM reset through /proc/self/clear_refs; device_used =
  MemTotal - MemAvailable; non_pool = RSS - allocated. Each point starts with malloc_trim(0).
  Each point first runs once unmeasured at its own shapes (oneDNN keeps per-shape state the
  first time a shape runs); --no-onednn turns oneDNN off.
- `--device emu:GPU` (meter `torch-emulated`): the same as cuda:0, on an emulated GPU
  (docs/src/guides/emulator.md): the probe runs itself again under `vramlab emulate --gpu GPU`
  (the binary from $VRAMLAB_BIN, PATH, or this checkout's target/). Every model is built from its
  config on the device, reading no weights (values do not change memory); the device name ends
  in "(emulated)"; device_used is total - free of the emulated device (cudaMalloc's bytes plus
  the CUDA context constant).

Generation (`mode = "generate"`): diffusers' UNet2DConditionModel / AutoencoderKL /
FluxTransformer2DModel / WanTransformer3DModel / AutoencoderKLWan and transformers' CLIP / T5 /
umT5 encoders from the same diffusers directory
vramlab loads (`synthetic:MODEL` = $VRAMLAB_MODELS/synthetic-gen/MODEL-DTYPE-vae-DTYPE, written
by `vramlab sweep`; `diffusers:DIR`), the rows of harness/src/workload/generate.rs (see the
"generation" section below).

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
import subprocess
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


def id_tail(attention, repeats, repeat):
    """The end of a point id, as grid.rs writes it: the attention unless eager, the repeat
    when there are several."""
    tail = f"/{attention}" if attention != "eager" else ""
    return tail + (f"/r{repeat}" if repeats > 1 else "")


def expand_one(spec: dict, s: dict) -> list[dict]:
    if "generate" in s.get("mode", []):
        return expand_generate(spec, s)
    if is_finetune(spec, s):
        return expand_finetune(spec, s)
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
        # As grid.rs: a quantized precision (GGUF blocks kept) runs once per compute
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
                                pid += id_tail(attention, repeats, repeat)
                                points.append(dict(
                                    id=pid, source=source, model_id=mid, mode=mode,
                                    precision=precision, batch=batch, context=context,
                                    prompt_len=prompt_len if prompt_len is not None
                                    else max(context - decode_steps, 0),
                                    decode_steps=decode_steps, decode_every=decode_every,
                                    kv_cache=kv, kv_window=window, repeat=repeat,
                                    train=train or default_train))
    return points


def gen_model_id(source: str) -> str:
    """The model id of a generation source (workload/generate.rs expand): what follows the
    last `:` or `/`."""
    return re.split(r"[:/]", source)[-1]


def parse_resolution(r: str) -> tuple[int, int]:
    m = re.fullmatch(r"([0-9]+)x([0-9]+)", str(r))
    if not m:
        raise InputError(f"resolution `{r}` must be WIDTHxHEIGHT in pixels, e.g. 512x512")
    return int(m.group(1)), int(m.group(2))


def expand_generate(spec: dict, s: dict) -> list[dict]:
    """workload/generate.rs expand: model, precision, attention, resolution, batch, cfg,
    decode, VAE precision, repeat; the same ids."""
    points = []
    tile, overlap = s.get("tile", 256), s.get("overlap", 64)
    repeats = s.get("repeats", 1)
    vae_p = s.get("vae_precision") or [None]
    for source in as_list(s.get("source", spec["model"]["source"])):
        mid = gen_model_id(source)
        for precision in s["precision"]:
            for attention in s.get("attention", ["eager"]):
                for res in s.get("resolution", []):
                    w, h = parse_resolution(res)
                    # A table that sets `frames` (a video model) names them in its ids.
                    for frames in s.get("frames", [1]):
                        ftag = f"/f{frames}" if "frames" in s else ""
                        points += [dict(p, frames=frames, id=p["id"].replace(
                            f"/{w}x{h}/", f"/{w}x{h}{ftag}/", 1))
                            for p in gen_points(mid, source, precision, attention, w, h, s,
                                                tile, overlap, vae_p, repeats)]
    return points


def default_cfg(source: str) -> bool:
    """CFG when the table does not say (workload/generate.rs GenSource::default_cfg): on, but
    for the guidance-distilled FLUX (`model_index.json`'s class, or a directory without one
    that has `transformer/` and no `unet/`)."""
    kind, _, rest = source.partition(":")
    if kind == "synthetic":
        return not rest.startswith("flux")
    root = Path(expand_env(rest))
    index = root / "model_index.json"
    if index.is_file():
        try:
            return read_json(index).get("_class_name") != "FluxPipeline"
        except InputError:
            return True  # as vramlab: the load says what is wrong with it
    return (root / "unet" / "config.json").is_file() or not (root / "transformer" / "config.json").is_file()


def gen_points(mid, source, precision, attention, w, h, s, tile, overlap, vae_p, repeats):
    """The points of one model, precision, attention and size (expand_generate's inner axes)."""
    points = []
    for batch in s["batch"]:
        for cfg in s.get("cfg", [default_cfg(source)]):
            for dec in s.get("vae_decode", ["full"]):
                for vp in vae_p:
                    for repeat in range(repeats):
                        pid = (f"{mid}/generate/{precision}/{w}x{h}/b{batch}/"
                               f"{'cfg' if cfg else 'nocfg'}/{dec}")
                        if dec == "tiled":
                            pid += f"-t{tile}o{overlap}"
                        if vp is not None:
                            pid += f"/vae-{vp}"
                        pid += id_tail(attention, repeats, repeat)
                        points.append(dict(
                            id=pid, source=source, model_id=mid, mode="generate",
                            precision=precision, vae_precision=vp,
                            gen_attention=attention, width=w, height=h,
                            batch=batch, cfg=cfg, vae_decode=dec, tile=tile,
                            overlap=overlap, steps=s.get("denoise_steps", 2),
                            repeat=repeat))
    return points


def is_finetune(spec: dict, s: dict) -> bool:
    """A `mode = ["train"]` table on diffusion pipelines (spec.rs is_pipeline_source:
    `diffusers:` or a `synthetic:` generation preset): workload/finetune.rs's LoRA of a
    denoiser."""
    gen = {"sd15", "sd21", "sdxl", "flux-dev", "flux-schnell", "wan2.1-t2v-1.3b"}
    sources = as_list(s.get("source", spec["model"]["source"]))
    return "train" in s.get("mode", []) and all(
        src.startswith("diffusers:") or (src.startswith("synthetic:") and src[10:] in gen)
        for src in sources)


def expand_finetune(spec: dict, s: dict) -> list[dict]:
    """workload/finetune.rs expand (ids only: the probe does not run a denoiser's LoRA)."""
    points = []
    repeats = s.get("repeats", 1)
    for source in as_list(s.get("source", spec["model"]["source"])):
        mid = gen_model_id(source)
        for precision in s["precision"]:
            for attention in s.get("attention", ["eager"]):
                for res in s.get("resolution", []):
                    w, h = parse_resolution(res)
                    # A video model's table sets `frames` (named in the id); an image model's not.
                    for frames in s.get("frames", [None]):
                        ftag = "" if frames is None else f"/f{frames}"
                        for batch in s["batch"]:
                            for opt in s.get("optimizer", ["adamw"]):
                                for tr in s.get("trainable", ["full"]):
                                    for ck in s.get("checkpointing", ["none"]):
                                        for ga in s.get("grad_accum", [1]):
                                            for repeat in range(repeats):
                                                pid = (f"{mid}/train/{precision}/{w}x{h}{ftag}/"
                                                       f"b{batch}/{opt}/{ck}/ga{ga}/{tr}")
                                                pid += id_tail(attention, repeats, repeat)
                                                points.append(dict(id=pid, mode="finetune"))
    return points


# ------------------------------------------------------------------------ measurement --

def now_rfc3339() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def short_hash(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:16]


def git_rev() -> str:
    import subprocess
    try:  # a worktree's .git is a file: ask git first
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout.strip()[:12]
    except (OSError, subprocess.SubprocessError):
        pass
    head = ROOT / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (ROOT / ".git" / ref[5:]).read_text().strip()[:12]
        return ref[:12]
    except OSError:
        return ""


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


class Writer:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS, lineterminator="\n")
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
              "trainable", "train_steps", "lr", "kernels", "attention",
              "resolution", "frames", "cfg", "vae_decode", "tile", "overlap", "vae_precision",
              "denoise_steps"}
# Our fused kernels and flash attention are candle ops; the probe's attention is --attention.
RUNNABLE = {"mode": {"infer", "train", "generate"}, "precision": set(PRECISION_BYTES),
            "kernels": {"reference"}, "attention": {"eager"},
            "checkpointing": {"none", "layer"}, "optimizer": {"adamw", "sgd"}}


def check_runnable(path: Path, spec: dict):
    """What the probe cannot run is refused before anything is measured (exit 2)."""
    for s in as_list(spec["sweep"]):
        if "generate" in s.get("mode", []):
            check_generate(path, spec, s)
            continue
        if is_finetune(spec, s):
            raise InputError(f"{path}: the torch probe cannot run `mode = [\"train\"]` on a diffusion "
                             "pipeline (the denoiser's LoRA is measured by vramlab only)")
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


def check_generate(path: Path, spec: dict, s: dict):
    """A generation table: its keys, attention (eager or sliced; the probe's --attention
    says eager or sdpa), and each point's diffusers directory (no torch)."""
    for k, v in s.items():
        if k not in SWEEP_KEYS or k in ("kv_cache", "optimizer", "checkpointing", "grad_accum",
                                        "trainable", "kernels"):
            raise InputError(f"{path}: the torch probe cannot run `{k} = {json.dumps(v)}` with mode \"generate\"")
    bad = [a for a in s.get("attention", []) if a not in ("eager", "sliced")]
    if bad:
        raise InputError(f"{path}: the torch probe cannot run `attention = \"{bad[0]}\"` for generation")
    if s.get("mode") != ["generate"]:
        raise InputError(f"{path}: [sweep] mode \"generate\" runs alone in its [sweep] table")
    for p in expand_generate(spec, s):
        try:
            lay = gen_layout(p)
        except InputError as e:
            raise InputError(f"{path}: {e}") from None
        if lay["family"] == "wan" and "frames" not in s:
            raise InputError(f"{path}: `frames` is missing: {p['model_id']} is a video model "
                             "(frames 4k+1, e.g. [5, 9])")


EMU_CONV_NOTE = ("emulated: convolutions on PyTorch's native CUDA path (cuDNN off); cuDNN's "
                 "algorithm and workspace are not modeled")


def emulated() -> bool:
    """Whether this process runs on vramlab's emulated GPU (`vramlab emulate` sets these)."""
    return bool(os.environ.get("VRAMLAB_EMU_TOTAL")) and bool(os.environ.get("VRAMLAB_EMU_REPORT"))


def vramlab_bin() -> str:
    """The vramlab binary: $VRAMLAB_BIN, PATH, or this checkout's release or debug build."""
    import shutil
    root = Path(__file__).resolve().parent.parent
    for c in (os.environ.get("VRAMLAB_BIN"), shutil.which("vramlab"),
              root / "target" / "release" / "vramlab", root / "target" / "debug" / "vramlab"):
        if c and Path(c).is_file():
            return str(c)
    raise InputError("--device emu:GPU needs the vramlab binary (set VRAMLAB_BIN, put it on PATH, "
                     "or `cargo build -p vramlab`)")


def build_model(torch, transformers, kind: str, path: str, dtype, attention: str, device):
    """The real transformers class of the config's model_type, with the source's weights:
    `hf:DIR` from_pretrained, `gguf:FILE` transformers' GGUF loader (dequantizes),
    `synthetic:CONFIG` from_config (random values, real shapes)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
    kw = dict(dtype=dtype, attn_implementation=attention)
    if emulated() and kind == "gguf":
        # On the emulated GPU: the GGUF's config, dense weights of the point's dtype built on
        # the device (values do not change memory; no host copy).
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{path}: no such GGUF file")
        config = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
        with torch.device(device):
            return config, AutoModelForCausalLM.from_config(config, **kw)
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
    if kind == "hf" and not emulated():
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
        if emulated():
            dev_name += " (emulated)"
        drv = ""
        try:
            drv = Path("/proc/driver/nvidia/version").read_text().split("Kernel Module")[1].split()[0]
        except (OSError, IndexError):
            pass
        pool = {"meter": meter.kind, "allocator": torch.cuda.get_allocator_backend(),
                "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
        if emulated():
            pool["emulated"] = {"context_bytes": int(os.environ.get("VRAMLAB_EMU_CONTEXT", "0")),
                                "weights": "built from each config on the device, not read"}
        gpu = dict(name=props.name, total_memory=props.total_memory,
                   compute_capability=f"{props.major}.{props.minor}")
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
              "mixed-bf16": torch.float32, "mixed-f16": torch.float32}
    runtime = f"torch-{torch.__version__}+transformers-{transformers.__version__}"
    generating = any(p["mode"] == "generate" for p in points)
    if generating:
        import diffusers
        runtime += f"+diffusers-{diffusers.__version__}"
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
                      diffusers=diffusers.__version__ if generating else None,
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

    common = dict(
        schema_version=SCHEMA_VERSION, run_id=run_id, vramlab_version="torch_probe",
        git_rev=git_rev(), backend="cpu" if cpu else "cuda", device_name=dev_name,
        driver_version=drv, cuda_version=cuda_v, candle_version="",
        kernels="reference", attention=args.attention, pool_release="", scenario_hash=shash,
        meter=meter.kind,
    )
    i = 0
    while i < len(points):
        if points[i]["mode"] == "generate":
            n = gen_group_len(points, i)
            run_generate_group(torch, points[i:i + n], common, writer, meter, device, args, counts)
            i += n
            continue
        src, prec = points[i]["source"], points[i]["precision"]
        n = 0
        while i + n < len(points) and points[i + n]["source"] == src and points[i + n]["precision"] == prec:
            n += 1
        group, i = points[i:i + n], i + n
        kind, path = parse_source(src)
        base = dict(common, weight_source={"hf": "safetensors", "gguf": "gguf", "synthetic": "synthetic"}[kind])
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
    if train and device.type != "cpu":
        # On a GPU, a full-model forward and backward can exceed memory that the point itself
        # (LoRA, checkpointing) fits in: rehearse the largest point as it will run.
        big = max(train, key=lambda p: (p["batch"] // p["train"]["grad_accum"], p["context"]))
        train_point(torch, model, big, device, NullMeter(), "foreach", rehearse=True)
    elif train:
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
    # With a frozen base, checkpointed layers need inputs that require grad (as PEFT users set
    # with enable_input_require_grads), or no gradient reaches the adapters inside them.
    frozen_inputs = t["checkpointing"] == "layer" and t["trainable"] != "full"
    if t["checkpointing"] == "layer":
        model.gradient_checkpointing_enable()
    if frozen_inputs:
        model.enable_input_require_grads()
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
        if frozen_inputs:
            model.disable_input_require_grads()
        if t["checkpointing"] == "layer":
            model.gradient_checkpointing_disable()
        model.eval()
    return rows


# ----------------------------------------------------------------------- generation --
#
# A pipeline read from a diffusers directory (`synthetic:MODEL` = the directory vramlab writes
# under $VRAMLAB_MODELS/synthetic-gen/, `diffusers:DIR` = a real one), measured phase by phase
# as harness/src/workload/generate.rs measures candle: a `load` row per component, `text_encode`,
# a `denoise` row per step (CFG doubles the denoiser's batch), `vae_decode` (full, diffusers'
# enable_slicing() or enable_tiling() with the scenario's tile and overlap), `total` with
# peak_phase. Families: Stable Diffusion (unet/: UNet2DConditionModel, vae/: AutoencoderKL,
# text_encoder/[_2]: CLIPTextModel[WithProjection]), FLUX (transformer/:
# FluxTransformer2DModel; text_encoder/ CLIP, text_encoder_2/ T5 and vae/ when present) and
# Wan2.1 T2V (model_index.json WanPipeline: transformer/ WanTransformer3DModel, vae/
# AutoencoderKLWan, text_encoder/ UMT5EncoderModel), as harness/src/model/wan_pipe.rs runs it.

GEN_DTYPE_NAMES = {"f32": "f32", "f16": "f16", "bf16": "bf16"}
# FLUX.1-dev's pipeline encodes prompts to 512 T5 tokens (max_sequence_length).
FLUX_TEXT_LEN = 512
GUIDANCE_SCALE = 7.5  # as generate.rs
# wan_pipe.rs: WanPipeline's max_sequence_length, guidance_scale and the scheduler's flow_shift.
WAN_TEXT_LEN = 512
WAN_GUIDANCE_SCALE = 5.0
WAN_FLOW_SHIFT = 3.0
# The diffusers classes of each family's denoiser and VAE.
GEN_CLASSES = {"sd": {"unet": "UNet2DConditionModel", "vae": "AutoencoderKL"},
               "flux": {"transformer": "FluxTransformer2DModel", "vae": "AutoencoderKL"},
               "wan": {"transformer": "WanTransformer3DModel", "vae": "AutoencoderKLWan"}}


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read config: {e}") from e


def gen_layout(p: dict) -> dict:
    """The diffusers directory of a generation point and what is in it (no torch): family
    (`sd`, `flux` or `wan`), components in load order, the VAE dtype name."""
    src = p["source"]
    kind, _, rest = src.partition(":")
    prec = p["precision"]
    if prec not in GEN_DTYPE_NAMES:
        raise InputError(f"[sweep] precision `{prec}`: generation runs f32, f16 or bf16")
    if kind == "diffusers":
        root = Path(expand_env(rest))
    elif kind == "synthetic":
        models = Path(expand_env("${VRAMLAB_MODELS}"))
        # The presets whose VAE runs f32 by default (SDXL's force_upcast, Wan's f32 VAE).
        vae = p["vae_precision"] or ("f32" if rest in ("sdxl", "wan2.1-t2v-1.3b") else prec)
        root = models / "synthetic-gen" / f"{rest}-{prec}-vae-{vae}"
        if not root.is_dir():
            raise InputError(f"{root}: no such directory (`vramlab sweep` writes the synthetic "
                             f"weights of `{src}` there; run it first)")
    else:
        raise InputError(f"generation source `{src}` must be `synthetic:MODEL` or `diffusers:DIR`")
    index = root / "model_index.json"
    wan = index.is_file() and read_json(index).get("_class_name") == "WanPipeline"
    if (root / "transformer" / "config.json").is_file():
        family, denoiser = ("wan" if wan else "flux"), "transformer"
    elif (root / "unet" / "config.json").is_file():
        family, denoiser = "sd", "unet"
    else:
        raise InputError(f"{root}: neither unet/config.json nor transformer/config.json")
    comps = [c for c in ("text_encoder", "text_encoder_2") if (root / c / "config.json").is_file()]
    comps.append(denoiser)
    has_vae = (root / "vae" / "config.json").is_file()
    if has_vae:
        comps.append("vae")
    elif family == "sd":
        raise InputError(f"{root}: no vae/config.json")
    if family == "sd" and "text_encoder" not in comps:
        raise InputError(f"{root}: no text_encoder/config.json")
    if family == "flux" and p["cfg"]:
        raise InputError(f"[sweep] cfg = true: {p['model_id']} (FLUX) runs without classifier-free "
                         "guidance (its guidance is an embedding)")
    if family == "wan":
        check_wan(p)
    elif p["frames"] != 1:
        raise InputError(f"[sweep] frames = {p['frames']}: {p['model_id']} is an image model")
    vae = p["vae_precision"]
    if vae is None and family == "wan":
        vae = "f32"  # wan_pipe.rs: diffusers' Wan docs load the VAE in f32
    elif vae is None:
        # diffusers' SDXL pipeline decodes in f32 when the VAE config sets force_upcast; SD
        # 1.5/2.1 and FLUX decode in the pipeline's dtype (sd.rs default_vae_dtype).
        upcast = has_vae and read_json(root / "vae" / "config.json").get("force_upcast", True)
        vae = "f32" if family == "sd" and "text_encoder_2" in comps and upcast else prec
    return dict(root=root, family=family, components=comps, vae_precision=vae,
                weight_source="safetensors" if kind == "diffusers" else "synthetic")


def check_wan(p: dict):
    """What vramlab's Wan pipeline refuses (wan_pipe.rs check, attention_problem): frames
    4k+1, no sliced attention."""
    if (p["frames"] - 1) % 4:
        raise InputError(f"[sweep] frames = {p['frames']}: {p['model_id']} decodes 4k+1 frames")
    if p["gen_attention"] == "sliced":
        raise InputError("[sweep] attention = \"sliced\": Wan's DiT has no sliced attention "
                         "(that is the UNet's)")


def weights_file(cdir: Path):
    for f in ("diffusion_pytorch_model.safetensors", "model.safetensors"):
        if (cdir / f).is_file():
            return cdir / f
    return None


def build_component(torch, family: str, name: str, cdir: Path, dtype, text_attn: str, device):
    """One component from its directory: the real class's from_pretrained when the weights are
    there, from_config (random values, the real shapes) when only config.json is. Weights
    loaded from a file are copied into the heap: torch's CPU from_pretrained leaves safetensors
    tensors mmapped (file pages, outside the counted heap), where a GPU would hold a copy."""
    import diffusers
    import transformers
    cfg = read_json(cdir / "config.json")
    wf = weights_file(cdir)
    if name.startswith("text_encoder"):
        arch = (cfg.get("architectures") or [""])[0]
        if family == "wan":
            # vramlab writes umT5's keys without model_type; Wan's text encoder is umT5.
            cls, ccls = transformers.UMT5EncoderModel, transformers.UMT5Config
        elif cfg.get("model_type") == "t5" or arch.startswith("T5"):
            cls, ccls = transformers.T5EncoderModel, transformers.T5Config
        elif arch == "CLIPTextModelWithProjection":
            cls, ccls = transformers.CLIPTextModelWithProjection, transformers.CLIPTextConfig
        else:
            cls, ccls = transformers.CLIPTextModel, transformers.CLIPTextConfig
        if emulated():
            wf = None  # the emulated GPU: shapes from config.json, no weights read
        if wf is not None:
            model = cls.from_pretrained(str(cdir), dtype=dtype, attn_implementation=text_attn)
        else:
            with torch.device(device):
                model = cls._from_config(ccls.from_dict(cfg), attn_implementation=text_attn,
                                         dtype=dtype)
    else:
        cls = getattr(diffusers, GEN_CLASSES[family][name])
        over = {}
        if cls is diffusers.AutoencoderKL:
            # vramlab writes the keys that shape memory; diffusers' defaults for the block types
            # are a one-block VAE, so they are spelled out (every SD/FLUX VAE block is these).
            n = len(cfg.get("block_out_channels", []))
            for k, v in (("down_block_types", "DownEncoderBlock2D"), ("up_block_types", "UpDecoderBlock2D")):
                if k not in cfg:
                    over[k] = [v] * n
        if emulated():
            wf = None
        if wf is not None:
            model = cls.from_pretrained(str(cdir), torch_dtype=dtype, **over)
        else:
            with torch.device(device):
                model = cls.from_config(dict(cfg, **over)).to(dtype)
    if wf is not None:
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                t.data = t.data.clone()
        model = model.to(device)
    model.eval()
    wrong = {n for n, q in model.named_parameters() if q.dtype != dtype and not kept_f32(model, n, q, dtype)}
    if wrong:
        raise RuntimeError(f"{cdir}: parameters {sorted(wrong)[:3]} not built as {dtype}")
    return model


def kept_f32(model, name: str, q, dtype) -> bool:
    """A parameter the class keeps in f32 in a 16-bit model (diffusers' and transformers'
    `_keep_in_fp32_modules`: WanTransformer3DModel's time embedder, modulation tables and
    norms), as from_pretrained does and vramlab does not."""
    mods = getattr(model, "_keep_in_fp32_modules", None) or []
    return q.dtype != dtype and q.dtype.itemsize == 4 and any(m in name.split(".") for m in mods)


def load_row(c: str, model, dtype, mem: dict, ms: float) -> dict:
    """A component's load row: its weights' bytes in the dtypes they were built in, and in the
    message what stayed f32 (kept_f32)."""
    params = list(model.named_parameters())
    msg = "components loaded once per (model, precision, VAE precision); shared by the group"
    kept = sum(q.numel() for n, q in params if kept_f32(model, n, q, dtype))
    if kept:
        msg += f"; {kept} parameters kept in f32 by {type(model).__name__}._keep_in_fp32_modules"
    return dict(phase="load", component=c, elapsed_ms=ms, message=msg, **mem,
                feature_weight_bytes=sum(q.numel() * q.element_size() for _, q in params))


def set_gen_attention(pipe: dict, axis: str, flag: str):
    """The denoiser's and the VAE's attention: `sliced` (the point's axis) = diffusers'
    set_attention_slice("auto") on the UNet (half the heads at a time, as candle's Some(0));
    otherwise the probe's --attention: `sdpa` = diffusers' default processor
    (AttnProcessor2_0, scaled_dot_product_attention), `eager` = AttnProcessor (the scores
    materialized). FLUX's and Wan's transformers: `eager` = the `_native_math` attention
    backend. The Wan VAE's mid-block attention calls scaled_dot_product_attention itself, with
    no processor: gen_attention_scope runs it on torch's math backend under `eager`."""
    import diffusers
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0
    unet, vae, tr = pipe.get("unet"), pipe.get("vae"), pipe.get("transformer")
    proc = AttnProcessor if flag == "eager" else AttnProcessor2_0
    for m in (unet, vae):
        if isinstance(m, (diffusers.UNet2DConditionModel, diffusers.AutoencoderKL)):
            m.set_attn_processor(proc())
    if unet is not None and axis == "sliced":
        unet.set_attention_slice("auto")
    if tr is not None:
        if axis == "sliced":
            raise RuntimeError(f"{type(tr).__name__} has no sliced attention in diffusers")
        tr.set_attention_backend("_native_math" if flag == "eager" else "native")


def gen_attention_scope(torch, flag: str):
    """Where a point runs: under `eager`, every scaled_dot_product_attention that no processor
    setting reaches (the Wan VAE's mid block) takes torch's math backend (the scores
    materialized, as candle's); under `sdpa`, torch's choice."""
    import contextlib
    if flag != "eager":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.MATH])


def gen_group_len(points: list, i: int) -> int:
    key = lambda p: (p["source"], p["precision"], p["vae_precision"])  # noqa: E731
    n = 0
    while i + n < len(points) and points[i + n]["mode"] == "generate" and key(points[i + n]) == key(points[i]):
        n += 1
    return n


def flux_ids(torch, h: int, w: int, device):
    """FluxPipeline's _prepare_latent_image_ids: (h·w, 3) with the row and column of each
    packed latent."""
    ids = torch.zeros(h, w, 3, device=device)
    ids[..., 1] += torch.arange(h, device=device)[:, None]
    ids[..., 2] += torch.arange(w, device=device)[None, :]
    return ids.reshape(h * w, 3)


def vae_spatial_scale(vae) -> int:
    """Pixels per latent along a side: AutoencoderKLWan's spatial_compression_ratio, an
    AutoencoderKL's 2^(blocks − 1); 8 without a VAE."""
    if vae is None:
        return 8
    if hasattr(vae, "spatial_compression_ratio"):
        return vae.spatial_compression_ratio
    return 2 ** (len(vae.config.block_out_channels) - 1)


def text_len(family: str, encoder) -> int:
    """Tokens per prompt: CLIP's max_position_embeddings, FLUX's T5 and Wan's umT5 512."""
    if encoder is not None and "CLIP" in type(encoder).__name__:
        return encoder.config.max_position_embeddings
    return WAN_TEXT_LEN if family == "wan" else FLUX_TEXT_LEN


def wan_sigma(i: int, steps: int) -> float:
    """wan_pipe.rs sigma: the shifted flow sigma at step i (1 at the start, 0 at the end)."""
    u = 1.0 - i / steps
    return WAN_FLOW_SHIFT * u / (1.0 + (WAN_FLOW_SHIFT - 1.0) * u)


def wan_encode(torch, pipe: dict, ids: list, b: int, cfg: bool, dtype, device):
    """wan_pipe.rs encode_text: the prompts' embeddings and, with CFG, the negative prompts'
    from a second encoder call (as WanPipeline.encode_prompt), in the transformer's dtype.
    Without a text encoder in the directory, embeddings of the shape the transformer reads."""
    te = pipe.get("text_encoder")
    calls = [slice(0, b), slice(b, 2 * b)] if cfg else [slice(0, b)]
    if te is None:
        d = pipe["transformer"].config.text_dim
        return [torch.randn(b, WAN_TEXT_LEN, d, device=device, dtype=dtype) for _ in calls]
    return [te(ids[0][s]).last_hidden_state.to(dtype) for s in calls]


def wan_step(torch, tr, latents, i: int, steps: int, conds: list):
    """wan_pipe.rs denoise_step: the transformer on the prompt (and, with CFG, a second call on
    the negative prompt while the first prediction lives), guidance 5.0, then the flow's Euler
    step x += (σ_next − σ)·v."""
    sigma, nxt = wan_sigma(i, steps), wan_sigma(i + 1, steps)
    ts = torch.full((latents.shape[0],), sigma * 1000.0, device=latents.device)
    pred = tr(hidden_states=latents, timestep=ts, encoder_hidden_states=conds[0]).sample
    if len(conds) > 1:
        uncond = tr(hidden_states=latents, timestep=ts, encoder_hidden_states=conds[1]).sample
        pred = uncond + (pred - uncond) * WAN_GUIDANCE_SCALE
        del uncond
    return latents + pred * (nxt - sigma)


def wan_vae_latents(torch, vae, latents, vae_dtype):
    """wan_pipe.rs vae_latents: latents · latents_std + latents_mean per channel, in the VAE's
    dtype (WanPipeline divides by 1/std)."""
    c = vae.config
    shape = (1, c.z_dim, 1, 1, 1)
    std = torch.tensor(c.latents_std, device=latents.device).view(shape).to(vae_dtype)
    mean = torch.tensor(c.latents_mean, device=latents.device).view(shape).to(vae_dtype)
    return latents.to(vae_dtype) * std + mean


def gen_point(torch, pipe: dict, lay: dict, p: dict, dtype, vae_dtype, device, meter, state: dict):
    """One generation point on a loaded pipeline: rows text_encode, denoise per step,
    vae_decode (their memory and milliseconds), and `output_bytes`."""
    rows = []
    b, nb = p["batch"], p["batch"] * (2 if p["cfg"] else 1)
    flux, wan = lay["family"] == "flux", lay["family"] == "wan"
    vae = pipe.get("vae")
    scale = vae_spatial_scale(vae)
    h, w = p["height"] // scale, p["width"] // scale

    def phase(name, fn, **extra):
        state["phase"] = name
        started = meter.start()
        out = fn()
        mem, ms = meter.finish(started)
        rows.append(dict(phase=name, elapsed_ms=ms, **extra, **mem))
        return out

    with torch.no_grad():
        encoders = [pipe[c] for c in ("text_encoder", "text_encoder_2") if c in pipe]
        lens = [text_len(lay["family"], e) for e in encoders]
        ids = [torch.tensor([(i * 7 + 1) % e.config.vocab_size for i in range(nb * s)],
                            device=device).view(nb, s) for e, s in zip(encoders, lens)]

        def encode():
            if wan:
                return wan_encode(torch, pipe, ids, b, p["cfg"], dtype, device), None
            if not flux:
                outs = [e(t).last_hidden_state for e, t in zip(encoders, ids)]
                return (outs[0] if len(outs) == 1 else torch.cat(outs, -1)), None
            tc = pipe["transformer"].config
            pooled = ctx = None
            for e, t in zip(encoders, ids):
                if "CLIP" in type(e).__name__:
                    pooled = e(t).pooler_output
                else:
                    ctx = e(t).last_hidden_state
            # Without a text encoder in the directory, its output has the shape the
            # transformer reads.
            if pooled is None:
                pooled = torch.randn(nb, tc.pooled_projection_dim, device=device, dtype=dtype)
            if ctx is None:
                ctx = torch.randn(nb, FLUX_TEXT_LEN, tc.joint_attention_dim, device=device, dtype=dtype)
            return ctx.to(dtype), pooled.to(dtype)

        context, pooled = phase("text_encode", encode)
        del ids
        g = torch.Generator(device="cpu").manual_seed(42)
        if wan:
            tr = pipe["transformer"]
            frames = (p["frames"] - 1) // vae.config.scale_factor_temporal + 1
            # wan_pipe.rs keeps the latents in the transformer's dtype.
            latents = torch.randn(b, tr.config.in_channels, frames, h, w, generator=g).to(device, dtype)
        elif flux:
            tr = pipe["transformer"]
            lat_ch = tr.config.in_channels // 4
            latents = torch.randn(b, (h // 2) * (w // 2), lat_ch * 4, generator=g).to(device, dtype)
            img_ids = flux_ids(torch, h // 2, w // 2, device).to(dtype)
            txt_ids = torch.zeros(context.shape[1], 3, device=device, dtype=dtype)
            guidance = (torch.full((nb,), 3.5, device=device, dtype=dtype)
                        if tr.config.guidance_embeds else None)
        else:
            unet = pipe["unet"]
            latents = torch.randn(b, unet.config.in_channels, h, w, generator=g).to(device, dtype)
        for i in range(p["steps"]):
            # A DDIM-like update at evenly spaced timesteps: a step's memory is the denoiser's.
            t = 999.0 * (1.0 - i / p["steps"])

            def step():
                nonlocal latents
                lat = latents
                if wan:
                    latents = wan_step(torch, tr, lat, i, p["steps"], context)
                    return
                inp = torch.cat([lat, lat]) if p["cfg"] else lat
                if flux:
                    ts = torch.full((nb,), t / 1000.0, device=device, dtype=dtype)
                    noise = tr(hidden_states=inp, encoder_hidden_states=context, pooled_projections=pooled,
                               timestep=ts, img_ids=img_ids, txt_ids=txt_ids, guidance=guidance).sample
                    del ts
                else:
                    noise = unet(inp, torch.tensor(t, device=device), encoder_hidden_states=context).sample
                del inp
                if p["cfg"]:
                    u, c = noise[:b], noise[b:]
                    noise = u + (c - u) * GUIDANCE_SCALE
                    del u, c
                latents = lat - noise * 0.1
                del lat, noise

            phase("denoise", step, step=i + 1)
        del context, pooled
        if vae is None:
            return rows, None

        def decode():
            lat = latents
            vae.disable_slicing()
            vae.disable_tiling()
            if wan:
                z = wan_vae_latents(torch, vae, lat, vae_dtype)
            else:
                if flux:
                    # FluxPipeline._unpack_latents, then the VAE's scaling and shift.
                    lat = lat.view(b, h // 2, w // 2, -1, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, -1, h, w)
                z = (lat / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)).to(vae_dtype)
            del lat
            if p["vae_decode"] == "sliced":
                vae.enable_slicing()
            elif p["vae_decode"] == "tiled" and wan:
                # AutoencoderKLWan's tiled_decode: tiles of `tile` pixels every tile − overlap,
                # each decoded through its own chunked decode and feature cache.
                stride = p["tile"] - p["overlap"]
                vae.enable_tiling(p["tile"], p["tile"], stride, stride)
            elif p["vae_decode"] == "tiled":
                vae.enable_tiling()
                vae.tile_sample_min_size = p["tile"]
                vae.tile_latent_min_size = p["tile"] // scale
                vae.tile_overlap_factor = p["overlap"] / p["tile"]
            return vae.decode(z).sample

        image = phase("vae_decode", decode)
        del latents
        shape, out_dtype = image.shape, image.dtype
        out_bytes = image.numel() * image.element_size()
        del image
        # What a fresh tensor of the output's shape holds in this allocator (its data and
        # torch's tensor and storage objects): the phase should keep exactly that.
        started = meter.start()
        fresh = torch.empty(shape, dtype=out_dtype, device=device)
        mem, _ = meter.finish(started)
        del fresh
    return rows, (out_bytes, mem["end_allocated"] - mem["baseline_allocated"])


def run_generate_group(torch, group: list, common: dict, writer, meter, device, args, counts: dict):
    """Loads one pipeline (per source, precision and VAE precision), then measures each point
    of the group on it (each first rehearsed unmeasured at its own shapes: oneDNN keeps
    per-shape state the first time a shape runs)."""
    import diffusers
    p0 = group[0]
    lay = gen_layout(p0)
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[p0["precision"]]
    vae_dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[lay["vae_precision"]]
    text_attn = "sdpa" if args.attention == "sdpa" else "eager"
    base = dict(common, weight_source=lay["weight_source"], mode="generate",
                architecture={"sd": "stable-diffusion"}.get(lay["family"], lay["family"]),
                optimizer="none", vae_precision=lay["vae_precision"])
    pipe, loads = {}, []
    state = {"phase": "load"}
    try:
        meter.trim()
        for c in lay["components"]:
            started = meter.start()
            cdtype = vae_dtype if c == "vae" else dtype
            pipe[c] = build_component(torch, lay["family"], c, lay["root"] / c, cdtype, text_attn,
                                      device)
            mem, ms = meter.finish(started)
            loads.append(load_row(c, pipe[c], cdtype, mem, ms))
        load_err = None
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - recorded per point, the sweep goes on
        load_err = " ".join(str(e).split())[:300]
    params = sum(sum(q.numel() for q in m.parameters()) for m in pipe.values())
    weights = sum(r["feature_weight_bytes"] for r in loads)
    base.update(param_count=params, context=text_len(lay["family"], pipe.get("text_encoder")))
    seen = set()
    for p in group:
        axis_attn = p["gen_attention"]
        cols = dict(base, point_id=p["id"], model_id=p["model_id"], precision=p["precision"],
                    batch=p["batch"], resolution=f"{p['width']}x{p['height']}", frames=p["frames"],
                    cfg="true" if p["cfg"] else "false", vae_decode=p["vae_decode"],
                    attention=axis_attn if axis_attn != "eager" else args.attention,
                    started_at=now_rfc3339())
        if load_err:
            writer.write(dict(cols, phase="load", status="error", message=load_err))
            counts["error"] = counts.get("error", 0) + 1
            continue
        rows = [dict(r) for r in loads]
        try:
            set_gen_attention(pipe, axis_attn, args.attention)
            key = (p["batch"], p["cfg"], p["width"], p["height"], p["frames"], p["vae_decode"])
            with gen_attention_scope(torch, args.attention):
                if key not in seen:
                    gen_point(torch, pipe, lay, dict(p, steps=1), dtype, vae_dtype, device, NullMeter(), state)
                    seen.add(key)
                meter.trim()
                measured, out_bytes = gen_point(torch, pipe, lay, p, dtype, vae_dtype, device, meter, state)
            for r in measured:
                r["feature_weight_bytes"] = weights
                if r["phase"] == "vae_decode":
                    r["message"] = f"output_bytes={out_bytes[0]} fresh_tensor_bytes={out_bytes[1]}"
            rows += measured
            keys = ("baseline_allocated", "peak_allocated", "end_allocated", "baseline_reserved",
                    "peak_reserved", "device_used", "non_pool")
            mems = [{k: r[k] for k in keys} for r in rows]
            peak = max(rows, key=lambda r: r["peak_allocated"])
            rows.append(dict(phase="total", peak_phase=peak["phase"], feature_weight_bytes=weights,
                             elapsed_ms=sum(r["elapsed_ms"] for r in rows), **span(mems[0], mems[1:])))
            for r in rows:
                writer.write(dict(cols, **r, status="ok"))
            status = "ok"
        except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
            status = "error"
            writer.write(dict(cols, phase=state["phase"], status=status,
                              message=" ".join(str(e).split())[:300]))
        counts[status] = counts.get(status, 0) + 1
        print(f"  {p['id']}: {status}", file=sys.stderr)
    pipe.clear()
    meter.trim()


def run_emulated(args, argv: list) -> int:
    """`--device emu:GPU`: this probe again, as cuda:0, under `vramlab emulate --gpu GPU`."""
    gpu = args.device.split(":", 1)[1]
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--device":
            skip = True
        elif not a.startswith("--device="):
            rest.append(a)
    cmd = [vramlab_bin(), "emulate", "--gpu", gpu, "--", sys.executable,
           str(Path(__file__).resolve()), *rest, "--out", str(args.out), "--device", "cuda:0"]
    # The probe's own progress is on stderr; emulate's per-step table is not needed here.
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    return done.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--out", type=Path, help="output CSV (manifest beside it)")
    ap.add_argument("--device", default="cuda:0", help="cuda:N (torch's caching allocator), cpu "
                    "(the preload meter; use scripts/torch-cpu.sh) or emu:GPU (an emulated GPU, "
                    "e.g. emu:h100-80gb)")
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
        if args.device.startswith("emu:"):
            return run_emulated(args, argv if argv is not None else sys.argv[1:])
        if args.device != "cpu" and not re.fullmatch(r"cuda(:[0-9]+)?", args.device):
            raise InputError(f"--device {args.device}: must be cpu, cuda:N or emu:GPU")
        return run(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
