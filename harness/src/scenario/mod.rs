//! Scenario files: the serde spec (strict), the pure expansion into points (language-model
//! grids, generation and fine-tuning points) and their checks before anything is measured.
pub mod finetune;
pub mod generate;
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

/// Every point id of `spec`, in measuring order, whatever its mode: a generation scenario's
/// points, else its fine-tuning points and its language-model grid.
pub fn point_ids(spec: &Spec) -> Vec<String> {
    if spec
        .sweep
        .0
        .iter()
        .any(|s| s.mode.contains(&Mode::Generate))
    {
        return generate::expand(spec).into_iter().map(|p| p.id).collect();
    }
    let mut ids: Vec<String> = finetune::expand(spec).into_iter().map(|p| p.id).collect();
    ids.extend(expand(spec).into_iter().map(|p| p.id));
    ids
}
