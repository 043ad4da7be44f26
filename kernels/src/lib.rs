//! vramlab-kernels: our own fused ops with a backward, and a fused AdamW, each with a CPU twin
//! and a CUDA version behind feature `cuda` (DESIGN.md §2).
//!
//! Empty so far: every model and optimizer runs on candle's own differentiable ops
//! (`kernels = "reference"` in the CSV). A fused kernel lands here together with a test that
//! it matches the reference ops' values and gradients, and a sweep column `kernels = "fused"`.
