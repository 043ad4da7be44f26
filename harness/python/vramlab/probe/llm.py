"""Language models with transformers: building the model, the KV cache, the inference and
training points (phases load; prefill, decode, total; forward, backward, optimizer, step_total)
and LoRA adapters."""
from __future__ import annotations

import time
from pathlib import Path

from .common import InputError, emulated, materialize
from .meters import NullMeter, span


def dynamic_cache(transformers, config):
    """A DynamicCache as `generate()` builds it: from the model's config where the release
    takes one (transformers 5: a sliding-window model's layers keep their window), else bare."""
    try:
        return transformers.DynamicCache(config=config)
    except TypeError:
        return transformers.DynamicCache()


def make_cache(transformers, kind, config, batch, context, dtype, device):
    """A KV cache: `preallocated` = StaticCache (capacity `context`), `growing` = DynamicCache.
    StaticCache's constructor changed across transformers releases; try the known forms."""
    if kind == "growing":
        return dynamic_cache(transformers, config)
    import torch  # lazily, as the probe's modules do
    S = transformers.StaticCache
    attempts = [
        dict(config=config, max_batch_size=batch, max_cache_len=context, device=device, dtype=dtype),
        dict(config=config, batch_size=batch, max_cache_len=context, device=device, dtype=dtype),
        dict(config=config, max_cache_len=context),
    ]
    last = None
    for kw in attempts:
        try:
            cache = S(**kw)
        except TypeError as e:
            last = e
            continue
        # transformers 4.39's StaticCache is one layer's: a single K and V tensor, which every
        # layer would overwrite when it is passed as `past_key_values` (its own static path sets
        # one per attention with `_setup_cache`, Llama's only). Its figures would be one layer's.
        if isinstance(getattr(cache, "key_cache", None), torch.Tensor):
            raise RuntimeError(
                f"kv_cache = \"preallocated\": transformers {transformers.__version__}'s StaticCache "
                "holds one layer's keys and values (every layer would share it); use "
                "kv_cache = \"growing\" on this stack")
        return cache
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


def position_kw(model, pos) -> dict:
    """`cache_position`, where the model's forward takes it (Qwen2 in transformers 4.39 does not,
    and places tokens by the cache's length)."""
    import inspect
    return {"cache_position": pos} if "cache_position" in inspect.signature(model.forward).parameters else {}


def older_than(version: str, major: int, minor: int) -> bool:
    """Whether a package version string ("4.39.3", "5.24.0.dev0") is below major.minor."""
    have = tuple(int(x) for x in version.split(".")[:2])
    return have < (major, minor)


def dtype_kwarg(transformers) -> str:
    """The from_config/from_pretrained keyword that sets the weights' dtype in this stack."""
    return "torch_dtype" if older_than(transformers.__version__, 4, 56) else "dtype"


