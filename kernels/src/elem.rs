//! The element types the CPU kernels accept (f32, bf16, f16; all computed in f32) and the
//! plumbing between candle storages and plain slices.
use candle_core::{
    bail, CpuStorage, DType, Layout, Result, Storage, StorageRef, Tensor, WithDType,
};
use half::{bf16, f16};

pub(crate) trait Elem: WithDType + Copy + Send + Sync {
    fn f(self) -> f32;
    fn of(x: f32) -> Self;
}

impl Elem for f32 {
    #[inline(always)]
    fn f(self) -> f32 {
        self
    }
    #[inline(always)]
    fn of(x: f32) -> Self {
        x
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn f(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn of(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn f(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn of(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// Calls the generic expression with `$t` bound to the Rust type of `$dtype`.
macro_rules! for_float {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            candle_core::DType::F16 => {
                type $t = half::f16;
                $body
            }
            d => candle_core::bail!("vramlab-kernels: unsupported dtype {d:?} (f32, bf16, f16)"),
        }
    };
}
pub(crate) use for_float;

/// The whole contiguous slice a layout covers.
pub(crate) fn contiguous<'a, T: Elem>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => bail!("{op}: expects a contiguous input"),
    }
}

/// Read guards on the storages of `ts` (held while a backward reads them).
pub(crate) fn guards<'a>(ts: &[&'a Tensor]) -> Vec<(StorageRef<'a>, &'a Layout)> {
    ts.iter().map(|t| t.storage_and_layout()).collect()
}

/// The CPU storage behind a guard.
pub(crate) fn cpu<'a>(g: &'a (StorageRef<'a>, &'a Layout)) -> Result<(&'a CpuStorage, &'a Layout)> {
    match &*g.0 {
        Storage::Cpu(c) => Ok((c, g.1)),
        _ => bail!("vramlab-kernels: a backward got tensors on different devices (expected all on the CPU)"),
    }
}

/// A CPU tensor of `shape` holding `v`.
pub(crate) fn tensor<T: Elem>(v: Vec<T>, shape: &[usize]) -> Result<Tensor> {
    Tensor::from_vec(v, shape, &candle_core::Device::Cpu)
}

/// Elements of `v` as a storage of the same type.
pub(crate) fn storage<T: Elem>(v: Vec<T>) -> CpuStorage {
    T::to_cpu_storage_owned(v)
}

pub(crate) fn same_dtype(op: &str, dtypes: &[DType]) -> Result<DType> {
    let d = dtypes[0];
    if dtypes.iter().any(|&x| x != d) {
        bail!("{op}: all inputs must share one dtype, got {dtypes:?}")
    }
    Ok(d)
}
