//! What transformers' layers save for the backward under PyTorch, per token: the default of
//! [`Architecture::torch_saved_per_token`](super::arch::Architecture::torch_saved_per_token)
//! for the llama family, the MoE layers', and what peft's LoRA adapters add.
use super::config::Moe;
use super::Config;
use crate::vocab::LoraTargets;

/// Bytes per token that one llama-family decoder layer of transformers (Llama, Mistral, Qwen2,
/// Qwen3, Phi-3) keeps for the backward under PyTorch: the tensors autograd saves, read from the
/// layer's code and checked tensor by tensor against `torch.autograd.graph.saved_tensors_hooks`
/// on the emulated GPU (docs/src/concepts/fit-and-estimate.md, "Training activations under
/// PyTorch"). `e` is the activation width in bytes, `lora` the adapters' rank.
/// - Each RMSNorm upcasts its input to f32 (4·h, saved by `pow` and the product), saves its
///   f32 reciprocal root (4 B) and, where its weight trains, the 16-bit cast of the normalized
///   input (e·h; none at f32, where the cast is the input itself); its output (e·h) is saved by
///   the projections that follow where they train.
/// - Attention (SDPA without a mask, flash or memory-efficient): the rotated q and k, v, the
///   output (which is `o_proj`'s input) and the f32 log-sum-exp per head. Rotary embedding saves
///   only its cos and sin, shared by the layers. A fused `qkv_proj` keeps its whole output,
///   whose view v is. Qwen3's per-head q/k norms save an RMSNorm's tensors over q and k.
/// - The gated MLP: the gate's output (for SiLU), SiLU's output and the up projection's (for
///   the product) and the product (`down_proj`'s input): 4·e·I, or 3·e·I with `down_proj` frozen.
/// - LoRA on the query and value projections (the fused `qkv_proj`): each adapter saves x·Aᵀ
///   (r·e); with the base frozen, a projection saves its input only through its adapter.
pub fn llama_saved_per_token(c: &Config, e: u64, lora: Option<u64>) -> u64 {
    llama_saved_per_token_in(c, e, lora, LoraTargets::DEFAULT, false, false)
}

/// [`llama_saved_per_token`] with the adapters on `targets` (`--lora-targets`). Beyond the
/// default's: each adapted module saves x·Aᵀ (r·e), and its input where the frozen projection
/// does not save it already: the attention's output for o (e·heads·head_dim), the
/// post-attention norm's output for gate and up (e·h), the product for down (e·I); on the
/// routed experts, each row's gathered input (e·h), which the merged weight's gradient needs
/// (the merged weights themselves: [`lora_merged_experts`]). Adapters in the activations'
/// dtype, as vramlab's own `lora-rN` and the calibration corpus's; with `f32_adapters`, as
/// peft ≥ 0.12 keeps them on a 16-bit model: each adapter casts its input to f32 and saves
/// that copy (4·in, one per adapter even where q, k and v share their input) and x·Aᵀ in f32
/// (4·r), and nothing else saves the frozen projections' 16-bit inputs.
///
/// With `dropout` (peft's `lora_dropout` > 0), each adapter's input goes through its own
/// dropout, whose CUDA kernel keeps a 1-byte mask (1·in). With f32 adapters that is all: the
/// dropout's f32 output replaces the f32 copy as what x·Aᵀ saves. With 16-bit adapters each
/// adapter also saves its own dropout output (e·in), and the inputs that only the adapters
/// saved go: the input norm's output (q, k, v), the post-attention norm's (gate, up), the
/// product (down); the attention's output stays (the attention saves it). Measured with
/// `torch.autograd.graph.saved_tensors_hooks` on the emulated GPU (peft 0.11 and 0.21, one
/// Mistral layer, each target alone and together; docs/src/concepts/fit-and-estimate.md).
pub fn llama_saved_per_token_in(
    c: &Config,
    e: u64,
    lora: Option<u64>,
    targets: LoraTargets,
    f32_adapters: bool,
    dropout: bool,
) -> u64 {
    use crate::vocab::LoraTarget as T;
    let u = |v: usize| v as u64;
    let (h, i, heads, kv_heads) = (
        u(c.hidden_size),
        u(c.intermediate_size),
        u(c.num_heads),
        u(c.num_kv_heads),
    );
    let (q, kv) = (heads * u(c.head_dim), kv_heads * u(c.head_dim));
    let trained = lora.is_none();
    let norm = |n: u64, rows: u64| rms_norm_saved(n, rows, e, trained);
    let on = |t: T| !trained && targets.contains(t);
    // The width of the MLP LoRA's gate/up/down adapt: the dense one's, or the shared
    // expert's where every layer is sparse (none: a MoE without either, Mixtral's).
    let mlp_width = match &c.moe {
        Some(m) if m.dense_layers.is_empty() => m.shared_size as u64,
        _ => i,
    };
    let has_mlp = mlp_width > 0;
    // The adapted modules' input widths.
    let adapted: Vec<u64> = if trained {
        vec![]
    } else if targets.is_default() {
        vec![h; if c.fused_qkv { 1 } else { 2 }]
    } else {
        let any = |ts: &[T]| ts.iter().any(|&t| on(t));
        let count = |ts: &[T]| ts.iter().filter(|&&t| on(t)).count();
        let attention = if c.fused_qkv {
            usize::from(any(&[T::Q, T::K, T::V]))
        } else {
            count(&[T::Q, T::K, T::V])
        };
        let gate_up = match (has_mlp, c.fused_gate_up) {
            (false, _) => 0,
            (true, true) => usize::from(any(&[T::Gate, T::Up])),
            (true, false) => count(&[T::Gate, T::Up]),
        };
        let mut w = vec![h; attention + gate_up];
        if on(T::O) {
            w.push(q);
        }
        if has_mlp && on(T::Down) {
            w.push(mlp_width);
        }
        w
    };
    let r = lora.unwrap_or(0);
    // The MLP inputs only 16-bit adapters save (the frozen projections save none): the
    // post-attention norm's output (gate, up) and the product (down).
    let mlp_inputs = if has_mlp && (on(T::Gate) || on(T::Up)) {
        e * h
    } else {
        0
    } + if has_mlp && on(T::Down) {
        e * mlp_width
    } else {
        0
    };
    let (adapters, inputs, input_norm) = if f32_adapters {
        // Each adapter's f32 copy of its input and its f32 x·Aᵀ; no 16-bit input is saved.
        let copies: u64 = adapted.iter().map(|&w| 4 * w + 4 * r).sum();
        (copies, 0, if trained { e * h } else { 0 })
    } else {
        // x·Aᵀ each, and the inputs the frozen projections do not save: the input norm's
        // output (q, k, v), the attention's output (o), the post-attention norm's output
        // (gate, up), the product (down).
        let inputs = if on(T::O) { e * q } else { 0 } + mlp_inputs;
        (adapted.len() as u64 * r * e, inputs, e * h)
    };
    let norms = 2 * norm(h, 1)
        // The input norm's output, saved by q/k/v (or, frozen, by the adapters'
        // first matmul); the post-attention norm's, saved by gate and up where they train.
        + input_norm
        + if trained { e * h } else { 0 };
    let qk_norm = if c.qk_norm {
        norm(q, heads) + norm(kv, kv_heads)
    } else {
        0
    };
    let v = if c.fused_qkv { q + 2 * kv } else { kv };
    let attention = e * (q + kv + v + q) + 4 * heads;
    let dense = if trained { 4 * e * i } else { 3 * e * i };
    let moe = |m: &Moe| {
        moe_saved_per_token(m, h, e, trained)
            + if on(T::Experts) {
                m.top_k as u64 * e * h
            } else {
                0
            }
    };
    // A model with sparse and dense layers: the larger of the two, for every layer.
    let mlp = match &c.moe {
        Some(m) if m.dense_layers.is_empty() => moe(m),
        Some(m) => dense.max(moe(m)),
        None => dense,
    } + inputs;
    let dropout = if dropout && !trained {
        let masks: u64 = adapted.iter().sum();
        if f32_adapters {
            masks
        } else {
            let qkv = targets.is_default() || [T::Q, T::K, T::V].iter().any(|&t| on(t));
            let freed = if qkv { e * h } else { 0 } + mlp_inputs;
            (e + 1) * masks - freed
        }
    } else {
        0
    };
    norms + qk_norm + attention + mlp + adapters + dropout
}

