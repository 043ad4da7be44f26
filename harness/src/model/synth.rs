//! Synthetic weights: the real shapes of a config.json with seeded random values. Memory does
//! not depend on the values. `vramlab synth-weights` writes them as safetensors for the real
//! loader ([`write()`]); a sweep's `synthetic:` source creates them directly in the target dtype
//! on the target device, in parallel, and never writes them to disk ([`generate`]): an 8B model
//! is 16 GB of bf16, which no device run has the time or disk to write and read back.
use super::Config;
use anyhow::{Context, Result};
use candle_core::DType;
use rand::{rngs::StdRng, Rng, SeedableRng};
use safetensors::tensor::{Dtype as StDtype, View};
use std::borrow::Cow;
use std::path::Path;

/// One tensor generated on demand when the serializer asks for its bytes.
struct Lazy {
    name: String,
    shape: Vec<usize>,
    dtype: DType,
    seed: u64,
}

fn st_dtype(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        other => unreachable!("synthetic weights in {other:?}"),
    }
}

/// Distinct random values per tensor; longer tensors repeat them (memory does not depend on
/// the values, and tiling a block is memory-bound, so an 8B model is created in seconds).
const BLOCK: usize = 1 << 16;

/// The values of one synthetic tensor of `n` elements in `T`: norms are ones, everything else
/// a block of uniform values in ±0.02 from a generator seeded per tensor, repeated to length
/// (the same values on disk and in memory). Allocated once, at exactly `n` elements.
fn values<T: Copy>(name: &str, n: usize, seed: u64, from: impl Fn(f32) -> T) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(seed);
    let norm = name.ends_with("norm.weight");
    let block: Vec<T> = (0..n.min(BLOCK))
        .map(|_| {
            from(if norm {
                1.0
            } else {
                rng.random_range(-0.02f32..0.02)
            })
        })
        .collect();
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let k = (n - v.len()).min(block.len());
        v.extend_from_slice(&block[..k]);
    }
    v
}

/// The seed of the synthetic weights of sweeps.
pub const SEED: u64 = 0x5eed;

/// Creates the tensors of `cfg` in `dtype` on `device`, with the values [`write()`] would store.
/// Each tensor is allocated once, at its exact size in `dtype`. On the CPU they are made one
/// after another, so the load row's peak is the same in every run (tensors made in parallel
/// would overlap their temporaries differently each time); for a GPU each is built on the host
/// and copied, one tensor per rayon task in parallel, and the device holds exactly the weights.
pub fn generate(
    cfg: &Config,
    dtype: DType,
    seed: u64,
    device: &candle_core::Device,
) -> Result<std::collections::HashMap<String, candle_core::Tensor>> {
    use candle_core::Tensor;
    use rayon::prelude::*;
    let make = |(i, (name, shape)): (usize, (String, Vec<usize>))| -> Result<(String, Tensor)> {
        let n: usize = shape.iter().product();
        let seed = seed.wrapping_add(i as u64);
        let t = match dtype {
            DType::F32 => Tensor::from_vec(values(&name, n, seed, |v| v), shape, device),
            DType::F16 => {
                Tensor::from_vec(values(&name, n, seed, half::f16::from_f32), shape, device)
            }
            DType::BF16 => {
                Tensor::from_vec(values(&name, n, seed, half::bf16::from_f32), shape, device)
            }
            other => anyhow::bail!("synthetic weights in {other:?}"),
        }?;
        Ok((name, t))
    };
    let shapes = cfg.tensor_shapes();
    if device.is_cpu() {
        shapes.into_iter().enumerate().map(make).collect()
    } else {
        shapes.into_par_iter().enumerate().map(make).collect()
    }
}

impl View for &Lazy {
    fn dtype(&self) -> StDtype {
        st_dtype(self.dtype)
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let n: usize = self.shape.iter().product();
        let (name, seed) = (&self.name, self.seed);
        let bytes: Vec<u8> = match self.dtype {
            DType::F32 => values(name, n, seed, f32::to_le_bytes).concat(),
            DType::F16 => values(name, n, seed, |v| half::f16::from_f32(v).to_le_bytes()).concat(),
            _ => values(name, n, seed, |v| half::bf16::from_f32(v).to_le_bytes()).concat(),
        };
        Cow::Owned(bytes)
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }
}

/// Writes `config.json` and `model.safetensors` for `cfg` in `dtype` into `out`.
pub fn write(cfg: &Config, dtype: DType, seed: u64, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&cfg.to_hf_json())?,
    )?;
    write_tensors(
        cfg.tensor_shapes(),
        dtype,
        seed,
        &out.join("model.safetensors"),
    )
}

/// Writes tensors of these names and shapes, with synthetic values in `dtype`, as one
/// safetensors `file` (through a temporary name, renamed when complete).
pub fn write_tensors(
    shapes: Vec<(String, Vec<usize>)>,
    dtype: DType,
    seed: u64,
    file: &Path,
) -> Result<()> {
    let tensors: Vec<Lazy> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| Lazy {
            name,
            shape,
            dtype,
            seed: seed.wrapping_add(i as u64),
        })
        .collect();
    // Per process: concurrent sweeps (the shards of one scenario) may fill the same cache.
    let tmp = file.with_extension(format!("{}.part", std::process::id()));
    safetensors::serialize_to_file(tensors.iter().map(|t| (t.name.clone(), t)), None, &tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, file)?;
    Ok(())
}
