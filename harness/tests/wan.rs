//! Wan2.1 T2V: the causal conv3d from conv2d against a naive f64 loop, the chunked
//! VAE decode against a two-chunk decode, the decoder's peak over frames with the CPU counting
//! allocator, `vramlab estimate --model wan2.1-t2v-1.3b`, and the generation pipeline
//! (`WanPipeline`) on a tiny config written as a synthetic diffusers directory: load rows,
//! equal denoising steps, CFG's second transformer call, the decode's output and its peak over
//! frames, the 16-bit text encoder and transformer, and `vramlab sweep` with `frames`; the DiT's
//! flash attention against its eager attention (values, and the scores missing from the peak);
//! LoRA training of the DiT (adapter count, gradients, AdamW state, steps, through the binary on
//! a tiny diffusers directory). Every expected figure is derived from the configs or measured
//! here.
//!
//! The counter is process-global: this binary has no libtest harness (`harness = false`),
//! `main` runs each check in turn on the main thread.
mod common;
use common::{random, Lab};

use candle_core::{DType, Device, Tensor};
use vramlab::meter::cpu::CpuMeter;
use vramlab::model::diffusion::wan::{
    self, CausalConv3d, FeatCache, UmT5Encoder, Wan, WanConfig, WanDecoder, WanDit,
    WanTransformerConfig, WanVaeConfig,
};
use vramlab::model::diffusion::{self, count, record, Pipeline, Shapes};
use vramlab::record::Phase;
use vramlab::vocab::{
    Attention, Checkpointing, Component, GenModel, Optimizer, Resolution, VaeDecode,
};
use vramlab::workload::generate::{self, GenShape};

fn decoder_shapes(c: &WanVaeConfig) -> Shapes {
    record(|vb| WanDecoder::new(c, vb).map(|_| ()))
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    common::max_abs_diff(a, b)
}

/// The causal conv3d equals a naive f64 loop over a zero-padded sequence (2 frames in front,
/// 1 pixel around), whole and in chunks through the cache.
fn conv3d_reference() {
    let (b, i, o, t, h, w) = (2, 3, 4, 5, 6, 5);
    let shapes: Shapes = vec![
        ("weight".into(), vec![o, i, 3, 3, 3]),
        ("bias".into(), vec![o]),
    ];
    let vb = random(&shapes);
    let conv = CausalConv3d::new(i, o, 3, 3, 1, vb.clone()).unwrap();
    let x = Tensor::randn(0f32, 1.0, (b, i, t, h, w), &Device::Cpu).unwrap();
    let (y, cache) = conv.forward(&x, None).unwrap();
    assert_eq!(y.dims(), &[b, o, t, h, w]);
    assert_eq!(cache.unwrap().dims(), &[b, i, 2, h, w]);

    let wt: Vec<f32> = vb
        .get((o, i, 3, 3, 3), "weight")
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let bias: Vec<f32> = vb.get(o, "bias").unwrap().to_vec1().unwrap();
    let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    let ys: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
    let xat = |bb: usize, c: usize, f: isize, yy: isize, xx: isize| -> f64 {
        if f < 0 || yy < 0 || xx < 0 || yy >= h as isize || xx >= w as isize {
            return 0.0;
        }
        let (f, yy, xx) = (f as usize, yy as usize, xx as usize);
        xs[(((bb * i + c) * t + f) * h + yy) * w + xx] as f64
    };
    let mut worst = 0f64;
    for bb in 0..b {
        for oc in 0..o {
            for f in 0..t {
                for yy in 0..h {
                    for xx in 0..w {
                        let mut s = bias[oc] as f64;
                        for c in 0..i {
                            for kt in 0..3 {
                                for ky in 0..3 {
                                    for kx in 0..3 {
                                        let wv = wt[(((oc * i + c) * 3 + kt) * 3 + ky) * 3 + kx];
                                        s += wv as f64
                                            * xat(
                                                bb,
                                                c,
                                                f as isize + kt as isize - 2,
                                                yy as isize + ky as isize - 1,
                                                xx as isize + kx as isize - 1,
                                            );
                                    }
                                }
                            }
                        }
                        let got = ys[(((bb * o + oc) * t + f) * h + yy) * w + xx] as f64;
                        worst = worst.max((got - s).abs());
                    }
                }
            }
        }
    }
    println!("conv3d vs f64 loop: max diff {worst:e}");
    assert!(worst <= 1e-5, "conv3d vs reference: {worst}");

    // In chunks of 1, 1, 3 frames through the cache: the same output.
    let mut cache = FeatCache::default();
    let mut parts = Vec::new();
    let mut at = 0;
    for n in [1, 1, 3] {
        cache.start_chunk();
        parts.push(cache.conv(&conv, &x.narrow(2, at, n).unwrap()).unwrap());
        at += n;
    }
    let chunked = Tensor::cat(&parts, 2).unwrap();
    let d = max_diff(&chunked, &y);
    println!("conv3d chunked vs whole: max diff {d:e}");
    assert!(d <= 1e-5, "chunked conv3d: {d}");
}

/// The built decoder has the parameters counted from the config (tiny and the real Wan2.1).
fn decoder_params() {
    for c in [common::tiny_vae(), WanConfig::t2v_1_3b().vae] {
        let built = count(&decoder_shapes(&c));
        assert_eq!(built, wan::vae_decoder_params(&c), "{c:?}");
    }
    let real = WanConfig::t2v_1_3b().vae;
    assert_eq!(
        wan::vae_encoder_params(&real) + count(&decoder_shapes(&real)),
        wan::vae_params(&real)
    );
    println!("decoder parameters: ok");
}

