//! Meters: how a phase's memory is read. Meters know nothing about models.
pub mod alloc;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod pool;

use anyhow::Result;

/// One phase's memory figures, all in bytes (ARCHITECTURE.md §3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseMemory {
    pub baseline_allocated: u64,
    pub peak_allocated: u64,
    pub end_allocated: u64,
    pub baseline_reserved: u64,
    pub peak_reserved: u64,
    pub device_used: u64,
    pub non_pool: u64,
}

impl PhaseMemory {
    /// The envelope of consecutive phases: baseline of the first, peak of all, end of the last.
    pub fn span(first: &PhaseMemory, rest: &[PhaseMemory]) -> PhaseMemory {
        let last = rest.last().unwrap_or(first);
        let all = std::iter::once(first).chain(rest);
        PhaseMemory {
            baseline_allocated: first.baseline_allocated,
            baseline_reserved: first.baseline_reserved,
            peak_allocated: all.clone().map(|m| m.peak_allocated).max().unwrap_or(0),
            peak_reserved: all.map(|m| m.peak_reserved).max().unwrap_or(0),
            end_allocated: last.end_allocated,
            device_used: last.device_used,
            non_pool: last.non_pool,
        }
    }
}

/// What a meter read at the start of a phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Baseline {
    pub allocated: u64,
    pub reserved: u64,
}

/// The extension point for backends (CPU counting allocator, CUDA memory pool).
pub trait Meter {
    /// The `meter` CSV column: `cpu-alloc`, `cuda-pool`, `cuda-meminfo`.
    fn kind(&self) -> crate::vocab::MeterKind;
    /// Synchronize, read the current figures as the baseline, reset the high-water marks.
    fn start(&mut self) -> Result<Baseline>;
    /// Synchronize and read the figures since `start`.
    fn finish(&mut self, base: Baseline) -> Result<PhaseMemory>;
    /// Gives back what the allocator caches (CUDA: `cuMemPoolTrimTo(pool, 0)` after a
    /// synchronize; CPU: `malloc_trim(0)`). The runner calls it at the start of every point,
    /// before the first phase's high-water marks are reset, so that a point's reserved
    /// figures are its own and not the largest earlier point's.
    fn trim(&mut self) -> Result<()>;
}

/// Runs `f` as one measured phase: returns its value, its memory and its wall time in ms.
pub fn measure<T>(
    meter: &mut dyn Meter,
    f: impl FnOnce() -> Result<T>,
) -> Result<(T, PhaseMemory, f64)> {
    let base = meter.start()?;
    let t0 = std::time::Instant::now();
    let out = f()?;
    let mem = meter.finish(base)?;
    Ok((out, mem, t0.elapsed().as_secs_f64() * 1e3))
}

/// What the manifest records about a GPU: `versions.cuda_driver`,
/// `versions.cuda_runtime`, and the rest under a `gpu` object.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GpuFacts {
    pub name: String,
    pub total_memory: u64,
    /// The kernel module's version where readable, and the CUDA version the driver supports:
    /// `580.65.06 (CUDA 13.0)`.
    pub driver_version: String,
    /// `cudaRuntimeGetVersion` of the libcudart loaded: `13.0`.
    pub runtime_version: String,
    /// `9.0` on an H100/H200.
    pub compute_capability: String,
    /// Whether candle allocates through the pool (`cuMemAllocAsync`).
    pub async_alloc: bool,
}

/// Whether this process runs on the emulated GPU: the preloaded stubs
/// (`libvramlab_emu.so`, docs/src/guides/emulator.md) define `vramlab_emu_stats`, which no
/// CUDA library does. Rows measured there carry `meter = cuda-pool-emulated` and a device name
/// ending in "(emulated)", never passing for a device's.
pub fn emulated() -> bool {
    static EMULATED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EMULATED.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the symbol up.
        !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"vramlab_emu_stats".as_ptr()) }.is_null()
    })
}
