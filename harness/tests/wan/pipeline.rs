//! The Wan pipeline on a tiny diffusers directory: load rows, steps, CFG, the decode in the pipeline, 16-bit, the sweep.
use super::*;

pub(super) fn gshape(
    side: usize,
    frames: usize,
    batch: usize,
    cfg: bool,
    decode: VaeDecode,
) -> GenShape {
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
pub(super) fn pipeline_counts() {
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
pub(super) fn load_tiny(dtype: DType) -> Lab {
    common::load_lab(
        &Wan::new(common::tiny_wan(), dtype, DType::F32),
        dtype,
        "wan",
    )
}

/// Each load row keeps the component's parameters (analytic, from the config) × its dtype's
/// bytes, plus under 512 B of module structs per stored tensor.
pub(super) fn load_rows(l: &Lab) {
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
pub(super) fn fresh_f32(meter: &mut CpuMeter, shape: &[usize]) -> u64 {
    let (t, m, _) = vramlab::meter::measure(meter, || {
        Ok(Tensor::zeros(shape, DType::F32, &Device::Cpu)?)
    })
    .unwrap();
    drop(t);
    m.end_allocated - m.baseline_allocated
}

/// Two denoising steps have the same peak (±0.1 %); the decode returns exactly
/// b × 3 × frames × H × W × 4 bytes and keeps nothing else, `full` and `sliced`.
pub(super) fn steps_and_output(l: &mut Lab) {
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
pub(super) fn decode_flat_in_pipeline(l: &mut Lab) {
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
pub(super) fn tiled_in_pipeline(l: &mut Lab) {
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
pub(super) fn cfg_on_off(l: &mut Lab) {
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
pub(super) fn sixteen_bit() {
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
pub(super) fn cli_sweep(l: &Lab) {
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
