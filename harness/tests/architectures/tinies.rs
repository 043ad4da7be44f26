//! The tiny real-shaped variants of tests/architectures.rs, with their hand-derived counts,
//! and the per-layer hand counts the published presets use.

/// A decoder layer of the llama family, by hand: q (h·hd × d), k and v (kv·hd × d each),
/// o (d × h·hd), gate/up/down (3 · f × d) and two RMSNorms (2d).
pub const fn llama_layer(d: u64, f: u64, h: u64, kv: u64, hd: u64) -> u64 {
    d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f + 2 * d
}

/// A GPT-2-shaped block, by hand: c_attn (d → d + 2·kvw, with bias), c_proj (d → d, bias),
/// c_fc (d → f, bias), mlp c_proj (f → d, bias), two LayerNorms (weight and bias).
pub const fn gpt2_block(d: u64, f: u64, kvw: u64) -> u64 {
    (d * (d + 2 * kvw) + d + 2 * kvw) + (d * d + d) + (d * f + f) + (f * d + d) + 4 * d
}

/// The tiny variants: the published structure at small dims (explicit head_dim wider than
/// d / heads and GQA for Qwen3; fused projections, untied head and a sliding window for
/// Phi-3; multi-query attention, prefixed nn.Linear names and a tied head for StarCoder).
pub const QWEN3: &str = r#"{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
 "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
 "max_position_embeddings": 128, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
 "attention_bias": false, "sliding_window": null, "use_sliding_window": false,
 "tie_word_embeddings": true}"#;
pub const PHI3: &str = r#"{"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
 "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128,
 "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "sliding_window": 47,
 "tie_word_embeddings": false}"#;
pub const BIGCODE: &str = r#"{"architectures": ["GPTBigCodeForCausalLM"],
 "model_type": "gpt_bigcode", "activation_function": "gelu_pytorch_tanh", "vocab_size": 256,
 "n_embd": 64, "n_head": 4, "n_inner": 256, "n_layer": 2, "n_positions": 128,
 "multi_query": true, "layer_norm_epsilon": 1e-05}"#;

/// Mixture-of-experts variants: Mixtral's naming (`block_sparse_moe`, w1/w3/w2), 4 experts
/// top-2; Qwen2-MoE's shared expert with its gate, q/k/v biases, no renormalization and a
/// dense layer (`mlp_only_layers`); Qwen3-MoE's 8 experts top-2, renormalized, q/k norms,
/// head_dim wider than d / heads and a tied head.
pub const MIXTRAL: &str = r#"{"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
 "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
 "rope_theta": 1000000.0, "rms_norm_eps": 1e-05, "sliding_window": null,
 "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": false}"#;
pub const QWEN2_MOE: &str = r#"{"architectures": ["Qwen2MoeForCausalLM"],
 "model_type": "qwen2_moe", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
 "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
 "shared_expert_intermediate_size": 48, "norm_topk_prob": false, "decoder_sparse_step": 1,
 "mlp_only_layers": [1], "use_sliding_window": false, "tie_word_embeddings": false}"#;
pub const QWEN3_MOE: &str = r#"{"architectures": ["Qwen3MoeForCausalLM"],
 "model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
 "max_position_embeddings": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
 "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
 "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
 "attention_bias": false, "use_sliding_window": false, "tie_word_embeddings": true}"#;

/// A sparse MoE decoder layer by hand: the llama layer with `e` routed experts of size `f`
/// in place of its MLP (e − 1 more gate/up/down triples) and the router (e × d).
pub const fn moe_layer(d: u64, f: u64, h: u64, kv: u64, hd: u64, e: u64) -> u64 {
    llama_layer(d, f, h, kv, hd) + (e - 1) * 3 * d * f + e * d
}

/// Gemma 2 (sliding layer 0 with a window of 8, full layer 1, soft-capping, four norms a
/// layer, tied head) and Gemma 3's text decoder (q/k norms, RoPE θ 10,000 on the sliding
/// layer and 1,000,000 on the full one).
pub const GEMMA2: &str = r#"{"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
 "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "max_position_embeddings": 128, "rope_theta": 10000.0, "rms_norm_eps": 1e-06,
 "query_pre_attn_scalar": 24, "sliding_window": 8, "attn_logit_softcapping": 50.0,
 "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
 "tie_word_embeddings": true}"#;
pub const GEMMA3: &str = r#"{"architectures": ["Gemma3ForCausalLM"],
 "model_type": "gemma3_text", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "max_position_embeddings": 128, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
 "rms_norm_eps": 1e-06, "query_pre_attn_scalar": 16, "sliding_window": 8,
 "layer_types": ["sliding_attention", "full_attention"],
 "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true}"#;

/// gpt-oss: biased attention with sinks, a sliding layer (window 8) then a full one, 4
/// stacked experts of 32 (gate and up interleaved, clamped GLU), top-2 with a biased router.
pub const GPT_OSS: &str = r#"{"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
 "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "max_position_embeddings": 128, "rope_theta": 150000.0,
 "rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}, "rms_norm_eps": 1e-05,
 "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
 "num_local_experts": 4, "num_experts_per_tok": 2, "swiglu_limit": 7.0,
 "attention_bias": true, "tie_word_embeddings": false}"#;

