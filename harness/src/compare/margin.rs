//! The memory metrics the gate judges and their noise margins: the defaults per backend and
//! the `--tolerance` overrides.
use crate::record::Record;
use serde::Serialize;
use std::collections::BTreeMap;

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
