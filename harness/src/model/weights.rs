//! Loading weights into candle tensors at a chosen precision, under HF names, from an HF
//! safetensors directory (single file or sharded index), a GGUF file, or synthetic weights.
//!
//! Loader transients (they show in a load phase's `peak_allocated`, not in its end figure):
//! - safetensors: the mmapped file is only in RSS; candle copies each tensor into a `Vec`, and
//!   a dtype cast adds a second copy of that one tensor;
//! - GGUF: the quantized bytes of one tensor, its f32 dequantization, and for q/k the
//!   un-permuted copy.
use super::{gguf, synth, Config, Source};
use crate::error::bad_file;
use anyhow::Result;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The safetensors files of an HF directory: the shards named by `model.safetensors.index.json`,
/// or `model.safetensors`.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index)
            .map_err(|e| bad_file(&index, format!("cannot read: {e}")))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| bad_file(&index, format!("not valid JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad_file(&index, "missing key `weight_map`"))?;
        let mut shards = BTreeSet::new();
        for (tensor, file) in map {
            let f = file.as_str().ok_or_else(|| {
                bad_file(
                    &index,
                    format!("weight_map entry `{tensor}` is not a file name"),
                )
            })?;
            shards.insert(f.to_string());
        }
        let mut files = Vec::new();
        for s in shards {
            let p = dir.join(&s);
            if !p.exists() {
                return Err(bad_file(
                    &index,
                    format!("shard `{s}` named by weight_map does not exist"),
                ));
            }
            files.push(p);
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        Ok(vec![single])
    } else {
        Err(bad_file(
            dir,
            "no model.safetensors or model.safetensors.index.json in this directory",
        ))
    }
}

/// Every file whose bytes make up the weights (for the manifest's weight hash).
pub fn weight_files(source: &Source, synth_dir: Option<&Path>) -> Result<Vec<PathBuf>> {
    match (source, synth_dir) {
        (Source::Gguf(p), _) => Ok(vec![p.clone()]),
        (Source::Hf(d), _) => safetensors_files(d),
        (Source::Synthetic(_), Some(d)) => safetensors_files(d),
        (Source::Synthetic(p), None) => Ok(vec![p.clone()]),
    }
}

/// Loads the tensors of `cfg` from safetensors files, checking names and shapes.
pub fn load_safetensors(
    files: &[PathBuf],
    cfg: &Config,
    dtype: DType,
    device: &Device,
    mut progress: impl FnMut(usize, usize),
) -> Result<HashMap<String, Tensor>> {
    for f in files {
        check_header(f)?;
    }
    // SAFETY: the files are not modified while mapped (they are ours or the user's inputs).
    let st = unsafe { MmapedSafetensors::multi(files) }
        .map_err(|e| bad_file(&files[0], format!("not a valid safetensors file: {e}")))?;
    let shapes = cfg.tensor_shapes();
    let mut out = HashMap::with_capacity(shapes.len());
    let first = &files[0];
    for (i, (name, shape)) in shapes.iter().enumerate() {
        let view = st
            .get(name)
            .map_err(|_| bad_file(first, format!("tensor `{name}` is missing")))?;
        if view.shape() != shape.as_slice() {
            return Err(bad_file(
                first,
                format!(
                    "tensor `{name}` has shape {:?}, config.json expects {shape:?}",
                    view.shape()
                ),
            ));
        }
        let t = st
            .load(name, device)
            .map_err(|e| bad_file(first, format!("reading tensor `{name}`: {e}")))?;
        let t = if t.dtype() == dtype {
            t
        } else {
            t.to_dtype(dtype)?
        };
        out.insert(name.clone(), t);
        progress(i + 1, shapes.len());
    }
    Ok(out)
}

/// Rejects a truncated file or a corrupt header length with a message naming the file.
fn check_header(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut f =
        std::fs::File::open(path).map_err(|e| bad_file(path, format!("cannot open: {e}")))?;
    let len = f.metadata()?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| {
        bad_file(
            path,
            "truncated safetensors file: shorter than its 8-byte header length",
        )
    })?;
    let n = u64::from_le_bytes(n);
    if n > len.saturating_sub(8) {
        return Err(bad_file(
            path,
            format!("corrupt safetensors header length {n} for a file of {len} bytes"),
        ));
    }
    Ok(())
}

/// Loads `source` at `dtype`. Synthetic sources must have been materialized first
/// ([`synth::materialize`]), which gives the directory to load from.
pub fn load(
    source: &Source,
    cfg: &Config,
    dtype: DType,
    device: &Device,
    progress: impl FnMut(usize, usize),
) -> Result<HashMap<String, Tensor>> {
    match source {
        Source::Gguf(p) => gguf::load(p, cfg, dtype, device, progress),
        Source::Hf(dir) => load_safetensors(&safetensors_files(dir)?, cfg, dtype, device, progress),
        Source::Synthetic(_) => {
            let dir = synth::materialize(source, cfg, dtype)?;
            load_safetensors(&safetensors_files(&dir)?, cfg, dtype, device, progress)
        }
    }
}

/// Exact storage bytes of `cfg`'s parameters at `dtype`.
pub fn storage_bytes(cfg: &Config, dtype: DType) -> u64 {
    cfg.param_count() * dtype.size_in_bytes() as u64
}
