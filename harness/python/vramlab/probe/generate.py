"""Generation with diffusers (`mode = "generate"`).

A pipeline read from a diffusers directory (`synthetic:MODEL` = the directory vramlab writes
under $VRAMLAB_MODELS/synthetic-gen/, `diffusers:DIR` = a real one), measured phase by phase
as harness/src/workload/generate.rs measures candle: a `load` row per component, `text_encode`,
a `denoise` row per step (CFG doubles the denoiser's batch), `vae_decode` (full, diffusers'
enable_slicing() or enable_tiling() with the scenario's tile and overlap), `total` with
peak_phase. Families: Stable Diffusion (unet/: UNet2DConditionModel, vae/: AutoencoderKL,
text_encoder/[_2]: CLIPTextModel[WithProjection]), FLUX (transformer/:
FluxTransformer2DModel; text_encoder/ CLIP, text_encoder_2/ T5 and vae/ when present) and
Wan2.1 T2V (model_index.json WanPipeline: transformer/ WanTransformer3DModel, vae/
AutoencoderKLWan, text_encoder/ UMT5EncoderModel), as harness/src/model/diffusion/wan/pipeline.rs runs it.
"""
import subprocess
import sys
from pathlib import Path

from .common import InputError, emulated, materialize, now_rfc3339, read_json, vramlab_bin
from .grid import expand_env
from .meters import NullMeter, span

GEN_DTYPE_NAMES = {"f32": "f32", "f16": "f16", "bf16": "bf16"}
# FLUX.1-dev's pipeline encodes prompts to 512 T5 tokens (max_sequence_length).
FLUX_TEXT_LEN = 512
GUIDANCE_SCALE = 7.5  # as generate.rs
# wan/pipeline.rs: WanPipeline's max_sequence_length, guidance_scale and the scheduler's flow_shift.
WAN_TEXT_LEN = 512
WAN_GUIDANCE_SCALE = 5.0
WAN_FLOW_SHIFT = 3.0
# The diffusers classes of each family's denoiser and VAE.
GEN_CLASSES = {"sd": {"unet": "UNet2DConditionModel", "vae": "AutoencoderKL"},
               "flux": {"transformer": "FluxTransformer2DModel", "vae": "AutoencoderKL"},
               "wan": {"transformer": "WanTransformer3DModel", "vae": "AutoencoderKLWan"}}


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
        if not root.is_dir() and emulated():
            # The emulated GPU builds every model from its config: the configs are enough.
            write_configs(rest, prec, vae, root)
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
        vae = "f32"  # wan/pipeline.rs: diffusers' Wan docs load the VAE in f32
    elif vae is None:
        # diffusers' SDXL pipeline decodes in f32 when the VAE config sets force_upcast; SD
        # 1.5/2.1 and FLUX decode in the pipeline's dtype (sd/config.rs default_vae_dtype).
        upcast = has_vae and read_json(root / "vae" / "config.json").get("force_upcast", True)
        vae = "f32" if family == "sd" and "text_encoder_2" in comps and upcast else prec
    return dict(root=root, family=family, components=comps, vae_precision=vae,
                weight_source="safetensors" if kind == "diffusers" else "synthetic")


def write_configs(model: str, prec: str, vae: str, root: Path):
    """`vramlab synth-weights --pipeline MODEL --configs-only`: the preset's model_index.json and
    component configs, no weights, into `root` (the directory a later sweep completes)."""
    cmd = [vramlab_bin(), "synth-weights", "--pipeline", model, "--dtype", prec, "--vae-dtype", vae,
           "--configs-only", "--out", str(root)]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise InputError(f"{root}: writing the configs of `synthetic:{model}` failed: {last}")


def check_wan(p: dict):
    """What vramlab's Wan pipeline refuses (wan/pipeline.rs check, attention_problem): frames
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
            # The emulated GPU: shapes from config.json, built on meta, no weights read.
            with torch.device("meta"):
                model = cls._from_config(ccls.from_dict(cfg), attn_implementation=text_attn,
                                         dtype=dtype)
            return materialize(torch, model, device).eval()
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
            # Built on meta in `dtype`, the class's `_keep_in_fp32_modules` in f32 (as
            # from_pretrained loads them), then allocated once on the device.
            with torch.device("meta"):
                model = cls.from_config(dict(cfg, **over)).to(dtype)
            keep = getattr(model, "_keep_in_fp32_modules", None) or []
            for name, t in list(model.named_parameters()) + list(model.named_buffers()):
                if t.is_floating_point() and any(k in name.split(".") for k in keep):
                    t.data = t.data.float()
            return materialize(torch, model, device).eval()
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
    """wan/pipeline.rs sigma: the shifted flow sigma at step i (1 at the start, 0 at the end)."""
    u = 1.0 - i / steps
    return WAN_FLOW_SHIFT * u / (1.0 + (WAN_FLOW_SHIFT - 1.0) * u)


def wan_encode(torch, pipe: dict, ids: list, b: int, cfg: bool, dtype, device):
    """wan/pipeline.rs encode_text: the prompts' embeddings and, with CFG, the negative prompts'
    from a second encoder call (as WanPipeline.encode_prompt), in the transformer's dtype.
    Without a text encoder in the directory, embeddings of the shape the transformer reads."""
    te = pipe.get("text_encoder")
    calls = [slice(0, b), slice(b, 2 * b)] if cfg else [slice(0, b)]
    if te is None:
        d = pipe["transformer"].config.text_dim
        return [torch.randn(b, WAN_TEXT_LEN, d, device=device, dtype=dtype) for _ in calls]
    return [te(ids[0][s]).last_hidden_state.to(dtype) for s in calls]


def wan_step(torch, tr, latents, i: int, steps: int, conds: list):
    """wan/pipeline.rs denoise_step: the transformer on the prompt (and, with CFG, a second call on
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
    """wan/pipeline.rs vae_latents: latents · latents_std + latents_mean per channel, in the VAE's
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

    # The closures below run (through phase) before `del` unbinds the names they read, inside
    # their own loop iteration: hence the noqa F821 / B023.
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
                return wan_encode(torch, pipe, ids, b, p["cfg"], dtype, device), None  # noqa: F821
            if not flux:
                outs = [e(t).last_hidden_state for e, t in zip(encoders, ids)]  # noqa: F821
                return (outs[0] if len(outs) == 1 else torch.cat(outs, -1)), None
            tc = pipe["transformer"].config
            pooled = ctx = None
            for e, t in zip(encoders, ids):  # noqa: F821
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
            assert vae is not None, "a Wan pipeline's frames are the VAE's"
            frames = (p["frames"] - 1) // vae.config.scale_factor_temporal + 1
            # wan/pipeline.rs keeps the latents in the transformer's dtype.
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
                    latents = wan_step(torch, tr, lat, i, p["steps"], context)  # noqa: B023, F821
                    return
                inp = torch.cat([lat, lat]) if p["cfg"] else lat
                if flux:
                    ts = torch.full((nb,), t / 1000.0, device=device, dtype=dtype)  # noqa: B023
                    noise = tr(hidden_states=inp, encoder_hidden_states=context, pooled_projections=pooled,  # noqa: F821
                               timestep=ts, img_ids=img_ids, txt_ids=txt_ids, guidance=guidance).sample
                    del ts
                else:
                    noise = unet(inp, torch.tensor(t, device=device), encoder_hidden_states=context).sample  # noqa: B023, F821
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
            lat = latents  # noqa: F821
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
    import diffusers  # noqa: F401
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