/// One latent frame per chunk (Wan's decode) equals a first chunk of one frame and a second of
/// all the rest; the feature cache holds what the estimator counts.
fn chunked_decode(dec: &WanDecoder, c: &WanVaeConfig) {
    let (h, w, t) = (4, 6, 4);
    let z = Tensor::randn(0f32, 1.0, (1, c.z_dim, t, h, w), &Device::Cpu).unwrap();
    let per_frame = dec.decode(&z).unwrap();
    let s = c.spatial_factor();
    assert_eq!(per_frame.dims(), &[1, 3, dec.frames(t), h * s, w * s]);
    let two = dec.decode_chunks(&z, &[1, t - 1]).unwrap();
    let d = max_diff(&per_frame, &two);
    println!("decode per frame vs two chunks: max diff {d:e}");
    assert!(d <= 1e-5, "two-chunk decode: {d}");

    // After three chunks every causal convolution holds 2 frames of its input.
    let mut cache = FeatCache::default();
    for i in 0..3 {
        dec.decode_chunk(&z.narrow(2, i, 1).unwrap(), &mut cache)
            .unwrap();
    }
    let want = c.decoder_cache_per_latent_pixel() as usize * h * w * 4;
    assert_eq!(cache.bytes(), want, "feature cache bytes");
    println!("feature cache: {want} bytes, as counted from the config");
}

/// The decode's peak minus its output is the same for 9, 13 and 17 frames (it stops growing
/// once the caches are full, from the third chunk on), lower at 5 frames by less than the
/// cache; the output is exactly frames × 3 × H × W × 4 bytes.
fn decode_peak_flat(dec: &WanDecoder, c: &WanVaeConfig) {
    let mut meter = CpuMeter::new();
    let (h, w) = (8, 8);
    let s = c.spatial_factor();
    let z = |t: usize| Tensor::randn(0f32, 1.0, (1, c.z_dim, t, h, w), &Device::Cpu).unwrap();
    // Warm-up: candle's gemm keeps per-thread buffers; the first run carries them.
    drop(dec.decode(&z(2)).unwrap());
    let mut rest = Vec::new();
    for frames in [5usize, 9, 13, 17] {
        let zt = z((frames - 1) / 4 + 1);
        let (out, m, _) = vramlab::meter::measure(&mut meter, || Ok(dec.decode(&zt)?)).unwrap();
        let out_bytes = (frames * 3 * h * s * w * s * 4) as u64;
        assert_eq!(out.dims(), &[1, 3, frames, h * s, w * s]);
        assert_eq!(
            (out.elem_count() * out.dtype().size_in_bytes()) as u64,
            out_bytes
        );
        let kept = m.end_allocated - m.baseline_allocated;
        assert!(
            kept >= out_bytes && kept - out_bytes < 1024,
            "{frames} frames: the decode keeps {kept}, the output is {out_bytes}"
        );
        let act = (m.peak_allocated - m.baseline_allocated) as f64 - out_bytes as f64;
        println!("{frames} frames: peak − output {act}");
        rest.push(act);
    }
    // From the third chunk (9 frames) on, every cache holds 2 frames: the peak is flat.
    for r in &rest[2..] {
        let err = (r - rest[1]).abs() / rest[1];
        assert!(err <= 0.01, "peak − output by frames {rest:?}");
    }
    // The second chunk (5 frames) runs with caches the first chunk filled with 1 frame: its
    // peak is lower, by less than the full cache.
    let cache = (c.decoder_cache_per_latent_pixel() as usize * h * w * 4) as f64;
    assert!(
        rest[0] <= rest[1] && rest[1] - rest[0] <= cache,
        "peak − output by frames {rest:?}, cache {cache}"
    );
}

/// A Wan2.1-shaped transformer (qk norm, cross-attention norm, patch 1×2×2), narrow: 2 heads
/// of 12, 2 blocks.
fn tiny_dit() -> WanTransformerConfig {
    let mut tiny = WanConfig::t2v_1_3b().transformer;
    tiny.num_attention_heads = 2;
    tiny.attention_head_dim = 12;
    tiny.ffn_dim = 40;
    tiny.num_layers = 2;
    tiny.text_dim = 16;
    tiny.freq_dim = 8;
    tiny.in_channels = 4;
    tiny.out_channels = 4;
    tiny
}

/// The built DiT has the parameters counted from the config (the real Wan2.1 1.3B and a tiny
/// one); the tiny one runs a step: its prediction has the latents' shape.
fn dit() {
    let real = WanConfig::t2v_1_3b().transformer;
    let shapes = record(|vb| WanDit::new(&real, vb, Attention::Eager).map(|_| ()));
    assert_eq!(count(&shapes), wan::transformer_params(&real));
    let tiny = tiny_dit();
    let shapes = record(|vb| WanDit::new(&tiny, vb, Attention::Eager).map(|_| ()));
    assert_eq!(count(&shapes), wan::transformer_params(&tiny));
    let m = WanDit::new(&tiny, random(&shapes), Attention::Eager).unwrap();
    let x = Tensor::randn(0f32, 1.0, (2, 4, 3, 4, 6), &Device::Cpu).unwrap();
    let t = Tensor::new(&[999f32, 500.0], &Device::Cpu).unwrap();
    let ctx = Tensor::randn(0f32, 1.0, (2, 7, 16), &Device::Cpu).unwrap();
    let y = m.forward(&x, &t, &ctx).unwrap();
    assert_eq!(y.dims(), x.dims());
    assert!(common::max_abs(&y).is_finite());
    println!("dit: parameters and a tiny step ok");
}

