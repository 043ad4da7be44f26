//! Process isolation for sweeps of every mode (a memory harness must survive running out of
//! memory).
//!
//! The parent `vramlab sweep` never measures: for each group of points that share loaded
//! weights it re-executes itself as a worker (`--worker START:END`) that loads the weights once
//! and runs the points in order, appending each row to the CSV (flushed and synced). A
//! language model's group is the points of one (model, precision, mode); a generation or
//! fine-tuning point loads its pipeline itself, so its group is the point alone: each runs in
//! a fresh process, its figures independent of the points before it (and of the shard). The worker reports
//! on stdout (`vramlab-phase NAME`, `vramlab-point-done ID`). When a worker dies (an allocation
//! refused by `--capacity` aborts it, or a signal, or a panic) the parent records the point it
//! was on as `oom` or `error`, with the phase, and starts a fresh worker after it.
//!
//! Resume: rows already in the CSV are kept; a point is finished when its last phase row or an
//! `oom`/`error` row is there. A point with only part of its rows is removed and re-run, so no
//! row is ever duplicated.
use crate::export::Exporter;
use crate::meter::alloc::OOM_MARKER;
use crate::record::{Phase, Record, Status};
use crate::scenario::ft_points::FtPoint;
use crate::scenario::gen_points::GenPoint;
use crate::scenario::Point;
use crate::vocab::Mode;
use anyhow::{Context, Result};
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::ops::Range;
use std::path::Path;
use std::process::{Command, Stdio};

/// A point of any mode, as the supervisor and the resume see it.
pub trait SweepPoint {
    fn id(&self) -> &str;
    /// True when `r` is the last row the point writes when it finishes (a failure's row aside).
    fn is_last_row(&self, r: &Record) -> bool;
}

impl SweepPoint for Point {
    fn id(&self) -> &str {
        &self.id
    }
    fn is_last_row(&self, r: &Record) -> bool {
        match self.mode {
            Mode::Infer | Mode::Encode | Mode::Generate => r.phase == Some(Phase::Total),
            Mode::Train => {
                r.phase == Some(Phase::StepTotal) && r.step == Some(self.train.steps as u64)
            }
        }
    }
}

impl SweepPoint for GenPoint {
    fn id(&self) -> &str {
        &self.id
    }
    fn is_last_row(&self, r: &Record) -> bool {
        r.phase == Some(Phase::Total)
    }
}

impl SweepPoint for FtPoint {
    fn id(&self) -> &str {
        &self.id
    }
    /// The last step's step_total row.
    fn is_last_row(&self, r: &Record) -> bool {
        r.phase == Some(Phase::StepTotal) && r.step == Some(self.steps as u64)
    }
}

/// True when `r` is the last row `p` writes (or records its failure).
pub fn is_final(r: &Record, p: &impl SweepPoint) -> bool {
    matches!(r.status, Some(Status::Oom) | Some(Status::Error)) || p.is_last_row(r)
}

/// Ids of the points of `points` that `rows` finish.
pub fn finished<P: SweepPoint>(rows: &[Record], points: &[P]) -> HashSet<String> {
    let by_id: std::collections::HashMap<&str, &P> = points.iter().map(|p| (p.id(), p)).collect();
    rows.iter()
        .filter(|r| {
            by_id
                .get(r.point_id.as_str())
                .is_some_and(|p| is_final(r, *p))
        })
        .map(|r| r.point_id.clone())
        .collect()
}

/// The groups of consecutive points that share loaded weights (`same`), as index ranges.
pub fn groups<P>(points: &[P], same: impl Fn(&P, &P) -> bool) -> Vec<Range<usize>> {
    let mut v = Vec::new();
    let mut i = 0;
    while i < points.len() {
        let end = i + points[i..]
            .iter()
            .take_while(|p| same(p, &points[i]))
            .count();
        v.push(i..end);
        i = end;
    }
    v
}

/// Rewrites `csv` without the rows of unfinished points (atomically: temp file + rename).
/// Returns the ids of the points whose rows were removed.
pub fn drop_unfinished(csv: &Path, rows: &[Record], done: &HashSet<String>) -> Result<Vec<String>> {
    let mut removed: Vec<String> = rows
        .iter()
        .filter(|r| !done.contains(&r.point_id))
        .map(|r| r.point_id.clone())
        .collect();
    removed.dedup();
    if removed.is_empty() {
        return Ok(removed);
    }
    let tmp = csv.with_extension("csv.part");
    {
        let mut w = crate::export::csv::CsvExporter::create(&tmp)?;
        for r in rows.iter().filter(|r| done.contains(&r.point_id)) {
            w.write(r)?;
        }
    }
    std::fs::rename(&tmp, csv).with_context(|| format!("replacing {}", csv.display()))?;
    Ok(removed)
}