def build_model(torch, transformers, kind: str, path: str, dtype, attention: str, device,
                gpus: int = 1, compute=None, offload: bool = False):
    """The real transformers class of the config's model_type, with the source's weights:
    `hf:DIR` from_pretrained, `gguf:FILE` transformers' GGUF loader (dequantizes),
    `synthetic:CONFIG` from_config (random values, real shapes). `gpus` > 1: rank 0's shards
    of FSDP full shard over that many ranks (fully_sharded), `compute` the 16-bit dtype of a
    mixed precision."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM
    # transformers renamed `torch_dtype` to `dtype` in 4.56; older stacks (torch-2.2's 4.39)
    # know only the old name.
    kw = {dtype_kwarg(transformers): dtype, "attn_implementation": attention}
    if emulated() and kind == "gguf":
        # On the emulated GPU: the GGUF's config, dense weights of the point's dtype built on
        # the device (values do not change memory; no host copy).
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{path}: no such GGUF file")
        config = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
        return config, on_device(torch, AutoModelForCausalLM, config, kw, device)
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
    if gpus > 1:
        return config, fully_sharded(torch, auto, config, kw, device, gpus, compute, offload)
    if kind == "hf" and not emulated():
        model = auto.from_pretrained(str(cfg_path.parent), config=config, **kw).to(device)
    else:
        model = on_device(torch, auto, config, kw, device)
    return config, model


def on_device(torch, auto, config, kw: dict, device):
    """from_config on `device`. On the emulated GPU it is built on meta and each tensor is
    allocated once (common.materialize), as from_pretrained leaves a tied embedding; built on
    the device, the tied head is allocated and freed first, which the caching allocator keeps."""
    if emulated():
        with torch.device("meta"):
            model = auto.from_config(config, **kw)
        return materialize(torch, model, device)
    with torch.device(device):
        return auto.from_config(config, **kw)


def decoder_layers(torch, model):
    """The model's stack of `num_hidden_layers` blocks (model.layers, transformer.h,
    encoder.layer, ...): the first ModuleList of that length."""
    n = model.config.num_hidden_layers
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == n:
            return m
    raise InputError(f"{model.config.model_type}: no list of {n} layers to shard")


def fully_sharded(torch, auto, config, kw: dict, device, gpus: int, compute, offload: bool = False):
    """FSDP full shard over `gpus` ranks, as rank 0 holds it: this process is rank 0 of torch's
    fake process group (cli.py sets it up; collectives move no data). The model is built on
    meta, each decoder layer and then the root wrapped by FSDP2's fully_shard, and only then are
    the rank's shards allocated (to_empty), as FSDP's meta-device initialisation does. Mixed
    precision is FSDP's own: f32 shards, all-gathered as `compute` copies
    (MixedPrecisionPolicy), so train_forward does not cast. `offload`: FSDP's CPU offload
    (CPUOffloadPolicy): the rank's parameter shards, their gradients and so the optimizer state
    live in host memory, the optimizer steps on the CPU, and each unit is copied to the device
    for its all-gather."""
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        except ImportError:
            return fsdp1(torch, auto, config, kw, device, gpus, compute, offload)
    with torch.device("meta"):
        model = auto.from_config(config, **kw)
    policy = MixedPrecisionPolicy(param_dtype=compute) if compute is not None else MixedPrecisionPolicy()
    placement = dict(offload_policy=CPUOffloadPolicy()) if offload else {}
    for layer in decoder_layers(torch, model):
        fully_shard(layer, mp_policy=policy, **placement)
    fully_shard(model, mp_policy=policy, **placement)
    model.to_empty(device="cpu" if offload else device)
    model.vramlab_ranks = gpus
    return model


def fsdp1(torch, auto, config, kw: dict, device, gpus: int, compute, offload: bool = False):
    """FSDP full shard before FSDP2 (torch < 2.4, the torch-2.2 stack), as accelerate's FSDP
    plugin wraps a transformers model: FullyShardedDataParallel with one unit per decoder layer
    (a ModuleWrapPolicy of the layer's class) and the root, `use_orig_params`, the model built
    on meta and each rank's flat shard allocated by `param_init_fn`; mixed precision through
    FSDP's MixedPrecision (parameters, gradient reduction and buffers in `compute`). Each unit's
    parameters are one flat parameter, padded to a multiple of `gpus`. The wrapper forwards
    attribute access (config, gradient checkpointing) to the model."""
    from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    with torch.device("meta"):
        model = auto.from_config(config, **kw)
    layer_class = type(decoder_layers(torch, model)[0])
    mp = (MixedPrecision(param_dtype=compute, reduce_dtype=compute, buffer_dtype=compute)
          if compute is not None else None)
    wrapped = FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({layer_class}), use_orig_params=True,
        device_id=device, mixed_precision=mp, cpu_offload=CPUOffload(offload_params=offload),
        param_init_fn=lambda m: m.to_empty(device=device, recurse=False))
    wrapped.vramlab_ranks = gpus
    return wrapped


def optimizer_label(p: dict, impl: str) -> str:
    return f"{p['train']['optimizer']}-{impl}" if p["mode"] == "train" else "none"


def infer_warm_up(torch, transformers, model, b: int, s: int, device, lkw):
    """A prefill of b × s tokens and one decode step, unmeasured."""
    with torch.no_grad():
        ids = torch.zeros((b, s), dtype=torch.long, device=device)
        cache = dynamic_cache(transformers, model.config)
        out = model(ids, use_cache=True, **cache_kw(model, cache), **mask_kw(torch, b, s, device),
                    **lkw)
        model(out.logits[:, -1:].argmax(-1), use_cache=True, **cache_kw(model, cache),
              **mask_kw(torch, b, s + 1, device), **lkw)
        del ids, cache, out


def within_memory(torch, device, run, *args, **kwargs) -> bool:
    """Runs `run(*args, **kwargs)`; False if the device ran out of memory (what it held is
    freed), True else."""
    try:
        run(*args, **kwargs)
        return True
    except torch.cuda.OutOfMemoryError:
        if device.type == "cpu":
            raise
        import gc
        gc.collect()
        torch.cuda.empty_cache()
        return False


def warm_up(torch, transformers, model, group, device, lkw, lora_impl: str = "hooks",
            lora_targets: str | None = None, lora_dropout: float = 0.0):
    """One-off costs (oneDNN/BLAS buffers, cuBLAS handles, lazily built kernels) land outside
    every measured phase: a prefill and decode at the group's largest inference shape, an
    encoder's forward at its largest encode shape, and a forward + backward at its largest
    training micro-batch shape."""
    infer = [p for p in group if p["mode"] == "infer"]
    train = [p for p in group if p["mode"] == "train"]
    encode = [p for p in group if p["mode"] == "encode"]
    if encode:
        encode_point(torch, model, max(encode, key=lambda p: (p["batch"], p["context"])), device,
                     NullMeter())
    if infer:
        # Largest shape first; one past the device's memory is skipped (its point records
        # `oom` when measured), and the next smaller one warms up instead.
        shapes = sorted({(p["batch"], max(p["prompt_len"], 1)) for p in infer}, reverse=True)
        for b, s in shapes:
            if within_memory(torch, device, infer_warm_up, torch, transformers, model, b, s, device,
                             lkw):
                break
    if train and device.type != "cpu":
        # On a GPU, a full-model forward and backward can exceed memory that the point itself
        # (LoRA, checkpointing) fits in: rehearse the largest point as it will run, or the
        # largest that fits the device.
        for big in sorted(train, key=lambda p: (p["batch"] // p["train"]["grad_accum"], p["context"]),
                          reverse=True):
            if within_memory(torch, device, train_point, torch, model, big, device, NullMeter(),
                             "foreach", rehearse=True, lora_impl=lora_impl,
                             lora_targets=lora_targets, lora_dropout=lora_dropout):
                break
            model.zero_grad(set_to_none=True)
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
        # A stack that needs a mask (needs_mask) attends over a StaticCache's whole capacity.
        static = p["kv_cache"] == "preallocated"
        out = model(ids, **cache_kw(model, cache), use_cache=True, **position_kw(model, pos),
                    **mask_kw(torch, b, p["context"] if static else plen, device), **lkw)
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
                        **position_kw(model, torch.tensor([cur], device=device)),
                        **mask_kw(torch, b, p["context"] if static else cur + 1, device), **lkw)
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


def encode_point(torch, model, p, device, meter):
    """An encoder's inference (`mode = "encode"`), as harness/src/workload/inference.rs's encode:
    one forward of the base encoder (BertModel under BertForMaskedLM: no MLM head) over seeded
    ids, mean-pooled as vramlab's bert encodes, no gradients; the `forward` row and its `total`
    envelope (the same figures)."""
    b, s = p["batch"], p["context"]
    g = torch.Generator(device="cpu").manual_seed(42)
    with torch.no_grad():
        started = meter.start()
        ids = torch.randint(0, model.config.vocab_size, (b, s), generator=g).to(device)
        out = model.base_model(ids, **mask_kw(torch, b, s, device)).last_hidden_state.mean(1)
        del ids, out
        mem, ms = meter.finish(started)
    return [dict(phase=ph, step=0, kv_tokens=0, elapsed_ms=ms, **mem) for ph in ("forward", "total")]


LORA_ALPHA = 8.0  # PEFT's default, as in harness/src/model/nn/layers.rs
LORA_TARGETS = {"gpt2": ("c_attn",), "bert": ("query", "value"),
                "phi3": ("qkv_proj",)}  # others: q_proj, v_proj


def lora_modules(model):
    targets = LORA_TARGETS.get(model.config.model_type, ("q_proj", "v_proj"))
    return [(n, m) for n, m in model.named_modules() if n.split(".")[-1] in targets]


def lora_dims(mod) -> tuple[int, int]:
    """(fan_in, fan_out): transformers' GPT-2 Conv1D stores (in, out); nn.Linear (out, in)."""
    w = mod.weight
    return (w.shape[0], w.shape[1]) if type(mod).__name__ == "Conv1D" else (w.shape[1], w.shape[0])


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

        # (`scale` is the same for every module: noqa B023.)
        def hook(m, inp, out):
            return out + (inp[0] @ m.lora_A.t().to(inp[0].dtype)
                          @ m.lora_B.t().to(inp[0].dtype)) * scale  # noqa: B023
        added.append((mod, mod.register_forward_hook(hook)))
    return added


# `--lora-targets` words (harness/src/vocab/training.rs, LoraTarget) as peft's module names;
# `experts` is the stacked expert tensors of transformers >= 5, through `target_parameters`.
PEFT_MODULES = {"q": ("q_proj", "q_a_proj", "q_b_proj"), "k": ("k_proj", "kv_a_proj_with_mqa",
                "kv_b_proj"), "v": ("v_proj", "kv_a_proj_with_mqa", "kv_b_proj"),
                "o": ("o_proj",), "gate": ("gate_proj",), "up": ("up_proj",),
                "down": ("down_proj",)}
FUSED_MODULES = {"q": "qkv_proj", "k": "qkv_proj", "v": "qkv_proj", "gate": "gate_up_proj",
                 "up": "gate_up_proj"}


def peft_targets(model, targets: str) -> tuple[list, list]:
    """(target_modules, target_parameters) of a `--lora-targets` list, among the model's own
    module and parameter names."""
    names = {n.split(".")[-1] for n, _ in model.named_modules()}
    words = targets.split(",")
    modules = {m for w in words if w != "experts"
               for m in PEFT_MODULES[w] + ((FUSED_MODULES[w],) if w in FUSED_MODULES else ())}
    params = sorted({".".join(n.split(".")[-2:]) for n, _ in model.named_parameters()
                     if "experts" in words and ".experts." in n and n.endswith(("gate_up_proj",
                                                                                 "down_proj"))})
    return sorted(modules & names), params


def add_peft_lora(model, rank: int, targets: str | None = None, dropout: float = 0.0):
    """Rank-`rank` LoRA through peft, as labs run it: `get_peft_model` with peft's own default
    target modules for the model's type (q_proj and v_proj for Llama, Mistral and Qwen2,
    c_attn for GPT-2, query and value for BERT; LORA_TARGETS where a peft release has none,
    as 0.11 for Qwen2), alpha LORA_ALPHA, dropout `dropout` (peft's default: none), and peft's
    other defaults: from 0.12 on
    the adapters of a 16-bit model are kept in f32 (`autocast_adapter_dtype`), and each
    adapter's input is cast to their dtype. Returns the peft model; `.unload()` restores the
    base model in place."""
    import peft
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as defaults
    kind = model.config.model_type
    if targets:
        modules, params = peft_targets(model, targets)
        # `target_parameters` only where experts are adapted: peft before 0.17 has no such field.
        extra = dict(target_parameters=params) if params else {}
        config = peft.LoraConfig(r=rank, lora_alpha=LORA_ALPHA, lora_dropout=dropout,
                                 target_modules=modules or None, **extra)
        return peft.get_peft_model(model, config)
    default = None if kind in defaults else list(LORA_TARGETS.get(kind, ("q_proj", "v_proj")))
    config = peft.LoraConfig(r=rank, lora_alpha=LORA_ALPHA, lora_dropout=dropout,
                             target_modules=default)
    return peft.get_peft_model(model, config)


def remove_lora(added: list):
    for mod, handle in added:
        handle.remove()
        del mod.lora_A, mod.lora_B


def compute_dtype(torch, precision: str):
    """The 16-bit compute dtype of a `mixed-*` precision; None for pure ones."""
    return {"mixed-bf16": torch.bfloat16, "mixed-f16": torch.float16}.get(precision)


def train_forward(torch, model, ids, compute, autocast: bool = False):
    """The training loss. `compute` (mixed-*): the parameters are f32 masters, and the model
    runs on their 16-bit casts (torch.func.functional_call), so that autograd brings the
    gradients back onto the masters in f32, as the harness's `to_dtype` does. `autocast`: the
    forward runs under torch.autocast(device, compute) instead, as the HF Trainer's `bf16=True`
    / `fp16=True` does (f32 weights, each matmul on autocast's 16-bit casts, norms, softmax and
    the loss in f32). Checkpointed layers need it: the casts above live for the forward only,
    while torch.utils.checkpoint re-enters the forward's autocast state for its recomputation."""
    kw = dict(labels=ids, use_cache=False)
    if needs_mask():
        kw["attention_mask"] = torch.ones_like(ids)
    if compute is None:
        return model(ids, **kw).loss
    if autocast:
        with torch.autocast(ids.device.type, dtype=compute):
            return model(ids, **kw).loss
    cast = {k: v.to(compute) for k, v in model.named_parameters()}
    return torch.func.functional_call(model, cast, (ids,), kw).loss


def mask_kw(torch, b: int, n: int, device) -> dict:
    """An all-ones attention mask over `n` positions where the stack needs one (needs_mask)."""
    if not needs_mask():
        return {}
    return {"attention_mask": torch.ones((b, n), dtype=torch.long, device=device)}


def needs_mask() -> bool:
    """Whether the forward gets an all-ones attention mask, as a tokenizer's batch carries.
    transformers before 4.40 (the torch-2.2 stack's 4.39) sizes its causal mask from the value
    of `cache_position[-1]` when no mask is passed: a device read, which the emulated GPU answers
    with zeros (docs/src/guides/emulator.md). Newer stacks size it from the shapes, and run
    without a mask as before, so their committed results stay comparable."""
    import transformers
    return older_than(transformers.__version__, 4, 40)


def make_optimizer(torch, params, kind: str, impl: str, lr: float):
    """The optimizer with its implementation chosen explicitly (torch picks the for-loop on
    CPU when left to itself)."""
    flags = {"foreach": dict(foreach=True), "for-loop": dict(foreach=False),
             "fused": dict(fused=True)}[impl]
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, **flags)
    return torch.optim.SGD(params, lr=lr, **flags)


