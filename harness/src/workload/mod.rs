//! Workloads: what runs inside measured phases.
pub mod inference;
pub mod training;
pub mod warmup;
