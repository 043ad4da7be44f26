//! Reliability: running out of memory under `--capacity`, SIGKILL then `--resume`, and
//! determinism of the allocated figures across processes.
mod common;
use common::{root, smollm2_gguf, stable, vramlab};
use predicates::prelude::*;
use std::path::Path;
use std::time::{Duration, Instant};
use vramlab::record::{Record, Status};

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

#[test]
fn capacity_between_points_records_oom_and_goes_on() {
    smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cap.csv");
    // f32 SmolLM2: the batch-1 points peak at about 546.6 MB, the batch-2 ones at 551.8 MB.
    vramlab()
        .args(["sweep", "--quiet", SCENARIO, "--capacity", "549MB", "--out"])
        .arg(&out)
        .assert()
        .success()
        .stderr(predicate::str::contains("4 ok, 4 oom"));
    let rows = rows(&out);
    for r in &rows {
        let b2 = r.point_id.contains("/b2/");
        if r.status == Some(Status::Oom) {
            assert!(b2, "{}", r.point_id);
            assert_eq!(r.phase, Some(vramlab::record::Phase::Prefill));
            assert!(r.peak_allocated.unwrap() <= 549_000_000);
            assert!(
                r.message.starts_with("out of memory in prefill"),
                "{}",
                r.message
            );
        }
    }
    let oom_points: Vec<_> = rows
        .iter()
        .filter(|r| r.status == Some(Status::Oom))
        .collect();
    assert_eq!(oom_points.len(), 4);
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("cap.manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["capacity_bytes"], 549_000_000u64);
    assert_eq!(manifest["status_counts"]["oom"], 4);
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
