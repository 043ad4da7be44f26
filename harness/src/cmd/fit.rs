//! `vramlab fit CSV... --out constants.toml`: fit per-group constants on calibration CSVs and
//! report held-out error (ARCHITECTURE.md §9).
use crate::error::{bad_file, InputError};
use crate::export::csv::read;
use crate::fit::generate::{self, GenGroupFit, Origin};
use crate::fit::{fit_all, Constants, ErrStats};
use crate::terms::TERMS;
use anyhow::Result;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit codes: 0 the constants were written; 1 a failure (writing --out, \
say); 2 bad input: an unusable CSV (unreadable, no fittable rows, runtimes, backends or \
emulated and measured rows mixed) or flag value (one line naming it)."
)]
pub struct Args {
    /// Calibration CSVs written by `vramlab sweep`.
    #[arg(required_unless_present = "vllm", conflicts_with = "vllm")]
    pub csv: Vec<PathBuf>,
    /// Instead of CSVs: fit the serving estimate's terms (`estimate --runtime vllm`: the other
    /// buffers, and the pool of vLLM's CUDA-graph capture) on vLLM startups, a TSV as
    /// `scripts/vllm-serving-grid.sh` writes it; each model's rows are held out in turn.
    #[arg(long, value_name = "STARTUPS.tsv")]
    pub vllm: Option<PathBuf>,
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
    /// Generation points whose id contains this text are left out of the fit and predicted by
    /// it afterwards (the held-out table). Repeatable.
    #[arg(long, value_name = "TEXT")]
    pub holdout: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    if a.folds < 2 {
        return Err(InputError::arg("--folds must be at least 2").into());
    }
    if let Some(tsv) = &a.vllm {
        return serving(tsv, &a.out);
    }
    let mut records = Vec::new();
    let mut tiles = std::collections::BTreeMap::new();
    let mut sha = std::collections::BTreeMap::new();
    for p in &a.csv {
        let rs = read(p)?;
        if rs.iter().any(|r| r.mode == crate::vocab::Mode::Generate) {
            tiles.extend(tiles_of(p)?);
            sha.insert(p.display().to_string(), generate::sha256_file(p)?);
        }
        records.extend(rs);
    }
    // One constants file describes one runtime on one backend (`estimate` matches on both),
    // and emulated rows are their own source: never fitted together with measured ones.
    for r in &records {
        let first = &records[0];
        if r.meter.is_emulated() != first.meter.is_emulated() {
            let e = if r.meter.is_emulated() { r } else { first };
            return Err(bad_file(
                &a.csv[0],
                format!(
                    "the CSVs mix emulated rows (meter {}) with measured ones; fit them separately",
                    e.meter
                ),
            ));
        }
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
    let mut report = fit_all(&records, sources, a.conservative, a.folds);
    report.constants.generation = fit_generation(&a, &records, &tiles, sha, &report.constants)?;
    print_reserve(&records);
    if report.constants.group.is_empty() && report.constants.generation.is_empty() {
        return Err(bad_file(
            &a.csv[0],
            "no fittable rows (status ok with peaks and features)",
        ));
    }
    let targets: &[&str] = if report.constants.group.is_empty() {
        &[]
    } else {
        &["peak_allocated", "peak_reserved"]
    };
    for target in targets {
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
            .filter(|g| g.target.as_str() == *target)
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
        let (k, l) = &report.heldout[*target];
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
        if let Some(env) = ErrStats::of(&report.envelope[*target]) {
            // How `estimate --mode train` predicts a step: the largest of its phase fits.
            println!(
                "held-out training steps as the envelope of their phases (k-fold): {}",
                env.line()
            );
        }
    }
    if !targets.is_empty() {
        println!(
            "(weight, kv, optimizer and grad are exact bytes with coefficient 1, never fitted; * = held at its analytic prior)"
        );
    }
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
        "wrote {} ({} groups, {} generation groups)",
        a.out.display(),
        report.constants.group.len(),
        report.constants.generation.len()
    );
    Ok(())
}

