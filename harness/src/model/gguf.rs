//! GGUF: metadata → [`Config`], GGUF tensor names → HF names, dequantization, and undoing
//! llama.cpp's q/k row permutation (its converter stores them for interleaved RoPE; our model
//! uses the HF rotate-half layout).
use super::config::Architecture;
use super::Config;
use crate::error::bad_file;
use anyhow::Result;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

/// Opens and parses a GGUF header (metadata and tensor index; no tensor data).
pub fn open(path: &Path) -> Result<(Content, BufReader<File>)> {
    let f = File::open(path).map_err(|e| bad_file(path, format!("cannot open: {e}")))?;
    let mut r = BufReader::new(f);
    let c =
        Content::read(&mut r).map_err(|e| bad_file(path, format!("not a valid GGUF file: {e}")))?;
    Ok((c, r))
}

fn meta_usize(path: &Path, c: &Content, key: &str) -> Result<usize> {
    let v = c
        .metadata
        .get(key)
        .ok_or_else(|| bad_file(path, format!("missing GGUF metadata key `{key}`")))?;
    v.to_u64()
        .map(|x| x as usize)
        .or_else(|_| v.to_u32().map(|x| x as usize))
        .or_else(|_| v.to_i32().map(|x| x as usize))
        .map_err(|e| bad_file(path, format!("GGUF metadata key `{key}`: {e}")))
}

fn meta_f64(c: &Content, key: &str, default: f64) -> f64 {
    match c.metadata.get(key) {
        Some(Value::F32(v)) => *v as f64,
        Some(Value::F64(v)) => *v,
        _ => default,
    }
}

/// Normalized config from a parsed GGUF header.
pub fn config_of(path: &Path, c: &Content) -> Result<Config> {
    let arch = c
        .metadata
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .ok_or_else(|| bad_file(path, "missing GGUF metadata key `general.architecture`"))?
        .clone();
    if arch != "llama" && arch != "qwen2" && arch != "mistral" {
        return Err(bad_file(
            path,
            format!("unknown architecture `{arch}` (supported: llama, mistral, qwen2)"),
        ));
    }
    let k = |s: &str| format!("{arch}.{s}");
    let hidden = meta_usize(path, c, &k("embedding_length"))?;
    let heads = meta_usize(path, c, &k("attention.head_count"))?;
    let vocab = match c.metadata.get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) => a.len(),
        _ => meta_usize(path, c, &k("vocab_size"))?,
    };
    let qkv_bias = c.tensor_infos.contains_key("blk.0.attn_q.bias");
    let cfg = Config {
        architecture: Architecture::Llama,
        model_type: arch.clone(),
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: meta_usize(path, c, &k("feed_forward_length"))?,
        num_layers: meta_usize(path, c, &k("block_count"))?,
        num_heads: heads,
        num_kv_heads: meta_usize(path, c, &k("attention.head_count_kv")).unwrap_or(heads),
        head_dim: meta_usize(path, c, &k("rope.dimension_count")).unwrap_or(hidden / heads),
        max_position_embeddings: meta_usize(path, c, &k("context_length"))?,
        rope_theta: meta_f64(c, &k("rope.freq_base"), 10_000.0),
        norm_eps: meta_f64(c, &k("attention.layer_norm_rms_epsilon"), 1e-6),
        tie_word_embeddings: !c.tensor_infos.contains_key("output.weight"),
        qkv_bias,
        o_bias: c.tensor_infos.contains_key("blk.0.attn_output.bias"),
        type_vocab_size: 0,
    };
    cfg.validate().map_err(|e| bad_file(path, e))?;
    Ok(cfg)
}

/// Normalized config of a GGUF file.
pub fn config(path: &Path) -> Result<Config> {
    let (c, _) = open(path)?;
    config_of(path, &c)
}

