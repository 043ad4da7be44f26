//! LoRA fine-tuning of Stable Diffusion's UNet (`model::diffusion::sd::SdUnet`, `workload::finetune`) on the
//! tiny SD config: the trainable UNet against candle-transformers' (same tensors, same
//! forward), the adapters' count from the config, their gradients with frozen kernels against
//! candle's own convolutions, the gradients and AdamW state of a step on the counting
//! allocator, two steps' peaks, `vramlab sweep` with mode = "train" on a tiny diffusers
//! directory, and FLUX still refused. Every expected figure is derived from the config or
//! measured here.
//!
//! The counter is process-global: this binary has no libtest harness (`harness = false`),
//! `main` runs each check in turn on the main thread.
mod common;
use common::{max_abs, max_abs_diff, random, tiny_sd};

use candle_core::{DType, Device, Tensor, Var};
use vramlab::meter::cpu::CpuMeter;
use vramlab::model::diffusion::sd::{self, DownBlock, SdUnet, UNetConfig, UpBlock};
use vramlab::model::diffusion::{count, record, Shapes};
use vramlab::vocab::{Attention, Component};
use vramlab::workload::finetune::{attach_adapters, run, Inputs};

fn unet_shapes(c: &UNetConfig) -> Shapes {
    record(|vb| SdUnet::new(c, vb, Attention::Eager).map(|_| ()))
}

