//! The regression gate behind `vramlab compare`: join two calibration CSVs on
//! (point_id, phase, step) and judge every memory metric against its noise margin, modelled on
//! PyTorch's `pr_time_benchmarks` (an expected-results file with a margin per metric, checked
//! both ways).
use crate::error::bad_file;
use crate::export::csv::Table;
use crate::record::{Phase, Record, Status};
use crate::units::{gb, gib, signed_gb, signed_gib, signed_pct};
use crate::vocab::Component;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// The memory columns the gate judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    PeakAllocated,
    EndAllocated,
    PeakReserved,
    DeviceUsed,
    /// peak_allocated − baseline_allocated: what the phase itself added at its peak. Reported
    /// in cross-runtime tables only, where the two processes start from different heaps.
    PhasePeak,
}

impl Metric {
    pub const ALL: [Metric; 4] = [
        Metric::PeakAllocated,
        Metric::EndAllocated,
        Metric::PeakReserved,
        Metric::DeviceUsed,
    ];

    /// The metrics of a cross-runtime table.
    pub const CROSS: [Metric; 5] = [
        Metric::PhasePeak,
        Metric::PeakAllocated,
        Metric::EndAllocated,
        Metric::PeakReserved,
        Metric::DeviceUsed,
    ];

    /// The CSV column name (`phase_peak`: derived from two columns).
    pub fn name(self) -> &'static str {
        match self {
            Metric::PeakAllocated => "peak_allocated",
            Metric::EndAllocated => "end_allocated",
            Metric::PeakReserved => "peak_reserved",
            Metric::DeviceUsed => "device_used",
            Metric::PhasePeak => "phase_peak",
        }
    }

    pub fn from_name(s: &str) -> Option<Metric> {
        Metric::CROSS.into_iter().find(|m| m.name() == s)
    }

    pub fn get(self, r: &Record) -> Option<u64> {
        match self {
            Metric::PeakAllocated => r.peak_allocated,
            Metric::EndAllocated => r.end_allocated,
            Metric::PeakReserved => r.peak_reserved,
            Metric::DeviceUsed => r.device_used,
            Metric::PhasePeak => r
                .peak_allocated
                .zip(r.baseline_allocated)
                .map(|(p, b)| p.saturating_sub(b)),
        }
    }
}

/// The backend a row was measured on sets the default margins.
pub use crate::vocab::Backend;

/// A noise margin: a change is within it when |new − baseline| ≤ max(pct % of baseline, abs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Margin {
    pub pct: f64,
    pub abs: u64,
}

impl Margin {
    pub const EXACT: Margin = Margin { pct: 0.0, abs: 0 };

    /// The largest change in bytes this margin allows on `baseline`.
    pub fn allowed(&self, baseline: u64) -> u64 {
        ((baseline as f64 * self.pct / 100.0).floor() as u64).max(self.abs)
    }

    /// Parses `PCT[,ABS]`: a percentage and an optional size (`2MiB`, `0`, bytes).
    pub fn parse(s: &str) -> Result<Margin, String> {
        let (pct, abs) = match s.split_once(',') {
            Some((p, a)) => (p, Some(a)),
            None => (s, None),
        };
        let pct: f64 = pct
            .trim()
            .trim_end_matches('%')
            .parse()
            .ok()
            .filter(|p: &f64| p.is_finite() && *p >= 0.0)
            .ok_or_else(|| format!("`{s}`: the percentage must be a number ≥ 0"))?;
        let abs = match abs.map(str::trim) {
            None | Some("0") => 0,
            Some(a) => crate::units::parse_size(a).map_err(|e| format!("`{s}`: {e}"))?,
        };
        Ok(Margin { pct, abs })
    }
}

/// The default margin of a metric on a backend; `None` means the metric is reported but not
/// gated. Allocated bytes are deterministic: exact on CPU (a counting allocator), 0.5% or
/// 2 MiB on CUDA (the pool's rounding). Reserved bytes (RSS on CPU, the pool's segments on
/// CUDA) and device_used (everything on the device, the CUDA context and other processes
/// included) are noisier. On CPU, device_used is the whole machine's memory in use and is not
/// gated unless a `--tolerance` asks for it.
pub fn default_margin(metric: Metric, backend: Backend) -> Option<Margin> {
    const MIB: u64 = 1 << 20;
    let m = |pct, abs| Some(Margin { pct, abs });
    match (backend, metric) {
        (Backend::Cpu, Metric::PeakAllocated | Metric::EndAllocated) => Some(Margin::EXACT),
        (Backend::Cpu, Metric::PeakReserved) => m(5.0, 16 * MIB),
        (Backend::Cpu, Metric::DeviceUsed) => None,
        (Backend::Cuda, Metric::PeakAllocated | Metric::EndAllocated) => m(0.5, 2 * MIB),
        (Backend::Cuda, Metric::PeakReserved) => m(2.0, 32 * MIB),
        (Backend::Cuda, Metric::DeviceUsed) => m(5.0, 256 * MIB),
        (_, Metric::PhasePeak) => None,
    }
}

