"""The feature_* columns: features::infer / encode / train of harness/src/features.rs."""


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
    """features::infer / encode / train of harness/src/features.rs, from the built model's
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
    if p["mode"] == "encode":
        # features::encode: the layers' outputs in the weights' dtype, no cache, no logits.
        f.update(feature_kv_bytes=0, feature_act_bytes=b * p["context"] * hl * wb,
                 feature_logits_bytes=0, feature_optimizer_bytes=0)
        return f
    held = p["context"] if p["kv_cache"] == "preallocated" else kv_tokens
    s = 1 if phase == "decode" else p["prompt_len"]
    f.update(feature_kv_bytes=shape["kv_per_token"] * wb * held * b, feature_act_bytes=b * s * hl * wb,
             feature_logits_bytes=b * shape["vocab"] * wb, feature_optimizer_bytes=0)
    return f
