//! `--device` parsing: `cpu` or `cuda:N`, and the meter that goes with it.
use crate::error::InputError;
use crate::meter::{cpu::CpuMeter, Meter};
use anyhow::Result;
use candle_core::Device;

/// The device and meter for a `--device` string. Created once per process.
pub fn open(spec: &str) -> Result<(Device, Box<dyn Meter>)> {
    match spec {
        "cpu" => Ok((Device::Cpu, Box::new(CpuMeter::new()))),
        s if s.starts_with("cuda") => {
            let ordinal = s
                .strip_prefix("cuda:")
                .unwrap_or("0")
                .parse::<usize>()
                .map_err(|_| InputError::arg(format!("bad device `{s}` (expected cpu or cuda:N)")))?;
            Err(InputError::arg(format!(
                "device cuda:{ordinal}: this vramlab was built without CUDA support (rebuild with `--features cuda`)"
            ))
            .into())
        }
        other => Err(InputError::arg(format!("bad device `{other}` (expected cpu or cuda:N)")).into()),
    }
}

/// A human name of the device for the `device_name` column.
pub fn name(dev: &Device) -> String {
    match dev {
        Device::Cpu => crate::export::manifest::cpu_name(),
        other => format!("{other:?}"),
    }
}