/// The reserve table: per class, the points, models, coefficients and the error of the
/// predicted peak reserved (held out by model where the class has two models or more), then
/// the median over every point.
fn print_reserve(records: &[crate::record::Record]) {
    let fits = crate::fit::reserve::fit_with_errors(records);
    if fits.is_empty() {
        return;
    }
    println!(
        "== caching-allocator reserve: reserved - allocated = sum of coefficient x term, per class"
    );
    println!(
        "{:<44} {:>6} {:>6} {:>18} {:>8} {:>8} {:>8}  coefficients",
        "class", "points", "models", "error on reserved", "min", "median", "max"
    );
    let pct = |x: f64| format!("{:+.1}%", 100.0 * x);
    for (f, _) in &fits {
        let coefficients: Vec<String> = f
            .coefficients
            .iter()
            .filter(|(_, c)| **c != 0.0)
            .map(|(t, c)| format!("{t} {c:.4}"))
            .collect();
        println!(
            "{:<44} {:>6} {:>6} {:>18} {:>8} {:>7.1}% {:>8}  {}",
            f.class.label(),
            f.points,
            f.models.len(),
            f.error_by,
            pct(f.error_min),
            100.0 * f.error_median,
            pct(f.error_max),
            coefficients.join(", ")
        );
    }
    let errors = |runs_only: bool| -> Vec<f64> {
        fits.iter()
            .filter(|(f, _)| !(runs_only && f.class.load))
            .flat_map(|(_, e)| e.iter().copied())
            .collect()
    };
    let (all, runs) = (errors(false), errors(true));
    let median = |e: &[f64]| 100.0 * crate::fit::reserve::median_abs(e);
    println!(
        "median |error| over all {} points: {:.2}%; over the {} run points (every class but load): {:.2}% (error = (predicted - measured) / measured peak reserved; estimate applies each class's model, and judges a GPU at the ends of its error range)",
        all.len(),
        median(&all),
        runs.len(),
        median(&runs)
    );
}

/// The generation groups: fitted on the points not held out, printed with their
/// leave-one-point-out error, then the held-out points' phase and point peaks predicted.
fn fit_generation(
    a: &Args,
    records: &[crate::record::Record],
    tiles: &std::collections::BTreeMap<String, (usize, usize)>,
    csv_sha256: std::collections::BTreeMap<String, String>,
    c: &Constants,
) -> Result<Vec<GenGroupFit>> {
    let samples = generate::samples(records, tiles)?;
    if samples.is_empty() {
        return Ok(Vec::new());
    }
    let out = |s: &generate::GenSample| a.holdout.iter().any(|h| s.point.contains(h.as_str()));
    let (held, fitted): (Vec<_>, Vec<_>) = samples.into_iter().partition(out);
    if fitted.is_empty() {
        return Err(InputError::arg("--holdout leaves no generation point to fit").into());
    }
    let origin = Origin {
        runtime: c.runtime,
        backend: c.backend,
        device: c.device.clone(),
        csv_sha256,
    };
    let groups = generate::fit_groups(&fitted, &origin);
    println!("== generation (peak over the point's start, less the exact tensors, on tensor-count terms)");
    println!(
        "{:<44} {:>6} {:>9}  coefficients (* = held at the analytic prior)",
        "group (arch/backend/precision/phase[/decode])", "points", "R²"
    );
    for g in &groups {
        let coef: Vec<String> = g
            .families
            .iter()
            .enumerate()
            .map(|(f, fam)| {
                let terms: Vec<String> = fam
                    .iter()
                    .map(|(t, v)| {
                        let tag = if g.families.len() > 1 {
                            format!("{t} (family {f})")
                        } else {
                            t.clone()
                        };
                        let mark = if g.held.contains_key(&tag) { "*" } else { "" };
                        format!("{t} {v:.4}{mark}")
                    })
                    .collect();
                terms.join(", ")
            })
            .collect();
        println!(
            "{:<44} {:>6} {:>9.6}  {}",
            g.key.label(),
            g.points,
            g.r2,
            if coef.len() > 1 {
                format!("max({})", coef.join(" | "))
            } else {
                coef.join("")
            }
        );
        for (t, why) in &g.held {
            println!("{:<44}   * {t}: {why}", "");
        }
        if let Some(l) = &g.loo {
            println!("{:<44}   leave-one-point-out: {}", "", l.line());
        }
    }
    if !held.is_empty() {
        let phases = generate::predict_heldout(&groups, &held);
        let totals = generate::point_totals(&groups, &held);
        println!(
            "== held-out generation points ({} not in the fit)",
            totals.len()
        );
        println!(
            "{:<58} {:>14} {:>14} {:>8}",
            "point phase", "measured", "predicted", "error"
        );
        let print_row = |h: &crate::fit::Heldout| {
            println!(
                "{:<58} {:>14} {:>14.0} {:>+7.2}%",
                h.row,
                h.measured,
                h.predicted,
                100.0 * h.rel()
            )
        };
        phases.iter().chain(&totals).for_each(print_row);
        // The same points on their activations alone (peak less the exact tensors): the
        // fitted part, without the weights that dominate an f32 SD 1.5 peak.
        let acts: Vec<crate::fit::Heldout> = held
            .iter()
            .filter_map(|s| {
                let g = generate::find(&groups, &s.key)
                    .or_else(|| generate::find_transfer(&groups, &s.key))?;
                Some(crate::fit::Heldout {
                    group: s.key.label(),
                    row: format!("{} {} activations", s.point, s.key.phase),
                    measured: s.y - s.exact,
                    predicted: generate::activation(&g.coefficients(), &s.x),
                })
            })
            .filter(|h| h.measured.abs() > 1.0)
            .collect();
        acts.iter().for_each(print_row);
        let line = |h: &[crate::fit::Heldout]| {
            ErrStats::of(h)
                .map(|s| s.line())
                .unwrap_or_else(|| "n/a".into())
        };
        println!("held-out phase peaks: {}", line(&phases));
        println!("held-out point peaks: {}", line(&totals));
        println!("held-out activations alone: {}", line(&acts));
    }
    Ok(groups)
}