def train_point(torch, model, p, device, meter, impl: str, rehearse: bool = False,
                lora_impl: str = "hooks", lora_targets: str | None = None,
                lora_dropout: float = 0.0):
    """Training steps as harness/src/workload/training.rs measures them: forward, backward,
    optimizer and step_total rows per step; micro-batches of batch/grad_accum, their forward and
    backward merged into one span each; `mixed-*` through train_forward (its casts, or autocast
    under `checkpointing = "layer"`). `rehearse`: one
    micro-batch's forward and backward, no optimizer. `lora_impl`: a `lora-rN` point's adapters
    as forward hooks (add_lora, vramlab's definition) or through peft (add_peft_lora, on
    `lora_targets`: vramlab's `--lora-targets`, None for peft's defaults; `lora_dropout`: peft's
    `lora_dropout`)."""
    t = p["train"]
    # FSDP's MixedPrecisionPolicy casts a sharded model's parameters itself (fully_sharded).
    compute = None if getattr(model, "vramlab_ranks", 1) > 1 else compute_dtype(torch, p["precision"])
    # Mixed precision with checkpointed layers runs under autocast (train_forward).
    amp = compute is not None and t["checkpointing"] == "layer"
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
    lora, base = [], model
    if t["trainable"].startswith("lora-r"):
        rank = int(t["trainable"][len("lora-r"):])
        if lora_impl == "peft":
            model = add_peft_lora(model, rank, lora_targets, lora_dropout)
        else:
            lora = add_lora(torch, model, rank)
    params = [q for q in model.parameters() if q.requires_grad]

    opt = None
    try:
        for step in range(1, steps + 1):
            fwd, bwd = [], []
            started_step = time.perf_counter()
            fwd_ms = bwd_ms = 0.0
            for _ in range(n):
                started = meter.start()
                ids = torch.randint(0, vocab, (micro, p["context"]), generator=g).to(device)
                loss = train_forward(torch, model, ids, compute, amp) / t["grad_accum"]
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
            for phase, m, ms in (("forward", f, fwd_ms), ("backward", b, bwd_ms),
                                 ("optimizer", opt_mem, opt_ms)):
                rows.append(dict(phase=phase, step=step, elapsed_ms=ms, **m))
            rows.append(dict(phase="step_total", step=step,
                             elapsed_ms=(time.perf_counter() - started_step) * 1e3,
                             **span(fwd[0], fwd[1:] + bwd + [opt_mem])))
    finally:
        del opt, params
        model.zero_grad(set_to_none=True)
        remove_lora(lora)
        if model is not base:
            model = model.unload()
        for q in model.parameters():
            q.requires_grad_(True)
        if frozen_inputs:
            model.disable_input_require_grads()
        if t["checkpointing"] == "layer":
            model.gradient_checkpointing_disable()
        model.eval()
    return rows