/// Latents (2, 4, 16, 16), noise, t and a text context of 7 tokens.
fn inputs(c: &UNetConfig) -> Inputs {
    Inputs::of_shape(
        (2, c.in_channels, 16, 16),
        (2, 7, c.cross_attention_dim),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap()
}

/// (a) The trainable UNet stores exactly candle's tensors and, on the same weights and
/// inputs, predicts what candle's UNet predicts (conv and linear projections, eager and flash
/// attention).
fn matches_candle() {
    for linear in [false, true] {
        let mut c = tiny_sd();
        c.unet.use_linear_projection = linear;
        let shapes = unet_shapes(&c.unet);
        let mut mine = shapes.clone();
        let mut theirs = c.shapes(Component::Unet);
        mine.sort();
        theirs.sort();
        assert_eq!(mine, theirs, "tensor names and shapes, linear={linear}");
        let vb = random(&shapes);
        let reference = sd::build_unet(&c.unet, vb.clone(), None).unwrap();
        let inp = inputs(&c.unet);
        let t = 421.0;
        let want = reference.forward(&inp.x0, t, &inp.text).unwrap();
        let ts = Tensor::new(&[t as f32, t as f32], &Device::Cpu).unwrap();
        for kind in [Attention::Eager, Attention::Flash] {
            let u = SdUnet::new(&c.unet, vb.clone(), kind).unwrap();
            let got = u.forward(&inp.x0, &ts, &inp.text).unwrap();
            let (d, scale) = (max_abs_diff(&got, &want), max_abs(&want));
            println!("linear={linear} {kind}: max |Δ| {d:e} (max |y| {scale})");
            assert!(d <= 1e-4 * scale.max(1.0), "linear={linear} {kind}: {d}");
        }
    }
    println!("matches candle: ok");
}

/// (b) The adapters' parameters from the config alone: r·(in + out) per targeted linear, the
/// four projections of both attentions of every transformer block.
fn lora_params(c: &UNetConfig, r: usize) -> usize {
    let x = c.cross_attention_dim;
    let block = |ch: usize| 4 * r * 2 * ch + r * (2 * ch + 2 * (x + ch) + 2 * ch);
    let ch = &c.block_out_channels;
    let n = ch.len();
    let level =
        |i: usize, blocks: usize| blocks * c.transformer_layers_per_block.at(i) * block(ch[i]);
    let mut total = level(n - 1, 1);
    for i in 0..n {
        if c.down_block_types[i] == DownBlock::CrossAttnDownBlock2D {
            total += level(i, c.layers_per_block);
        }
        if c.up_block_types[n - 1 - i] == UpBlock::CrossAttnUpBlock2D {
            total += level(i, c.layers_per_block + 1);
        }
    }
    total
}

/// (b) the count, A and B per linear; (with a backward) every adapter gets a gradient, no
/// frozen kernel or dense weight does, and the adapters' gradients equal those with candle's
/// own convolutions and products (the base weights as variables).
fn lora_count_and_gradients() {
    let c = tiny_sd().unet;
    let dev = Device::Cpu;
    let shapes = unet_shapes(&c);
    let vb = random(&shapes);
    let inp = inputs(&c);
    let t = Tensor::new(&[10f32, 900.0], &dev).unwrap();
    let mut grads = Vec::new();
    for as_vars in [false, true] {
        let vb = if as_vars {
            let map = shapes
                .iter()
                .map(|(n, s)| {
                    let v = Var::from_tensor(&vb.get(s.as_slice(), n).unwrap()).unwrap();
                    (n.clone(), v.as_tensor().clone())
                })
                .collect();
            candle_nn::VarBuilder::from_tensors(map, DType::F32, &dev)
        } else {
            vb.clone()
        };
        let mut u = SdUnet::new(&c, vb.clone(), Attention::Eager).unwrap();
        let targets = u.attention_linears_mut().len();
        let vars = attach_adapters(u.attention_linears_mut(), 4, DType::F32, &dev).unwrap();
        let n: usize = vars.iter().map(|v| v.elem_count()).sum();
        assert_eq!(n, lora_params(&c, 4), "LoRA parameters");
        assert_eq!(vars.len(), 2 * targets);
        // B is zero: A's gradient would be too, so B gets one first.
        for b in vars.iter().skip(1).step_by(2) {
            b.set(&(b.ones_like().unwrap() * 0.01).unwrap()).unwrap();
        }
        let y = u.forward(&inp.x0, &t, &inp.text).unwrap();
        let g = y.sqr().unwrap().mean_all().unwrap().backward().unwrap();
        for v in &vars {
            assert!(g.get(v.as_tensor()).is_some(), "an adapter has no gradient");
        }
        if !as_vars {
            for (name, s) in shapes.iter().filter(|(_, s)| s.len() >= 2) {
                let w = vb.get(s.as_slice(), name).unwrap();
                assert!(g.get(&w).is_none(), "{name} got a gradient");
            }
        }
        grads.push(
            vars.iter()
                .map(|v| g.get(v.as_tensor()).unwrap().clone())
                .collect::<Vec<_>>(),
        );
    }
    let worst = grads[0]
        .iter()
        .zip(&grads[1])
        .map(|(a, b)| max_abs_diff(a, b) / max_abs(b).max(1e-6))
        .fold(0f32, f32::max);
    println!("adapter gradients, frozen vs candle's ops: max relative diff {worst:e}");
    assert!(worst <= 1e-4, "{worst}");
    println!("lora count and gradients: ok");
}

/// (c), (d) Steps on the counting allocator: the gradients at the end of backward are the
/// adapters' bytes, AdamW's state at the end of the optimizer phase twice that (each plus
/// ≤ 1 KiB of bookkeeping per tensor, and exactly so between two ranks); two steps' forward
/// and backward peaks over their baseline agree within 0.1 % (plus a page for gemm's packing
/// buffers, as in the Wan test).
fn lora_steps() {
    let c = tiny_sd().unet;
    let dev = Device::Cpu;
    let vb = random(&unet_shapes(&c));
    let inp = inputs(&c);
    let mut meter = CpuMeter::new();
    let mut figures = |rank: u32| {
        let mut u = SdUnet::new(&c, vb.clone(), Attention::Eager).unwrap();
        let vars = attach_adapters(u.attention_linears_mut(), rank, DType::F32, &dev).unwrap();
        let spec = common::tiny_train_spec(2);
        let mut rows = Vec::new();
        let losses = run(&u, &vars, &inp, &spec, &mut meter, &mut |r, _| {
            rows.push(r);
            Ok(())
        })
        .unwrap();
        assert!(
            losses.iter().all(|l| l.is_finite() && *l > 0.0),
            "{losses:?}"
        );
        for b in vars.iter().skip(1).step_by(2) {
            assert!(max_abs(b.as_tensor()) > 0.0, "B still zero after AdamW");
        }
        let lora = (lora_params(&c, rank as usize) * 4) as i64;
        println!("r{rank}: losses {losses:?}");
        let (g, s) = common::check_lora_steps(&rows, lora, vars.len(), &format!("r{rank}"));
        (g, s)
    };
    let (g4, s4) = figures(4);
    let (g8, s8) = figures(8);
    let delta = ((lora_params(&c, 8) - lora_params(&c, 4)) * 4) as i64;
    assert_eq!(g8 - g4, delta, "r8 − r4 gradient bytes");
    assert_eq!(s8 - s4, 2 * delta, "r8 − r4 AdamW state bytes");
    println!("lora steps: ok");
}

/// Runs `vramlab sweep` on a scenario of `sweep` lines over `source`.
fn sweep(tmp: &std::path::Path, source: &str, sweep: &str) -> std::process::Output {
    let scenario = tmp.join("s.toml");
    std::fs::write(
        &scenario,
        format!(
            "name = \"t\"\ndevice = \"cpu\"\n[model]\nsource = \"{source}\"\n[sweep]\nmode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\n{sweep}"
        ),
    )
    .unwrap();
    common::vramlab()
        .args(["sweep", "--quiet"])
        .arg(&scenario)
        .arg("--out")
        .arg(tmp.join("t.csv"))
        .output()
        .unwrap()
}

/// (e), (f) `vramlab sweep` with mode = "train" on the tiny SD pipeline as a diffusers
/// directory: a load row, then forward, backward, optimizer and step_total per step, all ok,
/// no frames, the UNet's parameters and the adapters' count; FLUX is refused in one line.
fn sweep_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-sd");
    let cfg = tiny_sd();
    let p = sd::Sd::new(cfg.clone(), DType::F32, DType::F32);
    vramlab::workload::generate::write_synthetic(&p, &dir).unwrap();
    let out = sweep(
        tmp.path(),
        &format!("diffusers:{}", dir.display()),
        "resolution = [\"32x32\"]\ntrainable = [\"lora-r4\"]\noptimizer = [\"adamw\"]\ntrain_steps = 2\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = vramlab::export::csv::read(&tmp.path().join("t.csv")).unwrap();
    common::assert_train_rows(&rows.iter().collect::<Vec<_>>(), 2, "tiny sd");
    let params = count(&unet_shapes(&cfg.unet));
    let lora = lora_params(&cfg.unet, 4) as u64;
    for r in &rows {
        assert_eq!(r.frames, None);
        // No frames segment after the resolution.
        assert!(r.point_id.contains("/32x32/b1/"), "{}", r.point_id);
        assert_eq!(r.param_count, params);
        assert_eq!(r.context, 77);
    }
    assert_eq!(rows[0].component, Some(Component::Unet));
    assert_eq!(rows[0].message, format!("lora_params={lora}"));
    assert_eq!(rows[1].feature_optimizer_bytes, Some(2 * lora * 4));
    let loss: f32 = rows[4]
        .message
        .strip_prefix("loss=")
        .unwrap()
        .parse()
        .unwrap();
    assert!(loss.is_finite() && loss > 0.0);

    let out = sweep(
        tmp.path(),
        "synthetic:flux-dev",
        "resolution = [\"256x256\"]\n",
    );
    common::one_line_exit_2(
        &out,
        "mode `train` on the diffusion pipeline `synthetic:flux-dev`",
    );
    println!("sweep cli: ok");
}

fn main() {
    // One compute thread: every peak is reproducible.
    std::env::set_var("RAYON_NUM_THREADS", "1");
    matches_candle();
    lora_count_and_gradients();
    lora_steps();
    sweep_cli();
}