/// The margins in force: the defaults, with `--tolerance` overrides (for every backend).
#[derive(Clone, Debug, Default)]
pub struct Margins {
    pub overrides: BTreeMap<Metric, Margin>,
}

impl Margins {
    pub fn get(&self, metric: Metric, backend: Backend) -> Option<Margin> {
        self.overrides
            .get(&metric)
            .copied()
            .or_else(|| default_margin(metric, backend))
    }

    /// Parses one `METRIC=PCT[,ABS]`.
    pub fn add(&mut self, spec: &str) -> Result<(), String> {
        let (m, v) = spec
            .split_once('=')
            .ok_or_else(|| format!("--tolerance `{spec}`: expected METRIC=PCT[,ABS]"))?;
        let metric = Metric::from_name(m.trim())
            .filter(|m| Metric::ALL.contains(m))
            .ok_or_else(|| {
                format!(
                    "--tolerance `{spec}`: unknown metric `{m}` (one of {})",
                    Metric::ALL.map(Metric::name).join(", ")
                )
            })?;
        let margin = Margin::parse(v).map_err(|e| format!("--tolerance {e}"))?;
        self.overrides.insert(metric, margin);
        Ok(())
    }
}

/// How a change compares with its margin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Grew beyond the margin (or a point that was ok failed).
    Regression,
    /// Shrank beyond the margin (or a point that failed is now ok).
    Improvement,
    /// Changed within the margin.
    Within,
    /// Not gated (no margin for this metric on this backend, or a cross-runtime report).
    Ungated,
}

/// The join key of a row: its point, phase, step and component (a generation point has a
/// `load` row per component).
pub type Key = (String, Option<Phase>, Option<u64>, Option<Component>);

pub fn key(r: &Record) -> Key {
    (r.point_id.clone(), r.phase, r.step, r.component)
}

/// One metric of one joined row that changed.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    pub point_id: String,
    pub phase: Option<Phase>,
    pub step: Option<u64>,
    pub component: Option<Component>,
    pub metric: Metric,
    pub baseline: u64,
    pub new: u64,
    pub delta: i128,
    pub pct: f64,
    /// The margin's allowance in bytes on this baseline (absent when not gated).
    pub allowed: Option<u64>,
    pub verdict: Verdict,
}

/// A row whose status changed (for example ok → oom).
#[derive(Clone, Debug, Serialize)]
pub struct StatusChange {
    pub point_id: String,
    pub phase: Option<Phase>,
    pub step: Option<u64>,
    pub baseline: Option<Status>,
    pub new: Option<Status>,
    pub verdict: Verdict,
}

/// Points with rows on one side only, with how many rows.
#[derive(Clone, Debug, Serialize)]
pub struct OneSided {
    pub point_id: String,
    pub rows: usize,
}

/// The whole comparison.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub joined_rows: usize,
    pub regressions: usize,
    pub improvements: usize,
    /// Changes, worst first: regressions (largest growth first), improvements beyond margin
    /// (largest shrink first), then changes within margins or not gated (largest first).
    pub changes: Vec<Change>,
    pub status_changes: Vec<StatusChange>,
    pub only_in_baseline: Vec<OneSided>,
    pub only_in_new: Vec<OneSided>,
}

/// What makes the inputs unusable unless the user allows it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Allow {
    pub scenario_change: bool,
    pub device_change: bool,
    pub cross_runtime: bool,
}

fn distinct<T: Ord>(it: impl Iterator<Item = T>) -> BTreeSet<T> {
    it.collect()
}

