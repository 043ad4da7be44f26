//! What the op tests on the CPU (`ops.rs`) and on CUDA (`cuda_ops.rs`) compare with: the
//! tolerances per dtype, seeded random inputs, and the relative error.
#![allow(dead_code)]
use candle_core::{DType, Device, Result, Tensor};

/// Relative tolerance per dtype: f32 within 1e-5, bf16/f16 within 1e-2.
pub const TOL: [(DType, f32); 3] = [(DType::F32, 1e-5), (DType::BF16, 1e-2), (DType::F16, 1e-2)];

/// An op under test: inputs to output.
pub type Op<'a> = dyn Fn(&[Tensor]) -> Result<Tensor> + 'a;

/// Uniform values in [-1, 1) of `shape`, on the CPU, from `seed`.
pub fn randn(shape: &[usize], seed: u64) -> Tensor {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut r = StdRng::seed_from_u64(seed);
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// max |a − b| / max |b|, in f32 on the CPU (either may live on a device).
pub fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let f32_cpu = |t: &Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    };
    let (a, b) = (f32_cpu(a), f32_cpu(b));
    assert_eq!(a.dims(), b.dims());
    let diff = (a - &b).unwrap().abs().unwrap().max_all().unwrap();
    let scale = b.abs().unwrap().max_all().unwrap();
    diff.to_scalar::<f32>().unwrap() / scale.to_scalar::<f32>().unwrap().max(1e-30)
}
