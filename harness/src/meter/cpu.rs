//! CPU meter: allocated from the counting allocator, reserved from the resident set
//! (`VmRSS`/`VmHWM`, reset through `/proc/self/clear_refs`), device_used from /proc/meminfo.
use super::{alloc, Baseline, Meter, PhaseMemory};
use anyhow::{Context, Result};

pub struct CpuMeter {
    /// False where /proc/self/clear_refs cannot be written: peak_reserved is then the
    /// process-lifetime VmHWM.
    hwm_resettable: bool,
}

impl CpuMeter {
    pub fn new() -> Self {
        let hwm_resettable = reset_hwm().is_ok();
        CpuMeter { hwm_resettable }
    }
}

impl Default for CpuMeter {
    fn default() -> Self {
        Self::new()
    }
}

fn reset_hwm() -> std::io::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5")
}

/// Reads `key:  N kB` lines of a /proc file, in bytes.
fn proc_kb(path: &str, keys: &[&str]) -> Result<Vec<u64>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    keys.iter()
        .map(|k| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map(|kb| kb * 1024)
                .with_context(|| format!("{path}: no `{k}` line"))
        })
        .collect()
}

/// (VmRSS, VmHWM) of this process, in bytes.
pub fn rss() -> Result<(u64, u64)> {
    let v = proc_kb("/proc/self/status", &["VmRSS", "VmHWM"])?;
    Ok((v[0], v[1]))
}

/// MemTotal − MemAvailable, in bytes.
pub fn host_used() -> Result<u64> {
    let v = proc_kb("/proc/meminfo", &["MemTotal", "MemAvailable"])?;
    Ok(v[0].saturating_sub(v[1]))
}

impl Meter for CpuMeter {
    fn kind(&self) -> crate::vocab::MeterKind {
        crate::vocab::MeterKind::CpuAlloc
    }

    fn trim(&mut self) -> Result<()> {
        // SAFETY: glibc's malloc_trim returns free heap pages to the kernel; no pointers change.
        unsafe {
            libc::malloc_trim(0);
        }
        Ok(())
    }

    fn start(&mut self) -> Result<Baseline> {
        if self.hwm_resettable {
            reset_hwm().context("resetting VmHWM through /proc/self/clear_refs")?;
        }
        alloc::reset_peak();
        let (rss, _) = rss()?;
        Ok(Baseline {
            allocated: alloc::current(),
            reserved: rss,
        })
    }

    fn finish(&mut self, base: Baseline) -> Result<PhaseMemory> {
        let (peak_allocated, end_allocated) = (alloc::peak(), alloc::current());
        let (rss, hwm) = rss()?;
        Ok(PhaseMemory {
            baseline_allocated: base.allocated,
            peak_allocated,
            end_allocated,
            baseline_reserved: base.reserved,
            peak_reserved: hwm.max(rss),
            device_used: host_used()?,
            // RSS − allocated; zero when untouched (calloc'd) pages make RSS the smaller.
            non_pool: rss.saturating_sub(end_allocated),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_figures_are_sane() {
        let (rss, hwm) = rss().unwrap();
        assert!(rss > 0 && hwm >= rss);
        assert!(host_used().unwrap() > 0);
    }

    // The exact allocated-figure tests of the meter are in `harness/tests/meter_exact.rs`.
}