/// Llama 4's text decoder: layer 0 rotates in pairs, L2-normalizes q and k and attends within
/// chunks of 8 (so the 12-token reference prompt spans two), with a MoE of 4 stacked experts
/// of 32, top-2 scaling each expert's input by its sigmoid, and a shared expert of 32; layer 1
/// is NoPE, attends to every token with its queries scaled from position 3 on (floor_scale 4),
/// and has a dense MLP of 96 (`intermediate_size_mlp`). Untied head.
pub const LLAMA4: &str = r#"{"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text",
 "vocab_size": 256, "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 96,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "max_position_embeddings": 128, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
 "num_local_experts": 4, "num_experts_per_tok": 2, "moe_layers": [0],
 "no_rope_layers": [1, 0], "attention_chunk_size": 8, "use_qk_norm": true,
 "attn_temperature_tuning": true, "floor_scale": 4, "attn_scale": 0.1,
 "tie_word_embeddings": false}"#;

/// A tiny variant with its hand-derived facts.
pub struct Tiny {
    pub name: &'static str,
    pub json: &'static str,
    pub params: u64,
    pub tensors: u64,
    /// K and V elements per token: 2 · L · n_kv · head_dim.
    pub kv_elems: u64,
    /// Layers that attend within a window, and the window (0: none).
    pub sliding: (u64, u64),
    /// LoRA rank-1 parameters: Σ over the target modules of (in + out).
    pub lora_per_rank: u64,
    /// Modules LoRA adapts (each gets an A and a B).
    pub lora_modules: u64,
}

