//! What an emulated run leaves in its run folder, read back per process: the stubs' records
//! (`harness/emulator/emu_record.h`: bytes each process held on each device, written in place,
//! so they survive a kill), the Python boot's report (`python-<pid>.json`, written at exit) and
//! the stacks a stopped Python process dumped (`trace-<pid>.txt`).
use super::report::{Outcome, Report};
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;

/// `EMU_RECORD_MAGIC`: "VRMEREC1".
const MAGIC: u64 = 0x3143_4552_454d_5256;
/// `EMU_MAX_DEVICES` (harness/emulator/emu_record.h): the devices a process record holds.
pub(super) const MAX_DEVICES: usize = 16;
const TEXT: usize = 512;
const PROC_SIZE: usize = 128 + MAX_DEVICES * 32 + 2 * TEXT;
const DEVICE_SIZE: usize = 32;

/// One process's use of one device, from the stubs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProcDevice {
    /// Bytes held through cudaMalloc when the record was read (at exit, or when killed).
    pub used: u64,
    /// At most, over the process.
    pub peak: u64,
    pub mallocs: u64,
    /// Allocations refused for capacity (PyTorch frees its cache and retries).
    pub failed: u64,
}

/// A process's record from the stubs (`struct emu_proc`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Driver {
    pub pid: u32,
    pub ppid: u32,
    /// Bit d: the process made a context on device d.
    pub contexts: u64,
    pub d2h_reads: u64,
    pub last_d2h_ns: u64,
    pub errors: u64,
    /// The process ran its exit handlers (false: killed, or left through `_exit`).
    pub exited: bool,
    pub devices: Vec<ProcDevice>,
    pub last_error: String,
    pub cmdline: String,
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn text_at(b: &[u8], off: usize) -> String {
    let s = &b[off..off + TEXT];
    let end = s.iter().position(|&c| c == 0).unwrap_or(TEXT);
    String::from_utf8_lossy(&s[..end]).trim().to_string()
}

impl Driver {
    /// A record's bytes; `None` for one not yet complete (the process was killed while it
    /// created it) or of another layout.
    pub fn parse(b: &[u8]) -> Option<Driver> {
        if b.len() < PROC_SIZE || u64_at(b, 0) != MAGIC {
            return None;
        }
        let n = (u64_at(b, 24) as usize).min(MAX_DEVICES);
        let devices = (0..n)
            .map(|d| {
                let o = 128 + d * 32;
                ProcDevice {
                    used: u64_at(b, o),
                    peak: u64_at(b, o + 8),
                    mallocs: u64_at(b, o + 16),
                    failed: u64_at(b, o + 24),
                }
            })
            .collect();
        Some(Driver {
            pid: u64_at(b, 8) as u32,
            ppid: u64_at(b, 16) as u32,
            contexts: u64_at(b, 32),
            d2h_reads: u64_at(b, 40),
            last_d2h_ns: u64_at(b, 48),
            errors: u64_at(b, 56),
            exited: u64_at(b, 64) != 0,
            devices,
            last_error: text_at(b, 640),
            cmdline: text_at(b, 640 + TEXT),
        })
    }

    /// Two copies of the stubs in one process (libcuda.so.1 opened by dlopen beside the
    /// preloaded library) keep separate counts: their sum is the process's.
    fn merge(&mut self, o: Driver) {
        self.contexts |= o.contexts;
        self.d2h_reads += o.d2h_reads;
        self.last_d2h_ns = self.last_d2h_ns.max(o.last_d2h_ns);
        self.errors += o.errors;
        self.exited &= o.exited;
        if self.last_error.is_empty() {
            self.last_error = o.last_error;
        }
        for (a, b) in self.devices.iter_mut().zip(o.devices) {
            a.used += b.used;
            a.peak += b.peak;
            a.mallocs += b.mallocs;
            a.failed += b.failed;
        }
    }

    /// The most this process held through cudaMalloc on any one device.
    pub fn peak(&self) -> u64 {
        self.devices.iter().map(|d| d.peak).max().unwrap_or(0)
    }

    /// The device it allocated most on.
    pub fn main_device(&self) -> Option<usize> {
        (0..self.devices.len())
            .filter(|&d| self.contexts & (1 << d) != 0)
            .max_by_key(|&d| (self.devices[d].peak, std::cmp::Reverse(d)))
    }
}

/// One emulated device, shared by every process of the run (`struct emu_device`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceUse {
    pub index: usize,
    /// At most: all processes' cudaMalloc bytes plus one CUDA context per process there (the
    /// NVML-equivalent "used").
    pub peak_nvml_used: u64,
    /// Processes with a context there at the end (a killed one keeps its context).
    pub contexts_at_end: u64,
}

