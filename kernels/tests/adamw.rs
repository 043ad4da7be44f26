//! The in-place AdamW gives candle-nn's AdamW parameters after 10 steps (f32 within 1e-6; bf16
//! and f16 within their rounding of the f32 trajectory), and the mixed variant keeps an f32
//! master equal to the f32 run with a working copy that is exactly its cast.
mod common;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};
use vramlab_kernels::{adamw_step_mixed, AdamWParams, AdamWState};

const SHAPES: [&[usize]; 3] = [&[17, 33], &[5], &[4, 3, 8]];

fn params() -> AdamWParams {
    AdamWParams {
        lr: 0.01,
        weight_decay: 0.1,
        ..AdamWParams::default()
    }
}

fn init(dtype: DType) -> Vec<Var> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n: usize = s.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|j| ((j * 7 + i * 13) % 23) as f32 / 11.0 - 1.0)
                .collect();
            let t = Tensor::from_vec(v, *s, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            Var::from_tensor(&t).unwrap()
        })
        .collect()
}

/// Gradients of Σ (p²·r₁ + p·r₂) for step `t`: they depend on the parameters.
fn grads(vars: &[Var], t: usize) -> GradStore {
    let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu).unwrap();
    for (i, v) in vars.iter().enumerate() {
        let p = v.as_tensor().to_dtype(DType::F32).unwrap();
        let n = p.elem_count() as u32;
        let r = Tensor::arange(0u32, n, &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let r = ((r * 0.37).unwrap() + (t as f64 * 1.3 + i as f64))
            .unwrap()
            .sin()
            .unwrap();
        let r = r.reshape(p.dims()).unwrap();
        let term = ((p.sqr().unwrap() * &r).unwrap() + &p)
            .unwrap()
            .sum_all()
            .unwrap();
        loss = (loss + term).unwrap();
    }
    loss.backward().unwrap()
}

fn max_rel(a: &[Var], b: &[Var]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| {
            let a = a.as_tensor().to_dtype(DType::F32).unwrap();
            let b = b.as_tensor().to_dtype(DType::F32).unwrap();
            let d = (a - &b)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            d / b
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        })
        .fold(0.0, f32::max)
}

fn reference_run(steps: usize) -> Vec<Var> {
    let vars = init(DType::F32);
    let p = params();
    let mut opt = AdamW::new(
        vars.clone(),
        ParamsAdamW {
            lr: p.lr,
            beta1: p.beta1,
            beta2: p.beta2,
            eps: p.eps,
            weight_decay: p.weight_decay,
        },
    )
    .unwrap();
    for t in 1..=steps {
        opt.step(&grads(&vars, t)).unwrap();
    }
    vars
}

#[test]
fn fused_adamw_matches_candle_nn_after_10_steps() {
    let reference = reference_run(10);
    for (dtype, tol) in [
        (DType::F32, 1e-6f32),
        (DType::BF16, 2e-2),
        (DType::F16, 5e-3),
    ] {
        let vars = init(dtype);
        let mut opt = AdamWState::new(vars.clone(), params()).unwrap();
        for t in 1..=10 {
            opt.step(&grads(&vars, t)).unwrap();
        }
        let e = max_rel(&vars, &reference);
        println!("adamw-fused {dtype:?} vs candle-nn f32 after 10 steps: max rel err {e:.2e}");
        assert!(e <= tol, "{dtype:?}: {e} > {tol}");
    }
}

#[test]
fn mixed_adamw_keeps_f32_master_and_casts_working_copy() {
    let reference = reference_run(10);
    for work_dtype in [DType::BF16, DType::F16] {
        let master = init(DType::F32);
        let (work, state) = common::mixed_setup(&master, work_dtype);
        for t in 1..=10 {
            // The gradient comes from the 16-bit working copy, as in mixed-precision training.
            let g = grads(&work, t);
            for ((m, w), (mm, vv)) in master.iter().zip(&work).zip(&state) {
                let gw = g.get(w).unwrap();
                adamw_step_mixed(m, mm, vv, gw, w, &params(), t).unwrap();
            }
        }
        for (m, w) in master.iter().zip(&work) {
            let cast = m.as_tensor().to_dtype(work_dtype).unwrap();
            let same = cast
                .eq(w.as_tensor())
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            assert_eq!(same.mean_all().unwrap().to_scalar::<f32>().unwrap(), 1.0);
        }
        let e = max_rel(&master, &reference);
        println!(
            "adamw-fused mixed ({work_dtype:?} working copy): master vs candle-nn f32 {e:.2e}"
        );
        assert!(e <= 2e-2, "{work_dtype:?} master drifted {e}");
    }
}
