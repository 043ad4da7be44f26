"""The scenario grid, a mirror of harness/src/grid.rs: the points of a scenario TOML and their ids
(identical to `vramlab sweep --dry-run`). Imports no torch."""
import os
import re
from pathlib import Path, PurePosixPath

import tomllib

from .common import InputError, read_json

# vramlab's quantized precisions (harness/src/vocab/precision.rs `Precision`): GGUF blocks kept.
QUANTIZED = {"native", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4k", "q5k", "q6k", "q8k"}


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
                                    attention=attention if "attention" in s else None,
                                    train=train or default_train))
    return points


def gen_model_id(source: str) -> str:
    """The model id of a generation source (scenario/gen_points.rs expand): what follows the
    last `:` or `/`."""
    return re.split(r"[:/]", source)[-1]


def parse_resolution(r: str) -> tuple[int, int]:
    m = re.fullmatch(r"([0-9]+)x([0-9]+)", str(r))
    if not m:
        raise InputError(f"resolution `{r}` must be WIDTHxHEIGHT in pixels, e.g. 512x512")
    return int(m.group(1)), int(m.group(2))


def expand_generate(spec: dict, s: dict) -> list[dict]:
    """scenario/gen_points.rs expand: model, precision, attention, resolution, batch, cfg,
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
    """A `mode = ["train"]` table on diffusion pipelines (scenario/spec/pipeline.rs is_pipeline_source:
    `diffusers:` or a `synthetic:` generation preset): workload/finetune.rs's LoRA of a
    denoiser."""
    gen = {"sd15", "sd21", "sdxl", "flux-dev", "flux-schnell", "wan2.1-t2v-1.3b"}
    sources = as_list(s.get("source", spec["model"]["source"]))
    return "train" in s.get("mode", []) and all(
        src.startswith("diffusers:") or (src.startswith("synthetic:") and src[10:] in gen)
        for src in sources)


def expand_finetune(spec: dict, s: dict) -> list[dict]:
    """scenario/ft_points.rs expand (ids only: the probe does not run a denoiser's LoRA)."""
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
