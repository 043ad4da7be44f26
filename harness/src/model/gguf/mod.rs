//! GGUF: metadata → [`Config`], GGUF tensor names → HF names, dequantization, and undoing
//! llama.cpp's q/k row permutation (its converter stores them for interleaved RoPE; our model
//! uses the HF rotate-half layout).
use super::arch::Arch;
use super::Config;
use crate::error::{bad_file, candle_msg};
use anyhow::Result;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

mod plan;
mod scan;

use scan::{llama_cpp_type, scan, Scan};

pub use plan::{
    load_quantized, plan, plan_bytes, plan_config, plan_of, plan_types, type_name, Kept, Planned,
};

/// Opens and parses a GGUF header (metadata and tensor index; no tensor data).
pub fn open(path: &Path) -> Result<(Content, BufReader<File>)> {
    let f = File::open(path).map_err(|e| bad_file(path, format!("cannot open: {e}")))?;
    let mut r = BufReader::new(f);
    let c = read_content(path, &mut r)?;
    Ok((c, r))
}

/// `Content::read` for an untrusted file: errors name `path`, and a `general.alignment` of 0
/// (on which candle 0.11.1 divides by zero) is an error rather than a panic.
pub fn read_content<R: Read + Seek>(path: &Path, r: &mut R) -> Result<Content> {
    let start = r
        .stream_position()
        .map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
    let scan = scan(r);
    if let Ok(Scan {
        alignment: Some(0), ..
    }) = scan
    {
        return Err(bad_file(
            path,
            "not a valid GGUF file: metadata `general.alignment` is 0",
        ));
    }
    if let Ok(Scan {
        unsupported: Some((name, t)),
        ..
    }) = scan
    {
        return Err(bad_file(
            path,
            format!(
                "tensor `{name}` has GGML type {t}{}, which candle 0.11 cannot load (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K to Q6_K and Q8_K)",
                llama_cpp_type(t).map(|n| format!(" ({n})")).unwrap_or_default()
            ),
        ));
    }
    r.seek(SeekFrom::Start(start))
        .map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
    Content::read(r)
        .map_err(|e| bad_file(path, format!("not a valid GGUF file: {}", candle_msg(&e))))
}

