//! `vramlab validate`: the estimator against published measurements, row by row, with the
//! median and worst absolute error. `--json` prints the same content.
use crate::estimate::Runtime;
use crate::fit::Constants;
use crate::units::{gb, signed_pct};
use crate::validate::{self, Outcome, Summary, Validated};
use anyhow::Result;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the table was printed, whatever the errors it shows; 1 a \
failure; 2 bad input: an unusable peers file (malformed, or an unknown metric) or constants \
file (one line naming it)."
)]
pub struct Args {
    /// A peers file: a JSON array of published measurements (see results/peers/published.json
    /// and its sources, results/peers/SOURCES.md).
    pub peers: PathBuf,
    /// Fitted constants from `vramlab fit` (default: the analytic estimator). Used for the
    /// rows whose architecture they cover; the rows are torch on CUDA, so constants of another
    /// runtime or backend need --allow-transfer.
    #[arg(long)]
    pub constants: Option<PathBuf>,
    /// Use constants measured on another runtime or backend anyway (prints a warning line).
    #[arg(long)]
    pub allow_transfer: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    peers: String,
    estimator: &'a str,
    rows: &'a [Validated],
    summary: Summary,
}

pub fn run(a: Args) -> Result<()> {
    let constants = match &a.constants {
        None => None,
        Some(p) => {
            let c = Constants::load(p)?;
            if let Some(w) = c.check_query(
                p,
                Runtime::Torch,
                crate::vocab::Backend::Cuda,
                a.allow_transfer,
            )? {
                eprintln!("warning: {w}");
            }
            Some(c)
        }
    };
    let estimator = match &a.constants {
        Some(p) => format!("constants {}", p.display()),
        None => format!(
            "analytic (torch runtime, CUDA device terms); generation rows: built-in reference {} (diffusers on the CPU, transferred to CUDA)",
            crate::estimate::generate::reference(Runtime::Torch).0
        ),
    };
    let rows = validate::validate(&a.peers, constants.as_ref())?;
    let summary = validate::summarize(&rows);
    if a.json {
        let report = Report {
            peers: a.peers.display().to_string(),
            estimator: &estimator,
            rows: &rows,
            summary,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "validate {} ({} rows; estimator: {estimator}); bytes in GB (1e9), error = (estimate - measured) / measured",
        a.peers.display(),
        rows.len()
    );
    let id_w = rows.iter().map(|r| r.id.len()).max().unwrap_or(2).max(2);
    println!(
        "{:<id_w$}  {:>10}  {:>10}  {:>9}  includes",
        "id", "estimate", "measured", "error"
    );
    for r in &rows {
        if let Outcome::Estimated {
            estimate_bytes,
            error_pct,
            ..
        } = &r.outcome
        {
            println!(
                "{:<id_w$}  {:>10}  {:>10}  {:>9}  {}",
                r.id,
                gb(*estimate_bytes),
                gb(r.measured_bytes),
                signed_pct(*error_pct),
                r.includes
            );
        }
    }
    let skipped: Vec<&Validated> = rows.iter().filter(|r| r.error_pct().is_none()).collect();
    if !skipped.is_empty() {
        println!("not expressible ({}):", skipped.len());
        for r in skipped {
            if let Outcome::NotExpressible { reason } = &r.outcome {
                println!(
                    "{:<id_w$}  {:>10}  {:>10}  {:>9}  {reason}",
                    r.id,
                    "-",
                    gb(r.measured_bytes),
                    "-"
                );
            }
        }
    }
    match (
        summary.median_abs_error_pct,
        summary.worst_abs_error_pct,
        &summary.worst_id,
    ) {
        (Some(m), Some(w), Some(id)) => println!(
            "median absolute error: {m:.2}% over {} rows; worst: {w:.2}% ({id})",
            summary.estimated
        ),
        _ => println!("no row the estimator can express"),
    }
    Ok(())
}
