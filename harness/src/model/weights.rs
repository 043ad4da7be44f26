//! Loading weights into candle tensors at a chosen precision, under HF names, from an HF
//! safetensors directory (single file or sharded index), a GGUF file, or synthetic weights.
//!
//! Loader transients (they show in a load phase's `peak_allocated`, not in its end figure):
//! - safetensors: the mmapped file is only in RSS; candle copies each tensor into a `Vec`, and
//!   a dtype cast adds a second copy of that one tensor;
//! - GGUF: the quantized bytes of one tensor, its f32 dequantization, and for q/k the
//!   un-permuted copy.
use super::{gguf, synth, Config, Source};
use crate::error::{bad_file, candle_msg};
use anyhow::Result;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The safetensors files of an HF directory: the shards named by `model.safetensors.index.json`,
/// or `model.safetensors`.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    safetensors_files_named(dir, "model")
}

/// The safetensors files named `base` in `dir` (diffusers' components use
/// `diffusion_pytorch_model`): the shards `BASE.safetensors.index.json` names, or
/// `BASE.safetensors`.
pub fn safetensors_files_named(dir: &Path, base: &str) -> Result<Vec<PathBuf>> {
    let index = dir.join(format!("{base}.safetensors.index.json"));
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
        if shards.is_empty() {
            return Err(bad_file(&index, "`weight_map` names no tensors"));
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
            if !p.is_file() {
                return Err(bad_file(
                    &index,
                    format!("shard `{s}` named by weight_map is not a file"),
                ));
            }
            files.push(p);
        }
        return Ok(files);
    }
    let single = dir.join(format!("{base}.safetensors"));
    if single.exists() {
        Ok(vec![single])
    } else {
        Err(bad_file(
            dir,
            format!("no {base}.safetensors or {base}.safetensors.index.json in this directory"),
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
    let Some(first) = files.first() else {
        anyhow::bail!("no safetensors files to load");
    };
    for f in files {
        check_header(f)?;
    }
    // SAFETY: the files are not modified while mapped (they are ours or the user's inputs).
    let st = unsafe { MmapedSafetensors::multi(files) }.map_err(|e| {
        bad_file(
            first,
            format!("not a valid safetensors file: {}", candle_msg(&e)),
        )
    })?;
    let shapes = cfg.tensor_shapes();
    let mut out = HashMap::with_capacity(shapes.len());
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
        let t = st.load(name, device).map_err(|e| {
            bad_file(
                first,
                format!("reading tensor `{name}`: {}", candle_msg(&e)),
            )
        })?;
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

/// The safetensors crate's own limit on the JSON header.
const MAX_HEADER: u64 = 100_000_000;

/// Rejects a truncated file, a corrupt header length or a malformed header with one message
/// naming the file, before anything is mapped. Reads only the header.
pub fn check_header(path: &Path) -> Result<()> {
    read_header(path).map(|_| ())
}

/// Tensor name → shape, from a checked safetensors header.
pub type HeaderShapes = HashMap<String, Vec<usize>>;

/// [`check_header`], returning the shapes the header declares.
pub fn read_header(path: &Path) -> Result<HeaderShapes> {
    use std::io::Read;
    let mut f =
        std::fs::File::open(path).map_err(|e| bad_file(path, format!("cannot open: {e}")))?;
    let len = f
        .metadata()
        .map_err(|e| bad_file(path, format!("cannot read: {e}")))?
        .len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| {
        bad_file(
            path,
            "truncated safetensors file: shorter than its 8-byte header length",
        )
    })?;
    let n = header_len(path, u64::from_le_bytes(n), len)?;
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|e| bad_file(path, format!("cannot read the safetensors header: {e}")))?;
    check_header_json(path, &header, len - 8 - n)
}

/// [`check_header`] on the bytes of a whole file, then the safetensors crate's own parse.
/// `path` is only used in messages.
pub fn check_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    let len = bytes.len() as u64;
    let Some(n) = bytes.get(..8) else {
        return Err(bad_file(
            path,
            "truncated safetensors file: shorter than its 8-byte header length",
        ));
    };
    let n = header_len(
        path,
        u64::from_le_bytes(n.try_into().expect("8 bytes")),
        len,
    )?;
    let shapes = check_header_json(path, &bytes[8..8 + n as usize], len - 8 - n)?;
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| bad_file(path, format!("not a valid safetensors file: {e}")))?;
    for (name, t) in st.tensors() {
        if shapes.get(&name).map(Vec::as_slice) != Some(t.shape()) {
            return Err(bad_file(
                path,
                format!("tensor `{name}`: header check disagrees"),
            ));
        }
    }
    Ok(())
}