/// The built umT5 encoder has the parameters counted from the config (umT5-XXL and a tiny
/// one); the tiny one encodes: (b, len, d_model).
fn umt5() {
    let real = WanConfig::t2v_1_3b().text_encoder;
    let shapes = record(|vb| UmT5Encoder::new(&real, vb).map(|_| ()));
    assert_eq!(count(&shapes), wan::umt5_params(&real));
    let mut tiny = real.clone();
    (tiny.d_model, tiny.d_ff, tiny.d_kv, tiny.num_heads) = (16, 24, 4, 4);
    (tiny.num_layers, tiny.vocab_size) = (2, 50);
    let shapes = record(|vb| UmT5Encoder::new(&tiny, vb).map(|_| ()));
    assert_eq!(count(&shapes), wan::umt5_params(&tiny));
    let m = UmT5Encoder::new(&tiny, random(&shapes)).unwrap();
    let ids = Tensor::new(&[[1u32, 5, 7, 0, 0, 0], [3, 4, 9, 12, 2, 0]], &Device::Cpu).unwrap();
    let y = m.forward(&ids).unwrap();
    assert_eq!(y.dims(), &[2, 6, 16]);
    assert!(common::max_abs(&y).is_finite());
    println!("umt5: parameters and a tiny encode ok");
}

fn estimate_cli() {
    let cfg = WanConfig::t2v_1_3b();
    // `vramlab estimate` of Wan2.1 at 832×480, bf16, CFG, as JSON, plus `extra`.
    let wan = |extra: &[&str]| -> serde_json::Value {
        let out = common::vramlab()
            .args([
                "estimate",
                "--model",
                "wan2.1-t2v-1.3b",
                "--resolution",
                "832x480",
            ])
            .args(["--precision", "bf16", "--cfg", "--json"])
            .args(extra)
            .output()
            .unwrap();
        serde_json::from_slice(&common::ok_stdout(out)).unwrap()
    };
    let v = wan(&["--frames", "81"]);
    let bytes = |name: &str| common::named_u64(&v, "exact", name, "bytes");
    use vramlab::vocab::Component;
    // bf16 components, the VAE in f32 (WanPipeline's VAE is loaded in f32).
    for c in cfg.components() {
        let per = if c == Component::Vae { 4 } else { 2 };
        assert_eq!(bytes(c.as_str()), cfg.params_analytic(c) * per, "{c}");
    }
    let (lh, lw) = (480 / 8, 832 / 8);
    assert_eq!(bytes("latents"), 16 * 21 * lh * lw * 2);
    assert_eq!(bytes("decoded images"), 81 * 3 * 480 * 832 * 4);
    assert_eq!(
        bytes("feature cache"),
        cfg.vae.decoder_cache_per_latent_pixel() * lh * lw * 4
    );
    assert_eq!(bytes("text context"), 2 * 512 * 4096 * 2);
    // WanPipeline runs the conditional and unconditional passes one after the other.
    assert_eq!(v["denoiser_batch"], 1);
    println!("estimate wan: ok");

    // `--vae-decode tiled`: one 256² tile of every frame at a time, through its own feature
    // cache. diffusers (the default runtime) keeps every decoded tile until it blends them:
    // tiles of 32 latents every 24 give 32 + 32 + 12 latent rows (608 pixels) and
    // 4 · 32 + 8 columns (1,088); vramlab's candle decode holds one row strip of every frame,
    // the image's width.
    let decode_peak =
        |v: &serde_json::Value| common::named_u64(v, "phases", "vae_decode", "peak_bytes");
    let tiled = [
        "--frames",
        "81",
        "--vae-decode",
        "tiled",
        "--tile",
        "256",
        "--overlap",
        "64",
    ];
    let t = wan(&tiled);
    let tbytes = |name: &str| common::named_u64(&t, "exact", name, "bytes");
    assert_eq!(tbytes("decoded tiles"), 81 * 3 * 608 * 1088 * 4);
    assert_eq!(
        tbytes("feature cache"),
        cfg.vae.decoder_cache_per_latent_pixel() * (256 / 8) * (256 / 8) * 4
    );
    assert!(decode_peak(&t) < decode_peak(&v), "{t}");
    let candle = wan(&[tiled.as_slice(), &["--runtime", "candle"]].concat());
    assert_eq!(
        common::named_u64(&candle, "exact", "tile strip", "bytes"),
        81 * 3 * 256 * 832 * 4
    );
    println!("estimate wan tiled: ok");

    // Each GPU's most frames fit its budget, and 4 more (the next chunk) do not.
    let total = |frames: u64| -> u64 {
        wan(&["--frames", &frames.to_string()])["total_bytes"]
            .as_u64()
            .unwrap()
    };
    for g in v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["gb"] == 40 || g["gb"] == 80)
    {
        let budget = g["budget_bytes"].as_u64().unwrap();
        let most = g["largest_frames"].as_u64().unwrap();
        assert_eq!((most - 1) % 4, 0, "{g}");
        assert!(total(most) <= budget, "{g}");
        assert!(total(most + 4) > budget, "{g}");
    }
    println!("estimate wan most frames: ok");

    for (model, flag, value, key) in [
        ("wan2.1-t2v-1.3b", "--frames", "80", "--frames"),
        ("wan2.1-t2v-1.3b", "--resolution", "840x480", "--resolution"),
        ("sd15", "--frames", "5", "--frames"),
    ] {
        let mut args = vec![
            "estimate",
            "--model",
            model,
            "--resolution",
            "832x480",
            "--frames",
            "81",
        ];
        let i = args.iter().position(|a| *a == flag).unwrap();
        args[i + 1] = value;
        let res = common::vramlab().args(&args).assert().code(2);
        let err = String::from_utf8_lossy(&res.get_output().stderr).to_string();
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(key), "{err}");
    }
    println!("estimate wan bad inputs: ok");
}

