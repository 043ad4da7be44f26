//! What a sweep's worker process tells its parent (`sweep/supervisor.rs`) on stdout: that it
//! started, the phase starting now (`vramlab-phase NAME`), the device's facts and each point
//! finished (`vramlab-point-done ID`). The workloads mark their phases here; outside a worker
//! the reports are silent, and the running phase still names a failure's row.
use crate::record::Phase;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use strum::IntoEnumIterator;

static WORKER: AtomicBool = AtomicBool::new(false);

/// Marks this process as a worker: phase and point reports go to stdout.
pub fn become_worker() {
    WORKER.store(true, Ordering::Relaxed);
    // Touch stdout now, so its buffer is not first allocated inside a measured phase.
    println!("vramlab-worker ready");
    #[cfg(target_os = "linux")]
    // SAFETY: asks the kernel to kill this worker if its parent dies (no orphaned sweeps).
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
}

fn report(kind: &str, what: &str) {
    if WORKER.load(Ordering::Relaxed) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "vramlab-{kind} {what}");
        let _ = out.flush();
    }
}

/// The phase running now (its index in [`Phase`]'s order), for the row of an in-process
/// failure.
static RUNNING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Reports that a phase is starting (called between phases, never inside one), and
/// remembers it as the running phase.
pub fn mark_phase(p: Phase) {
    let i = Phase::iter().position(|q| q == p).unwrap_or(0);
    RUNNING.store(i, Ordering::Relaxed);
    report("phase", p.as_str());
}

/// The phase last marked as starting: the one that was running when an error came back.
pub fn running_phase() -> Phase {
    Phase::iter()
        .nth(RUNNING.load(Ordering::Relaxed))
        .unwrap_or(Phase::Load)
}

/// Reports the device's facts (one JSON line) for the parent's manifest.
pub fn report_device(facts: &serde_json::Value) {
    report("device", &facts.to_string());
}

/// Reports a finished point.
pub fn point_done(id: &str) {
    report("point-done", id);
}
