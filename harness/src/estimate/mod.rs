//! `estimate`: the memory a configuration needs, category by category (ARCHITECTURE.md §9), from
//! analytic formulas or from constants that `fit` measured.
//!
//! Training follows the ZeRO paper's accounting: per parameter, weights + gradients +
//! optimizer state (mixed precision with AdamW: 4 + 4 + 8 = 16 B here, since our f32 master
//! weights take the gradients, ARCHITECTURE.md §8), divided over `gpus` by the sharding stage.
//! Under torch the activations of the llama family, GPT-2 and StarCoder are what transformers'
//! own layer saves for the backward (`Architecture::torch_saved_per_token`); elsewhere
//! activations per GPU follow Korthikanti et al.: s·b·h·(34 + 5·a·s/h) bytes per layer at 16 bits,
//! without the 5·a·s/h score term under flash attention.
//!
//! One file per job: [`query`] (what is asked), [`breakdown`] (the rows of the answer),
//! [`infer`] and [`train`] (the analytic estimates), [`device`] (the device rows and the
//! allocator's reserve), [`fitted`] (fitted constants over the analytic rows: [`estimate`]),
//! [`gpu`] (the GPU verdicts on the catalogue of `crate::gpu`), [`formats`] (`--best-format`),
//! [`optimizer`] (bitsandbytes' optimizer state); [`model`] resolves `--model` (a Hub id
//! through [`hub`]) and [`generate`] is the generation estimate.
pub mod breakdown;
pub mod cudagraphs;
pub mod device;
pub mod fitted;
pub mod formats;
pub mod generate;
pub mod gpu;
pub mod hub;
pub mod infer;
pub mod model;
pub mod optimizer;
pub mod query;
pub mod serving;
pub mod serving_fit;
#[cfg(test)]
mod test_support;
pub mod train;
pub mod vllm;

pub use crate::checked::Overflow;
pub use crate::fit::Runtime;
pub use crate::gpu::budget;
pub use breakdown::Breakdown;
pub use device::{
    cublas_workspace, reference_reserve, with_reserve, with_reserve_of, ALLOCATOR_ROUNDING,
    CUBLAS_WORKSPACE, CUDA_CONTEXT, REFERENCE_RESERVE,
};
pub use fitted::{estimate, fitted_group, group_key, query_terms};
pub use formats::{format_fits, FormatFit, BEST_FORMATS};
pub use gpu::{fits_in, gpu_fit, largest, GpuFit, Verdict, MAX_BATCH, MAX_CONTEXT, MAX_GPUS};
pub use infer::infer_features;
pub use model::{resolve, Resolved};
pub use query::{
    Attention, Backend, Compute, KvWindow, Mode, Optimizer, OptimizerImpl, Precision, Query,
    Sharding, Stack, Trainable,
};
pub use train::{grad_bytes, layer_activations, model_states, train_features, Recompute};