/// Tile and overlap of each tiled point of `csv`, from its manifest's scenario (the CSV has no
/// such columns; the scenario the points were expanded from does).
pub fn tiles_of(
    csv: &std::path::Path,
) -> Result<std::collections::BTreeMap<String, (usize, usize)>> {
    let mp = crate::export::manifest::Manifest::path_for(csv);
    let Ok(text) = std::fs::read_to_string(&mp) else {
        return Ok(std::collections::BTreeMap::new());
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad_file(&mp, format!("not a manifest: {e}")))?;
    let scenario = v["scenario_text"].as_str().unwrap_or_default();
    let spec = crate::scenario::Spec::parse(&mp, scenario)?;
    Ok(crate::scenario::gen_points::expand(&spec)
        .into_iter()
        .map(|p| (p.id, (p.shape.tile, p.shape.overlap)))
        .collect())
}

/// `fit --vllm`: the serving estimate's fitted terms, their held-out error, the TOML.
fn serving(tsv: &std::path::Path, out: &std::path::Path) -> Result<()> {
    use crate::estimate::serving_fit as serving;
    let startups = serving::read(tsv)?;
    let fit = serving::fit(&startups);
    let f = &fit.fitted;
    println!(
        "== vLLM startups: {} ({} eager, {} with CUDA graphs)",
        startups.len(),
        startups.iter().filter(|s| !s.row.cuda_graphs).count(),
        startups.iter().filter(|s| s.row.cuda_graphs).count()
    );
    println!(
        "other buffers           {} B + {} B per max_num_seqs",
        f.other_fixed, f.other_per_seq
    );
    for (i, attention) in [
        "FlashAttention 3 (Hopper)",
        "FlashAttention 2 (other cards)",
    ]
    .iter()
    .enumerate()
    {
        let c = &f.graph_pool[3 * i..3 * i + 3];
        println!(
            "CUDA-graph pool, {attention}: {:.0} B + {:.4} × a hidden row over the PIECEWISE \
             sizes + {:.4} × over the FULL sizes (+ 1 MiB a FULL graph beyond the first, \
             vLLM's floor)",
            c[0], c[1], c[2]
        );
    }
    println!(
        "{:<44} {:>12} {:>12} {:>9}",
        "startup (held out by model)", "vLLM", "estimate", "error"
    );
    for (h, unit) in fit
        .heldout_tokens
        .iter()
        .map(|h| (h, "tokens"))
        .chain(fit.heldout_graphs.iter().map(|h| (h, "graph B")))
    {
        println!(
            "{:<44} {:>12.0} {:>12.0} {:>+8.3}%  {unit}",
            h.row,
            h.measured,
            h.predicted,
            100.0 * h.rel()
        );
    }
    let line = |h: &[crate::fit::Heldout]| {
        crate::fit::ErrStats::of(h).map_or_else(|| "n/a (one model)".into(), |s| s.line())
    };
    println!(
        "held-out leave-one-model-out, KV tokens:      {}",
        line(&fit.heldout_tokens)
    );
    println!(
        "held-out leave-one-model-out, CUDA graphs:    {}",
        line(&fit.heldout_graphs)
    );
    #[derive(serde::Serialize)]
    struct File<'a> {
        source: String,
        serving: &'a crate::estimate::serving::Fitted,
    }
    let text = toml::to_string_pretty(&File {
        source: tsv.display().to_string(),
        serving: f,
    })?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, text).map_err(|e| bad_file(out, format!("cannot write: {e}")))?;
    println!("wrote {}", out.display());
    Ok(())
}
