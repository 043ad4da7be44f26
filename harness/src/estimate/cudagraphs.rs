//! vLLM 0.33's CUDA graphs in the serving estimate: which graphs it captures and what its
//! startup subtracts for them before sizing the KV cache (`v1/worker/gpu_worker.py`,
//! `determine_available_memory`: "Estimated CUDA graph memory", on by default since vLLM 0.21,
//! `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`).
//!
//! The capture sizes follow `config/vllm.py` (`_set_cudagraph_sizes`): a ceiling of
//! `min(2 × max_num_seqs, 512)` tokens (1,024 on data-center Blackwell, compute capability
//! 10.x), then `min` with `max_num_batched_tokens`; sizes 1, 2, 4, multiples of 8 below 256 and
//! of 16 from 256, each up to the ceiling; plus `max_num_batched_tokens` and `max_num_seqs`
//! where the ceiling holds them. The default mode, FULL_AND_PIECEWISE, captures a PIECEWISE
//! graph at every size and a FULL (uniform decode) graph at every size up to `max_num_seqs`
//! (`v1/worker/gpu/cudagraph_utils.py`, `_init_candidates`).
//!
//! vLLM's estimate (`profile_cudagraph_memory`) captures every PIECEWISE graph and the two
//! largest FULL ones into a throwaway pool, measures the drop in free memory, and replaces the
//! two FULL samples by an extrapolation: the first, plus `max(second, 1 MiB)` for each further
//! FULL graph. The pool it measures depends on where PyTorch's caching allocator places each
//! capture's blocks; that part is fitted ([`crate::estimate::serving::Fitted::graph_pool`]) on
//! the features [`features`] names. The 1 MiB a FULL graph beyond the first is vLLM's floor:
//! exact where the second sample is under it, as it is on every emulated startup (the second
//! FULL capture frees more than it takes).
use crate::gpu::Gpu;
use serde::Serialize;

/// vLLM's floor for each FULL graph beyond the first (`_MIN_PER_GRAPH_BYTES`).
pub const FULL_GRAPH_FLOOR: u64 = 1 << 20;

/// The graphs vLLM captures for a query.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Captures {
    /// Every capture size, ascending (tokens): one PIECEWISE graph each.
    pub sizes: Vec<u64>,
    /// The FULL (uniform decode) graphs: the sizes up to `max_num_seqs`.
    pub full_graphs: u64,
}

impl Captures {
    /// The largest PIECEWISE capture (tokens).
    pub fn largest(&self) -> u64 {
        self.sizes.last().copied().unwrap_or(0)
    }

    /// The largest FULL capture (tokens).
    pub fn largest_full(&self) -> u64 {
        (self.full_graphs as usize)
            .checked_sub(1)
            .and_then(|i| self.sizes.get(i))
            .copied()
            .unwrap_or(0)
    }
}

/// The capture sizes of vLLM 0.33's defaults for `max_num_batched_tokens` `n` and
/// `max_num_seqs` `s` on `gpu` (module doc).
pub fn captures(gpu: &Gpu, n: u64, s: u64) -> Captures {
    let platform = if gpu.compute_capability.0 == 10 {
        1024
    } else {
        512
    };
    let ceiling = (2 * s).min(platform);
    let uniform_decode = (s <= ceiling).then_some(s);
    let ceiling = ceiling.min(n);
    let mut sizes: Vec<u64> = [1, 2, 4].into_iter().filter(|&i| i <= ceiling).collect();
    if ceiling >= 8 {
        sizes.extend((8..(ceiling + 1).min(256)).step_by(8));
    }
    if ceiling >= 256 {
        sizes.extend((256..=ceiling).step_by(16));
    }
    if n <= ceiling {
        sizes.push(n);
    }
    sizes.extend(uniform_decode.filter(|&u| u <= n));
    sizes.sort_unstable();
    sizes.dedup();
    let largest = sizes.last().copied().unwrap_or(0);
    let full_graphs = sizes.iter().filter(|&&t| t <= s && t <= largest).count() as u64;
    Captures { sizes, full_graphs }
}