/// Flash attention (self- and cross-attention through vramlab-kernels) gives eager's
/// prediction; its forward's peak does not hold the scores: at s video tokens, eager's peak
/// exceeds flash's by at least one score tensor, b · heads · s² · 4 bytes (eager also holds
/// the softmax beside the scores, so the gap is larger).
fn dit_flash() {
    let c = tiny_dit();
    let shapes = record(|vb| WanDit::new(&c, vb, Attention::Eager).map(|_| ()));
    let vb = random(&shapes);
    let eager = WanDit::new(&c, vb.clone(), Attention::Eager).unwrap();
    let flash = WanDit::new(&c, vb, Attention::Flash).unwrap();
    let dev = Device::Cpu;
    // Self-attention over 1·16·16 = 256 tokens, cross-attention to 7 text tokens (sq ≠ sk).
    let (b, f, h, w) = (1, 1, 32, 32);
    let x = Tensor::randn(0f32, 1.0, (b, 4, f, h, w), &dev).unwrap();
    let t = Tensor::new(&[700f32], &dev).unwrap();
    let ctx = Tensor::randn(0f32, 1.0, (b, 7, 16), &dev).unwrap();
    let ye = eager.forward(&x, &t, &ctx).unwrap();
    let yf = flash.forward(&x, &t, &ctx).unwrap();
    let d = max_diff(&ye, &yf);
    println!(
        "dit flash vs eager: max diff {d:e} (max |y| {})",
        common::max_abs(&ye)
    );
    assert!(
        d <= 1e-4 * common::max_abs(&ye).max(1.0),
        "flash vs eager: {d}"
    );

    let mut meter = CpuMeter::new();
    let mut peak = |m: &WanDit| {
        let (_y, mem, _) =
            vramlab::meter::measure(&mut meter, || Ok(m.forward(&x, &t, &ctx)?)).unwrap();
        mem.peak_allocated - mem.baseline_allocated
    };
    // Warm-up (gemm's per-thread buffers), then measured.
    peak(&eager);
    peak(&flash);
    let (pe, pf) = (peak(&eager), peak(&flash));
    let tokens = f * (h / 2) * (w / 2);
    let scores = (b * c.num_attention_heads * tokens * tokens * 4) as u64;
    println!("dit forward peak: eager {pe}, flash {pf}, scores {scores}");
    assert!(
        pe >= pf + scores,
        "eager {pe} − flash {pf} < the scores' {scores} bytes"
    );
}

/// LoRA parameters of rank r on the tiny DiT, from the config alone: per block 8 attention
/// linears dim → dim and the feed-forward's dim → ffn and ffn → dim, each r · (in + out).
fn lora_params(c: &WanTransformerConfig, r: usize) -> usize {
    let (d, f) = (c.dim(), c.ffn_dim);
    c.num_layers * r * (8 * (d + d) + (d + f) + (f + d))
}

