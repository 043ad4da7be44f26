//! Reliability: running out of memory under `--capacity`, SIGKILL then `--resume`, and
//! determinism of the allocated figures across processes.
mod common;
use common::{root, smollm2_gguf, stable, vramlab};
use predicates::prelude::*;
use std::path::Path;
use std::time::{Duration, Instant};
use vramlab::record::{Phase, Record, Status};

const SCENARIO: &str = "harness/tests/data/reliability.toml";

/// `vramlab sweep SCENARIO --out out` started in the background, output discarded.
fn spawn_sweep(out: &Path) -> std::process::Child {
    std::process::Command::new(assert_cmd::cargo::cargo_bin("vramlab"))
        .current_dir(root())
        .env("VRAMLAB_MODELS", common::models())
        .args(["sweep", "--quiet", SCENARIO, "--out"])
        .arg(out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn rows(p: &Path) -> Vec<Record> {
    vramlab::export::csv::read(p).unwrap()
}

/// Runs `vramlab sweep SCENARIO --out DIR/NAME.csv [--capacity BYTES]`; returns the rows, the
/// manifest and stderr. The sweep must exit 0 (out of memory is a status, not a failure).
fn sweep(
    scenario: &str,
    dir: &Path,
    name: &str,
    capacity: Option<u64>,
) -> (Vec<Record>, serde_json::Value, String) {
    let out = dir.join(format!("{name}.csv"));
    let mut cmd = vramlab();
    cmd.args(["sweep", "--quiet", scenario, "--out"]).arg(&out);
    if let Some(c) = capacity {
        cmd.args(["--capacity", &format!("{c}B")]);
    }
    let done = cmd.assert().success();
    let stderr = String::from_utf8_lossy(&done.get_output().stderr).into_owned();
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{name}.manifest.json"))).unwrap(),
    )
    .unwrap();
    (rows(&out), manifest, stderr)
}

fn peak_of<'a>(rows: impl Iterator<Item = &'a Record>) -> u64 {
    rows.map(|r| r.peak_allocated.unwrap()).max().unwrap()
}

/// The capacity is set between two peaks measured in the same test (never a constant from one
/// machine): above every figure of the batch-1 points, below the batch-8 prefill. The group's
/// warm-up (at batch 8) runs out of memory, so each point is warmed up at its own shapes: the
/// batch-1 points are measured, the batch-8 ones are `oom` in phase `warmup`.
#[test]
fn capacity_between_points_records_oom_and_goes_on() {
    const CAP: &str = "harness/tests/data/capacity.toml";
    smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let (free, _, _) = sweep(CAP, dir.path(), "free", None);
    let small = peak_of(free.iter().filter(|r| r.batch == 1));
    let large = peak_of(
        free.iter()
            .filter(|r| r.batch == 8 && r.phase == Some(Phase::Prefill)),
    );
    assert!(
        small < large,
        "batch 1 peaks at {small} B, batch 8 at {large} B"
    );
    let cap = (small + large) / 2;
    let (rows, manifest, stderr) = sweep(CAP, dir.path(), "cap", Some(cap));
    assert!(stderr.contains("2 ok, 2 oom"), "{stderr}");
    let oom: Vec<&Record> = rows
        .iter()
        .filter(|r| r.status == Some(Status::Oom))
        .collect();
    assert_eq!(oom.len(), 2);
    for r in &oom {
        assert_eq!(r.batch, 8, "{}", r.point_id);
        assert_eq!(r.phase, Some(Phase::Warmup), "{}", r.point_id);
        assert!(r.peak_allocated.unwrap() <= cap);
        assert!(
            r.message.starts_with("out of memory in warmup"),
            "{}",
            r.message
        );
    }
    // The batch-1 points ran in full, each under the capacity, and their load rows say how
    // they were warmed up.
    for r in rows.iter().filter(|r| r.batch == 1) {
        assert_eq!(r.status, Some(Status::Ok), "{}", r.point_id);
        assert!(r.peak_allocated.unwrap() <= cap);
    }
    assert!(rows.iter().any(|r| r.batch == 1
        && r.phase == Some(Phase::Load)
        && r.message.contains("warmed up at this point's shapes")));
    assert_eq!(manifest["capacity_bytes"], cap);
    assert_eq!(manifest["status_counts"]["oom"], 2);
    assert_eq!(manifest["status_counts"]["ok"], 2);
}

/// A capacity below the weights: every point of the group is `oom` in phase `load`, from one
/// worker (the weights are loaded once, not once per point).
#[test]
fn capacity_below_the_weights_fails_the_group_at_load_once() {
    const CAP: &str = "harness/tests/data/capacity.toml";
    smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let weights = 4 * common::SMOLLM2_PARAMS; // f32
    let (rows, manifest, stderr) = sweep(CAP, dir.path(), "load", Some(weights / 2));
    assert!(stderr.contains("4 oom"), "{stderr}");
    assert_eq!(rows.len(), 4, "one row per point");
    for r in &rows {
        assert_eq!(r.status, Some(Status::Oom), "{}", r.point_id);
        assert_eq!(r.phase, Some(Phase::Load), "{}", r.point_id);
        assert!(
            r.message.starts_with("out of memory in load"),
            "{}",
            r.message
        );
    }
    assert_eq!(manifest["workers_started"], 1);
}

