use super::*;
use serde_json::json;
use std::path::Path;

fn smollm2() -> Value {
    json!({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
           "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "max_position_embeddings": 8192, "rope_theta": 100000.0,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": true})
}

#[test]
fn smollm2_param_count_matches_the_gguf() {
    let c = Config::from_json(Path::new("c.json"), &smollm2()).unwrap();
    assert_eq!(c.head_dim, 64);
    // docs/src/reference/architectures.md: the GGUF holds 134,515,008 parameters.
    assert_eq!(c.param_count(), 134_515_008);
    // 2 · 30 · 3 · 64 · 4 B = 46,080 B per token in f32.
    assert_eq!(c.kv_bytes_per_token(4).get(), Some(46_080));
    assert_eq!(c.tensor_count(), 1 + 30 * 9 + 1);
}

#[test]
fn missing_key_names_it() {
    let mut v = smollm2();
    v.as_object_mut().unwrap().remove("num_hidden_layers");
    let e = Config::from_json(Path::new("x/config.json"), &v).unwrap_err();
    assert_eq!(
        e.to_string(),
        "x/config.json: missing config key `num_hidden_layers`"
    );
}

#[test]
fn unknown_architecture() {
    let mut v = smollm2();
    v["model_type"] = json!("mamba");
    let e = Config::from_json(Path::new("c.json"), &v).unwrap_err();
    assert!(e.to_string().contains("unknown architecture"), "{e}");
}

#[test]
fn minilm_and_gpt2_counts() {
    let bert = json!({"model_type": "bert", "vocab_size": 30522, "hidden_size": 384,
        "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 12,
        "max_position_embeddings": 512, "type_vocab_size": 2});
    let c = Config::from_json(Path::new("c.json"), &bert).unwrap();
    // all-MiniLM-L6-v2: 22,713,216 parameters (its model card says 22.7M).
    assert_eq!(c.param_count(), 22_713_216);
    let back = Config::from_json(Path::new("c.json"), &c.to_hf_json()).unwrap();
    assert_eq!(back, c);
    let gpt2 = json!({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768,
        "n_layer": 12, "n_head": 12, "n_positions": 1024});
    let g = Config::from_json(Path::new("c.json"), &gpt2).unwrap();
    // GPT-2 small: 124,439,808 parameters.
    assert_eq!(g.param_count(), 124_439_808);
    assert_eq!(
        Config::from_json(Path::new("c.json"), &g.to_hf_json()).unwrap(),
        g
    );
}

#[test]
fn qwen2_has_qkv_bias_and_roundtrips() {
    let mut v = smollm2();
    v["model_type"] = json!("qwen2");
    let c = Config::from_json(Path::new("c.json"), &v).unwrap();
    assert!(c.qkv_bias && !c.o_bias);
    let back = Config::from_json(Path::new("c.json"), &c.to_hf_json()).unwrap();
    assert_eq!(back, c);
}
