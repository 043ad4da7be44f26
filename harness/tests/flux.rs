//! FLUX.1 (a DiT image model): the published parameter counts from the configs alone
//! and from candle's modules; the estimate of `flux-dev`; a tiny FLUX pipeline written as a
//! synthetic diffusers directory, read back by the real loader (`model_index.json` →
//! `FluxPipeline`) and measured with the CPU counting allocator: every expected figure is
//! derived from the config, never copied from a run.
//!
//! The counter is process-global: this binary has no libtest harness (`harness = false`),
//! `main` runs each check in turn on the main thread.
mod common;
use common::{act, one_line_exit_2, Lab};
use vramlab::meter::PhaseMemory;

use candle_core::{DType, Device};
use vramlab::model::diffusion;
use vramlab::model::diffusion::flux::{
    diffusers_names, params_analytic, Flux, FluxConfig, FluxVaeConfig, T5Arch, T5Config,
    T5FeedForward, TransformerConfig,
};
use vramlab::model::diffusion::sd::VaeConfig;
use vramlab::vocab::{Attention, Component, GenModel, Resolution, VaeDecode};
use vramlab::workload::generate::{self, GenShape};

/// One double block, two single blocks (2 heads of 16), a four-block 16-channel VAE (the
/// factor of 8, 16 with the packing), a two-layer CLIP and a two-layer gated T5 of 16 tokens.
fn tiny() -> FluxConfig {
    FluxConfig {
        name: "tiny-flux".into(),
        transformer: TransformerConfig {
            patch_size: 1,
            in_channels: 64,
            out_channels: None,
            num_layers: 1,
            num_single_layers: 2,
            attention_head_dim: 16,
            num_attention_heads: 2,
            joint_attention_dim: 32,
            pooled_projection_dim: 32,
            guidance_embeds: true,
            axes_dims_rope: vec![4, 6, 6],
        },
        vae: FluxVaeConfig {
            base: VaeConfig {
                latent_channels: 16,
                ..common::tiny_sd().vae
            },
            use_quant_conv: false,
            use_post_quant_conv: false,
            shift_factor: 0.1159,
        },
        text_encoder: common::tiny_sd().text_encoder,
        text_encoder_2: T5Config {
            architectures: vec![T5Arch::T5EncoderModel],
            vocab_size: 100,
            d_model: 32,
            d_kv: 8,
            d_ff: 64,
            num_layers: 2,
            num_heads: 4,
            relative_attention_num_buckets: 32,
            relative_attention_max_distance: 128,
            layer_norm_epsilon: 1e-6,
            feed_forward_proj: T5FeedForward::GatedGelu,
            tie_word_embeddings: false,
        },
        text_len: 16,
    }
}

fn shape(w: usize, h: usize, batch: usize, decode: VaeDecode) -> GenShape {
    GenShape {
        batch,
        resolution: Resolution {
            width: w,
            height: h,
        },
        frames: 1,
        cfg: false,
        steps: 2,
        vae_decode: decode,
        tile: 32,
        overlap: 16,
    }
}

/// Shapes recorded from candle's modules agree with the independent analytic count for every
/// component of the presets and of the tiny config; FLUX.1-dev gives the published counts.
fn parameter_counts() {
    for cfg in [
        FluxConfig::preset(GenModel::FluxDev),
        FluxConfig::preset(GenModel::FluxSchnell),
        tiny(),
    ] {
        let mut total = 0;
        for c in cfg.components() {
            let (recorded, analytic) = (cfg.params(c), params_analytic(&cfg, c));
            assert_eq!(recorded, analytic, "{} {c}: recorded vs analytic", cfg.name);
            println!("{} {c}: {recorded} parameters", cfg.name);
            total += recorded;
        }
        println!("{}: {total} parameters in all", cfg.name);
    }
    // Published counts of black-forest-labs/FLUX.1-dev, as `num_parameters()` gives them:
    // the transformer's 11,901,408,320 ("12B", the model card; BFL's flux1-dev.safetensors
    // holds the same tensors), google/t5-v1_1-xxl's encoder 4,762,310,656, OpenAI's CLIP
    // ViT-L/14 text model 123,060,480 (the SD 1.5 text encoder's, tests/generate.rs). The
    // VAE's 83,819,683 is by arithmetic from SD's published 83,653,863: no quant convs
    // (−72 − 20), 16 latent channels in the encoder's conv_out (512·32·9 + 32 instead of
    // 512·8·9 + 8: +110,616) and the decoder's conv_in (16·512·9 + 512 instead of
    // 4·512·9 + 512: +55,296).
    let dev = FluxConfig::preset(GenModel::FluxDev);
    assert_eq!(dev.params(Component::Transformer), 11_901_408_320);
    assert_eq!(dev.params(Component::TextEncoder2), 4_762_310_656);
    assert_eq!(dev.params(Component::TextEncoder), 123_060_480);
    assert_eq!(
        dev.params(Component::Vae),
        83_653_863 - 72 - 20 + 110_616 + 55_296
    );
    assert_eq!(dev.params(Component::Vae), 83_819_683);
    // FLUX.1-schnell lacks the guidance embedder (two linears 256 → 3072 → 3072).
    let schnell = FluxConfig::preset(GenModel::FluxSchnell);
    assert_eq!(
        dev.params(Component::Transformer) - schnell.params(Component::Transformer),
        256 * 3072 + 3072 + 3072 * 3072 + 3072
    );
    // `diffusers:DIR` reads back the configs a synthetic directory writes.
    for cfg in [dev, tiny()] {
        let d = tempfile::tempdir().unwrap();
        cfg.write_configs(d.path()).unwrap();
        let back = FluxConfig::from_dir(d.path()).unwrap();
        assert_eq!(
            FluxConfig {
                name: cfg.name.clone(),
                ..back
            },
            cfg
        );
    }
    println!("parameter counts: ok");
}

