//! `--device` parsing: `cpu`, `cuda:N` or `emu:GPU`, and the meter that goes with it.
use crate::error::InputError;
use crate::meter::{cpu::CpuMeter, Meter};
use crate::vocab::PoolRelease;
use anyhow::Result;
use candle_core::Device;

/// The device and meter for a `--device` string, with the pool kept (`pool_release = "keep"`).
/// Created once per process.
pub fn open(spec: &str) -> Result<(Device, Box<dyn Meter>)> {
    open_with(spec, PoolRelease::default())
}

/// What a `--device` string names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec<'a> {
    /// `cpu`.
    Cpu,
    /// `cuda` or `cuda:N`: a CUDA device by ordinal.
    Cuda(usize),
    /// `emu:GPU`: a catalogued GPU emulated by the stub CUDA runtime (docs/src/guides/emulator.md):
    /// the torch probe under `vramlab emulate`, or vramlab's CUDA build, whose workers the sweep
    /// starts under the stubs, where it is the emulated process's `cuda:0`.
    Emulated(&'a str),
}

/// The device and meter for a `--device` string; `release` sets a CUDA pool's release
/// threshold (ignored on CPU).
pub fn open_with(spec: &str, release: PoolRelease) -> Result<(Device, Box<dyn Meter>)> {
    match parse(spec)? {
        DeviceSpec::Cpu => Ok((Device::Cpu, Box::new(CpuMeter::new()))),
        DeviceSpec::Cuda(ordinal) => open_cuda(ordinal, release),
        DeviceSpec::Emulated(_) if emulated() => open_cuda(0, release),
        DeviceSpec::Emulated(gpu) => Err(InputError::arg(format!(
            "device `emu:{gpu}`: this process is not on the emulated GPU (a sweep starts its \
             workers under the stubs; or run `vramlab emulate --gpu {gpu} -- vramlab ... --device cuda:0`)"
        ))
        .into()),
    }
}

/// `cpu`, `cuda`, `cuda:N` or `emu:GPU`; anything else is a one-line error. The catalogue
/// name is checked where it is used ([`crate::gpu::resolve`]).
pub fn parse(spec: &str) -> Result<DeviceSpec<'_>> {
    let bad = || {
        InputError::arg(format!(
            "bad device `{spec}` (expected cpu, cuda:N or emu:GPU)"
        ))
    };
    match spec {
        "cpu" => Ok(DeviceSpec::Cpu),
        "cuda" => Ok(DeviceSpec::Cuda(0)),
        s => match s.strip_prefix("emu:") {
            Some(gpu) if !gpu.is_empty() => Ok(DeviceSpec::Emulated(gpu)),
            Some(_) => Err(bad().into()),
            None => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| bad().into()),
        },
    }
}

/// The catalogued GPU of an emulated device spec (`emu:GPU`), `None` for any other.
pub fn emulated_gpu(spec: &str) -> Option<&str> {
    match parse(spec) {
        Ok(DeviceSpec::Emulated(gpu)) => Some(gpu),
        _ => None,
    }
}

pub use crate::meter::emulated;

/// Checks that `spec` names a device this process could open, without creating it (no CUDA
/// context, no cuBLAS): a sweep's parent calls it before it starts any worker, so that a bad
/// or absent device is one line, not one line per worker. An emulated GPU is checked against
/// the catalogue here; its workers run under the stubs.
pub fn probe(spec: &str) -> Result<()> {
    match parse(spec)? {
        DeviceSpec::Cpu => Ok(()),
        DeviceSpec::Cuda(ordinal) => probe_cuda(ordinal),
        DeviceSpec::Emulated(gpu) => probe_emulated(gpu),
    }
}

#[cfg(not(feature = "cuda"))]
fn probe_emulated(gpu: &str) -> Result<()> {
    Err(InputError::arg(format!(
        "device `emu:{gpu}` runs vramlab's CUDA build on the emulated GPU: this vramlab was built \
         without CUDA support (rebuild with `--features cuda`, or set runtime = \"torch\" in the scenario)"
    ))
    .into())
}

#[cfg(feature = "cuda")]
fn probe_emulated(gpu: &str) -> Result<()> {
    crate::gpu::resolve(Some(gpu), None)
        .map(|_| ())
        .map_err(|e| InputError::arg(format!("device `emu:{gpu}`: {e}")).into())
}

#[cfg(not(feature = "cuda"))]
fn probe_cuda(ordinal: usize) -> Result<()> {
    open_cuda(ordinal, PoolRelease::default()).map(|_| ())
}