/// How many terms [`features`] gives: three for Hopper cards (compute capability 9.x, where
/// vLLM's attention is FlashAttention 3) and three for the others (FlashAttention 2), each a
/// constant, the PIECEWISE captures and the FULL ones.
pub const GRAPH_FEATURES: usize = 6;

/// Whether vLLM runs FlashAttention 3 on `gpu` (Hopper), whose captures hold more than
/// FlashAttention 2's: the pool's terms are fitted apart for the two.
pub fn flash_attention_3(gpu: &Gpu) -> bool {
    gpu.compute_capability.0 == 9
}

/// The fitted pool's terms for captures `c` of a model of `hidden` width at `e` bytes an
/// element on `gpu`: 1 (a constant), a hidden row (h·e bytes) summed over every PIECEWISE
/// size, and over every FULL size; in the three slots of the card's attention
/// ([`flash_attention_3`]), the other three 0. On the emulated startups the pool follows the
/// hidden width and the capture sizes, not the layer count
/// (docs/src/guides/serving.md, "CUDA graphs").
pub fn features(gpu: &Gpu, c: &Captures, hidden: u64, e: u64) -> [f64; GRAPH_FEATURES] {
    let row = (hidden * e) as f64;
    let pw: u64 = c.sizes.iter().sum();
    let full: u64 = c.sizes[..c.full_graphs as usize].iter().sum();
    let terms = [1.0, row * pw as f64, row * full as f64];
    let mut f = [0.0; GRAPH_FEATURES];
    let at = if flash_attention_3(gpu) { 0 } else { 3 };
    f[at..at + 3].copy_from_slice(&terms);
    f
}

/// vLLM's "Estimated CUDA graph memory" (bytes): the fitted pool of its profiling capture plus
/// the floor of every FULL graph beyond the first.
pub fn estimate(c: &Captures, pool: &[f64; GRAPH_FEATURES], f: &[f64; GRAPH_FEATURES]) -> u64 {
    let fitted: f64 = pool.iter().zip(f).map(|(c, x)| c * x).sum();
    fitted.round().max(0.0) as u64 + c.full_graphs.saturating_sub(1) * FULL_GRAPH_FLOOR
}

#[cfg(test)]
mod tests {
    use super::captures;

    #[test]
    fn capture_sizes_follow_vllm_s_rule() {
        let h100 = crate::gpu::by_name("h100-80gb").unwrap();
        // 2 × 1,024 sequences over the 512 ceiling: 1, 2, 4, 8..248 by 8, 256..512 by 16.
        let c = captures(&h100, 8192, 1024);
        assert_eq!(c.sizes.len(), 3 + 31 + 17);
        assert_eq!(
            (c.largest(), c.full_graphs, c.largest_full()),
            (512, 51, 512)
        );
        // 256 sequences: the ceiling is still 512; the FULL graphs stop at 256.
        let c = captures(&h100, 2048, 256);
        assert_eq!(
            (c.sizes.len(), c.full_graphs, c.largest_full()),
            (51, 35, 256)
        );
        // 100 sequences: ceiling 200, and 100 itself is captured (off the stride).
        let c = captures(&h100, 8192, 100);
        assert!(c.sizes.contains(&100) && c.largest() == 200);
        assert_eq!(
            c.full_graphs as usize,
            c.sizes.iter().filter(|&&t| t <= 100).count()
        );
        // 300 batched tokens bound the ceiling and are captured themselves.
        let c = captures(&h100, 300, 1024);
        assert_eq!(c.largest(), 300);
        let b200 = crate::gpu::by_name("b200").unwrap();
        assert_eq!(captures(&b200, 16384, 1024).largest(), 1024);
    }
}