impl DeviceUse {
    fn parse(index: usize, b: &[u8]) -> Option<DeviceUse> {
        (b.len() >= DEVICE_SIZE && u64_at(b, 0) == MAGIC).then(|| DeviceUse {
            index,
            peak_nvml_used: u64_at(b, 24),
            contexts_at_end: u64_at(b, 16),
        })
    }
}

/// One process of an emulated run: what the stubs and the Python boot recorded of it.
#[derive(Clone, Debug, Default)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub command: String,
    /// The stubs' record, for a process that used the emulated device.
    pub driver: Option<Driver>,
    /// The Python boot's report, for a Python process that reached its exit handlers.
    pub python: Option<Report>,
    /// The stacks it dumped when vramlab stopped the run (Python's faulthandler format).
    pub trace: Option<String>,
}

/// How one process's run ended, as far as its records tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, strum::Display)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum ProcessStatus {
    /// Its report is whole: it ran to its end.
    Ok,
    /// PyTorch raised its out-of-memory error.
    Oom,
    /// Another uncaught exception.
    Error,
    /// It was stopped by SIGTERM and left through its exit handlers.
    Terminated,
    /// No PyTorch report, but it ran its exit handlers: a program that is not Python
    /// (vramlab's CUDA build, a candle program) or one that never imported the boot. Its
    /// figures are the stubs' own, whole.
    Exited,
    /// No report of its own, and no exit handlers: killed, or left through `_exit` (a forked
    /// worker). Its driver bytes are what it held up to then.
    Partial,
}

impl Process {
    /// Whether anything of it reached the emulated device: an allocation, or one refused
    /// (an out-of-memory first request is a verdict too).
    pub fn observed(&self) -> bool {
        self.driver
            .as_ref()
            .is_some_and(|d| d.devices.iter().any(|x| x.mallocs + x.failed > 0))
            || self.status() == ProcessStatus::Oom
            || self
                .python
                .as_ref()
                .is_some_and(|r| r.run.as_ref().is_some_and(|s| s.peak_reserved > 0))
    }

    pub fn status(&self) -> ProcessStatus {
        match self.python.as_ref().map(|r| r.outcome) {
            Some(Outcome::Ok) => ProcessStatus::Ok,
            Some(Outcome::Oom) => ProcessStatus::Oom,
            Some(Outcome::Error) => ProcessStatus::Error,
            Some(Outcome::Terminated) => ProcessStatus::Terminated,
            None if self.driver.as_ref().is_some_and(|d| d.exited) => ProcessStatus::Exited,
            None => ProcessStatus::Partial,
        }
    }

    /// The most it held on one device through cudaMalloc (the stubs' count; PyTorch's reserved
    /// plus anything allocated outside its allocator).
    pub fn peak_driver(&self) -> u64 {
        let py = self
            .python
            .as_ref()
            .and_then(|r| r.run.as_ref())
            .map_or(0, |s| s.peak_driver.unwrap_or(s.peak_reserved));
        self.driver.as_ref().map_or(0, Driver::peak).max(py)
    }

    /// The device it used (its Python report's, else the one it allocated most on).
    pub fn device(&self) -> Option<usize> {
        self.python
            .as_ref()
            .and_then(|r| r.device)
            .or_else(|| self.driver.as_ref().and_then(Driver::main_device))
    }

    /// The innermost frame of the stopped program's own code in its dumped stacks: the first
    /// frame outside the interpreter's and packages' folders, else the innermost frame.
    pub fn stopped_at(&self) -> Option<String> {
        let trace = self.trace.as_deref()?;
        let frames: Vec<&str> = trace
            .lines()
            .skip_while(|l| !l.starts_with("Current thread") && !l.starts_with("Thread"))
            .skip(1)
            .take_while(|l| l.starts_with("  File"))
            .map(str::trim)
            .collect();
        let own = |f: &&&str| !f.contains("site-packages") && !f.contains("/lib/python3");
        frames
            .iter()
            .find(own)
            .or(frames.first())
            .map(|f| f.trim_start_matches("File ").to_string())
    }
}

/// Everything the run folder holds, by process (ordered by pid) and by device.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub processes: Vec<Process>,
    pub devices: Vec<DeviceUse>,
}

