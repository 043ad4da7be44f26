//! The CUDA side (feature `cuda`): the PTX that build.rs compiles from `kernels/cuda/*.cu`,
//! and one launcher for all of it.
//!
//! Every entry point takes its buffers first, then its integers (all `long long`), then its
//! floats, and is named `{kernel}_{dtype}` (`_{dtype}_{dtype}` for the AdamW passes, which mix
//! types). Buffers are whole candle storages; element offsets and strides travel as integers,
//! so no view outlives its launch.
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaDevice, CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};

/// One compiled `.cu` file.
pub(crate) struct Module {
    name: &'static str,
    ptx: &'static str,
}

macro_rules! module {
    ($c:ident, $name:literal) => {
        pub(crate) const $c: Module = Module {
            name: concat!("vramlab-", $name),
            ptx: include_str!(concat!(env!("OUT_DIR"), "/", $name, ".ptx")),
        };
    };
}
module!(ATTENTION, "attention");
module!(NORM, "norm");
module!(ROWWISE, "rowwise");
module!(ADAMW, "adamw");

/// The suffix of an entry point for `dtype`.
pub(crate) fn suffix(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        d => bail!("vramlab-kernels: unsupported dtype {d:?} (f32, bf16, f16)"),
    })
}

/// Grid, block and dynamic shared memory of one launch.
pub(crate) struct Grid {
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub shared: u32,
}

impl Grid {
    /// One block of `block` threads per row.
    pub fn rows(rows: usize, block: u32) -> Result<Grid> {
        Ok(Grid {
            grid: (u32_of(rows)?.max(1), 1, 1),
            block,
            shared: 0,
        })
    }

    /// A grid-stride loop over `n` items.
    pub fn flat(n: usize) -> Grid {
        Grid {
            grid: (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
            block: 256,
            shared: 0,
        }
    }
}

pub(crate) fn u32_of(n: usize) -> Result<u32> {
    u32::try_from(n)
        .map_err(|_| candle_core::Error::Msg(format!("vramlab-kernels: grid of {n} is too large")))
}

/// Launches `func` of `module` on `dev` with the given buffers, integers and floats.
pub(crate) fn launch(
    dev: &CudaDevice,
    module: &Module,
    func: &str,
    g: Grid,
    bufs: &[&CudaStorage],
    ints: &[i64],
    floats: &[f32],
) -> Result<()> {
    let f = dev.get_or_load_custom_func(func, module.name, module.ptx)?;
    let mut b = f.builder();
    for s in bufs {
        match &s.slice {
            CudaStorageSlice::F32(x) => b.arg(x),
            CudaStorageSlice::BF16(x) => b.arg(x),
            CudaStorageSlice::F16(x) => b.arg(x),
            _ => bail!("{func}: unsupported dtype {:?}", s.dtype()),
        };
    }
    for i in ints {
        b.arg(i);
    }
    for x in floats {
        b.arg(x);
    }
    let cfg = LaunchConfig {
        grid_dim: g.grid,
        block_dim: (g.block, 1, 1),
        shared_mem_bytes: g.shared,
    };
    // SAFETY: the argument list matches the entry point's signature (buffers, i64s, f32s in
    // the order of kernels/cuda/*.cu), and every index the kernel forms lies in its buffer.
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

/// A zeroed buffer of `n` elements of `dtype`.
pub(crate) fn zeros(dev: &CudaDevice, dtype: DType, n: usize) -> Result<CudaStorage> {
    let n = n.max(1);
    Ok(match dtype {
        DType::F32 => CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<f32>(n)?, dev.clone()),
        DType::BF16 => CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<half::bf16>(n)?, dev.clone()),
        DType::F16 => CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<half::f16>(n)?, dev.clone()),
        d => bail!("vramlab-kernels: unsupported dtype {d:?} (f32, bf16, f16)"),
    })
}

/// A contiguous tensor of `shape` over `s` (no gradient).
pub(crate) fn tensor(s: CudaStorage, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cuda(s), shape, BackpropOp::none(), false)
}

/// The CUDA storage behind a read guard.
pub(crate) fn storage<'a>(
    g: &'a (candle_core::StorageRef<'a>, &'a Layout),
) -> Result<(&'a CudaStorage, &'a Layout)> {
    match &*g.0 {
        Storage::Cuda(c) => Ok((c, g.1)),
        _ => bail!("vramlab-kernels: inputs on different devices"),
    }
}

/// The start of a contiguous layout, as a kernel integer.
pub(crate) fn start(l: &Layout, op: &str) -> Result<i64> {
    match l.contiguous_offsets() {
        Some((a, _)) => Ok(a as i64),
        None => bail!("{op}: expects a contiguous input"),
    }
}