/// How a worker ended, as the parent saw it.
struct Death {
    phase: Option<Phase>,
    oom: Option<(u64, u64, u64)>,
    tail: String,
}

/// Runs one worker over `points[start..end]`; returns None when it finished them all.
fn run_worker(
    mut cmd: Command,
    on_done: &mut dyn FnMut(&str),
    on_device: &mut dyn FnMut(serde_json::Value),
) -> Result<Option<Death>> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting a sweep worker")?;
    let stderr = child.stderr.take().expect("piped");
    let err_thread = std::thread::spawn(move || {
        let mut oom = None;
        let mut tail = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if let Some(rest) = line.strip_prefix(OOM_MARKER) {
                let num = |k: &str| {
                    rest.split_whitespace()
                        .find_map(|kv| kv.strip_prefix(k)?.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                oom = Some((num("requested="), num("live="), num("capacity=")));
            } else if !line.starts_with("memory allocation of")
                && !line.starts_with("note: run with `RUST_BACKTRACE")
            {
                eprintln!("{line}");
                tail.push(line);
                if tail.len() > 5 {
                    tail.remove(0);
                }
            }
        }
        (oom, tail.join(" | "))
    });
    let mut phase = None;
    for line in BufReader::new(child.stdout.take().expect("piped"))
        .lines()
        .map_while(|l| l.ok())
    {
        if let Some(p) = line.strip_prefix("vramlab-phase ") {
            phase = p.parse::<Phase>().ok();
        } else if let Some(json) = line.strip_prefix("vramlab-device ") {
            if let Ok(v) = serde_json::from_str(json) {
                on_device(v);
            }
        } else if let Some(id) = line.strip_prefix("vramlab-point-done ") {
            on_done(id);
            phase = None;
        }
    }
    let status = child.wait()?;
    let (oom, tail) = err_thread.join().unwrap_or((None, String::new()));
    if status.success() {
        return Ok(None);
    }
    let tail = if tail.is_empty() {
        format!("worker exited with {status}")
    } else {
        tail
    };
    Ok(Some(Death { phase, oom, tail }))
}

/// Runs every unfinished point of `points` in workers, one worker per group of `groups` (a
/// fresh one after a worker dies); returns how many workers it started. `failed_row(point,
/// phase, status, peak, message)` builds the row recorded for a point whose worker died.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub fn supervise<P: SweepPoint>(
    points: &[P],
    groups: &[Range<usize>],
    done: &mut HashSet<String>,
    base_cmd: &dyn Fn(usize, usize) -> Command,
    exporter: &mut dyn Exporter,
    failed_row: &dyn Fn(&P, Phase, Status, Option<u64>, String) -> Result<Record>,
    on_done: &mut dyn FnMut(&str),
    on_device: &mut dyn FnMut(serde_json::Value),
) -> Result<usize> {
    let mut started = 0;
    for g in groups {
        let (i, end) = (g.start, g.end);
        // Set once a worker of this group died in the group's warm-up: later workers warm up
        // each point at its own shapes (`--point-warmup`).
        let mut point_warmup = false;
        while let Some(start) = (i..end).find(|&k| !done.contains(points[k].id())) {
            let mut mark = |id: &str| {
                done.insert(id.to_string());
                on_done(id);
            };
            let mut cmd = base_cmd(start, end);
            if point_warmup {
                cmd.arg("--point-warmup");
            }
            started += 1;
            let Some(death) = run_worker(cmd, &mut mark, on_device)? else {
                continue;
            };
            let Some(k) = (start..end).find(|&k| !done.contains(points[k].id())) else {
                break;
            };
            let phase = death.phase.unwrap_or(Phase::Load);
            if death.oom.is_some() && death.phase == Some(Phase::Warmup) && !point_warmup {
                // The group's warm-up at its largest shapes: no point was measured; run them
                // again, each warmed up at its own shapes.
                point_warmup = true;
                continue;
            }
            // Out of memory while loading the group's weights: every point left in the group
            // shares them, so all are recorded at once, without a reload per point.
            let affected = if death.oom.is_some() && death.phase == Some(Phase::Load) {
                (k..end)
                    .filter(|&j| !done.contains(points[j].id()))
                    .collect()
            } else {
                vec![k]
            };
            for j in affected {
                let p = &points[j];
                let row = match death.oom {
                    Some((req, live, cap)) => failed_row(
                        p,
                        phase,
                        Status::Oom,
                        Some(live),
                        format!(
                            "out of memory in {}: {req} B requested with {live} B live, capacity {cap} B",
                            phase.as_str()
                        ),
                    ),
                    None => failed_row(p, phase, Status::Error, None, format!("worker died: {}", death.tail)),
                }?;
                exporter.write(&row)?;
                done.insert(p.id().to_string());
                on_done(p.id());
            }
        }
    }
    Ok(started)
}
