//! `vramlab validate --against-emulator QUERIES.toml`: each query of a grid answered both ways,
//! by the instant estimate and by `--emulate` on the same card (PyTorch's own caching allocator
//! on the emulated GPU), with the error of the analytic allocated and NVML-used figures against
//! the emulated ones, the median and the worst, and whether the verdicts agree.
//!
//! A queries file is TOML: each `[[query]]` has `args`, the `vramlab estimate` arguments of the
//! query (with `--gpu`, the card both verdicts judge; `--emulate` is added as the same card),
//! and optional axes `model`, `batch`, `context`, whose product expands the query into one per
//! combination (appended as `--model`, `--batch`, `--context`).
use super::report::LlmReport;
use super::Report;
use crate::emulate::query::Emulated;
use crate::error::InputError;
use crate::estimate::Verdict;
use crate::units::{gb, signed_pct};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    query: Vec<QuerySpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuerySpec {
    args: Vec<String>,
    #[serde(default)]
    model: Vec<String>,
    #[serde(default)]
    batch: Vec<u64>,
    #[serde(default)]
    context: Vec<u64>,
}

/// `vramlab estimate`'s arguments, parsed the way the command line parses them.
#[derive(clap::Parser)]
struct Estimate {
    #[command(flatten)]
    args: super::Args,
}

/// One figure both ways: the analytic estimate, the emulated run and the error
/// (analytic − emulated) / emulated.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Pair {
    pub analytic_bytes: u64,
    pub emulated_bytes: u64,
    pub error: f64,
}

impl Pair {
    fn new(analytic_bytes: u64, emulated_bytes: u64) -> Pair {
        Pair {
            analytic_bytes,
            emulated_bytes,
            error: analytic_bytes as f64 / emulated_bytes.max(1) as f64 - 1.0,
        }
    }
}

/// One query answered both ways.
#[derive(Debug, Serialize)]
pub struct Agreement {
    /// The query's `vramlab estimate` arguments.
    pub query: String,
    pub gpu: String,
    pub budget_bytes: u64,
    pub allocated: Pair,
    /// NVML used: the analytic central figure against the emulated run's.
    pub nvml_used: Pair,
    /// The analytic range of NVML used (the allocator reserve's held-out error).
    pub nvml_low_bytes: u64,
    pub nvml_high_bytes: u64,
    /// The emulated NVML used lies inside the analytic range.
    pub inside_range: bool,
    pub analytic_verdict: Verdict,
    pub emulated_fits: bool,
    /// The same verdict, or an analytic "borderline".
    pub verdicts_agree: bool,
    /// The emulated run ran out of memory on the card: its figures are the same query's at
    /// four times the card's memory.
    pub emulated_oom: bool,
}

/// A query the emulator could not answer: the reason.
#[derive(Debug, Serialize)]
pub struct Failed {
    pub query: String,
    pub reason: String,
}

/// Median and worst absolute errors, and the verdicts.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub queries: usize,
    pub compared: usize,
    pub failed: usize,
    pub allocated_median_abs_error: Option<f64>,
    pub allocated_worst_abs_error: Option<f64>,
    pub nvml_used_median_abs_error: Option<f64>,
    pub nvml_used_worst_abs_error: Option<f64>,
    pub inside_range: usize,
    pub borderline: usize,
    /// Analytic "fits" where the emulated run does not, or "does not fit" where it does.
    pub verdicts_flipped: usize,
}

#[derive(Serialize)]
struct Out<'a> {
    queries: String,
    rows: &'a [Agreement],
    failed: &'a [Failed],
    summary: Summary,
}

/// The queries of `path`, expanded: each one's arguments and their parse.
fn queries(path: &Path) -> Result<Vec<(Vec<String>, super::Args)>> {
    let bad = |why: String| InputError::file(path, why);
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let f: File = toml::from_str(&text).map_err(|e| bad(e.message().to_string()))?;
    if f.query.is_empty() {
        return Err(bad("no [[query]]".into()).into());
    }
    let mut out = Vec::new();
    for (i, q) in f.query.iter().enumerate() {
        let n = i + 1;
        if !q.args.iter().any(|a| a == "--gpu") {
            return Err(bad(format!(
                "query {n}: no --gpu (the card both verdicts judge)"
            ))
            .into());
        }
        for flag in ["--emulate", "--json", "--best-format"] {
            if q.args.iter().any(|a| a == flag) {
                return Err(bad(format!("query {n}: {flag} is the command's to set")).into());
            }
        }
        let one = |v: Vec<String>| {
            if v.is_empty() {
                vec![None]
            } else {
                v.into_iter().map(Some).collect()
            }
        };
        let models = one(q.model.clone());
        let batches = one(q.batch.iter().map(u64::to_string).collect());
        let contexts = one(q.context.iter().map(u64::to_string).collect());
        for m in &models {
            for b in &batches {
                for c in &contexts {
                    let mut args = q.args.clone();
                    for (flag, v) in [("--model", m), ("--batch", b), ("--context", c)] {
                        if let Some(v) = v {
                            args.extend([flag.to_string(), v.clone()]);
                        }
                    }
                    let parsed = parse(path, n, &args)?;
                    out.push((args, parsed));
                }
            }
        }
    }
    Ok(out)
}

