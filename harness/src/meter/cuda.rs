//! The CUDA meter (feature `cuda`): [`PoolMeter`] over the device's memory pool, read through
//! the cudarc that candle itself links (`candle_core::cuda_backend::cudarc`), so the versions
//! match. The logic and its tests are in `meter/pool.rs`; this file is only the driver calls.
use super::pool::{PoolAttr, PoolAttrs, PoolMeter, PoolRelease};
use anyhow::{Context, Result};
use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaContext, DriverError};
use std::ffi::c_void;
use std::sync::Arc;

/// The CUDA meter: allocated/reserved from the pool's attributes, or `cuMemGetInfo`
/// differences where the device has no async allocation.
pub type CudaMeter = PoolMeter<CudarcPool>;

/// Makes the meter for a candle CUDA device; sets the pool's release threshold.
pub fn cuda_meter(dev: &candle_core::CudaDevice, release: PoolRelease) -> Result<CudaMeter> {
    let ctx = dev.cuda_stream().context().clone();
    PoolMeter::new(CudarcPool::new(ctx)?, release)
}

/// The pool candle allocates from: `cuMemAllocAsync` on a stream uses the device's current
/// memory pool (`cuDeviceGetMemPool`), the default pool unless someone replaced it.
pub struct CudarcPool {
    ctx: Arc<CudaContext>,
    /// None where the device has no memory pools (`has_async_alloc() == false`).
    pool: Option<sys::CUmemoryPool>,
}

impl CudarcPool {
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self> {
        let pool = if ctx.has_async_alloc() {
            ctx.bind_to_thread().map_err(driver_err)?;
            // SAFETY: the device comes from a live context.
            Some(unsafe { result::device::get_mem_pool(ctx.cu_device()) }.map_err(driver_err)?)
        } else {
            None
        };
        Ok(CudarcPool { ctx, pool })
    }

    fn handle(&self) -> Result<sys::CUmemoryPool> {
        self.pool
            .context("this device has no memory pool (no async allocation)")
    }
}

fn attr(a: PoolAttr) -> sys::CUmemPool_attribute {
    use sys::CUmemPool_attribute as A;
    match a {
        PoolAttr::UsedCurrent => A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        PoolAttr::UsedHigh => A::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        PoolAttr::ReservedCurrent => A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        PoolAttr::ReservedHigh => A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        PoolAttr::ReleaseThreshold => A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
    }
}

/// A driver error as `CUDA_ERROR_X: description` (the description needs a real driver).
pub fn driver_err(e: DriverError) -> anyhow::Error {
    anyhow::anyhow!(describe(&e))
}

/// `CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected`, or just the code's name where
/// the driver cannot describe it (the link stubs).
pub fn describe(e: &DriverError) -> String {
    match e.error_string() {
        Ok(s) => format!("{:?}: {}", e.0, s.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
}

impl PoolAttrs for CudarcPool {
    fn has_async_alloc(&self) -> bool {
        self.ctx.has_async_alloc()
    }

    fn synchronize(&self) -> Result<()> {
        // The whole context, not one stream: candle uses the per-thread default stream.
        self.ctx.synchronize().map_err(driver_err)
    }

    fn get(&self, a: PoolAttr) -> Result<u64> {
        let pool = self.handle()?;
        let mut v: u64 = 0;
        // SAFETY: all five attributes are cuuint64_t; the pool belongs to a live context.
        unsafe {
            result::mem_pool::get_attribute(pool, attr(a), &mut v as *mut u64 as *mut c_void)
        }
        .map_err(driver_err)
        .with_context(|| format!("reading the memory pool's {a:?}"))?;
        Ok(v)
    }

    fn set(&mut self, a: PoolAttr, value: u64) -> Result<()> {
        let pool = self.handle()?;
        let mut v = value;
        // SAFETY: as in `get`; the driver copies the value.
        unsafe { result::mem_pool::set_attribute(pool, attr(a), &mut v as *mut u64 as *mut c_void) }
            .map_err(driver_err)
            .with_context(|| format!("setting the memory pool's {a:?} to {value}"))
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let (free, total) = self.ctx.mem_get_info().map_err(driver_err)?;
        Ok((free as u64, total as u64))
    }

    fn trim_to(&mut self, keep: u64) -> Result<()> {
        let pool = self.handle()?;
        // SAFETY: the pool belongs to a live context; the caller synchronized first.
        unsafe { result::mem_pool::trim_to(pool, keep as usize) }
            .map_err(driver_err)
            .with_context(|| format!("trimming the memory pool to {keep} B"))
    }

    fn emulated(&self) -> bool {
        super::emulated()
    }
}

#[link(name = "cudart")]
extern "C" {
    fn cudaRuntimeGetVersion(version: *mut std::ffi::c_int) -> std::ffi::c_int;
}

/// `13000` → `13.0`.
fn cuda_version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The facts of a CUDA device for the manifest (see `device::gpu_facts`).
pub fn facts(dev: &candle_core::CudaDevice) -> Result<super::GpuFacts> {
    let ctx = dev.cuda_stream().context().clone();
    let name = ctx.name().map_err(driver_err)?;
    let total_memory = ctx.total_mem().map_err(driver_err)? as u64;
    let (major, minor) = ctx.compute_capability().map_err(driver_err)?;
    let mut drv: std::ffi::c_int = 0;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut drv) }
        .result()
        .map_err(driver_err)?;
    let mut rt: std::ffi::c_int = 0;
    // SAFETY: writes one int; needs no device.
    let rt_ok = unsafe { cudaRuntimeGetVersion(&mut rt) } == 0;
    let emulated = super::emulated();
    // The kernel module's version (e.g. 580.65.06), where the proc file exists (not the
    // emulated GPU's: the stubs answer for no kernel module).
    let kernel_module = (!emulated)
        .then(|| std::fs::read_to_string("/proc/driver/nvidia/version").ok())
        .flatten()
        .and_then(|t| {
            let line = t.lines().next()?.to_string();
            line.split_whitespace()
                .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
                .map(str::to_string)
        });
    let driver_version = match kernel_module {
        Some(k) => format!("{k} (CUDA {})", cuda_version_string(drv)),
        None if emulated => format!("emulated (CUDA {})", cuda_version_string(drv)),
        None => format!("CUDA {}", cuda_version_string(drv)),
    };
    Ok(super::GpuFacts {
        // The emulated GPU never passes for the device it presents.
        name: if emulated {
            format!("{name} (emulated)")
        } else {
            name
        },
        total_memory,
        driver_version,
        runtime_version: if rt_ok {
            cuda_version_string(rt)
        } else {
            String::new()
        },
        compute_capability: format!("{major}.{minor}"),
        async_alloc: ctx.has_async_alloc(),
    })
}