/// LoRA training of the tiny DiT in process, on the counting allocator:
/// - the adapters have `lora_params` parameters, 2 tensors per linear, B zero;
/// - a backward gives gradients to the adapters and to no frozen linear weight;
/// - flash attention's gradients equal eager's;
/// - per step, the gradients held at the end of backward are the adapters' bytes, AdamW's state
///   at the end of the optimizer phase is twice that (m and v in f32), each over the live bytes
///   before the step plus ≤ 1 KiB of bookkeeping per tensor;
/// - two steps have the same forward and backward peaks over their baseline (±0.1 %), the loss
///   is finite, and B is no longer zero after one AdamW step.
fn dit_lora() {
    use candle_core::backprop::GradStore;
    use vramlab::workload::finetune::{attach_lora, run, Inputs};
    use vramlab::workload::training::TrainSpec;
    let c = tiny_dit();
    let dev = Device::Cpu;
    let shapes = record(|vb| WanDit::new(&c, vb, Attention::Eager).map(|_| ()));
    let vb = random(&shapes);
    let rank = 4;
    let inputs = Inputs::of_shape((2, 4, 2, 8, 8), (2, 7, 16), DType::F32, &dev).unwrap();
    let mut grads: Vec<GradStore> = Vec::new();
    let mut models = Vec::new();
    for attention in [Attention::Eager, Attention::Flash] {
        let mut m = WanDit::new(&c, vb.clone(), attention).unwrap();
        let vars = attach_lora(&mut m, rank, DType::F32, &dev).unwrap();
        let n: usize = vars.iter().map(|v| v.elem_count()).sum();
        assert_eq!(n, lora_params(&c, rank as usize), "LoRA parameters");
        assert_eq!(vars.len(), 2 * 10 * c.num_layers);
        let x = ((&inputs.x0 + &inputs.noise).unwrap() * 0.5).unwrap();
        let y = m
            .forward(&x, &(&inputs.t * 1000.0).unwrap(), &inputs.text)
            .unwrap();
        let g = y.sqr().unwrap().mean_all().unwrap().backward().unwrap();
        for v in &vars {
            assert!(g.get(v.as_tensor()).is_some(), "an adapter has no gradient");
        }
        models.push((m, vars));
        grads.push(g);
    }
    // No frozen linear weight (2-d, of the base) gets a gradient.
    let base: Vec<(String, Tensor)> = shapes
        .iter()
        .filter(|(_, s)| s.len() == 2)
        .map(|(n, s)| (n.clone(), vb.get(s.as_slice(), n).unwrap()))
        .collect();
    for (n, t) in &base {
        assert!(grads[0].get(t).is_none(), "{n} got a gradient");
    }
    // Flash's adapter gradients equal eager's.
    let mut worst = 0f32;
    for (ve, vf) in models[0].1.iter().zip(&models[1].1) {
        let (ge, gf) = (
            grads[0].get(ve.as_tensor()).unwrap(),
            grads[1].get(vf.as_tensor()).unwrap(),
        );
        let scale = common::max_abs(ge).max(1e-3);
        worst = worst.max(max_diff(ge, gf) / scale);
    }
    println!("lora gradients, flash vs eager: max relative diff {worst:e}");
    assert!(worst <= 1e-3, "flash gradients differ: {worst}");
    drop(grads);

    let (m, vars) = &models[0];
    let lora_bytes = (lora_params(&c, rank as usize) * 4) as i64;
    let mut meter = CpuMeter::new();
    let mut first_losses = Vec::new();
    for (ckpt, ga) in [
        (Checkpointing::None, 1),
        (Checkpointing::Layer, 1),
        (Checkpointing::None, 2),
    ] {
        let spec = TrainSpec {
            batch: 2,
            seq: 7,
            optimizer: Optimizer::Adamw,
            checkpointing: ckpt,
            grad_accum: ga,
            steps: 2,
            lr: 1e-3,
        };
        // Fresh adapters (B zero again): a run starts from PEFT's init.
        for v in vars.iter().skip(1).step_by(2) {
            v.set(&v.zeros_like().unwrap()).unwrap();
        }
        let mut rows = Vec::new();
        let losses = run(m, vars, &inputs, &spec, &mut meter, &mut |r, _| {
            rows.push(r);
            Ok(())
        })
        .unwrap();
        assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
        first_losses.push(losses[0]);
        println!("{ckpt:?} ga{ga}: losses {losses:?}");
        common::check_lora_steps(&rows, lora_bytes, vars.len(), &format!("{ckpt:?} ga{ga}"));
        for b in vars.iter().skip(1).step_by(2) {
            assert!(common::max_abs(b.as_tensor()) > 0.0, "B still zero");
        }
    }
    // Checkpointing and accumulation see the same first loss as one full pass (B starts at
    // zero each time, the batch is the same).
    for l in &first_losses[1..] {
        assert!(
            (l - first_losses[0]).abs() <= 1e-5 * first_losses[0].abs(),
            "{first_losses:?}"
        );
    }
    // Exact across ranks: the bookkeeping per tensor does not depend on its size, so between
    // r = 8 and r = 4 (the same 40 adapter tensors) the gradients differ by exactly the
    // adapters' bytes and AdamW's state by twice that.
    let mut figures = |rank: u32| {
        let mut m = WanDit::new(&c, vb.clone(), Attention::Eager).unwrap();
        let vars = attach_lora(&mut m, rank, DType::F32, &dev).unwrap();
        let spec = common::tiny_train_spec(1);
        let mut rows = Vec::new();
        run(&m, &vars, &inputs, &spec, &mut meter, &mut |r, _| {
            rows.push(r);
            Ok(())
        })
        .unwrap();
        let at = |ph: Phase| rows.iter().find(|r| r.phase == ph).unwrap().mem;
        let before = at(Phase::Forward).baseline_allocated as i64;
        (
            at(Phase::Backward).end_allocated as i64 - before,
            at(Phase::Optimizer).end_allocated as i64 - before,
        )
    };
    let (g4, s4) = figures(4);
    let (g8, s8) = figures(8);
    let delta = ((lora_params(&c, 8) - lora_params(&c, 4)) * 4) as i64;
    println!(
        "r8 − r4: gradients {} B, state {} B, adapters {delta} B",
        g8 - g4,
        s8 - s4
    );
    assert_eq!(g8 - g4, delta, "r8 − r4 gradient bytes");
    assert_eq!(s8 - s4, 2 * delta, "r8 − r4 AdamW state bytes");
    println!("dit lora: ok");
}

/// The tiny transformer as a diffusers directory (WanPipeline, synthetic f32 transformer).
fn tiny_wan_dir(dir: &std::path::Path) {
    use vramlab::model::diffusion::{weights_file, write_config};
    use vramlab::vocab::Component;
    let c = tiny_dit();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("model_index.json"),
        r#"{"_class_name": "WanPipeline"}"#,
    )
    .unwrap();
    write_config(dir, Component::Transformer, &c).unwrap();
    vramlab::model::synth::write_tensors(
        vramlab::model::diffusion::denoiser::shapes(&c),
        DType::F32,
        vramlab::model::synth::SEED,
        &weights_file(dir, Component::Transformer),
    )
    .unwrap();
}

/// `vramlab sweep` of a LoRA scenario on the tiny diffusers directory: a load row, then
/// forward, backward, optimizer and step_total rows per step, mode train, the adapters'
/// count, the weights and AdamW's state as features, a finite loss.
fn lora_sweep_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-wan");
    tiny_wan_dir(&dir);
    let scenario = tmp.path().join("s.toml");
    std::fs::write(
        &scenario,
        format!(
            "name = \"t\"\n[model]\nsource = \"diffusers:{}\"\n[sweep]\nmode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\nresolution = [\"32x32\"]\nframes = [5]\ntrainable = [\"lora-r4\"]\nattention = [\"eager\", \"flash\"]\ntrain_steps = 2\n",
            dir.display()
        ),
    )
    .unwrap();
    let out = tmp.path().join("t.csv");
    common::vramlab()
        .args(["sweep", "--quiet"])
        .arg(&scenario)
        .arg("--out")
        .arg(&out)
        .assert()
        .success();
    let rows = vramlab::export::csv::read(&out).unwrap();
    let c = tiny_dit();
    let lora = lora_params(&c, 4) as u64;
    for attention in ["eager", "flash"] {
        let pr: Vec<_> = rows
            .iter()
            .filter(|r| r.attention.as_str() == attention)
            .collect();
        common::assert_train_rows(&pr, 2, attention);
        for r in &pr {
            assert_eq!(r.param_count, wan::transformer_params(&c));
            assert_eq!(r.frames, Some(5));
        }
        assert_eq!(pr[0].message, format!("lora_params={lora}"));
        assert_eq!(
            pr[0].feature_weight_bytes,
            Some(wan::transformer_params(&c) * 4)
        );
        assert_eq!(pr[1].feature_optimizer_bytes, Some(2 * lora * 4));
        let loss: f32 = pr[4]
            .message
            .strip_prefix("loss=")
            .unwrap()
            .parse()
            .unwrap();
        assert!(loss.is_finite() && loss > 0.0, "{}", pr[4].message);
    }
    // `--resume` finds both points finished (each has its last step's step_total row) and
    // runs nothing: the CSV is as it was.
    let before = std::fs::read_to_string(&out).unwrap();
    common::vramlab()
        .args(["sweep", "--quiet", "--resume"])
        .arg(&scenario)
        .arg("--out")
        .arg(&out)
        .assert()
        .success();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), before);
    println!("lora sweep: ok");
}

