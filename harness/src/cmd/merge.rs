//! `vramlab merge OUT.csv IN.csv...`: one CSV and one manifest from the shards of a sweep.
use crate::error::InputError;
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 merged; 1 a failure (writing OUT, say); 2 bad input: an \
input that cannot be merged (unreadable, another schema, scenario or weights, or a point \
measured twice with different figures) or an unusable OUT (one line naming the files)."
)]
pub struct Args {
    /// The merged CSV to write (its manifest goes beside it as OUT.manifest.json).
    pub out: PathBuf,
    /// The CSVs to merge (each with its NAME.manifest.json), e.g. the outputs of
    /// `vramlab sweep --shard K/N` for every K.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    if a.out.extension().and_then(|e| e.to_str()) != Some("csv") {
        return Err(
            InputError::arg(format!("{}: the output must end in .csv", a.out.display())).into(),
        );
    }
    if a.inputs.iter().any(|i| i == &a.out) {
        return Err(
            InputError::arg(format!("{}: the output is also an input", a.out.display())).into(),
        );
    }
    let s = crate::merge::merge(&a.out, &a.inputs)?;
    eprintln!(
        "merged {} files: {} points, {} rows ({} exact duplicate rows removed) -> {}",
        a.inputs.len(),
        s.points,
        s.rows,
        s.duplicates_removed,
        a.out.display()
    );
    Ok(())
}
