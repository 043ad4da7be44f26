use super::*;
use serde_json::json;

/// A small llama (hidden 64, MLP 128, 2 layers, 4 heads of 16 with 2 KV heads, vocabulary
/// 256, untied head) with `quantization_config` `q`. Per layer the matrices (out, in) are q
/// (64, 64), k and v (32, 64), o (64, 64), gate and up (128, 64), down (64, 128): 36,864
/// weights; outside them 2 · 64 of norms a layer, the embedding and head (2 · 256 · 64) and
/// the final norm: 33,088 dense elements, 66,176 B in bf16.
fn plan(q: Value) -> Plan {
    let v = json!({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false, "quantization_config": q});
    let path = Path::new("tiny/config.json");
    let cfg = Config::from_json(path, &v).unwrap();
    let k = Checkpoint::from_config_json(path, &v).unwrap().unwrap();
    k.plan(&cfg, 2).unwrap()
}
const DENSE: u64 = 66_176;
/// Σ over a layer's matrices of (in, out).
const MATRICES: [(u64, u64); 7] = [
    (64, 64),
    (64, 32),
    (64, 32),
    (64, 64),
    (64, 128),
    (64, 128),
    (128, 64),
];

#[test]
fn mxfp4_quantizes_what_is_not_excluded() {
    // gpt-oss's exclusions: only the MLP is MXFP4, 2 · (3 · 8,192) = 49,152 weights at
    // 1/2 + 1/32 B; the attention's 2 · 12,288 stay bf16.
    let p = plan(json!({"quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
            "model.embed_tokens", "lm_head"]}));
    assert_eq!(p.quantized_bytes, 49_152 / 2 + 49_152 / 32);
    assert_eq!(p.dense_bytes, DENSE + 2 * 24_576);
    assert_eq!((p.quantized, p.what()), (6, "linears"));
    assert_eq!(p.dequant_bytes(2), 0);
}

#[test]
fn fp8_blocks_add_an_f32_scale_each() {
    // 32 × 32 blocks: q and o 2·2, k and v 1·2, gate and up 4·2, down 2·4: 36 a layer.
    let p = plan(json!({"quant_method": "fp8", "fmt": "e4m3",
        "weight_block_size": [32, 32]}));
    assert_eq!(p.quantized_bytes, 2 * (36_864 + 36 * 4));
    assert_eq!(p.dense_bytes, DENSE);
    // DeepSeek-V3's 128 × 128: one block a matrix here.
    let p = plan(json!({"quant_method": "fp8", "weight_block_size": [128, 128]}));
    assert_eq!(p.quantized_bytes, 2 * (36_864 + 7 * 4));
}

/// AWQ and GPTQ's group terms: Σ (in / g) · out zeros at bits/8 B and scales at 2 B.
fn groups(g: impl Fn(u64) -> u64) -> u64 {
    MATRICES.iter().map(|&(i, o)| g(i) * o).sum()
}

#[test]
fn awq_gemm_by_hand() {
    let p = plan(json!({"quant_method": "awq", "bits": 4, "group_size": 32,
        "zero_point": true, "version": "gemm"}));
    // qweight 36,864 / 2; qzeros (in/32)·out/2 and scales (in/32)·out·2: 1,152 groups·out.
    assert_eq!(groups(|i| i / 32), 1_152);
    assert_eq!(p.quantized_bytes, 2 * (36_864 / 2 + 1_152 / 2 + 1_152 * 2));
    assert_eq!(p.dense_bytes, DENSE);
    // Dequantized per matmul: the largest matrix, 128 · 64, in the compute dtype.
    assert_eq!(p.dequant_bytes(2), 8_192 * 2);
}

#[test]
fn gptq_by_hand() {
    // g_idx: in · 4 B a matrix, 512 inputs a layer.
    let g_idx = 512 * 4;
    let p = plan(json!({"quant_method": "gptq", "bits": 4, "group_size": 32,
        "desc_act": true, "sym": true}));
    assert_eq!(
        p.quantized_bytes,
        2 * (36_864 / 2 + 1_152 / 2 + 1_152 * 2 + g_idx)
    );
    // Per-row (group_size -1): one group of each output, Σ out = 512.
    let p = plan(json!({"quant_method": "gptq", "bits": 4, "group_size": -1}));
    assert_eq!(groups(|_| 1), 512);
    assert_eq!(
        p.quantized_bytes,
        2 * (36_864 / 2 + 512 / 2 + 512 * 2 + g_idx)
    );
    let p = plan(json!({"quant_method": "gptq", "bits": 8, "group_size": 32}));
    assert_eq!(p.quantized_bytes, 2 * (36_864 + 1_152 + 1_152 * 2 + g_idx));
}

