//! The GPU-free half of the CUDA meter (ARCHITECTURE.md §3): the phase logic over a memory pool's
//! attributes, behind [`PoolAttrs`] so that a fake pool can test it without a GPU. The cudarc
//! implementation lives in `meter/cuda.rs` (feature `cuda`).
//!
//! - allocated = the pool's `USED_MEM_CURRENT/HIGH`; reserved = `RESERVED_MEM_CURRENT/HIGH`;
//!   the high-water marks are reset by writing 0 at the start of each phase;
//! - device_used = total − free from `cuMemGetInfo`; non_pool = device_used − reserved;
//! - without async allocation (`has_async_alloc() == false`, plain `cuMemAlloc`) there is no
//!   pool to read: the meter falls back to `cuMemGetInfo` differences, `meter = cuda-meminfo`.
use super::{Baseline, Meter, PhaseMemory};
use anyhow::Result;

/// The pool attributes the meter reads or writes (`CU_MEMPOOL_ATTR_*`, all `cuuint64_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolAttr {
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`: bytes of live allocations.
    UsedCurrent,
    /// `CU_MEMPOOL_ATTR_USED_MEM_HIGH`: high-water mark of the above; reset by writing 0.
    UsedHigh,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`: bytes the pool holds from the driver.
    ReservedCurrent,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`: high-water mark of the above; reset by writing 0.
    ReservedHigh,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`: bytes the pool keeps at a synchronization.
    ReleaseThreshold,
}

/// A device's memory pool and the device facts the meter needs. Implemented over cudarc in
/// `meter/cuda.rs`, and by a fake in the tests.
pub trait PoolAttrs {
    /// Whether allocations go through the pool (`cuMemAllocAsync`).
    fn has_async_alloc(&self) -> bool;
    /// Waits for all work on the device.
    fn synchronize(&self) -> Result<()>;
    fn get(&self, attr: PoolAttr) -> Result<u64>;
    fn set(&mut self, attr: PoolAttr, value: u64) -> Result<()>;
    /// `(free, total)` bytes of the device (`cuMemGetInfo`).
    fn mem_info(&self) -> Result<(u64, u64)>;
    /// Releases the pool's unused memory down to `keep` bytes (`cuMemPoolTrimTo`).
    fn trim_to(&mut self, keep: u64) -> Result<()>;
    /// Whether the pool is the emulated GPU's (the stub runtime's, `meter = cuda-pool-emulated`).
    fn emulated(&self) -> bool;
}

pub use crate::vocab::{MeterKind, PoolRelease};

/// Which way the meter reads memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// The pool's attributes (`meter = cuda-pool`).
    Pool,
    /// `cuMemGetInfo` differences (`meter = cuda-meminfo`): no pool, no high-water marks.
    MemInfo,
}

/// The meter over any [`PoolAttrs`]. `CudaMeter` is `PoolMeter<CudarcPool>`.
pub struct PoolMeter<P: PoolAttrs> {
    pool: P,
    mode: PoolMode,
    release: PoolRelease,
    /// MemInfo mode: device_used when the meter was made (context, modules, cuBLAS, other
    /// processes); allocated is device_used minus this.
    origin_used: u64,
}

impl<P: PoolAttrs> PoolMeter<P> {
    /// Chooses the mode from `has_async_alloc()` and, in pool mode, sets the release threshold.
    pub fn new(mut pool: P, release: PoolRelease) -> Result<Self> {
        let mode = if pool.has_async_alloc() {
            pool.set(PoolAttr::ReleaseThreshold, release.threshold())?;
            PoolMode::Pool
        } else {
            PoolMode::MemInfo
        };
        pool.synchronize()?;
        let origin_used = device_used(&pool)?;
        Ok(PoolMeter {
            pool,
            mode,
            release,
            origin_used,
        })
    }

    pub fn mode(&self) -> PoolMode {
        self.mode
    }

    pub fn pool(&self) -> &P {
        &self.pool
    }

    /// The `pool_release` CSV column: empty where no pool is used.
    pub fn pool_release_column(&self) -> Option<PoolRelease> {
        release_column(self.kind(), self.release)
    }

    /// The manifest's `pool` object.
    pub fn settings_json(&self) -> serde_json::Value {
        pool_json(self.kind(), self.release)
    }
}

/// The `pool_release` CSV column for a meter of kind `meter_kind`: the option where a pool is
/// read (`cuda-pool`), empty otherwise.
pub fn release_column(meter_kind: MeterKind, release: PoolRelease) -> Option<PoolRelease> {
    meter_kind.reads_pool().then_some(release)
}

