//! Quantized loading: which tensors stay quantized ([`Planned`], [`plan`]), what they weigh,
//! and loading them ([`load_quantized`]).
use super::{dense, gguf_name, open, permuted_heads, preflight, read_tensor};
use crate::error::{bad_file, candle_msg};
use crate::model::nn::QTensors;
use crate::model::Config;
use crate::vocab::Quantized;
use anyhow::Result;
use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// How a quantized point keeps one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// A candle `QTensor` of this type.
    Quant(GgmlDType),
    /// A dense tensor in the compute dtype: a norm or bias (1-D), or a matrix the file stores
    /// unquantized (F32/F16/BF16), which `QMatMul` would dequantize to f32 anyway.
    Dense,
}

/// One tensor of a quantized point: HF and GGUF names, shape, the type the file stores and
/// how it is kept.
#[derive(Clone, Debug)]
pub struct Planned {
    pub hf: String,
    pub gguf: String,
    pub shape: Vec<usize>,
    pub file: GgmlDType,
    pub kept: Kept,
}

impl Planned {
    /// Bytes the tensor occupies once loaded: blocks × block bytes for a quantized tensor,
    /// elements × the compute dtype's bytes for a dense one.
    pub fn bytes(&self, compute: DType) -> u64 {
        let elems: u64 = self.shape.iter().map(|&d| d as u64).product();
        match self.kept {
            Kept::Quant(t) => elems / t.block_size() as u64 * t.type_size() as u64,
            Kept::Dense => elems * compute.size_in_bytes() as u64,
        }
    }
}

/// A GGUF type's spelling for messages (llama.cpp's names).
pub fn type_name(t: GgmlDType) -> &'static str {
    use GgmlDType as G;
    match t {
        G::F32 => "F32",
        G::F16 => "F16",
        G::BF16 => "BF16",
        G::Q4_0 => "Q4_0",
        G::Q4_1 => "Q4_1",
        G::Q5_0 => "Q5_0",
        G::Q5_1 => "Q5_1",
        G::Q8_0 => "Q8_0",
        G::Q8_1 => "Q8_1",
        G::Q2K => "Q2_K",
        G::Q3K => "Q3_K",
        G::Q4K => "Q4_K",
        G::Q5K => "Q5_K",
        G::Q6K => "Q6_K",
        G::Q8K => "Q8_K",
    }
}

/// How a quantized point (`q`) keeps each tensor of `cfg` from a parsed GGUF header. A
/// re-quantization fails on the first matrix whose rows are not whole blocks, naming it.
pub fn plan_of(path: &Path, c: &Content, cfg: &Config, q: Quantized) -> Result<Vec<Planned>> {
    let mut out = Vec::new();
    for (hf, shape) in cfg.tensor_shapes() {
        let g = gguf_name(&hf).ok_or_else(|| bad_file(path, format!("no GGUF name for `{hf}`")))?;
        let info = c
            .tensor_infos
            .get(&g)
            .ok_or_else(|| bad_file(path, format!("tensor `{g}` (for `{hf}`) is missing")))?;
        out.push(planned(hf, g, shape, info.ggml_dtype, q).map_err(|e| bad_file(path, e))?);
    }
    Ok(out)
}

/// The tensors of `cfg` (say, a preset's) re-quantized to `to`, as if stored in f32: the
/// block formula per tensor. Err: the message naming the first tensor whose rows are not
/// whole blocks.
pub fn plan_config(cfg: &Config, to: GgmlDType) -> std::result::Result<Vec<Planned>, String> {
    cfg.tensor_shapes()
        .into_iter()
        .map(|(hf, shape)| {
            let g = gguf_name(&hf).unwrap_or_else(|| hf.clone());
            planned(hf, g, shape, GgmlDType::F32, Quantized::To(to))
        })
        .collect()
}

