//! `vramlab validate`: the estimator against published measurements, row by row, with the
//! median and worst absolute error; or, with `--against-emulator`, against the emulated GPU
//! over a grid of queries (`cmd/estimate/agreement.rs`). `--json` prints the same content.
use crate::estimate::Runtime;
use crate::fit::Constants;
use crate::units::{gb, signed_pct};
use crate::validate::emulated::{Column, Options};
use crate::validate::{self, Outcome, Summary, Validated};
use anyhow::Result;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the table was printed, whatever the errors it shows; 1 a \
failure, or with --against-emulator a verdict that flipped (the table is printed first); 2 bad \
input: an unusable peers or queries file (malformed, or a row with an unknown or missing value: \
one line naming the row and the key) or constants file (one line naming it)."
)]
pub struct Args {
    /// A peers file: a JSON array of published measurements, one typed row each (see
    /// results/peers/published.json, its sources in results/peers/SOURCES.md, and the row
    /// format in docs/src/results/peers.md). With --against-emulator: a queries file.
    pub peers: PathBuf,
    /// Run each query of a queries file (TOML: `[[query]]` tables of `vramlab estimate`
    /// arguments with a `--gpu`, and optional `model`, `batch` and `context` lists expanded as a
    /// grid; scenarios/agreement/) both ways: the instant estimate, and `--emulate` on the
    /// same card. Prints the allocated and NVML-used figures, their errors (analytic −
    /// emulated) / emulated, the analytic range, both verdicts, the median and worst errors and
    /// the verdicts that flipped. Tens of seconds per query; needs the torch environment.
    #[arg(long, conflicts_with_all = ["emulate", "constants"])]
    pub against_emulator: bool,
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
    /// Also run each row's own program on the emulated GPU of the row's card, under the
    /// installable software stack closest to the row's (rows vramlab has a program for: the HF
    /// Trainer runs of transformers' single-GPU training guide, and fms-acceleration's
    /// fine-tuning benchmark, whose multi-GPU rows run as rank 0 of FSDP through accelerate with
    /// torch's fake process group), and print PyTorch's figure
    /// (the one the row measured: NVML used, allocated or reserved) beside the estimate, with
    /// its error and a note naming the stack. Tens of seconds per row; needs the stacks
    /// installed (`scripts/torch-env.sh [--stack NAME]`).
    #[arg(long)]
    pub emulate: bool,
    /// With --emulate: this stack for every row instead of the closest one.
    #[arg(long, value_enum, value_name = "NAME", requires = "emulate")]
    pub stack: Option<crate::vocab::Stack>,
    /// With --emulate: this Python's torch for every row (instead of a stack's).
    #[arg(
        long,
        value_name = "PYTHON",
        requires = "emulate",
        conflicts_with = "stack"
    )]
    pub python: Option<PathBuf>,
    /// With --emulate: stop a row's program after this long (e.g. 90s, 10m; 0 for never); the
    /// row is then not emulated, naming where it was.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = crate::emulate::query::DEFAULT_TIMEOUT,
        value_parser = crate::emulate::supervise::parse_timeout,
        requires = "emulate"
    )]
    pub emulate_timeout: crate::emulate::supervise::Timeout,
}

#[derive(Serialize)]
struct Report<'a> {
    peers: String,
    estimator: &'a str,
    rows: &'a [Validated],
    summary: Summary,
}

pub fn run(a: Args) -> Result<()> {
    if a.against_emulator {
        return crate::cmd::estimate::agreement::run(&a.peers, a.json);
    }
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
    let emulate = a.emulate.then(|| Options {
        stack: a.stack,
        python: a.python.clone(),
        timeout: a.emulate_timeout.0,
        runs: Default::default(),
    });
    let rows = validate::validate(&a.peers, constants.as_ref(), emulate.as_ref())?;
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
    let emu_head = if a.emulate {
        format!("  {:>10}  {:>9}", "emulated", "emu error")
    } else {
        String::new()
    };
    println!(
        "{:<id_w$}  {:>10}  {:>10}  {:>9}{emu_head}  includes",
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
                "{:<id_w$}  {:>10}  {:>10}  {:>9}{}  {}",
                r.id,
                gb(*estimate_bytes),
                gb(r.measured_bytes),
                signed_pct(*error_pct),
                emu_cells(r, a.emulate),
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
                    "{:<id_w$}  {:>10}  {:>10}  {:>9}{}  {reason}",
                    r.id,
                    "-",
                    gb(r.measured_bytes),
                    "-",
                    emu_cells(r, a.emulate),
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
    if a.emulate {
        emulated_notes(&rows, id_w);
    }
    Ok(())
}

/// The emulated figure and its error, or dashes where the row has none.
fn emu_cells(r: &Validated, emulate: bool) -> String {
    match &r.emulated {
        Some(Column::Ran {
            emulated_bytes,
            error_pct,
            ..
        }) => format!(
            "  {:>10}  {:>9}",
            gb(*emulated_bytes),
            signed_pct(*error_pct)
        ),
        Some(Column::NotEmulated { .. }) => format!("  {:>10}  {:>9}", "-", "-"),
        None if emulate => format!("  {:>10}  {:>9}", "-", "-"),
        None => String::new(),
    }
}

/// `--emulate`: each emulated row's program, figure and note; why the others have none; the
/// median and worst absolute error of the emulated figures.
fn emulated_notes(rows: &[Validated], id_w: usize) {
    println!("emulated (PyTorch's allocator on a stub CUDA runtime; not a GPU measurement):");
    let mut errors = Vec::new();
    for r in rows {
        match &r.emulated {
            Some(Column::Ran {
                gpu,
                program,
                figure,
                error_pct,
                fits,
                note,
                ..
            }) => {
                errors.push((error_pct.abs(), r.id.as_str()));
                let oom = if *fits { "" } else { " (out of memory)" };
                println!("{:<id_w$}  {figure} on {gpu}{oom}: {program}; {note}", r.id);
            }
            Some(Column::NotEmulated { reason }) => println!("{:<id_w$}  -: {reason}", r.id),
            None => {}
        }
    }
    errors.sort_by(|a, b| a.0.total_cmp(&b.0));
    match errors.last() {
        Some((worst, id)) => println!(
            "emulated: median absolute error {:.2}% over {} rows; worst: {worst:.2}% ({id})",
            {
                let n = errors.len();
                (errors[(n - 1) / 2].0 + errors[n / 2].0) / 2.0
            },
            errors.len()
        ),
        None => println!("emulated: no row has a program vramlab runs"),
    }
}
