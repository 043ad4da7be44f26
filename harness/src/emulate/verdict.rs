//! The verdict of an emulated run, and only where the records support one: "fits" needs memory
//! seen on the device and every process that used it ended whole. Otherwise the run is out of
//! memory, or partial with the reason, or it saw nothing (docs/src/guides/emulator.md, "What
//! the report can and cannot see").
use super::records::{Collected, Process, ProcessStatus};
use super::supervise::{signal_name, Ending, Finished};

/// What an emulated run says about the fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Memory was seen, and every process ended whole without running out.
    Fits,
    /// A process ran out of memory (PyTorch's message).
    DoesNotFit { pid: u32, message: String },
    /// The figures are partial (a process killed, stopped at the timeout, or failed): the reason.
    Unknown(String),
    /// Nothing reached the emulated device; the reason adds how the program ended.
    NothingObserved(String),
}

impl Verdict {
    /// `true`, `false`, or no verdict (`None`).
    pub fn fits(&self) -> Option<bool> {
        match self {
            Verdict::Fits => Some(true),
            Verdict::DoesNotFit { .. } => Some(false),
            _ => None,
        }
    }

    /// "complete", "partial" or "no-cuda-memory" (the JSON's `status`).
    pub fn status(&self) -> &'static str {
        match self {
            Verdict::Fits | Verdict::DoesNotFit { .. } => "complete",
            Verdict::Unknown(_) => "partial",
            Verdict::NothingObserved(_) => "no-cuda-memory",
        }
    }
}

/// How the program ended, in words ("exited with 0", "killed by SIGKILL", ...).
pub fn ending_text(e: Ending) -> String {
    match e {
        Ending::Exited(c) => format!("exited with {c}"),
        Ending::Signal(s) => format!("was killed by {}", signal_name(s)),
        Ending::TimedOut(t) => format!(
            "was stopped by vramlab after --timeout {}",
            humantime::format_duration(t)
        ),
        Ending::Interrupted(s) => format!("was interrupted ({} passed on to it)", signal_name(s)),
    }
}

/// Why a process's figures are not whole, if they are not.
fn incomplete(p: &Process) -> Option<String> {
    let who = format!("process {} ({})", p.pid, short(&p.command));
    match p.status() {
        ProcessStatus::Ok | ProcessStatus::Oom | ProcessStatus::Exited => None,
        ProcessStatus::Error => Some(format!(
            "{who} failed: {}",
            p.python
                .as_ref()
                .map(|r| r.message.lines().next().unwrap_or("").to_string())
                .unwrap_or_default()
        )),
        ProcessStatus::Terminated => Some(format!("{who} was stopped by SIGTERM")),
        ProcessStatus::Partial => Some(format!(
            "{who} ended without its exit handlers (killed, or os._exit): its figures are what \
             the stubs counted until then"
        )),
    }
}

/// A command shortened for a line.
pub fn short(cmd: &str) -> String {
    const MAX: usize = 60;
    if cmd.chars().count() <= MAX {
        cmd.to_string()
    } else {
        format!("{}…", cmd.chars().take(MAX - 1).collect::<String>())
    }
}

/// The loop a stopped program was in, when the stubs can tell: device-to-host reads, which
/// return zeros here, up to the moment it was stopped.
pub fn hang_hint(f: &Finished) -> Option<String> {
    let stopped = f.stopped_at?;
    let stop_ns = stopped
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos() as u64;
    let p = f.collected.processes.iter().find(|p| {
        p.driver.as_ref().is_some_and(|d| {
            d.d2h_reads > 0 && stop_ns.saturating_sub(d.last_d2h_ns) < 2_000_000_000
        })
    })?;
    let d = p.driver.as_ref()?;
    let at = p
        .stopped_at()
        .map(|s| format!(" at {s}"))
        .unwrap_or_default();
    Some(format!(
        "process {} was reading device memory to the host when stopped{at} ({} reads in all): \
         device data reads as zeros on the emulated GPU, so a loop that waits for a value \
         computed on the device never ends",
        p.pid, d.d2h_reads
    ))
}

/// The verdict of a finished run.
pub fn judge(f: &Finished) -> Verdict {
    let c: &Collected = &f.collected;
    let observed: Vec<&Process> = c.observed().collect();
    match (observed.is_empty(), f.ending) {
        (true, Ending::Exited(_)) => return Verdict::NothingObserved(ending_text(f.ending)),
        (true, other) => {
            return Verdict::Unknown(format!(
                "the program {} before anything reached the emulated GPU",
                ending_text(other)
            ))
        }
        _ => {}
    }
    if let Some(p) = observed.iter().find(|p| p.status() == ProcessStatus::Oom) {
        let message = p
            .python
            .as_ref()
            .map(|r| r.message.lines().next().unwrap_or("").to_string())
            .unwrap_or_default();
        return Verdict::DoesNotFit {
            pid: p.pid,
            message,
        };
    }
    let mut why = match f.ending {
        Ending::Exited(_) => None,
        other => Some(format!("the program {}", ending_text(other))),
    };
    if let Some(h) = why.as_mut().and(hang_hint(f)) {
        why = why.map(|w| format!("{w}; {h}"));
    }
    // A process that failed says more than the exit code it caused (a rank that could not
    // start, say), whether or not it reached the device.
    let failed = c
        .processes
        .iter()
        .rev() // the innermost: a worker's error, not its launcher's "child failed"
        .find(|p| p.status() == ProcessStatus::Error)
        .and_then(incomplete);
    let why = why
        .or(failed)
        .or_else(|| match f.ending {
            Ending::Exited(code) if code != 0 => {
                Some(format!("the program {}", ending_text(f.ending)))
            }
            _ => None,
        })
        .or_else(|| observed.iter().find_map(|p| incomplete(p)));
    match why {
        Some(why) => Verdict::Unknown(why),
        None => Verdict::Fits,
    }
}

/// One device's figures and fit.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceFit {
    pub index: usize,
    /// At most: every process's cudaMalloc bytes there plus one CUDA context each.
    pub peak_nvml_used: u64,
    pub total_bytes: u64,
    /// The processes that made a context there.
    pub pids: Vec<u32>,
    /// No verdict (`None`) for a partial run; `false` where a process ran out of memory.
    pub fits: Option<bool>,
}

/// The verdict per device used.
pub fn devices(f: &Finished, v: &Verdict, total_bytes: u64) -> Vec<DeviceFit> {
    let c = &f.collected;
    c.devices
        .iter()
        .filter(|d| d.peak_nvml_used > 0)
        .map(|d| {
            let on = |p: &&Process| {
                p.driver
                    .as_ref()
                    .is_some_and(|r| r.contexts & (1 << d.index) != 0)
            };
            let pids: Vec<u32> = c.processes.iter().filter(on).map(|p| p.pid).collect();
            let fits = match v {
                Verdict::DoesNotFit { pid, .. } if pids.contains(pid) => Some(false),
                Verdict::Fits => Some(true),
                _ => None,
            };
            DeviceFit {
                index: d.index,
                peak_nvml_used: d.peak_nvml_used,
                total_bytes,
                pids,
                fits,
            }
        })
        .collect()
}