/// How a quantized point keeps one tensor stored as `file`.
fn planned(
    hf: String,
    gguf: String,
    shape: Vec<usize>,
    file: GgmlDType,
    q: Quantized,
) -> std::result::Result<Planned, String> {
    let unquantized = matches!(file, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
    let kept = match q {
        _ if shape.len() < 2 => Kept::Dense,
        Quantized::Native if unquantized => Kept::Dense,
        Quantized::Native => Kept::Quant(file),
        Quantized::To(t) => {
            let row = *shape.last().expect("a matrix");
            if !row.is_multiple_of(t.block_size()) {
                return Err(format!(
                    "cannot re-quantize tensor `{gguf}` (shape {shape:?}) to {}: its rows of {row} weights are not a multiple of the {}-weight block",
                    type_name(t),
                    t.block_size()
                ));
            }
            Kept::Quant(t)
        }
    };
    Ok(Planned {
        hf,
        gguf,
        shape,
        file,
        kept,
    })
}

/// Loaded weight bytes of a plan: blocks × block bytes per quantized tensor, the dense ones
/// in `compute`.
pub fn plan_bytes(plan: &[Planned], compute: DType) -> u64 {
    plan.iter().map(|t| t.bytes(compute)).sum()
}

/// Per kept type: (type, tensors, bytes), by type name; dense tensors under their compute
/// dtype's name.
pub fn plan_types(plan: &[Planned], compute: DType) -> Vec<(&'static str, usize, u64)> {
    let mut by: std::collections::BTreeMap<&'static str, (usize, u64)> = Default::default();
    for t in plan {
        let name = match t.kept {
            Kept::Quant(ty) => type_name(ty),
            Kept::Dense => compute.as_str(),
        };
        let e = by.entry(name).or_default();
        e.0 += 1;
        e.1 += t.bytes(compute);
    }
    by.into_iter().map(|(k, (n, b))| (k, n, b)).collect()
}

/// [`plan_of`] of a GGUF file.
pub fn plan(path: &Path, cfg: &Config, q: Quantized) -> Result<Vec<Planned>> {
    let (c, _) = open(path)?;
    plan_of(path, &c, cfg, q)
}

/// Loads the tensors of a quantized point: matrices and the embedding as `QTensor`s of the
/// planned types (q/k rows un-permuted block row by block row, which is exact: a quantized
/// row is a whole number of blocks), norms dense in `compute`. Transients: one tensor's file
/// bytes and its copy; for a re-quantization, also its f32 dequantization.
pub fn load_quantized(
    path: &Path,
    cfg: &Config,
    q: Quantized,
    compute: DType,
    device: &Device,
    mut progress: impl FnMut(usize, usize),
) -> Result<(HashMap<String, Tensor>, QTensors)> {
    preflight(path, cfg)?;
    let (content, mut reader) = open(path)?;
    let plan = plan_of(path, &content, cfg, q)?;
    let (mut dense_out, mut quant) = (HashMap::new(), QTensors::new());
    let cpu = Device::Cpu;
    for (i, p) in plan.iter().enumerate() {
        let qt = read_tensor(path, &content, &mut reader, &p.gguf, &cpu)?;
        let heads = permuted_heads(&p.gguf, cfg);
        match p.kept {
            Kept::Dense => {
                dense_out.insert(p.hf.clone(), dense(&qt, &p.gguf, cfg, compute, device)?);
            }
            Kept::Quant(t) if t == p.file => {
                let kept = match (heads, device) {
                    (None, Device::Cpu) => qt,
                    _ => {
                        let mut bytes = qt.data()?.into_owned();
                        drop(qt);
                        if let Some(h) = heads {
                            bytes = unpermute_rows(&bytes, p.shape[0], h);
                        }
                        qtensor_from_ggml(t, &bytes, p.shape.clone(), device)?
                    }
                };
                quant.insert(p.hf.clone(), Arc::new(kept));
            }
            Kept::Quant(t) => {
                let f32s = dense(&qt, &p.gguf, cfg, DType::F32, &cpu)?;
                drop(qt);
                let kept = QTensor::quantize_onto(&f32s, t, device).map_err(|e| {
                    bad_file(
                        path,
                        format!("re-quantizing tensor `{}`: {}", p.gguf, candle_msg(&e)),
                    )
                })?;
                quant.insert(p.hf.clone(), Arc::new(kept));
            }
        }
        progress(i + 1, plan.len());
    }
    Ok((dense_out, quant))
}

/// [`unpermute`] on the raw bytes of a tensor of `rows` rows (each a whole number of blocks).
pub(super) fn unpermute_rows(bytes: &[u8], rows: usize, n_head: usize) -> Vec<u8> {
    let row = bytes.len() / rows;
    let hd = rows / n_head;
    let mut out = Vec::with_capacity(bytes.len());
    for h in 0..n_head {
        for half in 0..2 {
            for pair in 0..hd / 2 {
                let src = h * hd + pair * 2 + half;
                out.extend_from_slice(&bytes[src * row..(src + 1) * row]);
            }
        }
    }
    out
}