fn vramlab(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(args)
        .output()
        .unwrap()
}

/// `vramlab estimate --model flux-dev --resolution 1024x1024 --precision bf16 --json`: every
/// component's bytes = its parameters × 2 (the VAE too: FluxPipeline does not upcast), the
/// packed latents, T5's 512 tokens plus CLIP's pooled vector, one denoiser batch; `--cfg` and
/// a resolution that is not a multiple of 16 are refused.
fn estimate() {
    let out = vramlab(&[
        "estimate",
        "--model",
        "flux-dev",
        "--resolution",
        "1024x768",
        "--batch",
        "2",
        "--precision",
        "bf16",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&common::ok_stdout(out)).unwrap();
    let bytes = |name: &str| common::named_u64(&v, "exact", name, "bytes");
    let cfg = FluxConfig::preset(GenModel::FluxDev);
    let mut params = 0;
    for c in cfg.components() {
        assert_eq!(bytes(c.as_str()), cfg.params(c) * 2, "{c}");
        params += cfg.params(c);
    }
    assert_eq!(v["model"]["params"].as_u64(), Some(params));
    assert_eq!(v["model"]["architecture"], "flux");
    // (1024/16)·(768/16) tokens of 64 channels = 16 × (1024/8)·(768/8).
    assert_eq!(bytes("latents"), 2 * 16 * 128 * 96 * 2);
    assert_eq!(bytes("text context"), 2 * (512 * 4096 + 768) * 2);
    assert_eq!(bytes("decoded images"), 2 * 3 * 1024 * 768 * 2);
    assert_eq!(v["denoiser_batch"], 2);
    let out = vramlab(&[
        "estimate",
        "--model",
        "flux-dev",
        "--resolution",
        "1024x1024",
    ]);
    common::ok_stdout(out);
    one_line_exit_2(
        &vramlab(&["estimate", "--model", "flux-dev", "--cfg"]),
        "--cfg: this model runs without classifier-free guidance",
    );
    one_line_exit_2(
        &vramlab(&[
            "estimate",
            "--model",
            "flux-dev",
            "--resolution",
            "1032x1024",
        ]),
        "--resolution 1032x1024 is not a multiple of 16",
    );
    println!("estimate: ok");
}

/// The tiny pipeline with synthetic weights in a diffusers directory, read back by
/// `pipeline::from_dir` and loaded under a fresh counting meter.
fn load_tiny() -> Lab {
    common::load_lab(
        &Flux::new(tiny(), DType::F32, DType::F32),
        DType::F32,
        "flux",
    )
}

/// Each load row keeps the component's weight bytes (params × 4, exact from the config; the
/// transformer's parameter-free LayerNorms add their ones, hidden × 4 each) plus the modules'
/// own structs: under 512 B per stored tensor.
fn load_rows(l: &Lab) {
    let cfg = tiny();
    assert_eq!(
        l.loads.iter().map(|r| r.0).collect::<Vec<_>>(),
        cfg.components()
    );
    for (c, m, _) in &l.loads {
        let mut w = params_analytic(&cfg, *c) * 4;
        if *c == Component::Transformer {
            w += (cfg.transformer_norms() * cfg.transformer.hidden_size() * 4) as u64;
        }
        common::load_keeps(*c, m, w, cfg.shapes(*c).len() as u64);
    }
}

/// Two consecutive denoising steps have the same peak (±0.1 %), and the analytic prior of a
/// step's activations (no fitted constants: a DiT's widest block, `GenArch::denoise_prior`, and
/// the materialized scores) does not fall short of the measured ones.
fn denoise(l: &mut Lab) {
    use vramlab::estimate::generate::estimate;
    use vramlab::terms::generation::{GenArch, GenQuery};
    use vramlab::vocab::{Backend, Phase, Runtime};
    let arch = GenArch::flux(&tiny());
    for (w, h, b) in [(64, 64, 1), (96, 64, 2), (256, 256, 1), (256, 256, 2)] {
        let g = shape(w, h, b, VaeDecode::Full);
        let m = common::equal_steps(l.p.as_ref(), &g, &mut l.meter);
        let (a, c) = (act(&m.denoise[0].0), act(&m.denoise[1].0));
        let q = GenQuery {
            batch: b as u64,
            resolution: g.resolution,
            frames: 1,
            cfg: false,
            vae_decode: VaeDecode::Full,
            tile: g.tile,
            overlap: g.overlap,
            dtype: DType::F32,
            vae_dtype: DType::F32,
            runtime: Runtime::Candle,
            backend: Backend::Cpu,
            attention: Attention::Eager,
        };
        let e = estimate(&arch, &q, None).unwrap();
        let prior = e.phases.iter().find(|p| p.name == Phase::Denoise).unwrap();
        let measured = a.max(c);
        println!(
            "denoise {w}x{h} b{b}: step activations {a} and {c}; prior {}",
            prior.activation_bytes
        );
        // Below a few hundred tokens the tiny model's per-step constants (modulation vectors,
        // rotary tables) outweigh its per-token tensors, which the prior counts.
        let ratio = prior.activation_bytes as f64 / measured;
        assert!(
            w * h < 256 * 256 || (1.0..1.5).contains(&ratio),
            "the prior ({} B) is {ratio:.2}× the measured step ({measured} B)",
            prior.activation_bytes
        );
    }
    println!("denoise: ok");
}

/// The decode's output tensor, exact to the byte (`common::decode_output_exact`).
fn decode_output_exact(l: &mut Lab) {
    let shapes: Vec<GenShape> = [
        (64, 64, 1, VaeDecode::Full),
        (96, 64, 2, VaeDecode::Full),
        (64, 96, 2, VaeDecode::Sliced),
        (64, 64, 1, VaeDecode::Tiled),
    ]
    .into_iter()
    .map(|(w, h, b, d)| shape(w, h, b, d))
    .collect();
    common::decode_output_exact(l.p.as_ref(), &mut l.meter, &shapes);
}

/// A diffusers-layout transformer (diffusers' tensor names, q/k/v split, `norm_out`'s halves
/// swapped) made from the synthetic BFL-named one loads through `DiffusersNames`: the load
/// keeps the same weight bytes and a denoising step gives the same output, bit for bit.
fn diffusers_names_load(l: &mut Lab) {
    use candle_core::Tensor;
    let cfg = tiny();
    let h = cfg.transformer.hidden_size();
    let dir = tempfile::tempdir().unwrap();
    cfg.write_configs(dir.path()).unwrap();
    for c in cfg.components() {
        let (from, to) = (
            diffusion::weights_file(l.dir.path(), c),
            diffusion::weights_file(dir.path(), c),
        );
        if c != Component::Transformer {
            std::fs::copy(from, to).unwrap();
            continue;
        }
        let mut out = std::collections::HashMap::new();
        for (name, t) in candle_core::safetensors::load(&from, &Device::Cpu).unwrap() {
            let (parts, swap) = diffusers_names(&name).unwrap_or_else(|| panic!("{name}"));
            let n = t.dim(0).unwrap();
            let t = if swap {
                Tensor::cat(
                    &[
                        t.narrow(0, n / 2, n / 2).unwrap(),
                        t.narrow(0, 0, n / 2).unwrap(),
                    ],
                    0,
                )
                .unwrap()
            } else {
                t
            };
            let sizes = match parts.len() {
                1 => vec![n],
                3 => vec![n / 3; 3],
                _ => vec![h, h, h, n - 3 * h],
            };
            let mut at = 0;
            for (p, k) in parts.into_iter().zip(sizes) {
                out.insert(p, t.narrow(0, at, k).unwrap().contiguous().unwrap());
                at += k;
            }
        }
        assert!(out.contains_key("x_embedder.weight"));
        assert!(out.contains_key("single_transformer_blocks.1.proj_mlp.weight"));
        candle_core::safetensors::save(&out, &to).unwrap();
    }
    let mut p = diffusion::from_dir(dir.path(), DType::F32, None).unwrap();
    let loads = generate::load(
        p.as_mut(),
        dir.path(),
        Attention::Eager,
        &Device::Cpu,
        &mut l.meter,
    )
    .unwrap();
    let kept = |r: &(Component, PhaseMemory, f64)| r.1.end_allocated - r.1.baseline_allocated;
    let w =
        (params_analytic(&cfg, Component::Transformer) + (cfg.transformer_norms() * h) as u64) * 4;
    let n = cfg.shapes(Component::Transformer).len() as u64;
    let k = kept(&loads[2]);
    assert_eq!(loads[2].0, Component::Transformer);
    assert!(
        k >= w && k - w <= 512 * n,
        "diffusers names: kept {k} for {w}"
    );
    let g = shape(64, 32, 1, VaeDecode::Full);
    let lat = Tensor::randn(
        0f32,
        1f32,
        l.p.latent_shape(g.resolution, 1, 1),
        &Device::Cpu,
    )
    .unwrap();
    let cond =
        l.p.encode_text(&l.p.prompt_ids(1, &Device::Cpu).unwrap(), false)
            .unwrap();
    let a = l.p.denoise_step(&lat, 0, 2, &cond, false).unwrap();
    let b = p.denoise_step(&lat, 0, 2, &cond, false).unwrap();
    assert_eq!(common::max_abs_diff(&a, &b), 0.0);
    println!("diffusers names: load kept {k} B, the same step output");
}

/// `vramlab sweep` on the tiny directory: one point's rows (a `load` per component in its
/// order, `text_encode`, a `denoise` per step, `vae_decode`, `total`), all `ok` and `flux`;
/// `cfg = true` and a resolution that is not a multiple of 16 are one line naming the
/// scenario's line and key, exit 2, before anything runs.
fn cli_sweep(l: &Lab) {
    let tmp = tempfile::tempdir().unwrap();
    let run = |sweep: &str| l.sweep_cli(tmp.path(), sweep);
    // No `cfg` in the table: FLUX runs without it (guidance-distilled).
    let out = run("resolution = [\"64x32\"]\ndenoise_steps = 2\n");
    common::ok_stdout(out);
    let rows = common::read_rows(&tmp.path().join("o.csv"));
    use vramlab::vocab::{Phase, Status};
    let phases: Vec<Phase> = rows.iter().map(|r| r.phase.unwrap()).collect();
    assert_eq!(
        phases,
        [
            [Phase::Load; 4].as_slice(),
            &[Phase::TextEncode, Phase::Denoise, Phase::Denoise],
            &[Phase::VaeDecode, Phase::Total]
        ]
        .concat()
    );
    let loaded: Vec<Component> = rows.iter().filter_map(|r| r.component).collect();
    assert_eq!(loaded, tiny().components());
    for r in &rows {
        assert_eq!(r.status, Some(Status::Ok), "{:?}: {}", r.phase, r.message);
        assert_eq!(r.architecture, "flux");
        assert_eq!(r.cfg, Some(false), "FLUX's default");
        assert_eq!(
            r.context, 16,
            "T5 tokens from tokenizer_2/tokenizer_config.json"
        );
    }
    one_line_exit_2(
        &run("resolution = [\"64x64\"]\ncfg = [true]\n"),
        "line 10: [sweep] cfg = true: ",
    );
    one_line_exit_2(
        &run("resolution = [\"72x64\"]\n"),
        "line 9: [sweep] resolution `72x64` is not a multiple of 16",
    );
    println!("cli sweep: ok");
}

fn main() {
    // One compute thread: candle's CPU ops split work over rayon/gemm threads whose transient
    // buffers overlap differently from run to run; on one thread every peak is reproducible.
    std::env::set_var("RAYON_NUM_THREADS", "1");
    parameter_counts();
    estimate();
    let mut l = load_tiny();
    load_rows(&l);
    // Warm-up: candle's gemm keeps per-thread buffers; the first run carries them.
    generate::run(
        l.p.as_ref(),
        &shape(64, 64, 1, VaeDecode::Full),
        &Device::Cpu,
        &mut l.meter,
    )
    .unwrap();
    denoise(&mut l);
    decode_output_exact(&mut l);
    diffusers_names_load(&mut l);
    cli_sweep(&l);
    println!("flux: all checks passed");
}