fn gshape(side: usize, frames: usize, batch: usize, cfg: bool, decode: VaeDecode) -> GenShape {
    GenShape {
        batch,
        resolution: Resolution {
            width: side,
            height: side,
        },
        frames,
        cfg,
        steps: 2,
        vae_decode: decode,
        tile: 32,
        overlap: 16,
    }
}

/// Every component's stored shapes (from building its modules over the shape recorder, the
/// VAE with its encoder) agree with the analytic count from the config, for Wan2.1-T2V-1.3B
/// and the tiny config; the real counts are the published ones (`published_counts` in
/// `model/diffusion/wan/config.rs`).
fn pipeline_counts() {
    for cfg in [WanConfig::t2v_1_3b(), common::tiny_wan()] {
        let p = Wan::new(cfg.clone(), DType::F32, DType::F32);
        for c in p.components() {
            assert_eq!(p.params(c), p.params_analytic(c), "{} {c}", cfg.name);
            println!("{} {c}: {} parameters", cfg.name, p.params(c));
        }
    }
    let real = diffusion::preset(GenModel::Wan21T2v13b, DType::BF16, None).unwrap();
    assert_eq!(real.architecture(), "wan");
    assert_eq!(real.dtype(Component::Transformer), DType::BF16);
    assert_eq!(real.dtype(Component::TextEncoder), DType::BF16);
    assert_eq!(
        real.dtype(Component::Vae),
        DType::F32,
        "diffusers' Wan VAE runs f32"
    );
    assert_eq!(real.params(Component::Transformer), 1_418_996_800);
    assert_eq!(real.params(Component::Vae), 126_892_531);
    assert_eq!(real.params(Component::TextEncoder), 5_680_910_336);
    assert_eq!(real.text_len(), 512);
    // (b, 16, (81 − 1)/4 + 1, 480/8, 832/8)
    let r = Resolution {
        width: 832,
        height: 480,
    };
    assert_eq!(real.latent_shape(r, 1, 81), vec![1, 16, 21, 60, 104]);
    println!("pipeline counts: ok");
}

/// The tiny Wan pipeline (`common::load_lab`) in `dtype`, its VAE in f32.
fn load_tiny(dtype: DType) -> Lab {
    common::load_lab(
        &Wan::new(common::tiny_wan(), dtype, DType::F32),
        dtype,
        "wan",
    )
}

/// Each load row keeps the component's parameters (analytic, from the config) × its dtype's
/// bytes, plus under 512 B of module structs per stored tensor.
fn load_rows(l: &Lab) {
    let cfg = common::tiny_wan();
    assert_eq!(
        l.loads.iter().map(|r| r.0).collect::<Vec<_>>(),
        cfg.components()
    );
    for (c, m, _) in &l.loads {
        let bytes = cfg.params_analytic(*c) * l.p.dtype(*c).size_in_bytes() as u64;
        common::load_keeps(*c, m, bytes, cfg.shapes(*c).len() as u64);
    }
}

/// Bytes of a fresh f32 tensor of `shape` as the counter sees it: measured (data plus
/// candle's headers, whose layout grows with the rank).
fn fresh_f32(meter: &mut CpuMeter, shape: &[usize]) -> u64 {
    let (t, m, _) = vramlab::meter::measure(meter, || {
        Ok(Tensor::zeros(shape, DType::F32, &Device::Cpu)?)
    })
    .unwrap();
    drop(t);
    m.end_allocated - m.baseline_allocated
}

/// Two denoising steps have the same peak (±0.1 %); the decode returns exactly
/// b × 3 × frames × H × W × 4 bytes and keeps nothing else, `full` and `sliced`.
fn steps_and_output(l: &mut Lab) {
    for (side, frames, b, d) in [
        (32, 5, 1, VaeDecode::Full),
        (48, 9, 2, VaeDecode::Full),
        (32, 5, 2, VaeDecode::Sliced),
    ] {
        let g = gshape(side, frames, b, true, d);
        let m = common::equal_steps(l.p.as_ref(), &g, &mut l.meter);
        let want = (b * 3 * frames * side * side * 4) as u64;
        assert_eq!(m.output_bytes, want, "{side} f{frames} b{b} {d}");
        let fresh = fresh_f32(&mut l.meter, &[b, 3, frames, side, side]);
        assert!(fresh >= want && fresh - want < 1024, "{fresh} vs {want}");
        let kept = m.vae_decode.0.end_allocated - m.vae_decode.0.baseline_allocated;
        assert_eq!(
            kept, fresh,
            "{side} f{frames} b{b} {d}: the decode keeps the output"
        );
    }
    println!("equal steps, decode output exact: ok");
}