fn meta_usize(path: &Path, c: &Content, key: &str) -> Result<usize> {
    let v = c
        .metadata
        .get(key)
        .ok_or_else(|| bad_file(path, format!("missing GGUF metadata key `{key}`")))?;
    let n: i128 = match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        other => {
            return Err(bad_file(
                path,
                format!(
                    "GGUF metadata key `{key}` must be an integer, got {:?}",
                    other.value_type()
                ),
            ))
        }
    };
    match usize::try_from(n) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(bad_file(
            path,
            format!("GGUF metadata key `{key}` must be a positive integer, got {n}"),
        )),
    }
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
    // llama.cpp's converter writes the llama decoder family's tensors under these names.
    let family = match arch.as_str() {
        "llama" | "qwen2" | "mistral" => Arch::of_model_type(&arch),
        _ => None,
    };
    let Some(family) = family else {
        return Err(bad_file(
            path,
            format!("unknown architecture `{arch}` (supported: llama, mistral, qwen2)"),
        ));
    };
    let k = |s: &str| format!("{arch}.{s}");
    let hidden = meta_usize(path, c, &k("embedding_length"))?;
    let heads = meta_usize(path, c, &k("attention.head_count"))?;
    let vocab = match c.metadata.get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) => a.len(),
        _ => meta_usize(path, c, &k("vocab_size"))?,
    };
    let qkv_bias = c.tensor_infos.contains_key("blk.0.attn_q.bias");
    let cfg = Config {
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: meta_usize(path, c, &k("feed_forward_length"))?,
        num_layers: meta_usize(path, c, &k("block_count"))?,
        num_heads: heads,
        num_kv_heads: match c.metadata.get(&k("attention.head_count_kv")) {
            None => heads,
            Some(_) => meta_usize(path, c, &k("attention.head_count_kv"))?,
        },
        head_dim: match c.metadata.get(&k("rope.dimension_count")) {
            None => hidden / heads,
            Some(_) => meta_usize(path, c, &k("rope.dimension_count"))?,
        },
        max_position_embeddings: meta_usize(path, c, &k("context_length"))?,
        rope_theta: meta_f64(c, &k("rope.freq_base"), 10_000.0),
        norm_eps: meta_f64(c, &k("attention.layer_norm_rms_epsilon"), 1e-6),
        tie_word_embeddings: !c.tensor_infos.contains_key("output.weight"),
        qkv_bias,
        o_bias: c.tensor_infos.contains_key("blk.0.attn_output.bias"),
        ..Config::new(family.get(), &arch)
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

/// Checks that the GGUF holds every tensor of `cfg` with its shape, and that each tensor's
/// bytes lie within the file (a truncated download fails here, not halfway through a load).
pub fn preflight(path: &Path, cfg: &Config) -> Result<()> {
    let (content, reader) = open(path)?;
    let len = reader
        .get_ref()
        .metadata()
        .map_err(|e| bad_file(path, format!("cannot read: {e}")))?
        .len();
    for (hf, shape) in cfg.tensor_shapes() {
        let Some(g) = gguf_name(&hf) else {
            return Err(bad_file(path, format!("no GGUF name for tensor `{hf}`")));
        };
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
        let elems = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
        let (bs, ts) = (
            info.ggml_dtype.block_size() as u64,
            info.ggml_dtype.type_size() as u64,
        );
        let end = elems
            .filter(|e| bs > 0 && e % bs == 0)
            .and_then(|e| (e / bs).checked_mul(ts))
            .and_then(|b| b.checked_add(info.offset))
            .and_then(|b| b.checked_add(content.tensor_data_offset));
        match end {
            None => {
                return Err(bad_file(
                    path,
                    format!("tensor `{g}`: its size or offset is corrupt"),
                ))
            }
            Some(end) if end > len => {
                return Err(bad_file(
                    path,
                    format!(
                        "truncated GGUF file: tensor `{g}` ends at byte {end}, the file has {len}"
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
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
    // Names, shapes and extents were checked by `preflight` (weights::load calls it first).
    for (i, (hf, _)) in shapes.iter().enumerate() {
        let g = gguf_name(hf).expect("every llama tensor has a GGUF name");
        let q = read_tensor(path, &content, &mut reader, &g, device)?;
        out.insert(hf.clone(), dense(&q, &g, cfg, dtype, device)?);
        progress(i + 1, shapes.len());
    }
    Ok(out)
}

fn read_tensor(
    path: &Path,
    content: &Content,
    reader: &mut BufReader<File>,
    g: &str,
    device: &Device,
) -> Result<QTensor> {
    content
        .tensor(reader, g, device)
        .map_err(|e| bad_file(path, format!("reading tensor `{g}`: {}", candle_msg(&e))))
}

/// GGUF tensor `g` dequantized, its q/k rows back in rotate-half order, in `dtype` on `device`.
fn dense(q: &QTensor, g: &str, cfg: &Config, dtype: DType, device: &Device) -> Result<Tensor> {
    let mut t = q.dequantize(device)?;
    if let Some(heads) = permuted_heads(g, cfg) {
        t = unpermute(&t, heads)?;
    }
    Ok(if t.dtype() == dtype {
        t
    } else {
        t.to_dtype(dtype)?
    })
}

/// The head count whose llama.cpp permutation tensor `g` carries (attn_q, attn_k), if any.
fn permuted_heads(g: &str, cfg: &Config) -> Option<usize> {
    if g.contains(".attn_q.") {
        Some(cfg.num_heads)
    } else if g.contains(".attn_k.") {
        Some(cfg.num_kv_heads)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::plan::unpermute_rows;
    use super::*;
    use candle_core::quantized::ggml_file::qtensor_from_ggml;
    use candle_core::quantized::GgmlDType;

    /// Bytes per block of each type vramlab re-quantizes to: the documented figures, candle's
    /// block structs, and `GgmlDType::type_size`, which `Planned::bytes` uses.
    #[test]
    fn block_bytes_are_candles_structs() {
        use candle_core::quantized::k_quants as k;
        use std::mem::size_of;
        let table = [
            (GgmlDType::Q4_0, 32, 18, size_of::<k::BlockQ4_0>()),
            (GgmlDType::Q4_1, 32, 20, size_of::<k::BlockQ4_1>()),
            (GgmlDType::Q5_0, 32, 22, size_of::<k::BlockQ5_0>()),
            (GgmlDType::Q5_1, 32, 24, size_of::<k::BlockQ5_1>()),
            (GgmlDType::Q8_0, 32, 34, size_of::<k::BlockQ8_0>()),
            (GgmlDType::Q4K, 256, 144, size_of::<k::BlockQ4K>()),
            (GgmlDType::Q5K, 256, 176, size_of::<k::BlockQ5K>()),
            (GgmlDType::Q6K, 256, 210, size_of::<k::BlockQ6K>()),
            (GgmlDType::Q8K, 256, 292, size_of::<k::BlockQ8K>()),
        ];
        for (t, weights, bytes, candle) in table {
            assert_eq!(t.block_size(), weights, "{}", type_name(t));
            assert_eq!(t.type_size(), bytes, "{}", type_name(t));
            assert_eq!(candle, bytes, "{}", type_name(t));
            let p = Planned {
                hf: String::new(),
                gguf: String::new(),
                shape: vec![3, 2 * weights],
                file: GgmlDType::F32,
                kept: Kept::Quant(t),
            };
            assert_eq!(p.bytes(DType::F32), 6 * bytes as u64);
        }
    }

    /// Un-permuting a quantized tensor's raw rows equals un-permuting its values.
    #[test]
    fn unpermute_rows_matches_unpermute() {
        let (heads, hd, cols) = (3usize, 4usize, 64usize);
        let t = Tensor::randn(0f32, 1.0, (heads * hd, cols), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
        let bytes = unpermute_rows(&q.data().unwrap(), heads * hd, heads);
        let back = qtensor_from_ggml(
            GgmlDType::Q8_0,
            &bytes,
            vec![heads * hd, cols],
            &Device::Cpu,
        )
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap();
        let want = unpermute(&q.dequantize(&Device::Cpu).unwrap(), heads).unwrap();
        assert_eq!(
            back.to_vec2::<f32>().unwrap(),
            want.to_vec2::<f32>().unwrap()
        );
    }

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