/// An out-of-memory inside a phase carries the phase that was running: the decode, whose
/// growing cache passes a capacity that the load, the warm-up and the prefill fit under.
#[test]
fn oom_in_decode_is_labelled_decode() {
    const SC: &str = "harness/tests/data/oom-decode.toml";
    smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let (free, _, _) = sweep(SC, dir.path(), "free", None);
    let before = peak_of(
        free.iter()
            .filter(|r| matches!(r.phase, Some(Phase::Load) | Some(Phase::Prefill))),
    );
    let decode = peak_of(free.iter().filter(|r| r.phase == Some(Phase::Decode)));
    assert!(
        before < decode,
        "load/prefill peak {before} B, decode {decode} B"
    );
    let cap = (before + decode) / 2;
    let (rows, _, stderr) = sweep(SC, dir.path(), "cap", Some(cap));
    assert!(stderr.contains("1 oom"), "{stderr}");
    let last = rows.last().unwrap();
    assert_eq!(last.status, Some(Status::Oom));
    assert_eq!(last.phase, Some(Phase::Decode), "{}", last.message);
    assert!(
        last.message.starts_with("out of memory in decode"),
        "{}",
        last.message
    );
    assert!(rows
        .iter()
        .any(|r| r.phase == Some(Phase::Decode) && r.status == Some(Status::Ok)));
}

/// Reserved per point: a point's reserved figures are its own, whether or not a larger point
/// ran before it in the same worker (the allocator's cache is trimmed at each point's start).
#[test]
fn reserved_does_not_depend_on_a_larger_earlier_point() {
    smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let (alone, _, _) = sweep(
        "harness/tests/data/order-small.toml",
        dir.path(),
        "alone",
        None,
    );
    let (after, _, _) = sweep(
        "harness/tests/data/order-large.toml",
        dir.path(),
        "after",
        None,
    );
    let reserved = |rows: &[Record], batch: u64, phase: Phase| {
        rows.iter()
            .find(|r| r.batch == batch && r.phase == Some(phase))
            .map(|r| (r.baseline_reserved.unwrap(), r.peak_reserved.unwrap()))
            .unwrap()
    };
    let (_, large) = reserved(&after, 16, Phase::Prefill);
    for phase in [Phase::Prefill, Phase::Decode] {
        let (base_alone, peak_alone) = reserved(&alone, 1, phase);
        let (base_after, peak_after) = reserved(&after, 1, phase);
        // Resident sets move by pages and by the warm-up's buffers: allow 2%, which is far
        // below what the larger point added (checked, so that the test can fail).
        let tol = peak_alone / 50;
        assert!(
            large > peak_alone + 10 * tol,
            "large {large} B, small {peak_alone} B"
        );
        assert!(
            peak_after.abs_diff(peak_alone) <= tol,
            "{phase:?} peak: alone {peak_alone} B, after the large point {peak_after} B"
        );
        assert!(
            base_after.abs_diff(base_alone) <= tol,
            "{phase:?} baseline: alone {base_alone} B, after the large point {base_after} B"
        );
    }
}

#[test]
fn sigkill_then_resume_equals_an_uninterrupted_run() {
    smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let (full, killed) = (dir.path().join("full.csv"), dir.path().join("killed.csv"));
    vramlab()
        .args(["sweep", "--quiet", SCENARIO, "--out"])
        .arg(&full)
        .assert()
        .success();

    // Start the same sweep and SIGKILL it once the third point has begun.
    let mut child = spawn_sweep(&killed);
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(&killed).unwrap_or_default();
        let third = "SmolLM2-135M-Instruct.Q4_1/infer/f32/b1/c64/growing/r0";
        if text
            .lines()
            .any(|l| l.contains(third) && l.contains(",prefill,"))
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "the sweep never reached point 3"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe {
        libc::kill(child.id() as i32, libc::SIGKILL);
    }
    child.wait().unwrap();
    let partial = rows(&killed);
    assert!(partial.len() < rows(&full).len());

    vramlab()
        .args(["sweep", "--quiet", "--resume", SCENARIO, "--out"])
        .arg(&killed)
        .assert()
        .success()
        .stderr(predicate::str::contains("resuming"));
    let (a, b) = (rows(&full), rows(&killed));
    let (a, b): (Vec<_>, Vec<_>) = (
        a.iter().map(stable).collect(),
        b.iter().map(stable).collect(),
    );
    assert_eq!(a.len(), b.len(), "row counts differ");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y);
    }
}