/// The decode's peak minus its output and its input latents stops growing after the first
/// chunks: the same (±1 %) at 9, 13 and 17 frames, not higher at 5; `sliced` at batch 2
/// peaks below `full` (one video's activations at a time).
fn decode_flat_in_pipeline(l: &mut Lab) {
    let (side, b) = (32, 1);
    let mut rest = Vec::new();
    for frames in [5usize, 9, 13, 17] {
        let g = gshape(side, frames, b, false, VaeDecode::Full);
        let m = generate::run(l.p.as_ref(), &g, &Device::Cpu, &mut l.meter).unwrap();
        let z: usize = l.p.latent_shape(g.resolution, b, frames).iter().product();
        let over = common::act(&m.vae_decode.0) - m.output_bytes as f64 - (z * 4) as f64;
        println!("pipeline decode, {frames} frames: peak − output − latents {over}");
        rest.push(over);
    }
    for r in &rest[2..] {
        assert!((r - rest[1]).abs() / rest[1] <= 0.01, "{rest:?}");
    }
    assert!(rest[0] <= rest[1], "{rest:?}");
    let mut peak = |d: VaeDecode| {
        let g = gshape(side, 9, 2, false, d);
        let m = generate::run(l.p.as_ref(), &g, &Device::Cpu, &mut l.meter).unwrap();
        common::act(&m.vae_decode.0) - m.output_bytes as f64
    };
    let (full, sliced) = (peak(VaeDecode::Full), peak(VaeDecode::Sliced));
    println!("batch 2, 9 frames: full {full}, sliced {sliced} (peak − output)");
    assert!(sliced < full, "sliced {sliced} vs full {full}");
    println!("pipeline decode peak flat over frames: ok");
}

/// `tiled` decodes spatial tiles of every frame: with one tile as large as the image it is the
/// full decode, bit for bit; with 16-pixel tiles (2×2 latents, 1 of overlap) over a 32-pixel
/// wide video of 5 frames, the output is exact and the peak beyond it does not grow with the
/// height (the strip of one tile row is as wide as the image, so the width is held).
fn tiled_in_pipeline(l: &mut Lab) {
    let shape = |h: usize, decode: VaeDecode, tile: usize| GenShape {
        resolution: Resolution {
            width: 32,
            height: h,
        },
        tile,
        overlap: 8,
        ..gshape(32, 5, 1, false, decode)
    };
    let g = shape(32, VaeDecode::Full, 32);
    let zs = l.p.latent_shape(g.resolution, 1, 5);
    let z = Tensor::randn(0f32, 1.0, zs, &Device::Cpu).unwrap();
    let full = l.p.decode(&z, &g).unwrap();
    let one_tile = l.p.decode(&z, &shape(32, VaeDecode::Tiled, 32)).unwrap();
    assert_eq!(max_diff(&full, &one_tile), 0.0);
    let mut rest = Vec::new();
    for h in [32, 48, 64, 80] {
        let g = shape(h, VaeDecode::Tiled, 16);
        let m = generate::run(l.p.as_ref(), &g, &Device::Cpu, &mut l.meter).unwrap();
        let want = (3 * 5 * h * 32 * 4) as u64;
        assert_eq!(m.output_bytes, want, "tiled {h}");
        rest.push(common::act(&m.vae_decode.0) - want as f64);
    }
    println!("tiled peak − output by height: {rest:?}");
    for r in &rest {
        assert!(
            (r - rest[0]).abs() / rest[0] <= 0.01,
            "tiled grew: {rest:?}"
        );
    }
    println!("tiled decode: ok");
}

/// CFG as WanPipeline runs it: the negative prompt is encoded by its own call (the text
/// encoder's transient is that of `batch` prompts, on or off) and kept (twice the embeddings);
/// each step calls the transformer twice at `batch` (not once on a doubled batch): the step's
/// peak grows by at least the conditional prediction it keeps across the second call, and by
/// less than half the single call's activations (a doubled batch would double the attention).
fn cfg_on_off(l: &mut Lab) {
    let run = |l: &mut Lab, cfg: bool| {
        let g = gshape(48, 9, 1, cfg, VaeDecode::Full);
        common::equal_steps(l.p.as_ref(), &g, &mut l.meter)
    };
    let (on, off) = (run(l, true), run(l, false));
    let kept = |m: &generate::Measured| {
        (m.text_encode.0.end_allocated - m.text_encode.0.baseline_allocated) as f64
    };
    let emb = fresh_f32(
        &mut l.meter,
        &[1, 512, common::tiny_wan().text_encoder.d_model],
    ) as f64;
    println!(
        "text_encode kept: cfg {} no cfg {} (one embedding {emb})",
        kept(&on),
        kept(&off)
    );
    // The embeddings, and the phase's Vec of them (under 64 B).
    let (k_off, k_on) = (kept(&off) - emb, kept(&on) - 2.0 * emb);
    assert!(
        (0.0..64.0).contains(&k_off),
        "one prompt's embeddings: {k_off}"
    );
    assert!(
        (0.0..64.0).contains(&k_on),
        "the prompt's and the negative's: {k_on}"
    );
    let transient = |m: &generate::Measured| common::act(&m.text_encode.0) - kept(m);
    let (t_on, t_off) = (transient(&on), transient(&off));
    assert!(
        (t_on - t_off).abs() <= 0.01 * t_off + emb,
        "text encoder transient: cfg {t_on} vs {t_off}"
    );
    let (a_on, a_off) = (
        common::act(&on.denoise[0].0),
        common::act(&off.denoise[0].0),
    );
    let lat: usize =
        l.p.latent_shape(gshape(48, 9, 1, true, VaeDecode::Full).resolution, 1, 9)
            .iter()
            .product();
    println!(
        "denoise step: cfg {a_on}, no cfg {a_off}, prediction {} B",
        lat * 4
    );
    assert!(a_on - a_off >= (lat * 4) as f64, "cfg {a_on} vs {a_off}");
    assert!(a_on - a_off < 0.5 * a_off, "cfg {a_on} vs {a_off}");
    println!("cfg on vs off: ok");
}