/// The manifest's `pool` object for a meter of kind `meter_kind`; null on CPU.
pub fn pool_json(meter_kind: MeterKind, release: PoolRelease) -> serde_json::Value {
    match meter_kind {
        MeterKind::CudaPool => serde_json::json!({
            "meter": meter_kind,
            "pool": "device's current pool (cuDeviceGetMemPool), used by cuMemAllocAsync",
            "pool_release": release.as_str(),
            "release_threshold": release.threshold(),
        }),
        MeterKind::CudaPoolEmulated => serde_json::json!({
            "meter": meter_kind,
            "pool": "the emulated GPU's default pool (stub runtime, docs/src/guides/emulator.md): used exact by rule, reserved modelled in 2 MiB granules",
            "pool_release": release.as_str(),
            "release_threshold": release.threshold(),
        }),
        MeterKind::CudaMeminfo => serde_json::json!({
            "meter": meter_kind,
            "pool": null,
            "note": "no async allocation on this device: cuMemAlloc, figures from cuMemGetInfo differences",
        }),
        _ => serde_json::Value::Null,
    }
}

fn device_used<P: PoolAttrs>(pool: &P) -> Result<u64> {
    let (free, total) = pool.mem_info()?;
    Ok(total.saturating_sub(free))
}

impl<P: PoolAttrs> Meter for PoolMeter<P> {
    fn kind(&self) -> MeterKind {
        match self.mode {
            PoolMode::Pool if self.pool.emulated() => MeterKind::CudaPoolEmulated,
            PoolMode::Pool => MeterKind::CudaPool,
            PoolMode::MemInfo => MeterKind::CudaMeminfo,
        }
    }

    fn trim(&mut self) -> Result<()> {
        self.pool.synchronize()?;
        match self.mode {
            PoolMode::Pool => self.pool.trim_to(0),
            PoolMode::MemInfo => Ok(()),
        }
    }

    fn start(&mut self) -> Result<Baseline> {
        self.pool.synchronize()?;
        match self.mode {
            PoolMode::Pool => {
                let allocated = self.pool.get(PoolAttr::UsedCurrent)?;
                let reserved = self.pool.get(PoolAttr::ReservedCurrent)?;
                self.pool.set(PoolAttr::UsedHigh, 0)?;
                self.pool.set(PoolAttr::ReservedHigh, 0)?;
                Ok(Baseline {
                    allocated,
                    reserved,
                })
            }
            PoolMode::MemInfo => {
                let used = device_used(&self.pool)?;
                let allocated = used.saturating_sub(self.origin_used);
                Ok(Baseline {
                    allocated,
                    reserved: allocated,
                })
            }
        }
    }

    fn finish(&mut self, base: Baseline) -> Result<PhaseMemory> {
        self.pool.synchronize()?;
        match self.mode {
            PoolMode::Pool => {
                let used = self.pool.get(PoolAttr::UsedCurrent)?;
                let used_high = self.pool.get(PoolAttr::UsedHigh)?;
                let reserved = self.pool.get(PoolAttr::ReservedCurrent)?;
                let reserved_high = self.pool.get(PoolAttr::ReservedHigh)?;
                let device_used = device_used(&self.pool)?;
                Ok(PhaseMemory {
                    baseline_allocated: base.allocated,
                    // The reset high-water mark restarts from the current value; the max also
                    // covers a driver that restarts it from zero.
                    peak_allocated: used_high.max(used).max(base.allocated),
                    end_allocated: used,
                    baseline_reserved: base.reserved,
                    peak_reserved: reserved_high.max(reserved).max(base.reserved),
                    device_used,
                    non_pool: device_used.saturating_sub(reserved),
                })
            }
            PoolMode::MemInfo => {
                // No high-water mark: the peak is the larger of the two readings, so a
                // transient freed before the end is missed. The `meter` column says so.
                let device_used = device_used(&self.pool)?;
                let end = device_used.saturating_sub(self.origin_used);
                Ok(PhaseMemory {
                    baseline_allocated: base.allocated,
                    peak_allocated: end.max(base.allocated),
                    end_allocated: end,
                    baseline_reserved: base.reserved,
                    peak_reserved: end.max(base.reserved),
                    device_used,
                    non_pool: device_used.saturating_sub(end),
                })
            }
        }
    }
}

