//! Scenario files: the serde spec (strict) and every expansion of a scenario into points,
//! with the checks that need the expanded point: language-model grids (`grid.rs`), generation
//! points (`gen_points.rs`) and a denoiser's fine-tuning points (`ft_points.rs`).
pub mod ft_points;
pub mod gen_points;
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
        return gen_points::expand(spec).into_iter().map(|p| p.id).collect();
    }
    let mut ids: Vec<String> = ft_points::expand(spec).into_iter().map(|p| p.id).collect();
    ids.extend(expand(spec).into_iter().map(|p| p.id));
    ids
}