/// The vocabulary stored in the GGUF (`tokenizer.ggml.tokens`), for printing token ids.
pub fn vocab(path: &Path) -> Result<Vec<String>> {
    let (c, _) = open(path)?;
    match c.metadata.get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) => Ok(a
            .iter()
            .map(|v| v.to_string().cloned().unwrap_or_default())
            .collect()),
        _ => Err(bad_file(
            path,
            "no `tokenizer.ggml.tokens` in the GGUF metadata",
        )),
    }
}

/// HF tensor name → GGUF tensor name, for the llama family.
pub fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (idx, tail) = rest.split_once('.')?;
    let (module, kind) = tail.rsplit_once('.')?;
    let g = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{idx}.{g}.{kind}"))
}

/// Inverse of llama.cpp's `permute(w, n_head)`: rows stored as (head, pair, half) go back to
/// (head, half, pair), i.e. interleaved RoPE order back to rotate-half order.
pub fn unpermute(t: &Tensor, n_head: usize) -> candle_core::Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    let hd = rows / n_head;
    let mut shape = vec![n_head, hd / 2, 2];
    shape.extend_from_slice(&dims[1..]);
    t.reshape(shape)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)
}

/// Loads every tensor of `cfg` from the GGUF, dequantized and cast to `dtype`, under HF names.
/// Transients: the quantized bytes of one tensor and its f32 dequantization.
pub fn load(
    path: &Path,
    cfg: &Config,
    dtype: DType,
    device: &Device,
    mut progress: impl FnMut(usize, usize),
) -> Result<HashMap<String, Tensor>> {
    let (content, mut reader) = open(path)?;
    let shapes = cfg.tensor_shapes();
    let mut out = HashMap::with_capacity(shapes.len());
    for (i, (hf, shape)) in shapes.iter().enumerate() {
        let g = gguf_name(hf).expect("every llama tensor has a GGUF name");
        let info = content
            .tensor_infos
            .get(&g)
            .ok_or_else(|| bad_file(path, format!("tensor `{g}` (for `{hf}`) is missing")))?;
        if info.shape.dims() != shape.as_slice() {
            return Err(bad_file(
                path,
                format!(
                    "tensor `{g}` has shape {:?}, the config expects {shape:?}",
                    info.shape.dims()
                ),
            ));
        }
        let q = content
            .tensor(&mut reader, &g, device)
            .map_err(|e| bad_file(path, format!("reading tensor `{g}`: {e}")))?;
        let mut t = q.dequantize(device)?;
        drop(q);
        if g.contains(".attn_q.") {
            t = unpermute(&t, cfg.num_heads)?;
        } else if g.contains(".attn_k.") {
            t = unpermute(&t, cfg.num_kv_heads)?;
        }
        let t = if t.dtype() == dtype {
            t
        } else {
            t.to_dtype(dtype)?
        };
        out.insert(hf.clone(), t);
        progress(i + 1, shapes.len());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map() {
        assert_eq!(
            gguf_name("model.layers.12.self_attn.k_proj.weight").unwrap(),
            "blk.12.attn_k.weight"
        );
        assert_eq!(
            gguf_name("model.layers.0.mlp.down_proj.weight").unwrap(),
            "blk.0.ffn_down.weight"
        );
        assert_eq!(
            gguf_name("model.embed_tokens.weight").unwrap(),
            "token_embd.weight"
        );
        assert!(gguf_name("model.layers.0.bogus.weight").is_none());
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(n_head, 2, hd/2, in).swapaxes(1, 2).reshape(w.shape)
        let (n_head, hd, inp) = (2usize, 4usize, 3usize);
        let hf = Tensor::arange(0f32, (n_head * hd * inp) as f32, &Device::Cpu)
            .unwrap()
            .reshape((n_head * hd, inp))
            .unwrap();
        let permuted = hf
            .reshape((n_head, 2, hd / 2, inp))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((n_head * hd, inp))
            .unwrap();
        assert_ne!(
            permuted.to_vec2::<f32>().unwrap(),
            hf.to_vec2::<f32>().unwrap()
        );
        let back = unpermute(&permuted, n_head).unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), hf.to_vec2::<f32>().unwrap());
    }
}