#[test]
fn bitsandbytes_by_hand() {
    // NF4: n/2 packed, a 64 B code table, an f32 absmax per 64 (576 blocks a layer).
    let p = plan(json!({"quant_method": "bitsandbytes", "load_in_4bit": true,
        "bnb_4bit_quant_type": "nf4"}));
    assert_eq!(p.quantized_bytes, 2 * (36_864 / 2 + 7 * 64 + 576 * 4));
    // Double quantization: a byte a block, and per matrix an f32 offset, one nested f32
    // absmax (every matrix here has at most 256 blocks) and the 1 KiB dynamic map.
    let p = plan(json!({"quant_method": "bitsandbytes", "load_in_4bit": true,
        "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true}));
    assert_eq!(
        p.quantized_bytes,
        2 * (36_864 / 2 + 7 * 64 + 576 + 7 * (4 + 4 + 1024))
    );
    assert_eq!(p.format.to_string(), "nf4 double-quant");
    // LLM.int8: a byte a weight and an f32 per output row (512 a layer).
    let p = plan(json!({"quant_method": "bitsandbytes", "load_in_8bit": true,
        "llm_int8_skip_modules": ["mlp.down_proj"]}));
    assert_eq!(p.quantized_bytes, 2 * (28_672 + 448 * 4));
    assert_eq!(p.dense_bytes, DENSE + 2 * 8_192 * 2);
    assert_eq!(p.dequant_bytes(2), 0);
}

/// bitsandbytes documents its NF4 storage as 4 bits a weight plus 32/64 = 0.5 bits of
/// absmax, and with double quantization 8/64 + 32/(64·256) ≈ 0.127 bits (Dettmers et al.,
/// QLoRA §3, "Double Quantization": 0.373 bits saved a parameter): the rule here, on a
/// 4,096 × 4,096 matrix, is that to within the per-tensor tables.
#[test]
fn nf4_bits_per_weight_match_the_qlora_paper() {
    let n = 4096u64 * 4096;
    let bits = |dq| {
        let f = Format::Bnb4 {
            kind: Bnb4Kind::Nf4,
            double_quant: dq,
        };
        f.matrix_bytes(1, 4096, 4096).unwrap() as f64 * 8.0 / n as f64
    };
    assert!((bits(false) - 4.5).abs() < 1e-4, "{}", bits(false));
    assert!((bits(true) - (4.0 + 8.0 / 64.0 + 32.0 / (64.0 * 256.0))).abs() < 1e-3);
    assert!((bits(false) - bits(true) - 0.373).abs() < 1e-3);
}

#[test]
fn unknown_methods_and_keys_are_one_line() {
    let v = json!({"quantization_config": {"quant_method": "hqq"}});
    let e = Checkpoint::from_config_json(Path::new("m/config.json"), &v).unwrap_err();
    assert_eq!(
        e.to_string(),
        "m/config.json: quantization_config: quant_method `hqq` is not a format vramlab \
         knows (mxfp4, fp8, awq, gptq, bitsandbytes)"
    );
    for q in [
        json!({"quant_method": "gptq", "bits": 3}),
        json!({"quant_method": "awq", "version": "gemv"}),
        json!({"quant_method": "bitsandbytes"}),
        json!({"quant_method": "mxfp4", "modules_to_not_convert": ["a(b)"]}),
    ] {
        let v = json!({ "quantization_config": q });
        let e = Checkpoint::from_config_json(Path::new("m/config.json"), &v).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("m/config.json: quantization_config: "),
            "{e}"
        );
    }
    assert_eq!(
        Checkpoint::from_config_json(Path::new("m"), &json!({})).unwrap(),
        None
    );
}

#[test]
fn not_convert_patterns_match_as_transformers_does() {
    // gpt-oss's published list.
    let attn = "model.layers.*.self_attn";
    assert!(excludes(attn, "model.layers.3.self_attn.q_proj"));
    assert!(excludes(attn, "model.layers.3.self_attn"));
    assert!(!excludes(attn, "model.layers.3.mlp.experts"));
    assert!(excludes(
        "model.layers.*.mlp.router",
        "model.layers.0.mlp.router"
    ));
    assert!(excludes("lm_head", "lm_head"));
    // Mixtral AWQ's "gate": the router by its name's end, not `gate_proj`.
    assert!(excludes("gate", "model.layers.0.block_sparse_moe.gate"));
    assert!(!excludes("gate", "model.layers.0.mlp.gate_proj"));
    assert!(pattern("re:.*visual.*").is_some());
    assert!(pattern("layers.(1|2)").is_none());
}
