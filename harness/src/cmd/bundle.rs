//! `vramlab bundle RESULTS_DIR --out NAME.tar.gz` and `vramlab bundle --verify NAME.tar.gz`.
use crate::error::InputError;
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the bundle was written and verified, or --verify found \
every file intact; 1 --verify found a file modified, added or removed, or another failure; 2 \
bad input: an unusable results folder, bundle name or archive (one line naming it)."
)]
pub struct Args {
    /// The results folder to pack: its CSVs, manifests, constants (*.constants.toml) and
    /// plots (*.svg, *.png), subfolders included.
    #[arg(required_unless_present = "verify", conflicts_with = "verify")]
    pub dir: Option<PathBuf>,
    /// The bundle to write: NAME.tar.gz (entries under NAME/, with REPORT.md and SHA256SUMS).
    #[arg(long, required_unless_present = "verify")]
    pub out: Option<PathBuf>,
    /// Check a bundle instead: every file against SHA256SUMS and REPORT.md (exit 1 when a
    /// file was modified, added or removed).
    #[arg(long, value_name = "NAME.tar.gz")]
    pub verify: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    if let Some(b) = &a.verify {
        let v = crate::bundle::verify(b)?;
        println!(
            "{}: {} files verified; archive sha256 {}",
            b.display(),
            v.files,
            v.archive_sha256
        );
        return Ok(());
    }
    let (Some(dir), Some(out)) = (&a.dir, &a.out) else {
        return Err(InputError::arg("bundle needs RESULTS_DIR and --out NAME.tar.gz").into());
    };
    let n = crate::bundle::pack(dir, out)?;
    let v = crate::bundle::verify(out)?;
    println!(
        "wrote {} ({n} files, REPORT.md and SHA256SUMS included); archive sha256 {}",
        out.display(),
        v.archive_sha256
    );
    Ok(())
}
