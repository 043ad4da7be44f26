//! vramlab-kernels: our own fused ops with a backward, and an in-place AdamW (ARCHITECTURE.md §12).
//!
//! Every op is a candle `CustomOp1/2/3` whose backward is written by hand, so it records a
//! gradient where candle-nn's fused `rms_norm`, `softmax_last_dim` and `rope` record none:
//! - [`flash_attention`]: tiled attention with an online softmax. The forward keeps only the
//!   output and one log-sum-exp per row; the backward recomputes the scores tile by tile.
//!   Causal or not, GQA, optional sliding window; O(s) memory in both directions.
//! - [`rms_norm`] (keeps rstd per row), [`layer_norm`] (keeps mean and rstd), [`rope`]
//!   (rotate-half, keeps nothing), [`swiglu`] `silu(a)·b`, [`softmax_last_dim`] (keeps its
//!   output).
//! - [`adamw`]: AdamW that updates the parameter, m and v in place, with no temporaries.
//!
//! Each has a CPU implementation (rayon over rows; f32, bf16 and f16, computed in f32). The
//! CUDA sources live in `kernels/cuda/` behind feature `cuda`.
pub mod adamw;
mod attention;
#[cfg(feature = "cuda")]
mod cuda;
mod elem;
mod norm;
mod rowwise;

pub use adamw::{adamw_step, adamw_step_mixed, AdamWParams, AdamWState};
pub use attention::{flash_attention, AttnMask, FLASH_TILE};
pub use norm::{layer_norm, rms_norm};
pub use rowwise::{rope, softmax_last_dim, swiglu};