/// A query's `vramlab estimate` arguments parsed as the command line parses them, with
/// `--emulate` on its own `--gpu`: a bad argument is bad input naming the file and the query.
fn parse(path: &Path, n: usize, args: &[String]) -> Result<super::Args> {
    let gpu = args
        .iter()
        .position(|a| a == "--gpu")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_default();
    let argv = std::iter::once("estimate".to_string())
        .chain(args.iter().cloned())
        .chain(["--emulate".to_string(), gpu]);
    let e = <Estimate as clap::Parser>::try_parse_from(argv).map_err(|e| {
        let text = e.to_string();
        // clap's first line, and the next where the first ends by announcing it.
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let mut first = lines
            .next()
            .unwrap_or("")
            .trim_start_matches("error: ")
            .to_string();
        if first.ends_with(':') {
            first = format!("{first} {}", lines.next().unwrap_or(""));
        }
        InputError::file(path, format!("query {n}: {first}"))
    })?;
    if e.args.model.parse::<crate::vocab::GenModel>().is_ok() {
        return Err(InputError::file(
            path,
            format!("query {n}: a generation pipeline; --emulate runs language models"),
        )
        .into());
    }
    Ok(e.args)
}

/// The query's estimate with its emulated run.
fn both_ways(args: &super::Args) -> Result<LlmReport, String> {
    match super::report(args).map_err(|e| format!("{e:#}"))? {
        Report::Llm(r) => Ok(*r),
        Report::Generation(_) => Err("a generation pipeline".into()),
        Report::Serving(_) => Err("a vLLM serving estimate".into()),
    }
}

/// How many times the card's memory the figures of a query that ran out of memory are taken
/// at.
const PAST_OOM: u64 = 4;

/// The query's emulated figures. A run that ran out of memory stopped short of its peak, so
/// its figures are lower bounds: they come from the same query on the same card's properties
/// with `PAST_OOM` times its memory, while the verdict stays the card's.
fn figures(args: &super::Args, e: &Emulated) -> Result<Emulated, String> {
    use crate::record::Status;
    match e.status {
        Status::Ok => Ok(e.clone()),
        Status::Oom => {
            let mut larger = args.clone();
            larger.emulate_memory = Some(e.gpu_total_bytes.saturating_mul(PAST_OOM));
            let r = both_ways(&larger)?;
            let run = r.emulated.map(|f| f.run);
            match run {
                Some(run) if run.status == Status::Ok => Ok(run),
                Some(run) => Err(format!(
                    "the emulated run at {PAST_OOM}x the card's memory: {}",
                    run.message
                )),
                None => Err("no emulated run".into()),
            }
        }
        _ => Err(format!("the emulated run: {}", e.message)),
    }
}

fn agreement(query: String, args: &super::Args, r: &LlmReport) -> Result<Agreement, String> {
    let (Some(g), Some(e)) = (&r.gpu, &r.emulated) else {
        return Err("no GPU verdict or emulated run".into());
    };
    let run = figures(args, &e.run)?;
    let used = run.nvml_used;
    let emulated_fits = e.fits_with_headroom;
    Ok(Agreement {
        query,
        gpu: g.gpu.clone(),
        budget_bytes: g.budget_bytes,
        allocated: Pair::new(r.allocated_bytes, run.max_memory_allocated),
        nvml_used: Pair::new(r.nvml_bytes, used),
        nvml_low_bytes: r.nvml_low_bytes,
        nvml_high_bytes: r.nvml_high_bytes,
        inside_range: r.nvml_low_bytes <= used && used <= r.nvml_high_bytes,
        analytic_verdict: g.verdict,
        emulated_fits,
        verdicts_agree: match g.verdict {
            Verdict::Borderline => true,
            Verdict::Fits => emulated_fits,
            Verdict::DoesNotFit => !emulated_fits,
        },
        emulated_oom: e.run.status == crate::record::Status::Oom,
    })
}

