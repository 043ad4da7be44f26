//! Synthetic weights: the real shapes of a config.json, seeded random values, written as
//! safetensors so that the real loader reads them. Memory does not depend on the values.
use super::{Config, Source};
use anyhow::{Context, Result};
use candle_core::DType;
use rand::{rngs::StdRng, Rng, SeedableRng};
use safetensors::tensor::{Dtype as StDtype, View};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

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

impl View for &Lazy {
    fn dtype(&self) -> StDtype {
        st_dtype(self.dtype)
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let n: usize = self.shape.iter().product();
        let mut rng = StdRng::seed_from_u64(self.seed);
        let norm = self.name.ends_with("norm.weight");
        let vals = (0..n).map(|_| {
            if norm {
                1.0f32
            } else {
                rng.random_range(-0.02f32..0.02)
            }
        });
        let bytes: Vec<u8> = match self.dtype {
            DType::F32 => vals.flat_map(f32::to_le_bytes).collect(),
            DType::F16 => vals
                .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            _ => vals
                .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
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
    let tensors: Vec<Lazy> = cfg
        .tensor_shapes()
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
    let tmp = out.join(format!("model.safetensors.{}.part", std::process::id()));
    safetensors::serialize_to_file(tensors.iter().map(|t| (t.name.clone(), t)), None, &tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&cfg.to_hf_json())?,
    )?;
    std::fs::rename(&tmp, out.join("model.safetensors"))?;
    Ok(())
}

/// Cache folder for synthetic weights (`$VRAMLAB_CACHE`, default `.cache/synthetic`).
pub fn cache_root() -> PathBuf {
    std::env::var_os("VRAMLAB_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".cache/synthetic"))
}

/// Makes sure the synthetic weights of `source` exist in `dtype` and returns their directory.
pub fn materialize(source: &Source, cfg: &Config, dtype: DType) -> Result<PathBuf> {
    let key = serde_json::to_string(cfg)?;
    let hash = crate::scenario::short_hash(key.as_bytes());
    let dir = cache_root().join(format!("{}-{:?}-{hash}", source.model_id(), dtype).to_lowercase());
    if !dir.join("model.safetensors").exists() {
        write(cfg, dtype, 0x5eed, &dir)?;
    }
    Ok(dir)
}