fn show<T: std::fmt::Display>(s: &BTreeSet<T>) -> String {
    s.iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks that two CSVs can be compared: the same schema, scenario, backend and device, and
/// runtime (or two runtimes with `cross_runtime`). Every refusal is a one-line input error
/// naming the new file.
pub fn check_compatible(
    base: (&Path, &Table),
    new: (&Path, &Table),
    allow: Allow,
) -> anyhow::Result<()> {
    let (bp, b) = base;
    let (np, n) = new;
    for (p, t) in [base, new] {
        if t.records.is_empty() {
            return Err(bad_file(p, "no rows to compare"));
        }
    }
    let runtimes = |t: &Table| distinct(t.records.iter().map(|r| r.meter.runtime()));
    let (br, nr) = (runtimes(b), runtimes(n));
    if allow.cross_runtime {
        if br == nr {
            return Err(bad_file(
                np,
                format!(
                    "--cross-runtime compares two runtimes, but both files are {}",
                    show(&br)
                ),
            ));
        }
    } else if br != nr {
        return Err(bad_file(
            np,
            format!(
                "runtime {} differs from {}'s {} (use --cross-runtime for a candle-vs-torch table)",
                show(&nr),
                bp.display(),
                show(&br)
            ),
        ));
    }
    let versions = |t: &Table| distinct(t.records.iter().map(|r| r.schema_version));
    let (bv, nv) = (versions(b), versions(n));
    if !allow.cross_runtime && (bv != nv || b.columns != n.columns) {
        let missing: Vec<&String> = b
            .columns
            .iter()
            .filter(|c| !n.columns.contains(c))
            .collect();
        let extra: Vec<&String> = n
            .columns
            .iter()
            .filter(|c| !b.columns.contains(c))
            .collect();
        return Err(bad_file(
            np,
            format!(
                "schema mismatch with {}: schema_version {} vs {}; columns missing {missing:?}, extra {extra:?}{}",
                bp.display(),
                show(&bv),
                show(&nv),
                if missing.is_empty() && extra.is_empty() { " (or in another order)" } else { "" }
            ),
        ));
    }
    let hashes = |t: &Table| distinct(t.records.iter().map(|r| r.scenario_hash.clone()));
    if !allow.scenario_change && hashes(b) != hashes(n) {
        return Err(bad_file(
            np,
            format!(
                "scenario hash {} differs from {}'s {} (another scenario; --allow-scenario-change compares anyway)",
                show(&hashes(n)),
                bp.display(),
                show(&hashes(b))
            ),
        ));
    }
    let devices = |t: &Table| {
        distinct(
            t.records
                .iter()
                .map(|r| format!("({}, {})", r.backend, r.device_name)),
        )
    };
    if !allow.device_change && devices(b) != devices(n) {
        return Err(bad_file(
            np,
            format!(
                "backend/device {} differs from {}'s {} (--allow-device-change compares anyway)",
                show(&devices(n)),
                bp.display(),
                show(&devices(b))
            ),
        ));
    }
    Ok(())
}

/// Indexes rows by key; a key seen twice is an input error naming the point.
pub fn index<'a>(p: &Path, t: &'a Table) -> anyhow::Result<HashMap<Key, &'a Record>> {
    let mut m = HashMap::new();
    for r in &t.records {
        if m.insert(key(r), r).is_some() {
            return Err(bad_file(
                p,
                format!(
                    "two rows for point `{}` phase {:?} step {:?} component {:?}",
                    r.point_id, r.phase, r.step, r.component
                ),
            ));
        }
    }
    Ok(m)
}

fn pct(base: u64, delta: i128) -> f64 {
    if base == 0 {
        if delta == 0 {
            0.0
        } else {
            f64::INFINITY.copysign(delta as f64)
        }
    } else {
        delta as f64 / base as f64 * 100.0
    }
}

fn status_rank(s: Option<Status>) -> bool {
    s == Some(Status::Ok)
}

