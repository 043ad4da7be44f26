//! Workloads: what runs inside measured phases.
pub mod inference;
pub mod warmup;
