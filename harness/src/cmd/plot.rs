//! `vramlab plot CSV... --out DIR [--constants FILE]`: SVG and PNG figures of calibration CSVs.
use crate::error::bad_file;
use crate::export::csv::read_table;
use crate::fit::Constants;
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Figures (per model, runtime, backend and device in the input; axes in GiB):
  *-context         peak allocated vs context, per precision and KV kind (smallest batch)
  *-batch           peak allocated vs batch (largest context)
  *-kv-curve        allocated (end of step) and reserved (peak) over decode steps
  *-train-phases    a training step's peak built up by forward, backward and optimizer (stacked)
  *-parity          predicted (--constants) vs measured, with ±1% and ±5% bands
  *-candle-vs-torch per phase, when both runtimes are in the input (torch probe CSVs)
  *-gen-phases      a generation point's peak built up by text encode, denoise and VAE decode
  *-decode-pixels   the VAE decode's peak over its baseline vs output pixels, per decode kind

Exit codes: 0 the figures were written; 1 drawing or writing them failed; 2 bad input: an \
unusable CSV or constants file, nothing to plot, or an --out that cannot be created (one line \
naming it).")]
pub struct Args {
    /// Calibration CSVs (from `vramlab sweep`, `merge`, or the torch probe).
    #[arg(required = true)]
    pub csv: Vec<PathBuf>,
    /// Folder for the figures (created): NAME.svg and NAME.png each.
    #[arg(long)]
    pub out: PathBuf,
    /// Fitted constants (`vramlab fit`): adds the predicted-vs-measured parity plot.
    #[arg(long)]
    pub constants: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let tables = a
        .csv
        .iter()
        .map(|p| read_table(p))
        .collect::<Result<Vec<_>>>()?;
    let constants = a.constants.as_deref().map(Constants::load).transpose()?;
    let figs = crate::plot::figures(&tables, constants.as_ref());
    if figs.is_empty() {
        return Err(bad_file(
            &a.csv[0],
            "nothing to plot: no ok inference, encode, training or generation rows",
        ));
    }
    std::fs::create_dir_all(&a.out).map_err(|e| bad_file(&a.out, format!("cannot create: {e}")))?;
    for f in &figs {
        let files = crate::plot::render(f, &a.out)?;
        println!(
            "{}  ({})",
            files[0].with_extension("{svg,png}").display(),
            f.title
        );
    }
    eprintln!("{} figures -> {}", figs.len(), a.out.display());
    Ok(())
}