fn header_len(path: &Path, n: u64, len: u64) -> Result<u64> {
    if n > len.saturating_sub(8) || n > MAX_HEADER {
        return Err(bad_file(
            path,
            format!("corrupt safetensors header length {n} for a file of {len} bytes"),
        ));
    }
    Ok(n)
}

/// Checks the JSON header: an object of tensors whose `data_offsets` lie within the
/// `data_len` bytes that follow it.
fn check_header_json(path: &Path, header: &[u8], data_len: u64) -> Result<HeaderShapes> {
    let v: serde_json::Value = serde_json::from_slice(header)
        .map_err(|e| bad_file(path, format!("safetensors header is not valid JSON: {e}")))?;
    let map = v
        .as_object()
        .ok_or_else(|| bad_file(path, "safetensors header is not a JSON object"))?;
    let mut end = 0u64;
    let mut shapes = HashMap::new();
    for (name, t) in map.iter().filter(|(k, _)| *k != "__metadata__") {
        let shape = t
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or_else(|| {
                bad_file(
                    path,
                    format!("safetensors header: tensor `{name}` has no valid `shape`"),
                )
            })?;
        shapes.insert(name.clone(), shape);
        let offs = t
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
            .ok_or_else(|| {
                bad_file(
                    path,
                    format!("safetensors header: tensor `{name}` has no valid `data_offsets`"),
                )
            })?;
        if offs.1 < offs.0 {
            return Err(bad_file(
                path,
                format!(
                    "safetensors header: tensor `{name}` has data_offsets [{}, {}] that end before they start",
                    offs.0, offs.1
                ),
            ));
        }
        end = end.max(offs.1);
    }
    if end > data_len {
        return Err(bad_file(
            path,
            format!(
                "truncated safetensors file: its tensors need {end} data bytes, the file holds {data_len}"
            ),
        ));
    }
    Ok(shapes)
}

/// Checks, before anything is loaded, that the weight files of `source` hold every tensor of
/// `cfg` with its shape, and that the files are whole: one clear error naming the file,
/// instead of a failure halfway through a load. Reads headers only.
pub fn preflight(source: &Source, cfg: &Config) -> Result<()> {
    match source {
        Source::Gguf(p) => gguf::preflight(p, cfg),
        Source::Hf(dir) => {
            let mut found: HashMap<String, (PathBuf, Vec<usize>)> = HashMap::new();
            for f in safetensors_files(dir)? {
                for (name, shape) in read_header(&f)? {
                    found.insert(name, (f.clone(), shape));
                }
            }
            for (name, shape) in cfg.tensor_shapes() {
                match found.get(&name) {
                    None => {
                        return Err(bad_file(
                            dir,
                            format!("tensor `{name}` is missing from the safetensors files"),
                        ))
                    }
                    Some((f, s)) if s != &shape => {
                        return Err(bad_file(
                            f,
                            format!(
                                "tensor `{name}` has shape {s:?}, config.json expects {shape:?}"
                            ),
                        ))
                    }
                    Some(_) => {}
                }
            }
            Ok(())
        }
        // Written by us from the config.
        Source::Synthetic(_) => Ok(()),
    }
}

/// Loads `source` at `dtype`. Synthetic sources are created in memory ([`synth::generate`]).
pub fn load(
    source: &Source,
    cfg: &Config,
    dtype: DType,
    device: &Device,
    progress: impl FnMut(usize, usize),
) -> Result<HashMap<String, Tensor>> {
    preflight(source, cfg)?;
    match source {
        Source::Gguf(p) => gguf::load(p, cfg, dtype, device, progress),
        Source::Hf(dir) => load_safetensors(&safetensors_files(dir)?, cfg, dtype, device, progress),
        Source::Synthetic(_) => synth::generate(cfg, dtype, synth::SEED, device),
    }
}

/// Exact storage bytes of `cfg`'s parameters at `dtype`.
pub fn storage_bytes(cfg: &Config, dtype: DType) -> u64 {
    cfg.param_count() * dtype.size_in_bytes() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.resize(b.len() + data, 0);
        b
    }

    #[test]
    fn header_checks() {
        let p = Path::new("w.safetensors");
        let h = r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
        check_bytes(p, &file(h, 16)).unwrap();
        let e = check_bytes(p, &file(h, 8)).unwrap_err().to_string();
        assert!(
            e.starts_with("w.safetensors: truncated safetensors file"),
            "{e}"
        );
        let e = check_bytes(p, &[0xff; 12]).unwrap_err().to_string();
        assert!(e.contains("corrupt safetensors header length"), "{e}");
        let h = r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[16,0]}}"#;
        let e = check_bytes(p, &file(h, 16)).unwrap_err().to_string();
        assert!(e.contains("end before they start"), "{e}");
        let e = check_bytes(p, &file("[]", 0)).unwrap_err().to_string();
        assert!(e.contains("not a JSON object"), "{e}");
    }
}