pub const TINIES: [Tiny; 10] = [
    // 2 layers of (q 128×64, k and v 64×64, o 64×128, mlp 3×96×64, norms 128, q/k norms
    // 2×32), tied embedding 256×64, final norm. LoRA on q (64 → 128) and v (64 → 64).
    Tiny {
        name: "qwen3",
        json: QWEN3,
        params: 256 * 64 + 2 * (llama_layer(64, 96, 4, 2, 32) + 2 * 32) + 64,
        tensors: 1 + 2 * 11 + 1,
        kv_elems: 2 * 2 * 2 * 32,
        sliding: (0, 0),
        lora_per_rank: 2 * ((64 + 128) + (64 + 64)),
        lora_modules: 2 * 2,
    },
    // 2 layers of (qkv 192×64, o 64×64, gate_up 256×64, down 64×128, norms), embedding and
    // head 256×64 each, final norm. LoRA on the fused qkv_proj (64 → 192).
    Tiny {
        name: "phi3",
        json: PHI3,
        params: 2 * 256 * 64 + 2 * llama_layer(64, 128, 4, 4, 16) + 64,
        tensors: 2 + 2 * 6 + 1,
        kv_elems: 2 * 2 * 4 * 16,
        sliding: (0, 0),
        lora_per_rank: 2 * (64 + 192),
        lora_modules: 2,
    },
    // wte 256×64, wpe 128×64, 2 blocks with c_attn 64 → 64 + 2×16 (one K/V head of 16),
    // ln_f. LoRA on c_attn (64 → 96).
    Tiny {
        name: "gpt_bigcode",
        json: BIGCODE,
        params: 256 * 64 + 128 * 64 + 2 * gpt2_block(64, 256, 16) + 2 * 64,
        tensors: 2 + 2 * 12 + 2,
        kv_elems: 2 * 2 * 16,
        sliding: (0, 0),
        lora_per_rank: 2 * (64 + 96),
        lora_modules: 2,
    },
    // Embedding and head 256×64 each, final norm; 2 MoE layers of (q 64×64, k and v 32×64,
    // o 64×64, norms, router 4×64, 4 experts of gate/up/down 96×64). Tensors: 2 + 2 × (2
    // norms + 4 projections + router + 12 expert matrices) + 1. LoRA on q (64 → 64) and v
    // (64 → 32).
    Tiny {
        name: "mixtral",
        json: MIXTRAL,
        params: 2 * 256 * 64 + 2 * moe_layer(64, 96, 4, 2, 16, 4) + 64,
        tensors: 2 + 2 * 19 + 1,
        kv_elems: 2 * 2 * 2 * 16,
        sliding: (0, 0),
        lora_per_rank: 2 * ((64 + 64) + (64 + 32)),
        lora_modules: 2 * 2,
    },
    // Layer 0 sparse: 4 experts of 32, the shared expert (3 × 48×64) and its gate (1×64);
    // layer 1 dense (`mlp_only_layers`, f = 128). Both with q/k/v biases (64 + 2 × 32).
    // Tensors: 2 + (2 + 4 + 3 + router + 12 + 3 + gate = 26) + (2 + 4 + 3 + 3 = 12) + 1.
    Tiny {
        name: "qwen2_moe",
        json: QWEN2_MOE,
        params: 2 * 256 * 64
            + moe_layer(64, 32, 4, 2, 16, 4)
            + 3 * 64 * 48
            + 64
            + llama_layer(64, 128, 4, 2, 16)
            + 2 * (64 + 2 * 32)
            + 64,
        tensors: 2 + 26 + 12 + 1,
        kv_elems: 2 * 2 * 2 * 16,
        sliding: (0, 0),
        lora_per_rank: 2 * ((64 + 64) + (64 + 32)),
        lora_modules: 2 * 2,
    },
    // 2 MoE layers of (q 128×64, k and v 64×64, o 64×128, q/k norms 2×32, router 8×64,
    // 8 experts of 32), tied embedding. Tensors: 1 + 2 × (2 + 4 + 2 + 1 + 24) + 1.
    Tiny {
        name: "qwen3_moe",
        json: QWEN3_MOE,
        params: 256 * 64 + 2 * (moe_layer(64, 32, 4, 2, 32, 8) + 2 * 32) + 64,
        tensors: 1 + 2 * 33 + 1,
        kv_elems: 2 * 2 * 2 * 32,
        sliding: (0, 0),
        lora_per_rank: 2 * ((64 + 128) + (64 + 64)),
        lora_modules: 2 * 2,
    },
    // Tied embedding 256×64, final norm; 2 layers of the llama layer (q 64×64, k and v 32×64,
    // o 64×64, gate/up/down 96×64, 2 norms) plus 2 more norms (pre- and post-feedforward).
    // Tensors: 1 + 2 × (4 norms + 4 projections + 3 MLP) + 1.
    Tiny {
        name: "gemma2",
        json: GEMMA2,
        params: 256 * 64 + 2 * (llama_layer(64, 96, 4, 2, 16) + 2 * 64) + 64,
        tensors: 1 + 2 * 11 + 1,
        kv_elems: 2 * 2 * 2 * 16,
        sliding: (1, 8),
        lora_per_rank: 2 * ((64 + 64) + (64 + 32)),
        lora_modules: 2 * 2,
    },
    // Gemma 2's layer plus q/k norms (2 × 16) a layer.
    Tiny {
        name: "gemma3_text",
        json: GEMMA3,
        params: 256 * 64 + 2 * (llama_layer(64, 96, 4, 2, 16) + 2 * 64 + 2 * 16) + 64,
        tensors: 1 + 2 * 13 + 1,
        kv_elems: 2 * 2 * 2 * 16,
        sliding: (1, 8),
        lora_per_rank: 2 * ((64 + 64) + (64 + 32)),
        lora_modules: 2 * 2,
    },
    // Embedding and head 256×64, final norm; 2 layers of the llama layer with one expert's
    // 3 × 32×64 as its MLP, plus: q/k/v/o biases (64 + 32 + 32 + 64), 4 sinks, the router
    // (4×64 and 4), 3 more experts and every expert's biases (2 × 32 + 64). Tensors: 2 + 2 ×
    // (2 norms + 4 projections + 4 biases + sinks + router and its bias + 4 expert stacks) + 1.
    Tiny {
        name: "gpt_oss",
        json: GPT_OSS,
        params: 2 * 256 * 64
            + 2 * (llama_layer(64, 32, 4, 2, 16)
                + 192
                + 4
                + (4 * 64 + 4)
                + 3 * 3 * 64 * 32
                + 4 * (2 * 32 + 64))
            + 64,
        tensors: 2 + 2 * 17 + 1,
        kv_elems: 2 * 2 * 2 * 16,
        sliding: (1, 8),
        lora_per_rank: 2 * ((64 + 64) + (64 + 32)),
        lora_modules: 2 * 2,
    },
    // Embedding and head 256×64, final norm. Layer 0: the llama layer with the shared
    // expert's 3 × 32×64 as its MLP, 4 routed experts (gate_up 4×64×64, down 4×32×64) and the
    // router 4×64; layer 1: the llama layer with a 96-wide MLP. Tensors: 2 + (2 norms + 4
    // projections + 2 expert stacks + router + 3 shared) + (2 + 4 + 3) + 1. The chunked layer
    // holds at most its chunk of 8.
    Tiny {
        name: "llama4",
        json: LLAMA4,
        params: 2 * 256 * 64
            + llama_layer(64, 32, 4, 2, 16)
            + 4 * 3 * 64 * 32
            + 4 * 64
            + llama_layer(64, 96, 4, 2, 16)
            + 64,
        tensors: 2 + 12 + 9 + 1,
        kv_elems: 2 * 2 * 2 * 16,
        sliding: (1, 8),
        lora_per_rank: 2 * ((64 + 64) + (64 + 32)),
        lora_modules: 2 * 2,
    },
];

impl Tiny {
    /// K and V elements one sequence holds after `tokens` tokens (both tinies have 2 layers):
    /// every token in a full layer, at most the window in a sliding one.
    pub fn kv_elems_at(&self, tokens: u64) -> u64 {
        let (sliding, window) = self.sliding;
        let held = |l: u64| {
            if l < sliding {
                tokens.min(window)
            } else {
                tokens
            }
        };
        (0..2).map(|l| self.kv_elems / 2 * held(l)).sum()
    }
}