#[test]
fn resume_with_another_scenario_is_a_clear_error() {
    smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.csv");
    std::fs::write(&out, vramlab::record::columns().join(",") + "\n").unwrap();
    std::fs::write(
        dir.path().join("r.manifest.json"),
        r#"{"scenario_hash": "0000000000000000"}"#,
    )
    .unwrap();
    vramlab()
        .args(["sweep", "--quiet", SCENARIO, "--out"])
        .arg(&out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "was written by scenario hash 0000000000000000",
        ));
}

/// Two sweeps into one output would interleave their rows: the second is refused with one
/// line naming the file (exit 2) while the first runs, and the lock dies with its holder.
#[test]
fn a_second_sweep_into_the_same_output_is_refused() {
    use std::os::fd::AsRawFd;
    smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("busy.csv");
    let mut first = spawn_sweep(&out);
    // The lock is taken before the CSV is created.
    let t0 = Instant::now();
    while !out.exists() {
        assert!(t0.elapsed() < Duration::from_secs(120), "no output");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = vramlab()
        .args(["sweep", "--quiet", SCENARIO, "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let still_running = first.try_wait().unwrap().is_none();
    unsafe {
        libc::kill(first.id() as i32, libc::SIGKILL);
    }
    first.wait().unwrap();
    assert!(
        still_running,
        "the first sweep ended before the second started"
    );
    assert_eq!(second.status.code(), Some(2));
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("busy.csv") && err.contains("another vramlab sweep is writing this output"),
        "{err}"
    );
    // The killed holder's lock is gone.
    let lock = std::fs::File::open(dir.path().join(".busy.csv.lock")).unwrap();
    assert_eq!(
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
}

/// A generation sweep resumes like the LLM sweep: a point whose rows stop short of its
/// `total` is re-run, finished points are kept as they were, `--fresh` starts over, and a
/// scenario refused by its checks leaves the output as it was (even with `--fresh`).
#[test]
fn generation_sweep_resumes_and_a_bad_scenario_loses_nothing() {
    use candle_core::DType;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-sd");
    let sd = vramlab::model::diffusion::sd::Sd::new(common::tiny_sd(), DType::F32, DType::F32);
    vramlab::workload::generate::write_synthetic(&sd, &model).unwrap();
    let scenario = |res: &str| {
        format!(
            "name = \"tiny-gen\"\ndevice = \"cpu\"\n[model]\nsource = \"diffusers:{}\"\n\
             [sweep]\nmode = [\"generate\"]\nprecision = [\"f32\"]\nresolution = [\"{res}\"]\n\
             batch = [1, 2]\ncfg = [false]\nvae_decode = [\"full\"]\n",
            model.display()
        )
    };
    let good = dir.path().join("gen.toml");
    std::fs::write(&good, scenario("64x64")).unwrap();
    let out = dir.path().join("gen.csv");
    let run = |toml: &Path, extra: &[&str]| {
        vramlab()
            .args(["sweep", "--quiet"])
            .arg(toml)
            .arg("--out")
            .arg(&out)
            .args(extra)
            .assert()
    };
    run(&good, &[]).success();
    let first = rows(&out);
    let totals = |r: &[Record]| r.iter().filter(|r| r.phase == Some(Phase::Total)).count();
    assert_eq!(totals(&first), 2);
    // Cut the second point short of its total row, as a crash would.
    let last = first
        .iter()
        .rposition(|r| r.phase == Some(Phase::Total))
        .unwrap();
    let mut w = vramlab::export::csv::CsvExporter::create(&out).unwrap();
    for r in &first[..last] {
        vramlab::export::Exporter::write(&mut w, r).unwrap();
    }
    drop(w);
    run(&good, &[]).success().stderr(predicate::str::contains(
        "1 of 2 points done, re-running 1 partial",
    ));
    let resumed = rows(&out);
    assert_eq!(totals(&resumed), 2);
    let kept: Vec<&Record> = resumed
        .iter()
        .filter(|r| r.point_id == first[0].point_id)
        .collect();
    let before: Vec<&Record> = first
        .iter()
        .filter(|r| r.point_id == first[0].point_id)
        .collect();
    assert_eq!(kept, before, "a finished point is kept as it was");
    assert!(resumed
        .iter()
        .filter(|r| r.point_id != first[0].point_id)
        .all(|r| r.run_id != first[0].run_id));
    // A resolution that is not a multiple of 8: one line, exit 2, the output untouched.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, scenario("60x60")).unwrap();
    let text = std::fs::read(&out).unwrap();
    run(&bad, &["--fresh"])
        .code(2)
        .stderr(predicate::str::contains("resolution"));
    assert_eq!(std::fs::read(&out).unwrap(), text);
    run(&good, &["--fresh"]).success();
    let fresh = rows(&out);
    assert_eq!(totals(&fresh), 2);
    assert!(fresh.iter().all(|r| r.run_id != first[0].run_id));
}
