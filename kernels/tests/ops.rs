//! Every fused op's forward and backward against the reference composition of candle ops, on
//! random shapes (non-contiguous inputs, GQA, lengths that are not a multiple of the tile):
//! f32 within 1e-5 and bf16/f16 within 1e-2, relative to the largest reference magnitude. The
//! reference runs in f32 on the same (rounded) input values. Plus a finite-difference check
//! of attention's gradient.
use candle_core::{DType, Device, Result, Tensor, Var, D};
use vramlab_kernels as k;

mod compare;
use compare::{randn, rel, Op, TOL};

/// Runs `fused` in every dtype and `reference` in f32 on the same values; compares the
/// outputs and the gradients of Σ out·r for every input.
fn check(name: &str, inputs: &[Tensor], fused: &Op<'_>, reference: &Op<'_>) {
    for (dtype, tol) in TOL {
        let leaves = |dt: DType| -> Vec<Var> {
            inputs
                .iter()
                .map(|t| {
                    let t = t.to_dtype(dtype).unwrap().to_dtype(dt).unwrap();
                    Var::from_tensor(&t).unwrap()
                })
                .collect()
        };
        let (vf, vr) = (leaves(dtype), leaves(DType::F32));
        let tf: Vec<Tensor> = vf.iter().map(|v| v.as_tensor().clone()).collect();
        let tr: Vec<Tensor> = vr.iter().map(|v| v.as_tensor().clone()).collect();
        let of = fused(&tf).unwrap();
        let or = reference(&tr).unwrap();
        assert_eq!(of.dims(), or.dims(), "{name}: output shape");
        assert_eq!(of.dtype(), dtype, "{name}: output dtype");
        let r = randn(or.dims(), 99);
        let loss = |o: &Tensor| {
            (o.to_dtype(DType::F32).unwrap() * &r)
                .unwrap()
                .sum_all()
                .unwrap()
        };
        let (gf, gr) = (loss(&of).backward().unwrap(), loss(&or).backward().unwrap());
        let e = rel(&of, &or);
        println!("{name} {dtype:?}: forward rel err {e:.2e}");
        assert!(e <= tol, "{name} {dtype:?}: forward rel err {e} > {tol}");
        for (i, (a, b)) in vf.iter().zip(&vr).enumerate() {
            let (Some(ga), Some(gb)) = (gf.get(a), gr.get(b)) else {
                assert!(gr.get(b).is_none(), "{name}: no gradient for input {i}");
                continue;
            };
            let e = rel(ga, gb);
            println!("{name} {dtype:?}: grad {i} rel err {e:.2e}");
            assert!(
                e <= tol,
                "{name} {dtype:?}: grad of input {i} rel err {e} > {tol}"
            );
        }
    }
}

