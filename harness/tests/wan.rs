//! Wan2.1 T2V (issue 17): the causal conv3d from conv2d against a naive f64 loop, the chunked
//! VAE decode against a two-chunk decode, the decoder's peak over frames with the CPU counting
//! allocator, and `vramlab estimate --model wan2.1-t2v-1.3b`. Every expected figure is derived
//! from the configs or measured here.
//!
//! The counter is process-global: this binary has no libtest harness (`harness = false`),
//! `main` runs each check in turn on the main thread.
mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use vramlab::meter::cpu::CpuMeter;
use vramlab::model::conv3d::{CausalConv3d, FeatCache};
use vramlab::model::pipeline::{count, record, Shapes};
use vramlab::model::umt5::UmT5Encoder;
use vramlab::model::wan::{self, WanConfig, WanVaeConfig};
use vramlab::model::wan_dit::WanDit;
use vramlab::model::wan_vae::WanDecoder;
use vramlab::vocab::Attention;

/// A Wan2.1-shaped VAE (4 levels, temporal upsampling in the first two up blocks: stride
/// 4 × 8 × 8), narrow.
fn tiny_vae() -> WanVaeConfig {
    WanVaeConfig {
        base_dim: 8,
        z_dim: 4,
        dim_mult: vec![1, 2, 4, 4],
        num_res_blocks: 1,
        attn_scales: vec![],
        temperal_downsample: vec![false, true, true],
        latents_mean: vec![],
        latents_std: vec![],
    }
}

/// Random tensors of `shapes` (norm gammas around 1).
fn random(shapes: &Shapes) -> VarBuilder<'static> {
    let dev = Device::Cpu;
    let map: HashMap<String, Tensor> = shapes
        .iter()
        .map(|(n, s)| {
            let mean = if n.ends_with("gamma") { 1.0 } else { 0.0 };
            let std = if n.ends_with("gamma") { 0.1 } else { 0.2 };
            (
                n.clone(),
                Tensor::randn(mean, std, s.as_slice(), &dev).unwrap(),
            )
        })
        .collect();
    VarBuilder::from_tensors(map, DType::F32, &dev)
}

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
    for c in [tiny_vae(), WanConfig::t2v_1_3b().vae] {
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

/// The built DiT has the parameters counted from the config (the real Wan2.1 1.3B and a tiny
/// one); the tiny one runs a step: its prediction has the latents' shape.
fn dit() {
    let real = WanConfig::t2v_1_3b().transformer;
    let shapes = record(|vb| WanDit::new(&real, vb, Attention::Eager).map(|_| ()));
    assert_eq!(count(&shapes), wan::transformer_params(&real));
    let mut tiny = real.clone();
    tiny.num_attention_heads = 2;
    tiny.attention_head_dim = 12;
    tiny.ffn_dim = 40;
    tiny.num_layers = 2;
    tiny.text_dim = 16;
    tiny.freq_dim = 8;
    tiny.in_channels = 4;
    tiny.out_channels = 4;
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
    let out = common::vramlab()
        .args([
            "estimate",
            "--model",
            "wan2.1-t2v-1.3b",
            "--resolution",
            "832x480",
            "--frames",
            "81",
            "--precision",
            "bf16",
            "--cfg",
            "--json",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&common::ok_stdout(out)).unwrap();
    let bytes = |name: &str| -> u64 {
        v["exact"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no `{name}` row"))["bytes"]
            .as_u64()
            .unwrap()
    };
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

    // Each GPU's most frames fit its budget, and 4 more (the next chunk) do not.
    let total = |frames: u64| -> u64 {
        let f = frames.to_string();
        let out = common::vramlab()
            .args([
                "estimate",
                "--model",
                "wan2.1-t2v-1.3b",
                "--resolution",
                "832x480",
            ])
            .args(["--frames", &f, "--precision", "bf16", "--cfg", "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&common::ok_stdout(out)).unwrap();
        v["total_bytes"].as_u64().unwrap()
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

fn main() {
    // One compute thread: every peak is reproducible.
    std::env::set_var("RAYON_NUM_THREADS", "1");
    conv3d_reference();
    decoder_params();
    let c = tiny_vae();
    let dec = WanDecoder::new(&c, random(&decoder_shapes(&c))).unwrap();
    chunked_decode(&dec, &c);
    decode_peak_flat(&dec, &c);
    dit();
    umt5();
    estimate_cli();
    println!("wan: all checks passed");
}
