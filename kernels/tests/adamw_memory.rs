//! Exact memory of the in-place AdamW step, with a counting allocator in a process of its own:
//! the step's peak exceeds the live state (parameters, m, v, gradients) by at most 1 KiB per
//! tensor, for f32, bf16, f16 and the mixed variant. candle-nn's AdamW is measured on the same
//! state to show the counter sees its temporaries (at least one copy of the largest tensor).
mod common;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};
use vramlab_kernels::{adamw_step_mixed, AdamWParams, AdamWState};

#[global_allocator]
static ALLOC: common::Counting = common::Counting;

const SHAPES: [&[usize]; 4] = [&[256, 384], &[384], &[1000, 64], &[7]];
const PER_TENSOR: usize = 1024;

fn vars(dtype: DType) -> Vec<Var> {
    SHAPES
        .iter()
        .map(|s| {
            Var::from_tensor(
                &Tensor::randn(0f32, 1.0, *s, &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
            .unwrap()
        })
        .collect()
}

fn grads(vars: &[Var]) -> candle_core::backprop::GradStore {
    let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu).unwrap();
    for v in vars {
        let t = v
            .as_tensor()
            .to_dtype(DType::F32)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        loss = (loss + t).unwrap();
    }
    loss.backward().unwrap()
}

fn largest(dtype: DType) -> usize {
    SHAPES
        .iter()
        .map(|s| s.iter().product::<usize>())
        .max()
        .unwrap()
        * dtype.size_in_bytes()
}

fn main() {
    let n = SHAPES.len();
    // Warm up rayon's pool.
    let w = vars(DType::F32);
    AdamWState::new(w.clone(), AdamWParams::default())
        .unwrap()
        .step(&grads(&w))
        .unwrap();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let vs = vars(dtype);
        let mut opt = AdamWState::new(vs.clone(), AdamWParams::default()).unwrap();
        for step in 1..=3 {
            let g = grads(&vs);
            let (_, extra) = common::transient(|| opt.step(&g).unwrap());
            println!(
                "adamw-fused {dtype:?} step {step}: peak above live state {extra} B ({n} tensors)"
            );
            assert!(
                extra <= PER_TENSOR * n,
                "{dtype:?}: step transient {extra} B > {} B",
                PER_TENSOR * n
            );
        }
        let mut reference = AdamW::new(vs.clone(), ParamsAdamW::default()).unwrap();
        let g = grads(&vs);
        reference.step(&g).unwrap(); // its state now exists, like ours
        let (_, theirs) = common::transient(|| reference.step(&g).unwrap());
        println!("candle-nn AdamW {dtype:?}: peak above live state {theirs} B");
        assert!(
            theirs >= largest(dtype),
            "candle-nn's temporaries not seen: {theirs} B"
        );
    }
    // Mixed: f32 master, m, v; 16-bit working copy written in place.
    for work_dtype in [DType::BF16, DType::F16] {
        let master = vars(DType::F32);
        let (work, state) = common::mixed_setup(&master, work_dtype);
        let g = grads(&work);
        let (_, extra) = common::transient(|| {
            for ((m, w), (mm, vv)) in master.iter().zip(&work).zip(&state) {
                adamw_step_mixed(m, mm, vv, g.get(w).unwrap(), w, &AdamWParams::default(), 1)
                    .unwrap();
            }
        });
        println!(
            "adamw-fused mixed ({work_dtype:?}): peak above live state {extra} B ({n} tensors)"
        );
        assert!(
            extra <= PER_TENSOR * n,
            "mixed {work_dtype:?}: {extra} B > {} B",
            PER_TENSOR * n
        );
    }
    println!("adamw_memory: ok");
}