/// The median of the absolute values, none for no values.
fn median(xs: Vec<f64>) -> Option<f64> {
    (!xs.is_empty()).then(|| crate::fit::reserve::median_abs(&xs))
}

fn summarize(rows: &[Agreement], failed: usize) -> Summary {
    let abs = |f: fn(&Agreement) -> f64| rows.iter().map(|r| f(r).abs()).collect::<Vec<f64>>();
    let worst = |v: &[f64]| v.iter().copied().reduce(f64::max);
    let (a, u) = (abs(|r| r.allocated.error), abs(|r| r.nvml_used.error));
    Summary {
        queries: rows.len() + failed,
        compared: rows.len(),
        failed,
        allocated_worst_abs_error: worst(&a),
        allocated_median_abs_error: median(a),
        nvml_used_worst_abs_error: worst(&u),
        nvml_used_median_abs_error: median(u),
        inside_range: rows.iter().filter(|r| r.inside_range).count(),
        borderline: rows
            .iter()
            .filter(|r| r.analytic_verdict == Verdict::Borderline)
            .count(),
        verdicts_flipped: rows.iter().filter(|r| !r.verdicts_agree).count(),
    }
}

/// Runs every query of `path` both ways and prints the table (or `--json`). An error when a
/// verdict flips (exit 1), so the command can gate a change.
pub fn run(path: &Path, json: bool) -> Result<()> {
    let qs = queries(path)?;
    let (mut rows, mut failed) = (Vec::new(), Vec::new());
    for (i, (args, parsed)) in qs.iter().enumerate() {
        let query = args.join(" ");
        eprintln!(
            "[{}/{}] vramlab estimate {query} --emulate …",
            i + 1,
            qs.len()
        );
        match both_ways(parsed).and_then(|r| agreement(query.clone(), parsed, &r)) {
            Ok(a) => rows.push(a),
            Err(reason) => failed.push(Failed { query, reason }),
        }
    }
    let summary = summarize(&rows, failed.len());
    let flipped = summary.verdicts_flipped;
    if json {
        let out = Out {
            queries: path.display().to_string(),
            rows: &rows,
            failed: &failed,
            summary,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", render(path, &rows, &failed, &summary));
    }
    if flipped > 0 {
        anyhow::bail!(
            "{flipped} verdict(s) flipped between the instant estimate and the emulated GPU"
        );
    }
    Ok(())
}

fn render(path: &Path, rows: &[Agreement], failed: &[Failed], s: &Summary) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "validate --against-emulator {} ({} queries); GB (1e9), error = (analytic - emulated) / emulated",
        path.display(),
        s.queries
    );
    let _ = writeln!(
        o,
        "{:<10} {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8} {:>19}  {:<12} {:<8} query",
        "gpu",
        "alloc",
        "emu",
        "error",
        "used",
        "emu used",
        "error",
        "analytic range",
        "verdict",
        "emulated"
    );
    for r in rows {
        let _ = writeln!(
            o,
            "{:<10} {:>9} {:>9} {:>8}  {:>9} {:>9} {:>8} {:>19}  {:<12} {:<8} {}{}",
            r.gpu,
            gb(r.allocated.analytic_bytes),
            gb(r.allocated.emulated_bytes),
            signed_pct(100.0 * r.allocated.error),
            gb(r.nvml_used.analytic_bytes),
            gb(r.nvml_used.emulated_bytes),
            signed_pct(100.0 * r.nvml_used.error),
            format!("{}..{}", gb(r.nvml_low_bytes), gb(r.nvml_high_bytes)),
            serde_json::to_value(r.analytic_verdict)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            match (r.emulated_fits, r.emulated_oom) {
                (true, _) => "fits",
                (false, false) => "no",
                (false, true) => "oom",
            },
            r.query,
            if r.verdicts_agree { "" } else { "  <- FLIPPED" }
        );
    }
    for f in failed {
        let _ = writeln!(o, "not compared: {}: {}", f.query, f.reason);
    }
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{:.2}%", 100.0 * x));
    let _ = writeln!(
        o,
        "allocated: median |error| {}, worst {}; NVML used: median |error| {}, worst {}; emulated used inside the analytic range: {}/{}; verdicts: {} agree ({} borderline), {} flipped",
        pct(s.allocated_median_abs_error),
        pct(s.allocated_worst_abs_error),
        pct(s.nvml_used_median_abs_error),
        pct(s.nvml_used_worst_abs_error),
        s.inside_range,
        s.compared,
        s.compared - s.verdicts_flipped,
        s.borderline,
        s.verdicts_flipped
    );
    o
}