/// Asks the driver how many devices it sees; its error is a code without candle's backtrace.
#[cfg(feature = "cuda")]
fn probe_cuda(ordinal: usize) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::CudaContext;
    let no_device = |why: String| anyhow::anyhow!("cuda:{ordinal}: no CUDA device ({why})");
    let count =
        CudaContext::device_count().map_err(|e| no_device(crate::meter::cuda::describe(&e)))?;
    if ordinal as i64 >= count as i64 {
        return Err(no_device(format!("the driver sees {count} device(s)")));
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(ordinal: usize, _release: PoolRelease) -> Result<(Device, Box<dyn Meter>)> {
    Err(InputError::arg(format!(
        "device cuda:{ordinal}: this vramlab was built without CUDA support (rebuild with `--features cuda`)"
    ))
    .into())
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize, release: PoolRelease) -> Result<(Device, Box<dyn Meter>)> {
    let device = cuda_device(ordinal)?;
    let meter = crate::meter::cuda::cuda_meter(device.as_cuda_device()?, release)
        .map_err(|e| anyhow::anyhow!("cuda:{ordinal}: cannot read the memory pool: {e:#}"))?;
    Ok((device, Box::new(meter)))
}

/// The candle device for `cuda:N`, created on first use and shared after: `Device::new_cuda`
/// makes a cuBLAS handle and a cuRAND generator, so it is made once per process.
#[cfg(feature = "cuda")]
pub fn cuda_device(ordinal: usize) -> Result<Device> {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};
    static DEVICES: OnceLock<Mutex<BTreeMap<usize, Device>>> = OnceLock::new();
    let mut map = DEVICES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    // Ask the driver first: its error is a code without candle's backtrace.
    use candle_core::cuda_backend::cudarc::driver::CudaContext;
    let no_device = |why: String| anyhow::anyhow!("cuda:{ordinal}: no CUDA device ({why})");
    let count =
        CudaContext::device_count().map_err(|e| no_device(crate::meter::cuda::describe(&e)))?;
    if ordinal as i64 >= count as i64 {
        return Err(no_device(format!("the driver sees {count} device(s)")));
    }
    let dev = Device::new_cuda(ordinal).map_err(|e| {
        // candle appends a backtrace on further lines when RUST_BACKTRACE is set.
        let first = e.to_string().lines().next().unwrap_or_default().to_string();
        no_device(first)
    })?;
    map.insert(ordinal, dev.clone());
    Ok(dev)
}

/// A human name of the device for the `device_name` column.
pub fn name(dev: &Device) -> String {
    match dev {
        Device::Cpu => crate::export::manifest::cpu_name(),
        other => match gpu_facts(other) {
            Some(f) => f.name,
            None => format!("{other:?}"),
        },
    }
}

pub use crate::meter::GpuFacts;

/// The GPU facts of a CUDA device; None on CPU (or if the driver will not say).
pub fn gpu_facts(dev: &Device) -> Option<GpuFacts> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = dev {
        return crate::meter::cuda::facts(d).ok();
    }
    let _ = dev;
    None
}

/// Whether an error is a device out-of-memory (`CUDA_ERROR_OUT_OF_MEMORY` from the driver, or
/// cuBLAS's allocation failure), so that a sweep records `status = oom` and goes on. candle's
/// errors do not carry the requested size.
pub fn is_oom(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        let s = e.to_string();
        s.contains("CUDA_ERROR_OUT_OF_MEMORY") || s.contains("CUBLAS_STATUS_ALLOC_FAILED")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_opens_and_has_no_gpu_facts() {
        let (dev, meter) = open("cpu").unwrap();
        assert!(dev.is_cpu());
        assert_eq!(meter.kind(), crate::vocab::MeterKind::CpuAlloc);
        assert_eq!(gpu_facts(&dev), None);
    }

    #[test]
    fn bad_devices_are_input_errors() {
        for s in ["gpu", "cuda:x", "cuda:-1", "emu:"] {
            let e = open(s).err().unwrap();
            assert_eq!(crate::error::exit_code(&e), 2, "{s}");
            let e = probe(s).err().unwrap();
            assert_eq!(crate::error::exit_code(&e), 2, "{s}");
        }
        probe("cpu").unwrap();
    }

    #[test]
    fn oom_is_recognized_through_the_chain() {
        let e = anyhow::anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")")
            .context("prefill");
        assert!(is_oom(&e));
        assert!(!is_oom(&anyhow::anyhow!("shape mismatch")));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_so() {
        let e = open_with("cuda:1", PoolRelease::Release).err().unwrap();
        assert!(e.to_string().contains("built without CUDA support"), "{e}");
        assert_eq!(crate::error::exit_code(&e), 2);
        let e = probe("cuda:0").err().unwrap();
        assert!(e.to_string().contains("built without CUDA support"), "{e}");
        let e = probe("emu:h100-80gb").err().unwrap();
        assert!(e.to_string().contains("built without CUDA support"), "{e}");
        assert_eq!(crate::error::exit_code(&e), 2);
    }

    #[test]
    fn an_emulated_device_opens_only_on_the_emulated_gpu() {
        assert_eq!(
            parse("emu:rtx-4090").unwrap(),
            DeviceSpec::Emulated("rtx-4090")
        );
        assert!(!emulated(), "the unit tests do not run under the stubs");
        let e = open("emu:rtx-4090").err().unwrap();
        assert!(e.to_string().contains("not on the emulated GPU"), "{e}");
        assert_eq!(crate::error::exit_code(&e), 2);
    }
}
