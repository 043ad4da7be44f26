//! `vramlab fit` and `vramlab estimate` through the real binary. Expected figures are computed
//! here from the published shapes, independently of the formulas in the crate.
#[path = "../common/mod.rs"]
mod common;
use assert_cmd::Command;
use common::{estimate_json, estimate_row as row, root};
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;
use std::path::{Path, PathBuf};
use vramlab::export::{csv::CsvExporter, Exporter};
use vramlab::fit::{Constants, GroupKey, Target};
use vramlab::record::{Phase, Record, Status};
use vramlab::terms::record_terms;

/// Llama-3.1-8B: 2·128256·4096 (embedding + untied head) + 32 layers ×
/// (q, o: 4096² each; k, v: 1024·4096 each; MLP 3·14336·4096; 2 norms) + final norm.
const LLAMA31_8B_PARAMS: u64 = 2 * 128_256 * 4096
    + 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14_336 * 4096 + 2 * 4096)
    + 4096;

fn vramlab() -> Command {
    let mut c = Command::cargo_bin("vramlab").unwrap();
    c.current_dir(root());
    c
}

/// Sweeps `scenario`, fits on the rows `held` rejects, and returns every row, the constants
/// file and the sorted relative errors of the held-out rows' predicted peak allocated bytes.
fn sweep_fit_heldout(
    dir: &Path,
    scenario: &str,
    held: impl Fn(&Record) -> bool,
) -> (Vec<Record>, PathBuf, Vec<f64>) {
    let csv = dir.join("synth.csv");
    vramlab()
        .args(["sweep", "--quiet", scenario, "--out", csv.to_str().unwrap()])
        .assert()
        .success();
    let rows = vramlab::export::csv::read(&csv).unwrap();
    let train = dir.join("train.csv");
    let mut w = CsvExporter::create(&train).unwrap();
    for r in rows.iter().filter(|r| !held(r)) {
        w.write(r).unwrap();
    }
    drop(w);
    let constants = dir.join("constants.toml");
    vramlab()
        .args([
            "fit",
            train.to_str().unwrap(),
            "--out",
            constants.to_str().unwrap(),
        ])
        .assert()
        .success()
        .stdout(contains("held-out k-fold by point"))
        .stdout(contains("leave-one-context-out"));
    let c: Constants = toml::from_str(&std::fs::read_to_string(&constants).unwrap()).unwrap();
    let mut err: Vec<f64> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| held(r) && r.status == Some(Status::Ok))
    {
        // The row as phase `phase` of the same point and step: its group and its terms (the
        // optimizer state's liveness depends on the phase in the first step).
        let predict = |phase: Phase| {
            let as_phase = Record {
                phase: Some(phase),
                ..r.clone()
            };
            let k = GroupKey::of(&as_phase).unwrap();
            let g = c.find(&k, Target::PeakAllocated).expect("a fitted group");
            g.model.predict(&record_terms(&as_phase).unwrap())
        };
        // A training step's peak is the envelope of its phases' (as `estimate` predicts it).
        let predicted = if r.phase == Some(Phase::StepTotal) {
            [Phase::Forward, Phase::Backward, Phase::Optimizer]
                .map(predict)
                .into_iter()
                .fold(0.0, f64::max)
        } else {
            predict(r.phase.unwrap())
        };
        let measured = r.peak_allocated.unwrap() as f64;
        err.push((predicted - measured).abs() / measured);
    }
    err.sort_by(f64::total_cmp);
    (rows, constants, err)
}

/// `estimate --json` of the fit-synth model in f32 at (batch, context) with `constants`:
/// asserts that the source names the fitted group `source` and returns the total bytes.
fn fitted_estimate(constants: &Path, mode: &str, (b, c): (u32, u32), source: &str) -> f64 {
    let (b, c) = (b.to_string(), c.to_string());
    let j = estimate_json(&[
        "--model",
        "scenarios/fit-synth/config.json",
        "--mode",
        mode,
        "--precision",
        "f32",
        "--batch",
        &b,
        "--context",
        &c,
        "--constants",
        constants.to_str().unwrap(),
        "--runtime",
        "candle",
        "--backend",
        "cpu",
    ]);
    let got = j["source"].as_str().unwrap();
    assert!(got.starts_with(source), "{got}");
    j["total_bytes"].as_u64().unwrap() as f64
}

/// Median ≤ 1% and p95 ≤ 3% over at least `min_rows` held-out rows.
fn assert_heldout(what: &str, err: &[f64], min_rows: usize) {
    assert!(err.len() >= min_rows, "{what}: {} held-out rows", err.len());
    let q = |p: f64| err[((p * (err.len() - 1) as f64).round()) as usize];
    eprintln!(
        "{what} held-out peak_allocated: {} rows, median {:.3}%, p95 {:.3}%, worst {:.3}%",
        err.len(),
        100.0 * q(0.5),
        100.0 * q(0.95),
        100.0 * err[err.len() - 1]
    );
    assert!(
        q(0.5) <= 0.01 && q(0.95) <= 0.03,
        "{what}: median {} p95 {}",
        q(0.5),
        q(0.95)
    );
}

/// Runs `vramlab estimate args...` and checks the overflow error: exit 2, nothing on stdout,
/// one line on stderr naming `flag` and the figure, no panic (the test binary is a debug build,
/// where unchecked arithmetic would panic).
fn overflows(args: &[&str], flag: &str, figure: &str) {
    let out = vramlab().arg("estimate").args(args).output().expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?}: stdout {:?}", out.stdout);
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert_eq!(
        err.trim_end(),
        format!("error: {flag}: the estimate's byte figures exceed 2^64 B ({figure})")
    );
}

mod analytic;
mod fitted;
mod formats;
