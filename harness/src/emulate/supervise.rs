//! Runs an emulated program to its end, whatever end it has: its own exit, a signal, vramlab's
//! `--timeout`, or the user's Ctrl-C. The program runs in a process group of its own, so that
//! every process it starts (spawned and forked workers, torchrun's ranks) is stopped with it,
//! and in a run folder of its own, removed afterwards, where each of them leaves its records.
use super::records::Collected;
use super::{Launch, ProgramOutput};
use anyhow::{Context, Result};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Stdio;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// How the program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// It exited with this code.
    Exited(i32),
    /// A signal vramlab did not send ended it (SIGKILL from the OOM killer or a user, say).
    Signal(i32),
    /// It ran past `--timeout`, and vramlab stopped it.
    TimedOut(Duration),
    /// vramlab itself got this signal (Ctrl-C: SIGINT) and passed it on.
    Interrupted(i32),
}

/// A finished run: how it ended and what its processes recorded.
pub struct Finished {
    pub ending: Ending,
    pub collected: Collected,
    /// The program's standard error, when `capture_stderr` kept it.
    pub stderr: Vec<u8>,
    /// When vramlab stopped the program (for a timeout or an interrupt).
    pub stopped_at: Option<std::time::SystemTime>,
    /// The program's own process id (the processes it started have others).
    pub root_pid: u32,
}

/// The signal vramlab received while a program ran (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    RECEIVED.store(sig, Ordering::SeqCst);
}

/// SIGINT and SIGTERM caught for the length of a run (restored on drop), to be passed on to the
/// program's process group, which the terminal no longer reaches.
struct Catch {
    old: [libc::sighandler_t; 2],
}

const CAUGHT: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

impl Catch {
    fn new() -> Catch {
        RECEIVED.store(0, Ordering::SeqCst);
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only stores into an atomic.
        let old = CAUGHT.map(|s| unsafe { libc::signal(s, handler) });
        Catch { old }
    }
}

impl Drop for Catch {
    fn drop(&mut self) {
        for (s, h) in CAUGHT.iter().zip(self.old) {
            // SAFETY: restoring the disposition saved in `new`.
            unsafe { libc::signal(*s, h) };
        }
    }
}

/// Sends `sig` to every process of the group `pgid`; false once none is left.
fn signal_group(pgid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) on a process group this run created.
    unsafe { libc::kill(-(pgid as libc::pid_t), sig) == 0 }
}

/// How long a stopped program has to leave through its exit handlers before SIGKILL.
const GRACE: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(20);

impl Launch<'_> {
    /// Runs `argv` (the program first) on the emulated GPU and collects every process's records.
    pub fn run(&self, argv: &[String]) -> Result<Finished> {
        let dir = tempfile::Builder::new()
            .prefix("vramlab-emulate-")
            .tempdir()
            .context("creating the emulated run's folder")?;
        let mut cmd = self.command(argv, dir.path());
        cmd.process_group(0);
        match self.stdout {
            ProgramOutput::Inherit => {}
            ProgramOutput::Discard => {
                cmd.stdout(Stdio::null());
            }
            ProgramOutput::ToStderr => {
                let err = std::os::fd::AsFd::as_fd(&std::io::stderr())
                    .try_clone_to_owned()
                    .context("duplicating standard error for the program's output")?;
                cmd.stdout(Stdio::from(err));
            }
        }
        if self.capture_stderr {
            cmd.stderr(Stdio::piped());
        }
        let catch = Catch::new();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", argv[0]))?;
        let pgid = child.id();
        let reader = child.stderr.take().map(|mut e| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = std::io::Read::read_to_end(&mut e, &mut buf);
                buf
            })
        });
        let started = Instant::now();
        let mut stop: Option<(Ending, Instant)> = None;
        let mut stopped_at = None;
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break st;
            }
            let received = RECEIVED.swap(0, Ordering::SeqCst);
            if received != 0 && stop.is_none() {
                signal_group(pgid, received);
                stop = Some((Ending::Interrupted(received), Instant::now()));
                stopped_at = Some(std::time::SystemTime::now());
            }
            if let Some(limit) = self
                .timeout
                .filter(|t| stop.is_none() && started.elapsed() > *t)
            {
                stopped_at = Some(std::time::SystemTime::now());
                dump_stacks(dir.path());
                signal_group(pgid, libc::SIGTERM);
                stop = Some((Ending::TimedOut(limit), Instant::now()));
            }
            if stop.is_some_and(|(_, at)| at.elapsed() > GRACE) {
                signal_group(pgid, libc::SIGKILL);
            }
            std::thread::sleep(POLL);
        };
        // What the program left running (a worker it did not wait for) ends with it.
        if signal_group(pgid, libc::SIGTERM) {
            let t = Instant::now();
            while signal_group(pgid, 0) && t.elapsed() < GRACE {
                std::thread::sleep(POLL);
            }
            signal_group(pgid, libc::SIGKILL);
        }
        drop(catch);
        let stderr = reader
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let ending = match (stop, status.code(), status.signal()) {
            (Some((e, _)), _, _) => e,
            (None, Some(c), _) => Ending::Exited(c),
            (None, None, Some(s)) => Ending::Signal(s),
            (None, None, None) => Ending::Exited(-1),
        };
        let collected = Collected::read(dir.path()).with_context(|| {
            format!(
                "reading the emulated run's records in {}",
                dir.path().display()
            )
        })?;
        Ok(Finished {
            ending,
            collected,
            stderr,
            stopped_at,
            root_pid: pgid,
        })
    }
}

/// Asks every Python process of the run to write its stacks (SIGUSR1: the boot's faulthandler),
/// and gives them a moment to.
fn dump_stacks(dir: &std::path::Path) {
    let pids: Vec<i32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_prefix("trace-")?
                .strip_suffix(".txt")?
                .parse()
                .ok()
        })
        .collect();
    for &pid in &pids {
        // SAFETY: kill(2) on a process of this run (its trace file is in the run's folder).
        unsafe { libc::kill(pid, libc::SIGUSR1) };
    }
    if !pids.is_empty() {
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A `--timeout`: a duration, or none (`0`).
#[derive(Clone, Copy, Debug)]
pub struct Timeout(pub Option<std::time::Duration>);

/// `--timeout`'s value: a humantime duration ("90s", "10m") or 0 for none.
pub fn parse_timeout(s: &str) -> Result<Timeout, String> {
    if s.trim() == "0" {
        return Ok(Timeout(None));
    }
    humantime::parse_duration(s)
        .map(|d| Timeout((!d.is_zero()).then_some(d)))
        .map_err(|e| format!("`{s}`: {e} (e.g. 90s, 10m, 2h; 0 for none)"))
}

/// A signal's name: "SIGKILL".
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}