/// Compares `new` against `base`. With `gate = false` (cross-runtime) every change is
/// reported as [`Verdict::Ungated`], the metrics are [`Metric::CROSS`] (with each phase's own
/// peak) and the changes keep NEW's row order (a per-phase table).
pub fn compare(
    base: &HashMap<Key, &Record>,
    new_rows: &[Record],
    margins: &Margins,
    gate: bool,
) -> Report {
    let mut rep = Report::default();
    let mut seen: std::collections::HashSet<&Key> = std::collections::HashSet::new();
    let mut new_only: BTreeMap<String, usize> = BTreeMap::new();
    for n in new_rows {
        let k = key(n);
        let Some((bk, b)) = base.get_key_value(&k) else {
            *new_only.entry(n.point_id.clone()).or_default() += 1;
            continue;
        };
        seen.insert(bk);
        rep.joined_rows += 1;
        if b.status != n.status {
            let verdict = match (status_rank(b.status), status_rank(n.status), gate) {
                (_, _, false) => Verdict::Ungated,
                (true, false, _) => Verdict::Regression,
                (false, true, _) => Verdict::Improvement,
                _ => Verdict::Within,
            };
            rep.status_changes.push(StatusChange {
                point_id: n.point_id.clone(),
                phase: n.phase,
                step: n.step,
                baseline: b.status,
                new: n.status,
                verdict,
            });
            continue;
        }
        let metrics: &[Metric] = if gate { &Metric::ALL } else { &Metric::CROSS };
        for &metric in metrics {
            let (Some(bv), Some(nv)) = (metric.get(b), metric.get(n)) else {
                continue;
            };
            let delta = nv as i128 - bv as i128;
            if delta == 0 {
                continue;
            }
            let margin = margins.get(metric, b.backend).filter(|_| gate);
            let allowed = margin.map(|m| m.allowed(bv));
            let verdict = match allowed {
                None => Verdict::Ungated,
                Some(a) if delta.unsigned_abs() <= a as u128 => Verdict::Within,
                Some(_) if delta > 0 => Verdict::Regression,
                Some(_) => Verdict::Improvement,
            };
            rep.changes.push(Change {
                point_id: n.point_id.clone(),
                phase: n.phase,
                step: n.step,
                component: n.component,
                metric,
                baseline: bv,
                new: nv,
                delta,
                pct: pct(bv, delta),
                allowed,
                verdict,
            });
        }
    }
    let mut base_only: BTreeMap<String, usize> = BTreeMap::new();
    for (k, _) in base.iter().filter(|(k, _)| !seen.contains(k)) {
        *base_only.entry(k.0.clone()).or_default() += 1;
    }
    let one_sided = |m: BTreeMap<String, usize>| {
        m.into_iter()
            .map(|(point_id, rows)| OneSided { point_id, rows })
            .collect()
    };
    rep.only_in_baseline = one_sided(base_only);
    rep.only_in_new = one_sided(new_only);
    let count = |v: Verdict| {
        rep.changes.iter().filter(|c| c.verdict == v).count()
            + rep.status_changes.iter().filter(|c| c.verdict == v).count()
    };
    rep.regressions = count(Verdict::Regression);
    rep.improvements = count(Verdict::Improvement);
    if !gate {
        return rep;
    }
    // Worst first: regressions by growth, improvements by shrink, the rest by size.
    rep.changes.sort_by(|a, b| {
        a.verdict
            .cmp(&b.verdict)
            .then_with(|| match a.verdict {
                Verdict::Regression => b.delta.cmp(&a.delta),
                Verdict::Improvement => a.delta.cmp(&b.delta),
                _ => b.delta.unsigned_abs().cmp(&a.delta.unsigned_abs()),
            })
            .then_with(|| a.point_id.cmp(&b.point_id))
    });
    rep.status_changes.sort_by_key(|c| c.verdict);
    rep
}

/// The next baseline: the new run's rows in its order, except that a row whose every gated
/// metric moved by at most a third of its margin (and whose status did not change) keeps the
/// baseline's row, so that the baseline does not churn on noise. Rows only in the baseline are
/// dropped: the new run defines the grid.
pub fn next_baseline(
    base: &HashMap<Key, &Record>,
    new_rows: &[Record],
    margins: &Margins,
) -> Vec<Record> {
    new_rows
        .iter()
        .map(|n| {
            let Some(b) = base.get(&key(n)) else {
                return n.clone();
            };
            let quiet = b.status == n.status
                && Metric::ALL.into_iter().all(|m| {
                    match (m.get(b), m.get(n), margins.get(m, b.backend)) {
                        (Some(bv), Some(nv), Some(margin)) => {
                            (nv as i128 - bv as i128).unsigned_abs() * 3
                                <= margin.allowed(bv) as u128
                        }
                        (bv, nv, Some(_)) => bv == nv,
                        (_, _, None) => true,
                    }
                });
            if quiet {
                (*b).clone()
            } else {
                n.clone()
            }
        })
        .collect()
}

fn verdict_word(v: Verdict, cross: bool) -> &'static str {
    match v {
        Verdict::Regression => "REGRESSION",
        Verdict::Improvement => "improvement",
        Verdict::Within => "within margin",
        Verdict::Ungated if cross => "",
        Verdict::Ungated => "not gated",
    }
}

