//! Bad configs and weights (safetensors, sharded index, GGUF): one line, exit 2.
use super::*;

#[test]
fn config_unknown_architecture() {
    sweep_names(
        &format!("{DIR}/config-unknown-arch.toml"),
        &format!("{DIR}/config-unknown-arch.json"),
        "unknown architecture `model_type = \"mamba\"`",
    );
}

#[test]
fn config_not_json() {
    sweep_names(
        &format!("{DIR}/config-not-json.toml"),
        &format!("{DIR}/config-not-json.json"),
        "not valid JSON: trailing comma at line 5",
    );
}

#[test]
fn config_implausible_size() {
    sweep_names(
        &format!("{DIR}/config-huge-layers.toml"),
        &format!("{DIR}/config-huge-layers.json"),
        "num_hidden_layers = 1000000000000 is implausibly large",
    );
}

#[test]
fn config_heads_not_a_multiple_of_kv_heads() {
    sweep_names(
        &format!("{DIR}/config-heads-not-multiple.toml"),
        &format!("{DIR}/config-heads-not-multiple.json"),
        "num_attention_heads (4) is not a multiple of num_key_value_heads (3)",
    );
}

#[test]
fn truncated_safetensors() {
    let bytes = std::fs::read(minilm().join("model.safetensors")).unwrap();
    let (_tmp, d) = hf_dir(|c| c, &bytes[..bytes.len() / 3]);
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "truncated safetensors file: its tensors need",
    );
}

#[test]
fn safetensors_shorter_than_its_header_length() {
    let (_tmp, d) = hf_dir(|c| c, &[1, 2, 3]);
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "shorter than its 8-byte header length",
    );
}

#[test]
fn corrupt_safetensors_header_length() {
    let mut bytes = std::fs::read(minilm().join("model.safetensors")).unwrap();
    bytes.truncate(1 << 16);
    bytes[..8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    let (_tmp, d) = hf_dir(|c| c, &bytes);
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "corrupt safetensors header length 4611686018427387904 for a file of 65536 bytes",
    );
}

#[test]
fn corrupt_safetensors_header_json() {
    let mut bytes = 16u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{\"a\": not json }");
    let (_tmp, d) = hf_dir(|c| c, &bytes);
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "safetensors header is not valid JSON",
    );
}

#[test]
fn tensor_shapes_do_not_match_the_config() {
    let bytes = std::fs::read(minilm().join("model.safetensors")).unwrap();
    let (_tmp, d) = hf_dir(
        |c| c.replace("\"intermediate_size\": 1536", "\"intermediate_size\": 1000"),
        &bytes,
    );
    decode(
        &format!("hf:{}", show(&d)),
        &show(&d.join("model.safetensors")),
        "tensor `encoder.layer.0.intermediate.dense.weight` has shape [1536, 384], config.json expects [1000, 384]",
    );
}

#[test]
fn sharded_index_names_a_missing_shard() {
    let d = format!("{DIR}/sharded-missing-shard");
    decode(
        &format!("hf:{d}"),
        &format!("{d}/model.safetensors.index.json"),
        "shard `model-00001-of-00002.safetensors` named by weight_map does not exist",
    );
}

#[test]
fn truncated_gguf_header() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("t.gguf");
    let bytes = std::fs::read(smollm2_gguf()).unwrap();
    std::fs::write(&p, &bytes[..300_000]).unwrap();
    fails(
        &os(&["estimate", "--model", &show(&p)]),
        &show(&p),
        "not a valid GGUF file: gguf: array of 49152 elements needs",
    );
}

#[test]
fn truncated_gguf_data() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("t.gguf");
    let bytes = std::fs::read(smollm2_gguf()).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    decode(
        &format!("gguf:{}", show(&p)),
        &show(&p),
        "truncated GGUF file: tensor `",
    );
}

#[test]
fn not_a_gguf_file() {
    sweep_names(
        &format!("{DIR}/not-gguf.toml"),
        &format!("{DIR}/not-gguf.gguf"),
        "not a valid GGUF file",
    );
}

/// candle 0.11.1 divides by `general.alignment`: 0 used to panic.
#[test]
fn gguf_alignment_zero() {
    gguf_case(
        &[("general.alignment", GgufValue::U32(0))],
        "metadata `general.alignment` is 0",
    );
}

/// A head count of 0 used to panic (hidden / heads).
#[test]
fn gguf_zero_heads() {
    use GgufValue::*;
    gguf_case(
        &[
            ("general.architecture", Str("llama")),
            ("llama.embedding_length", U32(64)),
            ("llama.attention.head_count", U32(0)),
            ("llama.vocab_size", U32(100)),
            ("llama.feed_forward_length", U32(128)),
            ("llama.block_count", U32(2)),
            ("llama.context_length", U32(256)),
        ],
        "GGUF metadata key `llama.attention.head_count` must be a positive integer, got 0",
    );
}

#[test]
fn gguf_unknown_architecture() {
    gguf_case(
        &[("general.architecture", GgufValue::Str("mamba"))],
        "unknown architecture `mamba`",
    );
}

#[test]
fn config_missing_num_hidden_layers() {
    sweep_names(
        &format!("{DIR}/config-missing-layers.toml"),
        &format!("{DIR}/config-missing-layers.json"),
        "missing config key `num_hidden_layers`",
    );
}
