//! Scenario files: the serde spec (strict) and the pure expansion of language-model grids
//! into points. Generation and fine-tuning points are expanded beside their workloads
//! (`workload/gen_points.rs`, `workload/ft_points.rs`), which own their sources' types.
pub mod grid;
pub mod spec;

pub use grid::{expand, Point};
pub use spec::{Mode, Precision, Spec};

use sha2::{Digest, Sha256};

/// First 16 hex digits of the sha256 of `bytes`.
pub fn short_hash(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
