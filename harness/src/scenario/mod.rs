//! Scenario files: the serde spec (strict), and the pure grid expansion into points.
pub mod grid;
pub mod shard;
pub mod spec;

pub use grid::{expand, Point};
pub use spec::{Mode, Precision, Spec};

use sha2::{Digest, Sha256};

/// First 16 hex digits of the sha256 of `bytes`.
pub fn short_hash(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