/// A fake pool for tests: allocations move `used`/`reserved` and their high-water marks the way
/// the driver does; writes and synchronizations are logged.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use anyhow::bail;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    pub struct FakePool {
        pub async_alloc: bool,
        pub attrs: HashMap<PoolAttr, u64>,
        pub total: u64,
        /// Bytes outside the pool: context, modules, cuBLAS workspace.
        pub outside: u64,
        /// Plain `cuMemAlloc` bytes (MemInfo mode).
        pub plain: u64,
        pub log: RefCell<Vec<String>>,
        pub fail_set: bool,
        /// The stub runtime's pool (the emulated GPU).
        pub emulated: bool,
    }

    impl FakePool {
        pub fn new(async_alloc: bool) -> Self {
            FakePool {
                async_alloc,
                total: 100 << 30,
                outside: 500 << 20,
                ..Default::default()
            }
        }
        fn a(&self, k: PoolAttr) -> u64 {
            self.attrs.get(&k).copied().unwrap_or(0)
        }
        /// An allocation of `n` bytes (through the pool when async).
        pub fn alloc(&mut self, n: u64) {
            if !self.async_alloc {
                self.plain += n;
                return;
            }
            let used = self.a(PoolAttr::UsedCurrent) + n;
            let reserved = self.a(PoolAttr::ReservedCurrent).max(used);
            self.attrs.insert(PoolAttr::UsedCurrent, used);
            self.attrs.insert(PoolAttr::ReservedCurrent, reserved);
            let uh = self.a(PoolAttr::UsedHigh).max(used);
            let rh = self.a(PoolAttr::ReservedHigh).max(reserved);
            self.attrs.insert(PoolAttr::UsedHigh, uh);
            self.attrs.insert(PoolAttr::ReservedHigh, rh);
        }
        /// A free of `n` bytes; with a release threshold of 0 the pool shrinks to `used`.
        pub fn free(&mut self, n: u64) {
            if !self.async_alloc {
                self.plain -= n;
                return;
            }
            let used = self.a(PoolAttr::UsedCurrent) - n;
            self.attrs.insert(PoolAttr::UsedCurrent, used);
            if self.a(PoolAttr::ReleaseThreshold) == 0 {
                self.attrs.insert(PoolAttr::ReservedCurrent, used);
            }
        }
    }

    impl PoolAttrs for FakePool {
        fn has_async_alloc(&self) -> bool {
            self.async_alloc
        }
        fn synchronize(&self) -> Result<()> {
            self.log.borrow_mut().push("sync".into());
            Ok(())
        }
        fn get(&self, attr: PoolAttr) -> Result<u64> {
            self.log.borrow_mut().push(format!("get {attr:?}"));
            Ok(self.a(attr))
        }
        fn set(&mut self, attr: PoolAttr, value: u64) -> Result<()> {
            if self.fail_set {
                bail!("CUDA_ERROR_INVALID_VALUE");
            }
            self.log.borrow_mut().push(format!("set {attr:?}={value}"));
            match attr {
                // The driver only accepts 0 for the high-water marks, and restarts them from
                // the current value.
                PoolAttr::UsedHigh | PoolAttr::ReservedHigh => {
                    if value != 0 {
                        bail!("CUDA_ERROR_INVALID_VALUE: high-water marks can only be reset to 0");
                    }
                    let cur = match attr {
                        PoolAttr::UsedHigh => PoolAttr::UsedCurrent,
                        _ => PoolAttr::ReservedCurrent,
                    };
                    let v = self.a(cur);
                    self.attrs.insert(attr, v);
                }
                PoolAttr::UsedCurrent | PoolAttr::ReservedCurrent => {
                    bail!("CUDA_ERROR_INVALID_VALUE: read-only attribute")
                }
                PoolAttr::ReleaseThreshold => {
                    self.attrs.insert(attr, value);
                }
            }
            Ok(())
        }
        fn mem_info(&self) -> Result<(u64, u64)> {
            let used = self.outside + self.a(PoolAttr::ReservedCurrent) + self.plain;
            Ok((self.total - used, self.total))
        }
        fn trim_to(&mut self, keep: u64) -> Result<()> {
            self.log.borrow_mut().push(format!("trim {keep}"));
            let used = self.a(PoolAttr::UsedCurrent);
            let reserved = self.a(PoolAttr::ReservedCurrent);
            self.attrs
                .insert(PoolAttr::ReservedCurrent, reserved.min(used.max(keep)));
            Ok(())
        }
        fn emulated(&self) -> bool {
            self.emulated
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::FakePool;
    use super::*;
    use crate::meter::measure;

    const MIB: u64 = 1 << 20;

    #[test]
    fn fallback_selection() {
        let m = PoolMeter::new(FakePool::new(true), PoolRelease::Keep).unwrap();
        assert_eq!((m.mode(), m.kind()), (PoolMode::Pool, MeterKind::CudaPool));
        let m = PoolMeter::new(FakePool::new(false), PoolRelease::Keep).unwrap();
        assert_eq!(
            (m.mode(), m.kind()),
            (PoolMode::MemInfo, MeterKind::CudaMeminfo)
        );
        // No pool attribute is touched without async allocation.
        assert!(m.pool().log.borrow().iter().all(|l| !l.starts_with("set")));
        assert_eq!(m.pool_release_column(), None);
        // The emulated GPU's pool: its own meter kind, a pool_release column, and the manifest
        // says where the figures come from.
        let emu = FakePool {
            emulated: true,
            ..FakePool::new(true)
        };
        let m = PoolMeter::new(emu, PoolRelease::Release).unwrap();
        assert_eq!(m.kind(), MeterKind::CudaPoolEmulated);
        assert!(m.kind().is_emulated() && !MeterKind::CudaPool.is_emulated());
        assert_eq!(m.pool_release_column(), Some(PoolRelease::Release));
        assert_eq!(m.settings_json()["meter"], "cuda-pool-emulated");
        assert_eq!(m.settings_json()["release_threshold"], 0);
    }

    #[test]
    fn release_threshold_from_the_option() {
        let m = PoolMeter::new(FakePool::new(true), PoolRelease::Keep).unwrap();
        assert_eq!(m.pool().attrs[&PoolAttr::ReleaseThreshold], u64::MAX);
        assert_eq!(m.pool_release_column(), Some(PoolRelease::Keep));
        let m = PoolMeter::new(FakePool::new(true), PoolRelease::Release).unwrap();
        assert_eq!(m.pool().attrs[&PoolAttr::ReleaseThreshold], 0);
        assert_eq!(m.pool_release_column(), Some(PoolRelease::Release));
        let mut p = FakePool::new(true);
        p.fail_set = true;
        assert!(PoolMeter::new(p, PoolRelease::Keep).is_err());
    }

    #[test]
    fn pool_release_parses() {
        assert_eq!("keep".parse::<PoolRelease>().unwrap(), PoolRelease::Keep);
        assert_eq!(
            "release".parse::<PoolRelease>().unwrap(),
            PoolRelease::Release
        );
        assert!("never".parse::<PoolRelease>().is_err());
        assert_eq!(PoolRelease::default(), PoolRelease::Keep);
    }

    #[test]
    fn start_syncs_reads_then_resets_high_marks() {
        let mut m = PoolMeter::new(FakePool::new(true), PoolRelease::Keep).unwrap();
        m.pool.log.borrow_mut().clear();
        m.start().unwrap();
        let log = m.pool.log.borrow().clone();
        assert_eq!(log[0], "sync");
        let pos = |s: &str| log.iter().position(|l| l == s).unwrap();
        assert!(pos("get UsedCurrent") < pos("set UsedHigh=0"));
        assert!(pos("get ReservedCurrent") < pos("set ReservedHigh=0"));
        m.pool.log.borrow_mut().clear();
        m.finish(Baseline::default()).unwrap();
        assert_eq!(
            m.pool.log.borrow()[0],
            "sync",
            "finish synchronizes before reading"
        );
    }

    #[test]
    fn pool_phase_fields() {
        let mut m = PoolMeter::new(FakePool::new(true), PoolRelease::Keep).unwrap();
        m.pool.alloc(100 * MIB); // weights, before the phase
        let base = m.start().unwrap();
        assert_eq!((base.allocated, base.reserved), (100 * MIB, 100 * MIB));
        m.pool.alloc(40 * MIB); // KV, stays
        m.pool.alloc(30 * MIB); // transient
        m.pool.free(30 * MIB);
        let mem = m.finish(base).unwrap();
        assert_eq!(mem.baseline_allocated, 100 * MIB);
        assert_eq!(mem.peak_allocated, 170 * MIB);
        assert_eq!(mem.end_allocated, 140 * MIB);
        assert_eq!(mem.baseline_reserved, 100 * MIB);
        // keep: the pool holds the freed transient.
        assert_eq!(mem.peak_reserved, 170 * MIB);
        assert_eq!(mem.device_used, 500 * MIB + 170 * MIB);
        assert_eq!(mem.non_pool, 500 * MIB);

        // The next phase's peak is its own, not the previous one's.
        let base = m.start().unwrap();
        m.pool.alloc(MIB);
        let mem = m.finish(base).unwrap();
        assert_eq!(mem.peak_allocated, 141 * MIB);
        assert_eq!(mem.peak_reserved, 170 * MIB);
    }

    /// Reserved per point: under `keep`, a point's reserved figures would carry a larger
    /// earlier point's cached memory; the trim at the point's start gives it back first.
    #[test]
    fn trim_at_a_point_start_makes_reserved_its_own() {
        let mut m = PoolMeter::new(FakePool::new(true), PoolRelease::Keep).unwrap();
        m.pool.alloc(100 * MIB); // weights
        let base = m.start().unwrap();
        m.pool.alloc(900 * MIB); // a large point's transient
        m.pool.free(900 * MIB);
        assert_eq!(m.finish(base).unwrap().peak_reserved, 1000 * MIB);
        m.pool.log.borrow_mut().clear();
        m.trim().unwrap();
        assert_eq!(*m.pool.log.borrow(), ["sync", "trim 0"]);
        let base = m.start().unwrap();
        m.pool.alloc(10 * MIB); // a small point
        let mem = m.finish(base).unwrap();
        assert_eq!(mem.baseline_reserved, 100 * MIB);
        assert_eq!(mem.peak_reserved, 110 * MIB);
    }

    #[test]
    fn release_mode_shrinks_reserved() {
        let mut m = PoolMeter::new(FakePool::new(true), PoolRelease::Release).unwrap();
        let base = m.start().unwrap();
        m.pool.alloc(64 * MIB);
        m.pool.free(64 * MIB);
        let mem = m.finish(base).unwrap();
        assert_eq!(mem.peak_allocated, 64 * MIB);
        assert_eq!(mem.peak_reserved, 64 * MIB);
        assert_eq!(mem.end_allocated, 0);
        assert_eq!(mem.device_used, 500 * MIB);
        assert_eq!(mem.non_pool, 500 * MIB);
    }

    #[test]
    fn meminfo_fallback_fields() {
        let mut m = PoolMeter::new(FakePool::new(false), PoolRelease::Keep).unwrap();
        m.pool.alloc(10 * MIB);
        let base = m.start().unwrap();
        assert_eq!(base.allocated, 10 * MIB);
        m.pool.alloc(5 * MIB);
        let mem = m.finish(base).unwrap();
        assert_eq!(mem.baseline_allocated, 10 * MIB);
        assert_eq!(mem.peak_allocated, 15 * MIB);
        assert_eq!(mem.end_allocated, 15 * MIB);
        assert_eq!(mem.peak_reserved, 15 * MIB);
        assert_eq!(mem.device_used, 515 * MIB);
        assert_eq!(mem.non_pool, 500 * MIB);
        // A freed transient is invisible to cuMemGetInfo differences.
        let base = m.start().unwrap();
        m.pool.alloc(MIB);
        m.pool.free(MIB);
        assert_eq!(m.finish(base).unwrap().peak_allocated, 15 * MIB);
    }

    #[test]
    fn record_fields_through_measure() {
        let mut m = PoolMeter::new(FakePool::new(true), PoolRelease::Keep).unwrap();
        let (_, mem, _) = measure(&mut m, || Ok(())).unwrap();
        let mut r = crate::record::Record {
            meter: m.kind(),
            pool_release: m.pool_release_column(),
            ..Default::default()
        };
        r.set_memory(&mem);
        assert_eq!(r.meter, MeterKind::CudaPool);
        assert_eq!(r.pool_release, Some(PoolRelease::Keep));
        assert_eq!(r.device_used, Some(500 * MIB));
        assert_eq!(r.non_pool, Some(500 * MIB));
        let j = m.settings_json();
        assert_eq!(j["meter"], "cuda-pool");
        assert_eq!(j["pool_release"], "keep");
        assert_eq!(j["release_threshold"], u64::MAX);
        assert_eq!(
            pool_json(MeterKind::CpuAlloc, PoolRelease::Keep),
            serde_json::Value::Null
        );
        assert_eq!(
            release_column(MeterKind::CudaMeminfo, PoolRelease::Release),
            None
        );
        assert_eq!(
            pool_json(MeterKind::CudaMeminfo, PoolRelease::Keep)["meter"],
            "cuda-meminfo"
        );
    }
}
