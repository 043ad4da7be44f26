//! The KV cache, in two kinds (ARCHITECTURE.md §4):
//! - `preallocated`: one (batch, n_kv, capacity, head_dim) tensor per layer for K and for V,
//!   allocated once and written in place with `slice_set`;
//! - `growing`: exact-fit growth by concatenation. Each append allocates a tensor one step
//!   longer and frees the old one, so the live bytes are exactly
//!   `kv_bytes_per_token · tokens · batch` (plus two tensors' metadata per layer) at every step,
//!   and the step's transient is one extra copy of that layer's cache.
//!
//! A sliding-window model (Mistral) under `kv_window = "model"` keeps only the last `window`
//! tokens: the cache holds min(context, window) tokens, and token i lives at slot i mod
//! window (a ring buffer; `growing` drops the oldest tokens instead). A decode step's query
//! sees exactly the window, in slot order, which softmax attention does not depend on.
use super::config::KvWindow;
use super::Config;
use candle_core::{DType, Device, Result, Tensor};

pub use crate::vocab::KvKind;

pub struct KvCache {
    kind: KvKind,
    /// Tokens appended so far (the next token's position).
    len: usize,
    layers: Vec<LayerCache>,
}

/// One layer's K and V, with how many tokens it holds at most.
struct LayerCache {
    /// Tokens the layer holds at most (min(context, window) for a layer capped at its window).
    capacity: usize,
    /// Whether tokens beyond `capacity` replace the oldest (a capped sliding window).
    ring: bool,
    kv: Option<(Tensor, Tensor)>,
}

/// Of the keys and values (b, n_kv, held, hd) a layer's cache returned to a decode step at
/// position `pos`, those a layer of chunked attention (chunk `c`) sees: its own chunk's, the
/// last `pos mod c + 1` tokens. A cache in position order holds them last; a full
/// `preallocated` ring of c slots (`ring`, [`KvCache::ring_ordered`]) holds token i at slot
/// i mod c, and a chunk starts at a multiple of c, so they are its first slots.
pub fn chunk_keys(
    ring: bool,
    (k, v): (Tensor, Tensor),
    pos: usize,
    chunk: usize,
) -> Result<(Tensor, Tensor)> {
    let (held, n) = (k.dim(2)?, pos % chunk + 1);
    let start = match ring && pos >= chunk {
        true => 0,
        false => held - n.min(held),
    };
    Ok((k.narrow(2, start, n)?, v.narrow(2, start, n)?))
}

impl KvCache {
    /// A cache for `context` tokens of `batch` sequences, each layer capped at its sliding
    /// window under [`KvWindow::Model`] (a model that interleaves local and global layers
    /// caps only the local ones). `preallocated` allocates it all now.
    pub fn new(
        kind: KvKind,
        cfg: &Config,
        batch: usize,
        context: usize,
        window: KvWindow,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let capacity = cfg.layer_kv_tokens(i, context, window);
            let kv = match kind {
                KvKind::Preallocated => {
                    let shape = (batch, cfg.num_kv_heads, capacity, cfg.head_dim);
                    Some((
                        Tensor::zeros(shape, dtype, device)?,
                        Tensor::zeros(shape, dtype, device)?,
                    ))
                }
                KvKind::Growing => None,
            };
            layers.push(LayerCache {
                capacity,
                ring: capacity < context,
                kv,
            });
        }
        Ok(KvCache {
            kind,
            len: 0,
            layers,
        })
    }

    pub fn kind(&self) -> KvKind {
        self.kind
    }

    /// Tokens appended so far (per sequence): the position of the next token.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Tokens the cache holds now (per sequence): `len()`, capped at a window's capacity; the
    /// most any layer holds.
    pub fn held(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                if l.ring {
                    self.len.min(l.capacity)
                } else {
                    self.len
                }
            })
            .max()
            .unwrap_or(self.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `k`, `v` (batch, n_kv, s, head_dim) at position `self.len()` of `layer` and
    /// returns the keys and values the new queries attend to: every token so far; for a
    /// capped window, the window (a decode step), or the whole new chunk (a first prefill
    /// longer than the window, which the attention masks to the window). Call
    /// [`KvCache::advance`] once every layer has appended.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let s = k.dim(2)?;
        let total = self.len + s;
        let layer = &mut self.layers[layer];
        let cap = layer.capacity;
        if total > cap && !layer.ring {
            candle_core::bail!(
                "KV cache full: {} + {s} tokens exceed its capacity of {cap}",
                self.len
            )
        }
        if total > cap && s > 1 && self.len > 0 {
            candle_core::bail!(
                "KV cache: a chunk of {s} tokens after {} cannot be written past the window of {cap} (only the first prefill or single-token steps can)",
                self.len
            )
        }
        let slot = &mut layer.kv;
        match self.kind {
            KvKind::Preallocated => {
                let (ck, cv) = slot.as_ref().expect("preallocated");
                if total <= cap {
                    ck.slice_set(&k.contiguous()?, 2, self.len)?;
                    cv.slice_set(&v.contiguous()?, 2, self.len)?;
                    return Ok((ck.narrow(2, 0, total)?, cv.narrow(2, 0, total)?));
                }
                // Token i at slot i mod cap: the last `cap` tokens of the chunk, in at most two
                // contiguous runs.
                let first = total - cap.min(s) - self.len; // offset in the chunk
                let mut i = first;
                while i < s {
                    let at = (self.len + i) % cap;
                    let n = (cap - at).min(s - i);
                    ck.slice_set(&k.narrow(2, i, n)?.contiguous()?, 2, at)?;
                    cv.slice_set(&v.narrow(2, i, n)?.contiguous()?, 2, at)?;
                    i += n;
                }
                if s == 1 {
                    Ok((ck.clone(), cv.clone()))
                } else {
                    Ok((k.clone(), v.clone()))
                }
            }
            KvKind::Growing => {
                let (nk, nv) = match slot.take() {
                    None => (k.contiguous()?, v.contiguous()?),
                    Some((ok, ov)) => (Tensor::cat(&[&ok, k], 2)?, Tensor::cat(&[&ov, v], 2)?),
                };
                let held = nk.dim(2)?;
                let (sk, sv) = if held > cap {
                    // Drop the oldest tokens: a copy of the window.
                    (
                        nk.narrow(2, held - cap, cap)?.contiguous()?,
                        nv.narrow(2, held - cap, cap)?.contiguous()?,
                    )
                } else {
                    (nk.clone(), nv.clone())
                };
                *slot = Some((sk.clone(), sv.clone()));
                if held > cap && s > 1 {
                    Ok((nk, nv))
                } else {
                    Ok((sk, sv))
                }
            }
        }
    }

    /// Whether `layer`'s cache returns a decode step its tokens in slot order (a capped
    /// `preallocated` ring) rather than in position order.
    pub fn ring_ordered(&self, layer: usize) -> bool {
        self.kind == KvKind::Preallocated && self.layers[layer].ring
    }

    /// Marks `s` more tokens as held, after every layer appended them.
    pub fn advance(&mut self, s: usize) {
        self.len += s;
    }
}