/// The real pipeline's dtypes on this CPU: the transformer and umT5 in bf16 and in f16, the
/// VAE in f32. Every phase runs; the load rows keep params × 2 for the 16-bit components; the
/// video is f32 and finite.
fn sixteen_bit() {
    for dt in [DType::BF16, DType::F16] {
        let mut l = load_tiny(dt);
        load_rows(&l);
        let g = gshape(32, 5, 1, true, VaeDecode::Full);
        let m = common::equal_steps(l.p.as_ref(), &g, &mut l.meter);
        assert_eq!(m.output_bytes, (3 * 5 * 32 * 32 * 4) as u64);
        let ids = l.p.prompt_ids(1, &Device::Cpu).unwrap();
        let cond = l.p.encode_text(&ids, false).unwrap();
        assert_eq!(cond[0].dtype(), dt);
        let lat = Tensor::randn(
            0f32,
            1.0,
            l.p.latent_shape(g.resolution, 1, 5),
            &Device::Cpu,
        )
        .unwrap()
        .to_dtype(dt)
        .unwrap();
        let next = l.p.denoise_step(&lat, 0, 2, &cond, false).unwrap();
        let video = l.p.decode(&l.p.vae_latents(&next).unwrap(), &g).unwrap();
        assert_eq!(video.dtype(), DType::F32);
        assert_eq!(video.dims(), &[1, 3, 5, 32, 32]);
        assert!(common::max_abs(&video).is_finite());
        println!("{dt:?} transformer and text encoder, f32 VAE: ok");
    }
}

/// `vramlab sweep` on the tiny directory with `frames = [5, 9]`: per point a `load` per
/// component (weights = params × 4), `text_encode`, two `denoise`, `vae_decode` (its output
/// bytes in the message), `total`; `frames` in the CSV and the point id. Frames that are not
/// 4k+1, a missing `frames` and `sliced` attention are one line naming the key, exit 2.
fn cli_sweep(l: &Lab) {
    let tmp = tempfile::tempdir().unwrap();
    let run = |sweep: &str| l.sweep_cli(tmp.path(), sweep);
    common::ok_stdout(run(
        "resolution = [\"32x32\"]\nframes = [5, 9]\ndenoise_steps = 2\n",
    ));
    let rows = common::read_rows(&tmp.path().join("o.csv"));
    use vramlab::vocab::{Phase, Status};
    let cfg = common::tiny_wan();
    for (frames, point) in [5u64, 9].iter().zip(rows.chunks(8)) {
        let phases: Vec<Phase> = point.iter().map(|r| r.phase.unwrap()).collect();
        assert_eq!(
            phases,
            [
                [Phase::Load; 3].as_slice(),
                &[Phase::TextEncode, Phase::Denoise, Phase::Denoise],
                &[Phase::VaeDecode, Phase::Total]
            ]
            .concat()
        );
        for r in point {
            assert_eq!(r.status, Some(Status::Ok), "{:?}: {}", r.phase, r.message);
            assert_eq!(r.architecture, "wan");
            assert_eq!(r.frames, Some(*frames));
            assert_eq!(r.context, 512);
            assert_eq!(r.cfg, Some(true), "Wan runs CFG by default");
            assert!(
                r.point_id.contains(&format!("/f{frames}/")),
                "{}",
                r.point_id
            );
        }
        for r in point.iter().filter(|r| r.phase == Some(Phase::Load)) {
            let c = r.component.unwrap();
            assert_eq!(
                r.feature_weight_bytes,
                Some(cfg.params_analytic(c) * 4),
                "{c}"
            );
            assert_eq!(r.message, "dtype=f32", "{c}: the component's dtype");
        }
        let decode = &point[6];
        assert_eq!(
            decode.message,
            format!("output_bytes={}", 3 * frames * 32 * 32 * 4)
        );
        let peak = point
            .iter()
            .take(7)
            .map(|r| r.peak_allocated.unwrap())
            .max();
        assert_eq!(point[7].peak_allocated, peak);
    }
    let bad = |sweep: &str, needle: &str| {
        common::one_line_exit_2(&run(&format!("resolution = [\"32x32\"]\n{sweep}")), needle)
    };
    bad(
        "frames = [6]\n",
        "decodes 4k+1 frames (1, 5, 9, ...; the VAE's temporal factor 4)",
    );
    bad("cfg = [true]\n", "[sweep] `frames` is missing: ");
    bad(
        "frames = [5]\nattention = [\"sliced\"]\n",
        "line 11: [sweep] attention `sliced`: Wan's DiT has no sliced attention",
    );
    println!("cli sweep: ok");
}

fn main() {
    // One compute thread: every peak is reproducible.
    std::env::set_var("RAYON_NUM_THREADS", "1");
    conv3d_reference();
    decoder_params();
    let c = common::tiny_vae();
    let dec = WanDecoder::new(&c, random(&decoder_shapes(&c))).unwrap();
    chunked_decode(&dec, &c);
    decode_peak_flat(&dec, &c);
    dit();
    dit_flash();
    dit_lora();
    lora_sweep_cli();
    umt5();
    estimate_cli();
    pipeline_counts();
    let mut l = load_tiny(DType::F32);
    load_rows(&l);
    // Warm-up: candle's gemm keeps per-thread buffers; the first run carries them.
    generate::run(
        l.p.as_ref(),
        &gshape(48, 9, 2, true, VaeDecode::Full),
        &Device::Cpu,
        &mut l.meter,
    )
    .unwrap();
    steps_and_output(&mut l);
    decode_flat_in_pipeline(&mut l);
    tiled_in_pipeline(&mut l);
    cfg_on_off(&mut l);
    cli_sweep(&l);
    sixteen_bit();
    println!("wan: all checks passed");
}
