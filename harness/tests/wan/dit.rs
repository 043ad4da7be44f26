//! Wan's DiT and UMT5: shapes, the estimate through the binary, flash against eager attention, LoRA training.
use super::*;

/// A Wan2.1-shaped transformer (qk norm, cross-attention norm, patch 1×2×2), narrow: 2 heads
/// of 12, 2 blocks.
pub(super) fn tiny_dit() -> WanTransformerConfig {
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
pub(super) fn dit() {
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
pub(super) fn umt5() {
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

pub(super) fn estimate_cli() {
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
pub(super) fn dit_flash() {
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
pub(super) fn lora_params(c: &WanTransformerConfig, r: usize) -> usize {
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
pub(super) fn dit_lora() {
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
pub(super) fn tiny_wan_dir(dir: &std::path::Path) {
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
pub(super) fn lora_sweep_cli() {
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