impl Collected {
    /// Reads the run folder. A record a killed process left half-written is skipped; a Python
    /// report that does not parse is an error naming it.
    pub fn read(dir: &Path) -> Result<Collected> {
        let mut procs: BTreeMap<u32, Process> = BTreeMap::new();
        let mut devices = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for path in entries {
            let name = path
                .file_name()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            let pid_of = |prefix: &str, suffix: &str| -> Option<u32> {
                let core = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
                core.split('.').next()?.parse().ok()
            };
            if let Some(pid) = pid_of("proc-", ".bin") {
                if let Some(d) = Driver::parse(&std::fs::read(&path)?) {
                    let p = procs.entry(pid).or_default();
                    match &mut p.driver {
                        Some(have) => have.merge(d),
                        None => p.driver = Some(d),
                    }
                }
            } else if let Some(i) = pid_of("device-", ".bin") {
                if let Some(d) = DeviceUse::parse(i as usize, &std::fs::read(&path)?) {
                    devices.push(d);
                }
            } else if let Some(pid) = pid_of("python-", ".json") {
                procs.entry(pid).or_default().python = Some(Report::read(&path)?);
            } else if let Some(pid) = pid_of("trace-", ".txt") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let p = procs.entry(pid).or_default();
                if !text.trim().is_empty() {
                    p.trace = Some(text);
                }
            }
        }
        devices.sort_by_key(|d| d.index);
        let processes = procs
            .into_iter()
            .map(|(pid, mut p)| {
                p.pid = pid;
                let py = p.python.as_ref();
                p.ppid = py
                    .and_then(|r| r.ppid)
                    .or(p.driver.as_ref().map(|d| d.ppid))
                    .unwrap_or(0);
                p.command = py
                    .filter(|r| !r.argv.is_empty())
                    .map(|r| format!("python {}", r.argv.join(" ")))
                    .or_else(|| p.driver.as_ref().map(|d| d.cmdline.clone()))
                    .unwrap_or_default();
                p
            })
            .collect();
        Ok(Collected { processes, devices })
    }

    /// The processes that put something on the emulated device.
    pub fn observed(&self) -> impl Iterator<Item = &Process> {
        self.processes.iter().filter(|p| p.observed())
    }

    /// The process that held the most on one device (the earliest started on a tie).
    pub fn peak_process(&self) -> Option<&Process> {
        self.observed()
            .max_by_key(|p| (p.peak_driver(), std::cmp::Reverse(p.pid)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: u64, peak: u64, exited: bool) -> Vec<u8> {
        let mut b = vec![0u8; PROC_SIZE];
        let put =
            |b: &mut Vec<u8>, off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
        put(&mut b, 0, MAGIC);
        put(&mut b, 8, pid);
        put(&mut b, 16, 1);
        put(&mut b, 24, 2);
        put(&mut b, 32, 0b10);
        put(&mut b, 64, exited as u64);
        put(&mut b, 128 + 32 + 8, peak);
        put(&mut b, 128 + 32 + 16, 3);
        b[640..640 + 5].copy_from_slice(b"oops!");
        b
    }

    #[test]
    fn a_record_reads_at_the_header_offsets() {
        let d = Driver::parse(&record(42, 1 << 30, true)).unwrap();
        assert_eq!((d.pid, d.ppid, d.exited), (42, 1, true));
        assert_eq!(d.devices.len(), 2);
        assert_eq!(d.devices[1].peak, 1 << 30);
        assert_eq!(d.main_device(), Some(1));
        assert_eq!(d.last_error, "oops!");
        assert_eq!(
            Driver::parse(&record(42, 1, true)[..100]),
            None,
            "a short record is skipped"
        );
        let mut torn = record(42, 1, true);
        torn[0] = 0;
        assert_eq!(
            Driver::parse(&torn),
            None,
            "a record without its magic is skipped"
        );
    }

    #[test]
    fn the_folder_groups_files_by_process_and_names_the_peak() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("proc-7.bin"), record(7, 100, false)).unwrap();
        std::fs::write(dir.path().join("proc-9.bin"), record(9, 300, true)).unwrap();
        std::fs::write(dir.path().join("proc-9.1.bin"), record(9, 50, true)).unwrap();
        std::fs::write(
            dir.path().join("trace-7.txt"),
            "Current thread 0x1 (most recent call first):\n  File \"/x/site-packages/torch/_tensor.py\", line 1 in item\n  File \"/tmp/loop.py\", line 4 in <module>\n",
        )
        .unwrap();
        let c = Collected::read(dir.path()).unwrap();
        assert_eq!(c.processes.len(), 2);
        assert_eq!(
            c.processes[1].peak_driver(),
            350,
            "two copies of the stubs add up"
        );
        assert_eq!(c.peak_process().unwrap().pid, 9);
        assert_eq!(c.processes[0].status(), ProcessStatus::Partial);
        assert_eq!(c.processes[1].status(), ProcessStatus::Exited);
        assert_eq!(
            c.processes[0].stopped_at().as_deref(),
            Some("\"/tmp/loop.py\", line 4 in <module>")
        );
    }
}