/// Bytes of the merged expert weights (W + B·A, in the weights' `e` bytes) that peft's
/// `target_parameters` builds in each sparse layer's forward (`_LoraFactorsProxy`'s
/// `baddbmm`) and autograd keeps for the backward, where LoRA adapts the routed experts:
/// every expert's gate/up and down, E · 3 · hidden · expert_size a layer. The backward adds
/// one layer's gradient of them. Zero without `experts` in `targets`.
pub fn lora_merged_experts(c: &Config, e: u64, targets: LoraTargets) -> u64 {
    match &c.moe {
        Some(m) if targets.contains(crate::vocab::LoraTarget::Experts) => {
            3 * m.experts as u64 * c.hidden_size as u64 * m.expert_size as u64 * e
        }
        _ => 0,
    }
}

/// Bytes per token a sparse MoE layer of transformers (its default grouped experts, which hold
/// k rows a token whatever the routing) keeps for the backward, in place of the dense MLP's,
/// read from `grouped_mm_experts_forward` (not yet checked tensor by tensor):
/// - the router: softmax's f32 output (4·E), top-k's int64 indices (8·k) and the
///   renormalization's operands (4·k + 4);
/// - per routed row (k a token): the gather's index (8), the permuted input (e·h, saved by the
///   up projection where it trains), the gate/up output (2·e·f, which SiLU's input and the
///   product's `up` are views of), SiLU's output and the product (e·f each), and the down
///   projection's output with its routing weight (e·h + 4) for the weighting;
/// - a shared expert as a dense MLP, and its sigmoid gate's output and product (e·h + e).
pub fn moe_saved_per_token(m: &Moe, h: u64, e: u64, trained: bool) -> u64 {
    let (k, f) = (m.top_k as u64, m.expert_size as u64);
    let router = 4 * m.experts as u64 + 8 * k + 4 * k + 4;
    let input = if trained { e * h } else { 0 };
    let row = 8 + input + 2 * e * f + 2 * e * f + e * h + 4;
    let s = m.shared_size as u64;
    let shared = if s == 0 {
        0
    } else {
        (if trained { 4 } else { 3 }) * e * s + if m.shared_gate { e * h + e } else { 0 }
    };
    router + k * row + shared
}

/// What transformers' RMSNorm over `n` features (`rows` rows per token) saves for the backward
/// per token: its f32 input, its f32 reciprocal root per row and, where its weight trains, the
/// 16-bit cast of the normalized input (none at f32, where the cast is the input itself).
pub(super) fn rms_norm_saved(n: u64, rows: u64, e: u64, trained: bool) -> u64 {
    let cast = if e < 4 && trained { e * n } else { 0 };
    4 * n + 4 * rows + cast
}