fn ref_softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// softmax(q kᵀ·scale + mask) v with K/V repeated per query head; (b, sq, h, d).
fn ref_attention(
    q: &Tensor,
    kk: &Tensor,
    v: &Tensor,
    scale: f64,
    mask: k::AttnMask,
) -> Result<Tensor> {
    let (b, h, sq, d) = q.dims4()?;
    let (kvh, sk) = (kk.dim(1)?, kk.dim(2)?);
    let rep = |t: &Tensor| {
        t.unsqueeze(2)?
            .broadcast_as((b, kvh, h / kvh, sk, d))?
            .reshape((b, h, sk, d))
    };
    let (kk, v) = (rep(kk)?, rep(v)?);
    let s = (q.contiguous()?.matmul(&kk.t()?.contiguous()?)? * scale)?;
    let m: Vec<f32> = (0..sq)
        .flat_map(|i| {
            let p = i + sk - sq;
            (0..sk).map(move |j| {
                let causal_ok = !mask.causal || j <= p;
                let win_ok = mask.window.is_none_or(|w| p.abs_diff(j) < w);
                if causal_ok && win_ok {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    let m = Tensor::from_vec(m, (sq, sk), q.device())?;
    ref_softmax(&s.broadcast_add(&m)?)?
        .matmul(&v.contiguous()?)?
        .transpose(1, 2)
}

#[test]
fn attention_matches_reference() {
    // (b, h, kvh, sq, sk, d, mask): GQA, MHA, lengths around the tile, decode-style sq < sk.
    let w = |n| Some(n);
    let cases = [
        (2, 4, 2, 70, 70, 16, k::AttnMask::CAUSAL),
        (1, 3, 3, 130, 130, 8, k::AttnMask::FULL),
        (
            2,
            6,
            2,
            65,
            65,
            16,
            k::AttnMask {
                causal: true,
                window: w(17),
            },
        ),
        (1, 4, 1, 5, 70, 16, k::AttnMask::CAUSAL),
        (
            1,
            2,
            1,
            40,
            40,
            8,
            k::AttnMask {
                causal: false,
                window: w(9),
            },
        ),
    ];
    for (i, &(b, h, kvh, sq, sk, d, mask)) in cases.iter().enumerate() {
        let scale = 1.0 / (d as f64).sqrt();
        // q arrives (b, sq, h, d) and is transposed: a non-contiguous input, as in the models.
        let inputs = [
            randn(&[b, sq, h, d], 10 + i as u64),
            randn(&[b, kvh, sk, d], 20 + i as u64),
            randn(&[b, kvh, sk, d], 30 + i as u64),
        ];
        check(
            &format!("attention case {i} {mask:?}"),
            &inputs,
            &move |t| k::flash_attention(&t[0].transpose(1, 2)?, &t[1], &t[2], scale as f32, mask),
            &move |t| ref_attention(&t[0].transpose(1, 2)?, &t[1], &t[2], scale, mask),
        );
    }
}

#[test]
fn attention_finite_differences() {
    let (b, h, kvh, s, d) = (1, 2, 1, 67, 8);
    let mask = k::AttnMask {
        causal: true,
        window: Some(30),
    };
    let x = [
        randn(&[b, h, s, d], 1),
        randn(&[b, kvh, s, d], 2),
        randn(&[b, kvh, s, d], 3),
    ];
    let r = randn(&[b, s, h, d], 4);
    let loss = |x: &[Tensor]| -> Tensor {
        let o = k::flash_attention(&x[0], &x[1], &x[2], 0.35, mask).unwrap();
        (o * &r).unwrap().sum_all().unwrap()
    };
    let vars: Vec<Var> = x.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let grads = loss(&ts).backward().unwrap();
    let h_step = 1e-2f32;
    let mut worst = 0f32;
    for (which, var) in vars.iter().enumerate() {
        let g: Vec<f32> = grads
            .get(var)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let base: Vec<f32> = x[which].flatten_all().unwrap().to_vec1().unwrap();
        for idx in (0..base.len()).step_by(37) {
            let at = |delta: f32| -> f64 {
                let mut v = base.clone();
                v[idx] += delta;
                let mut xs = x.to_vec();
                xs[which] = Tensor::from_vec(v, x[which].dims(), &Device::Cpu).unwrap();
                loss(&xs).to_scalar::<f32>().unwrap() as f64
            };
            let fd = ((at(h_step) - at(-h_step)) / (2.0 * h_step as f64)) as f32;
            let err = (fd - g[idx]).abs() / (g[idx].abs().max(1.0));
            worst = worst.max(err);
            assert!(
                err < 2e-3,
                "input {which} element {idx}: analytic {} vs fd {fd}",
                g[idx]
            );
        }
    }
    println!("attention finite differences: worst rel err {worst:.2e}");
}

fn ref_rms(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let r = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
    x.broadcast_div(&r)?.broadcast_mul(w)
}

#[test]
fn rms_norm_matches_reference() {
    let inputs = [randn(&[37, 3, 48], 1), randn(&[48], 2)];
    check(
        "rms_norm",
        &inputs,
        &|t| k::rms_norm(&t[0].transpose(0, 1)?, &t[1], 1e-5),
        &|t| ref_rms(&t[0].transpose(0, 1)?, &t[1], 1e-5),
    );
}

#[test]
fn layer_norm_matches_reference() {
    let inputs = [randn(&[5, 29, 40], 3), randn(&[40], 4), randn(&[40], 5)];
    let reference = |t: &[Tensor]| -> Result<Tensor> {
        let x = t[0].transpose(0, 1)?;
        let xc = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        ref_rms(&xc, &t[1], 1e-5)?.broadcast_add(&t[2])
    };
    check(
        "layer_norm",
        &inputs,
        &|t| k::layer_norm(&t[0].transpose(0, 1)?, &t[1], &t[2], 1e-5),
        &reference,
    );
}

#[test]
fn rope_matches_reference() {
    let (s, d) = (37, 16);
    let f: Vec<f32> = (0..s)
        .flat_map(|p| {
            (0..d).map(move |e| p as f32 * 10000f32.powf(-2.0 * (e % (d / 2)) as f32 / d as f32))
        })
        .collect();
    let f = Tensor::from_vec(f, (s, d), &Device::Cpu).unwrap();
    let inputs = [randn(&[2, s, 3, d], 6), f.cos().unwrap(), f.sin().unwrap()];
    let reference = |t: &[Tensor]| -> Result<Tensor> {
        let x = t[0].transpose(1, 2)?;
        let (x1, x2) = (
            x.narrow(D::Minus1, 0, d / 2)?,
            x.narrow(D::Minus1, d / 2, d / 2)?,
        );
        let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        x.broadcast_mul(&t[1])? + rot.broadcast_mul(&t[2])?
    };
    check(
        "rope",
        &inputs,
        &|t| k::rope(&t[0].transpose(1, 2)?, &t[1].detach(), &t[2].detach()),
        &|t| reference(&[t[0].clone(), t[1].detach(), t[2].detach()]),
    );
}

#[test]
fn swiglu_matches_reference() {
    let inputs = [(randn(&[5, 77], 7) * 4.0).unwrap(), randn(&[77, 5], 8)];
    check("swiglu", &inputs, &|t| k::swiglu(&t[0], &t[1].t()?), &|t| {
        t[0].silu()? * t[1].t()?
    });
}

#[test]
fn softmax_matches_reference() {
    let inputs = [(randn(&[33, 4, 70], 9) * 5.0).unwrap()];
    check(
        "softmax",
        &inputs,
        &|t| k::softmax_last_dim(&t[0].transpose(0, 1)?),
        &|t| ref_softmax(&t[0].transpose(0, 1)?),
    );
}
