//! `vramlab compare BASELINE.csv NEW.csv`: the memory regression gate (exit 0 within margins,
//! 1 on a regression, 2 on unusable input).
use crate::compare::{
    by_phase, check_compatible, compare, index, next_baseline, render, render_by_phase, Allow,
    Margins, Metric,
};
use crate::error::InputError;
use crate::export::csv::{read_table, CsvExporter};
use crate::export::Exporter;
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Default margins (a change within max(PCT of the baseline, ABS) passes):
  cpu:  peak_allocated, end_allocated exact; peak_reserved (RSS) 5% or 16 MiB;
        device_used (the whole machine) not gated
  cuda: peak_allocated, end_allocated 0.5% or 2 MiB; peak_reserved 2% or 32 MiB;
        device_used 5% or 256 MiB

Exit codes: 0 within margins (improvements are reported); 1 a regression (or an improvement with \
--fail-on-improvement, or baseline points missing from NEW); 2 bad input: an unusable or \
incompatible CSV, or flag value (one line naming it).")]
pub struct Args {
    /// The expected results (a CSV written by `vramlab sweep`, `merge` or `--write-baseline`).
    pub baseline: PathBuf,
    /// The run to check.
    pub new: PathBuf,
    /// Override a metric's margin: `METRIC=PCT[,ABS]`, e.g. `peak_reserved=3,64MiB`. METRIC is
    /// peak_allocated, end_allocated, peak_reserved or device_used; ABS is a size (bytes, MiB,
    /// GB...). Repeatable.
    #[arg(long, value_name = "METRIC=PCT[,ABS]")]
    pub tolerance: Vec<String>,
    /// Fail (exit 1) on a change beyond the margin in either direction: an unexpected
    /// improvement means the baseline is stale.
    #[arg(long)]
    pub fail_on_improvement: bool,
    /// Write NEW as the next baseline to FILE; rows that moved by at most a third of their
    /// margin keep the baseline's figures, so the baseline does not churn.
    #[arg(long, value_name = "FILE")]
    pub write_baseline: Option<PathBuf>,
    /// Compare although the scenario hashes differ (points missing from NEW then do not fail).
    #[arg(long)]
    pub allow_scenario_change: bool,
    /// Compare although the backend or device name differs.
    #[arg(long)]
    pub allow_device_change: bool,
    /// BASELINE and NEW come from two runtimes (a torch probe CSV and a candle CSV of the same
    /// scenario): print the candle-vs-torch table, with no gate.
    #[arg(long)]
    pub cross_runtime: bool,
    /// Print only these metrics' changes (the gate still judges all): peak_allocated,
    /// end_allocated, peak_reserved, device_used;
    /// with --cross-runtime also phase_peak = peak_allocated − baseline_allocated, what each
    /// phase added). Repeatable; default: all.
    #[arg(long, value_name = "METRIC")]
    pub metric: Vec<String>,
    /// Print a Markdown report (for CI bots) instead of the text table.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Print the whole report as JSON (raw bytes) instead of the text table.
    #[arg(long)]
    pub json: bool,
    /// Sum the changes up per phase and metric (how many changed, how many beyond margin, the
    /// median and the largest change) instead of one row per change: what a new runtime or
    /// software stack does to each phase. JSON always carries it as `by_phase`.
    #[arg(long)]
    pub by_phase: bool,
    /// Rows of changes to print in text and Markdown (worst first); JSON has them all.
    #[arg(long, default_value_t = 30)]
    pub top: usize,
}

pub fn run(a: Args) -> Result<()> {
    let mut margins = Margins::default();
    for t in &a.tolerance {
        margins.add(t).map_err(InputError::arg)?;
    }
    if a.cross_runtime && a.write_baseline.is_some() {
        return Err(InputError::arg("--write-baseline cannot be used with --cross-runtime").into());
    }
    let base = read_table(&a.baseline)?;
    let new = read_table(&a.new)?;
    let allow = Allow {
        scenario_change: a.allow_scenario_change,
        device_change: a.allow_device_change,
        cross_runtime: a.cross_runtime,
    };
    check_compatible((&a.baseline, &base), (&a.new, &new), allow)?;
    let base_ix = index(&a.baseline, &base)?;
    index(&a.new, &new)?;
    let mut rep = compare(&base_ix, &new.records, &margins, !a.cross_runtime);
    if !a.metric.is_empty() {
        let mut keep = Vec::new();
        for m in &a.metric {
            let metric = Metric::from_name(m)
                .filter(|x| a.cross_runtime || Metric::ALL.contains(x))
                .ok_or_else(|| {
                    InputError::arg(format!(
                        "--metric `{m}`: one of peak_allocated, end_allocated, peak_reserved, device_used (phase_peak with --cross-runtime)"
                    ))
                })?;
            keep.push(metric);
        }
        rep.changes.retain(|c| keep.contains(&c.metric));
    }
    let title = format!("{} → {}", a.baseline.display(), a.new.display());
    if a.json {
        let mut j = serde_json::to_value(&rep)?;
        j["by_phase"] = serde_json::to_value(by_phase(&rep))?;
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else if a.by_phase {
        print!(
            "{}",
            render_by_phase(&rep, &title, a.markdown, a.cross_runtime)
        );
    } else {
        print!(
            "{}",
            render(&rep, &title, a.top, a.markdown, a.cross_runtime)
        );
    }
    if let Some(out) = &a.write_baseline {
        let mut w = CsvExporter::create(out)?;
        let rows = next_baseline(&base_ix, &new.records, &margins);
        let refreshed = rows
            .iter()
            .zip(&new.records)
            .filter(|(r, n)| r == n)
            .count();
        for r in &rows {
            w.write(r)?;
        }
        eprintln!(
            "wrote {} ({} rows: {refreshed} from NEW, {} kept from the baseline)",
            out.display(),
            rows.len(),
            rows.len() - refreshed
        );
    }
    let missing = if a.allow_scenario_change || a.cross_runtime {
        0
    } else {
        rep.only_in_baseline.len()
    };
    let failing = rep.regressions
        + if a.fail_on_improvement {
            rep.improvements
        } else {
            0
        };
    if failing > 0 || missing > 0 {
        anyhow::bail!(
            "memory gate failed: {} regression(s), {} improvement(s){}, {missing} baseline point(s) missing from {}",
            rep.regressions,
            rep.improvements,
            if a.fail_on_improvement { " (--fail-on-improvement)" } else { "" },
            a.new.display()
        );
    }
    Ok(())
}