fn cells(c: &Change, cross: bool) -> Vec<String> {
    let step = c.step.map(|s| s.to_string()).unwrap_or_default();
    let phase = c.phase.map(|p| p.to_string()).unwrap_or_default();
    let phase = match c.component {
        Some(comp) => format!("{phase} {comp}"),
        None => phase,
    };
    let margin = c
        .allowed
        .map(|a| {
            if a == 0 {
                "exact".to_string()
            } else {
                format!("±{}", crate::units::human(a))
            }
        })
        .unwrap_or_else(|| "-".into());
    vec![
        c.point_id.clone(),
        phase,
        step,
        c.metric.name().to_string(),
        gb(c.baseline),
        gib(c.baseline),
        gb(c.new),
        gib(c.new),
        signed_gb(c.delta),
        signed_gib(c.delta),
        signed_pct(c.pct),
        margin,
        verdict_word(c.verdict, cross).to_string(),
    ]
}

/// The report as a text table or Markdown.
pub fn render(rep: &Report, title: &str, top: usize, markdown: bool, cross: bool) -> String {
    let (old, new) = if cross {
        ("A", "B")
    } else {
        ("baseline", "new")
    };
    let header: Vec<String> = [
        "point",
        "phase",
        "step",
        "metric",
        &format!("{old} GB"),
        &format!("{old} GiB"),
        &format!("{new} GB"),
        &format!("{new} GiB"),
        "change GB",
        "change GiB",
        "change %",
        "margin",
        "verdict",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = rep
        .changes
        .iter()
        .take(top)
        .map(|c| cells(c, cross))
        .collect();
    let mut s = String::new();
    let summary = format!(
        "{} joined rows: {} regression(s), {} improvement(s) beyond margin, {} changed value(s) in all; {} point(s) only in the {old}, {} only in the {new}",
        rep.joined_rows,
        rep.regressions,
        rep.improvements,
        rep.changes.len(),
        rep.only_in_baseline.len(),
        rep.only_in_new.len()
    );
    if markdown {
        s += &format!("### vramlab compare: {title}\n\n{summary}\n\n");
        if !rows.is_empty() {
            s += &format!("| {} |\n", header.join(" | "));
            s += &format!("|{}\n", "---|".repeat(header.len()));
            for r in &rows {
                s += &format!("| {} |\n", r.join(" | "));
            }
        }
    } else {
        s += &format!("compare {title}\n{summary}\n");
        if !rows.is_empty() {
            let widths: Vec<usize> = (0..header.len())
                .map(|i| {
                    rows.iter()
                        .map(|r| r[i].chars().count())
                        .chain([header[i].chars().count()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |r: &[String]| {
                let mut l = String::new();
                for (i, c) in r.iter().enumerate() {
                    let w = widths[i];
                    if i < 4 || i + 1 == r.len() {
                        l += &format!("{c:<w$}  ");
                    } else {
                        l += &format!("{c:>w$}  ");
                    }
                }
                l.trim_end().to_string() + "\n"
            };
            s += &line(&header);
            for r in &rows {
                s += &line(r);
            }
        }
    }
    if rep.changes.len() > top {
        s += &format!(
            "({} more changed values; --top or --json shows them)\n",
            rep.changes.len() - top
        );
    }
    let bullet = if markdown { "- " } else { "  " };
    for c in &rep.status_changes {
        s += &format!(
            "{bullet}status {} phase {:?} step {:?}: {:?} → {:?} ({})\n",
            c.point_id,
            c.phase,
            c.step,
            c.baseline,
            c.new,
            verdict_word(c.verdict, cross)
        );
    }
    for (side, list) in [(old, &rep.only_in_baseline), (new, &rep.only_in_new)] {
        for p in list {
            s += &format!(
                "{bullet}only in the {side}: {} ({} rows)\n",
                p.point_id, p.rows
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margins_parse_and_allow() {
        let m = Margin::parse("0.5,2MiB").unwrap();
        assert_eq!(m.allowed(1_000_000_000), 5_000_000);
        assert_eq!(m.allowed(100), 2 << 20);
        assert_eq!(Margin::parse("3").unwrap(), Margin { pct: 3.0, abs: 0 });
        assert!(Margin::parse("x").is_err());
        assert!(Margin::parse("-1").is_err());
        let mut ms = Margins::default();
        assert!(ms.add("peak_allocated=1,0").is_ok());
        assert_eq!(
            ms.get(Metric::PeakAllocated, Backend::Cpu),
            Some(Margin { pct: 1.0, abs: 0 })
        );
        assert!(ms.add("bogus=1").unwrap_err().contains("unknown metric"));
        assert!(ms.add("peak_allocated").is_err());
    }
}
