//! The defaults of the scenario keys a table may leave out (serde's `default = ...`).
use crate::vocab::{
    Attention, Checkpointing, Compute, Kernels, KvKind, KvWindow, Optimizer, QMatmul, Trainable,
    VaeDecode,
};

pub(super) fn default_kv_window() -> Vec<KvWindow> {
    vec![KvWindow::Model]
}
pub(super) fn default_kv() -> Vec<KvKind> {
    vec![KvKind::Preallocated]
}
pub(super) fn default_decode_steps() -> usize {
    16
}
pub(super) fn default_decode_every() -> usize {
    8
}
pub(super) fn default_repeats() -> usize {
    1
}
pub(super) fn default_optimizer() -> Vec<Optimizer> {
    vec![Optimizer::Adamw]
}
pub(super) fn default_ckpt() -> Vec<Checkpointing> {
    vec![Checkpointing::None]
}
pub(super) fn default_accum() -> Vec<i64> {
    vec![1]
}
pub(super) fn default_trainable() -> Vec<Trainable> {
    vec![Trainable::Full]
}
pub(super) fn default_kernels() -> Vec<Kernels> {
    vec![Kernels::Reference]
}
pub(super) fn default_compute() -> Vec<Compute> {
    vec![Compute::F32]
}

pub(super) fn default_qmatmul() -> Vec<QMatmul> {
    vec![QMatmul::Auto]
}
pub(super) fn default_attention() -> Vec<Attention> {
    vec![Attention::Eager]
}
pub(super) fn default_train_steps() -> usize {
    1
}
pub(super) fn default_lr() -> f64 {
    1e-4
}
pub(super) fn default_vae_decode() -> Vec<VaeDecode> {
    vec![VaeDecode::Full]
}
pub(super) fn default_tile() -> usize {
    256
}
pub(super) fn default_overlap() -> usize {
    64
}
pub(super) fn default_denoise_steps() -> usize {
    2
}

pub(super) fn default_device() -> String {
    "cpu".into()
}
