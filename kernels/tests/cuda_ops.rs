//! Every fused op on CUDA against the same op on the CPU (feature `cuda`;
//! docs/src/guides/device-run.md): forward and the gradients of Σ out·r for every input, on the
//! same random inputs in f32, bf16 and f16 (f32 within 1e-5, bf16/f16 within 1e-2, relative to the
//! largest CPU magnitude): attention with GQA, causal or not, sliding windows, lengths that are not
//! a multiple of either tile, decode-style sq < sk, head_dim up to 160, non-contiguous q, k and
//! incoming gradient; norms, RoPE, SwiGLU, softmax; then 10 AdamW steps (plain and mixed).
//!
//! Without a CUDA device it prints one line saying so and exits 0, so CI can build it
//! (scripts/cuda-build-check.sh) on a machine with no GPU. scripts/gpu/run.sh runs it on one.
use candle_core::{DType, Device, Tensor, Var};
use vramlab_kernels as k;

mod compare;
use compare::{randn, rel, Op, TOL};

/// The output and the gradient of every input of Σ op(inputs)·r on `dev`.
fn run(dev: &Device, inputs: &[Tensor], op: &Op<'_>, r: &Tensor) -> (Tensor, Vec<Option<Tensor>>) {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(&t.to_device(dev).unwrap()).unwrap())
        .collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let out = op(&ts).unwrap();
    assert_eq!(out.device().is_cuda(), dev.is_cuda(), "output device");
    let loss = (out.to_dtype(DType::F32).unwrap() * r.to_device(dev).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    let g = vars.iter().map(|v| grads.get(v).cloned()).collect();
    (out, g)
}

/// Runs `op` on the CPU and on `gpu` in every dtype on the same values and compares.
fn check(gpu: &Device, name: &str, inputs: &[Tensor], op: &Op<'_>) {
    for (dtype, tol) in TOL {
        let xs: Vec<Tensor> = inputs.iter().map(|t| t.to_dtype(dtype).unwrap()).collect();
        let probe = op(&xs).unwrap();
        let r = randn(probe.dims(), 99);
        let (oc, gc) = run(&Device::Cpu, &xs, op, &r);
        let (og, gg) = run(gpu, &xs, op, &r);
        assert_eq!(og.dtype(), dtype, "{name}: output dtype");
        let e = rel(&og, &oc);
        println!("{name} {dtype:?}: forward rel err {e:.2e}");
        assert!(e <= tol, "{name} {dtype:?}: forward rel err {e} > {tol}");
        for (i, (a, b)) in gg.iter().zip(&gc).enumerate() {
            match (a, b) {
                (Some(a), Some(b)) => {
                    let e = rel(a, b);
                    println!("{name} {dtype:?}: grad {i} rel err {e:.2e}");
                    assert!(e <= tol, "{name} {dtype:?}: grad {i} rel err {e} > {tol}");
                }
                (None, None) => {}
                _ => panic!("{name} {dtype:?}: input {i} has a gradient on one device only"),
            }
        }
    }
}

fn attention(gpu: &Device) {
    let mask = |causal, window| k::AttnMask { causal, window };
    // (b, h, kvh, sq, sk, d, mask): GQA and MHA, lengths around both tiles (CPU 64, CUDA 32 or
    // 16), decode-style sq < sk, windows, head_dim 8 to 160 (160: the 16-row tile, and lanes
    // holding 5 elements for some and 6 for others).
    let cases = [
        (2, 4, 2, 70, 70, 16, mask(true, None)),
        (1, 3, 3, 130, 130, 8, mask(false, None)),
        (2, 6, 2, 65, 65, 64, mask(true, Some(17))),
        (1, 4, 1, 5, 70, 32, mask(true, None)),
        (1, 2, 1, 40, 40, 8, mask(false, Some(9))),
        (1, 4, 2, 33, 33, 160, mask(true, None)),
        (1, 2, 2, 50, 19, 128, mask(false, Some(5))),
    ];
    for (i, &(b, h, kvh, sq, sk, d, m)) in cases.iter().enumerate() {
        let scale = 1.0 / (d as f32).sqrt();
        // q and k arrive (b, s, heads, d) and are transposed, as in the models; the loss reads
        // the output transposed, so the incoming gradient is not contiguous either.
        let inputs = [
            randn(&[b, sq, h, d], 10 + i as u64),
            randn(&[b, sk, kvh, d], 20 + i as u64),
            randn(&[b, kvh, sk, d], 30 + i as u64),
        ];
        check(
            gpu,
            &format!("attention case {i} {m:?}"),
            &inputs,
            &move |t| {
                let (q, kk) = (t[0].transpose(1, 2)?, t[1].transpose(1, 2)?);
                k::flash_attention(&q, &kk, &t[2], scale, m)?.transpose(1, 2)
            },
        );
    }
}

fn rowwise(gpu: &Device) {
    check(
        gpu,
        "rms_norm",
        &[randn(&[37, 3, 48], 1), randn(&[48], 2)],
        &|t| k::rms_norm(&t[0].transpose(0, 1)?, &t[1], 1e-5),
    );
    check(
        gpu,
        "rms_norm wide",
        &[randn(&[9, 1500], 11), randn(&[1500], 12)],
        &|t| k::rms_norm(&t[0], &t[1], 1e-6),
    );
    let ln = [randn(&[5, 29, 40], 3), randn(&[40], 4), randn(&[40], 5)];
    check(gpu, "layer_norm", &ln, &|t| {
        k::layer_norm(&t[0].transpose(0, 1)?, &t[1], &t[2], 1e-5)
    });
    let (s, d) = (37, 64);
    let f: Vec<f32> = (0..s)
        .flat_map(|p| {
            (0..d).map(move |e| p as f32 * 10000f32.powf(-2.0 * (e % (d / 2)) as f32 / d as f32))
        })
        .collect();
    let f = Tensor::from_vec(f, (s, d), &Device::Cpu).unwrap();
    let rope = [randn(&[2, s, 3, d], 6), f.cos().unwrap(), f.sin().unwrap()];
    check(gpu, "rope", &rope, &|t| {
        k::rope(&t[0].transpose(1, 2)?, &t[1].detach(), &t[2].detach())
    });
    let sw = [(randn(&[5, 777], 7) * 4.0).unwrap(), randn(&[777, 5], 8)];
    check(gpu, "swiglu", &sw, &|t| k::swiglu(&t[0], &t[1].t()?));
    check(
        gpu,
        "softmax",
        &[(randn(&[33, 4, 70], 9) * 5.0).unwrap()],
        &|t| k::softmax_last_dim(&t[0].transpose(0, 1)?),
    );
    check(
        gpu,
        "softmax wide",
        &[(randn(&[3, 5000], 10) * 5.0).unwrap()],
        &|t| k::softmax_last_dim(&t[0]),
    );
}

/// 10 AdamW steps on each device from the same parameters and gradients; the parameter, m
/// and v agree (and, mixed, the f32 master and its bf16 working copy).
fn adamw(gpu: &Device) {
    let p = k::AdamWParams {
        lr: 0.01,
        weight_decay: 0.1,
        ..k::AdamWParams::default()
    };
    let shape = [37, 129];
    for (dtype, tol) in TOL {
        let init = randn(&shape, 40).to_dtype(dtype).unwrap();
        let state = |dev: &Device| -> Vec<Tensor> {
            let x = init.to_device(dev).unwrap().copy().unwrap();
            let z = x.zeros_like().unwrap();
            vec![x, z.copy().unwrap(), z]
        };
        let (cpu, cuda) = (state(&Device::Cpu), state(gpu));
        for t in 1..=10 {
            let g = (randn(&shape, 100 + t as u64) * 0.5).unwrap();
            for (s, dev) in [(&cpu, &Device::Cpu), (&cuda, gpu)] {
                let g = g.to_device(dev).unwrap();
                k::adamw_step(&s[0], &s[1], &s[2], &g, &p, t).unwrap();
            }
        }
        for (i, what) in ["param", "m", "v"].iter().enumerate() {
            let e = rel(&cuda[i], &cpu[i]);
            println!("adamw {dtype:?}: {what} after 10 steps rel err {e:.2e}");
            assert!(e <= tol, "adamw {dtype:?}: {what} rel err {e} > {tol}");
        }
    }
    // Mixed: f32 master, m, v; bf16 working copy written in place from the master.
    let master_init = randn(&shape, 41);
    let state = |dev: &Device| -> Vec<Tensor> {
        let x = master_init.to_device(dev).unwrap().copy().unwrap();
        let z = x.zeros_like().unwrap();
        let w = x.to_dtype(DType::BF16).unwrap();
        vec![x, z.copy().unwrap(), z, w]
    };
    let (cpu, cuda) = (state(&Device::Cpu), state(gpu));
    for t in 1..=10 {
        let g = (randn(&shape, 200 + t as u64) * 0.5)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        for (s, dev) in [(&cpu, &Device::Cpu), (&cuda, gpu)] {
            let g = g.to_device(dev).unwrap();
            k::adamw_step_mixed(&s[0], &s[1], &s[2], &g, &s[3], &p, t).unwrap();
        }
    }
    for (i, (what, tol)) in [("master", 1e-5), ("m", 1e-5), ("v", 1e-5), ("work", 1e-2)]
        .into_iter()
        .enumerate()
    {
        let e = rel(&cuda[i], &cpu[i]);
        println!("adamw mixed: {what} after 10 steps rel err {e:.2e}");
        assert!(e <= tol, "adamw mixed: {what} rel err {e} > {tol}");
    }
    let cast = cuda[0].to_dtype(DType::BF16).unwrap();
    assert_eq!(
        rel(&cuda[3], &cast),
        0.0,
        "adamw mixed: the working copy is the master's cast"
    );
}

fn main() {
    let gpu = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            let e = e.to_string();
            println!(
                "cuda_ops: no CUDA device ({}); nothing run",
                e.lines().next().unwrap_or("")
            );
            return;
        }
    };
    attention(&gpu);
    rowwise(&gpu);
    adamw(&gpu);
    println!("cuda_ops: all CUDA kernels match the CPU");
}
