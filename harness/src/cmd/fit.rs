//! `vramlab fit CSV... --out constants.toml`: fit per-group constants on calibration CSVs and
//! report held-out error (DESIGN.md §9).
use crate::error::{bad_file, InputError};
use crate::export::csv::read;
use crate::fit::{fit_all, ErrStats, TERMS};
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Calibration CSVs written by `vramlab sweep`.
    #[arg(required = true)]
    pub csv: Vec<PathBuf>,
    /// Where to write the fitted constants (TOML).
    #[arg(long)]
    pub out: PathBuf,
    /// Fit an upper envelope: raise each group's constant until no row is under-predicted by
    /// more than 1%.
    #[arg(long)]
    pub conservative: bool,
    /// Folds of the k-fold (by point) held-out check.
    #[arg(long, default_value_t = 5)]
    pub folds: usize,
}

pub fn run(a: Args) -> Result<()> {
    if a.folds < 2 {
        return Err(InputError::arg("--folds must be at least 2").into());
    }
    let mut records = Vec::new();
    for p in &a.csv {
        records.extend(read(p)?);
    }
    // One constants file describes one runtime on one backend (`estimate` matches on both).
    for r in &records {
        let first = &records[0];
        if (r.meter.runtime(), r.backend) != (first.meter.runtime(), first.backend) {
            return Err(bad_file(
                &a.csv[0],
                format!(
                    "the CSVs mix {} on {} with {} on {}; fit each runtime and backend separately",
                    first.meter.runtime(),
                    first.backend,
                    r.meter.runtime(),
                    r.backend
                ),
            ));
        }
    }
    let sources = a.csv.iter().map(|p| p.display().to_string()).collect();
    let report = fit_all(&records, sources, a.conservative, a.folds);
    if report.constants.group.is_empty() {
        return Err(bad_file(
            &a.csv[0],
            "no fittable rows (status ok with peaks and features)",
        ));
    }
    for target in ["peak_allocated", "peak_reserved"] {
        println!("== target {target}");
        println!(
            "{:<44} {:>5} {:>6} {:>9} {}",
            "group (arch/backend/precision/mode/kv/phase)",
            "rows",
            "model",
            "R²",
            TERMS.map(|t| format!("{t:>11}")).join("")
        );
        for g in report
            .constants
            .group
            .iter()
            .filter(|g| g.target.as_str() == target)
        {
            let coef = TERMS.map(|t| {
                let c = g.model.get(t);
                let mark = if g.model.is_held(t) { "*" } else { " " };
                format!("{:>10}{mark}", format!("{c:.4e}"))
            });
            println!(
                "{:<44} {:>5} {:>6} {:>9.6} {}",
                g.key.label(),
                g.rows,
                g.model.kind(),
                g.r2,
                coef.join("")
            );
            for (t, why) in &g.model.held {
                println!("{:<44}   * {t}: {why}", "");
            }
            for (i, c) in g.model.candidates.iter().enumerate() {
                let terms: Vec<String> = c.iter().map(|(t, v)| format!("{t} {v:.4e}")).collect();
                println!("{:<44}   + max candidate {i}: {}", "", terms.join(", "));
            }
        }
        let (k, l) = &report.heldout[target];
        let line = |s: Option<ErrStats>| {
            s.map(|s| s.line())
                .unwrap_or_else(|| "n/a (too few points)".into())
        };
        println!(
            "held-out k-fold by point ({} folds): {}",
            a.folds,
            line(ErrStats::of(k))
        );
        println!(
            "held-out leave-one-context-out:     {}",
            line(ErrStats::of(l))
        );
        if let Some(env) = ErrStats::of(&report.envelope[target]) {
            // How `estimate --mode train` predicts a step: the largest of its phase fits.
            println!(
                "held-out training steps as the envelope of their phases (k-fold): {}",
                env.line()
            );
        }
    }
    println!(
        "(weight, kv, optimizer and grad are exact bytes with coefficient 1, never fitted; * = held at its analytic prior)"
    );
    let c = &report.constants;
    println!(
        "constants from {} on {} ({}), models {}",
        c.runtime.as_str(),
        c.backend,
        c.device,
        c.models.join(", ")
    );
    let text = toml::to_string_pretty(&report.constants)?;
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.out, text).map_err(|e| bad_file(&a.out, format!("cannot write: {e}")))?;
    println!(
        "wrote {} ({} groups)",
        a.out.display(),
        report.constants.group.len()
    );
    Ok(())
}
