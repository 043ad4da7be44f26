//! The KV cache, in two kinds (DESIGN.md §5):
//! - `preallocated`: one (batch, n_kv, capacity, head_dim) tensor per layer for K and for V,
//!   allocated once and written in place with `slice_set`;
//! - `growing`: exact-fit growth by concatenation. Each append allocates a tensor one step
//!   longer and frees the old one, so the live bytes are exactly
//!   `kv_bytes_per_token · tokens · batch` (plus two tensors' metadata per layer) at every step,
//!   and the step's transient is one extra copy of that layer's cache.
use super::Config;
use candle_core::{DType, Device, Result, Tensor};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum KvKind {
    Preallocated,
    Growing,
}

impl KvKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            KvKind::Preallocated => "preallocated",
            KvKind::Growing => "growing",
        }
    }
}

pub struct KvCache {
    kind: KvKind,
    capacity: usize,
    len: usize,
    layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    /// A cache for `capacity` tokens of `batch` sequences. `preallocated` allocates it all now.
    pub fn new(
        kind: KvKind,
        cfg: &Config,
        batch: usize,
        capacity: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for _ in 0..cfg.num_layers {
            layers.push(match kind {
                KvKind::Preallocated => {
                    let shape = (batch, cfg.num_kv_heads, capacity, cfg.head_dim);
                    Some((
                        Tensor::zeros(shape, dtype, device)?,
                        Tensor::zeros(shape, dtype, device)?,
                    ))
                }
                KvKind::Growing => None,
            });
        }
        Ok(KvCache {
            kind,
            capacity,
            len: 0,
            layers,
        })
    }

    pub fn kind(&self) -> KvKind {
        self.kind
    }

    /// Tokens held (per sequence).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `k`, `v` (batch, n_kv, s, head_dim) at position `self.len()` of `layer` and
    /// returns the keys and values of all tokens so far. Call [`KvCache::advance`] once every
    /// layer has appended.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let s = k.dim(2)?;
        let total = self.len + s;
        if total > self.capacity {
            candle_core::bail!(
                "KV cache full: {} + {s} tokens exceed its capacity of {}",
                self.len,
                self.capacity
            )
        }
        let slot = &mut self.layers[layer];
        match self.kind {
            KvKind::Preallocated => {
                let (ck, cv) = slot.as_ref().expect("preallocated");
                ck.slice_set(&k.contiguous()?, 2, self.len)?;
                cv.slice_set(&v.contiguous()?, 2, self.len)?;
                Ok((ck.narrow(2, 0, total)?, cv.narrow(2, 0, total)?))
            }
            KvKind::Growing => {
                let (nk, nv) = match slot.take() {
                    None => (k.contiguous()?, v.contiguous()?),
                    Some((ok, ov)) => (Tensor::cat(&[&ok, k], 2)?, Tensor::cat(&[&ov, v], 2)?),
                };
                *slot = Some((nk.clone(), nv.clone()));
                Ok((nk, nv))
            }
        }
    }

    /// Marks `s` more tokens as held, after every layer appended them.
    pub fn advance(&mut self, s: usize) {
        self.len += s;
    }
}
