//! The probe's diffusion pipelines on CPU (SD, FLUX, Wan): rows, steps and the decode's output.
use super::*;

#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn tiny_sd_on_diffusers_rows_steps_and_decode_output() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-sd");
    let cfg = tiny_sd(&model);
    let scenario = gen_scenario(
        dir.path(),
        "tiny-sd-torch",
        &model,
        "resolution = [\"64x128\"]\nbatch = [1, 2]\ncfg = [true, false]\n\
         vae_decode = [\"full\", \"sliced\", \"tiled\"]\ntile = 64\noverlap = 16\n",
    );
    for attention in ["sdpa", "eager"] {
        let out = dir.path().join(format!("gen-{attention}.csv"));
        run_generate(&scenario, &out, attention);
        let rows = generate_rows(&out, attention);
        let mut cfg_act = std::collections::HashMap::new();
        for (w, h) in [(64u64, 128u64)] {
            for b in [1u64, 2] {
                for guidance in ["cfg", "nocfg"] {
                    for dec in ["full", "sliced", "tiled-t64o16"] {
                        let point = format!("tiny-sd/generate/f32/{w}x{h}/b{b}/{guidance}/{dec}");
                        let (denoise, decode) =
                            check_point(&rows, &point, &["text_encoder", "unet", "vae"], 2);
                        check_steps_and_decode(&denoise, decode, b, 1, w, h);
                        cfg_act.insert((w, h, b, guidance), act(denoise[1]));
                    }
                }
            }
        }
        // The same configs, the same file as candle's.
        check_loads(&rows, &cfg.components(), |c| cfg.params(c));
        // CFG doubles the denoiser's batch: CFG at batch 1 is batch 2 without it (± 1 %).
        let (w, h) = (64u64, 128u64);
        let (c1, n2) = (cfg_act[&(w, h, 1, "cfg")], cfg_act[&(w, h, 2, "nocfg")]);
        eprintln!("{attention} {w}x{h}: denoise cfg b1 {c1} B, nocfg b2 {n2} B");
        assert!(c1.abs_diff(n2) as f64 <= 0.01 * n2 as f64, "{c1} vs {n2}");
    }
}

/// A tiny FLUX.1 transformer (FluxTransformer2DModel from `transformer/config.json`, random
/// values) with a tiny 16-channel VAE: the same rows; no text encoder in the directory, so
/// `text_encode` makes the T5 and CLIP outputs' shapes.
#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn tiny_flux_on_diffusers_rows_steps_and_decode_output() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-flux");
    tiny_flux(&model);
    let scenario = gen_scenario(
        dir.path(),
        "tiny-flux-torch",
        &model,
        "resolution = [\"128x128\", \"128x64\"]\nbatch = [1, 2]\n\
         vae_decode = [\"full\", \"tiled\"]\ntile = 64\noverlap = 16\n",
    );
    for attention in ["sdpa", "eager"] {
        let out = dir.path().join(format!("flux-{attention}.csv"));
        // No `cfg` in the table: FLUX's default is off (guidance-distilled), as vramlab's.
        run_generate(&scenario, &out, attention);
        let rows = generate_rows(&out, attention);
        for (w, h) in [(128u64, 128u64), (128, 64)] {
            for b in [1u64, 2] {
                for dec in ["full", "tiled-t64o16"] {
                    let point = format!("tiny-flux/generate/f32/{w}x{h}/b{b}/nocfg/{dec}");
                    let (denoise, decode) = check_point(&rows, &point, &["transformer", "vae"], 2);
                    check_steps_and_decode(&denoise, decode, b, 1, w, h);
                    assert!(rows
                        .iter()
                        .filter(|r| r.point_id == point)
                        .all(|r| r.architecture == "flux"));
                }
            }
        }
    }
}

/// Wan2.1 T2V on diffusers (transformers' UMT5EncoderModel, WanTransformer3DModel,
/// AutoencoderKLWan) on the tiny Wan config of tests/wan/ (`common::tiny_wan`), with the
/// weights of vramlab's own synthetic writer, at two frame counts: a load row per component of
/// its analytic parameters × 4 bytes, equal denoising steps (CFG as a second transformer call),
/// the decoded videos' b·3·frames·H·W·4 bytes, the `frames` column, and the ids of
/// `vramlab sweep --dry-run`.
#[test]
#[ignore = "needs torch: scripts/test.sh runs it after scripts/torch-env.sh"]
fn tiny_wan_on_diffusers_rows_steps_and_decode_output() {
    use vramlab::model::diffusion::Pipeline;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-wan");
    let cfg = common::tiny_wan();
    let f32 = candle_core::DType::F32;
    let wan = vramlab::model::diffusion::wan::Wan::new(cfg.clone(), f32, f32);
    vramlab::workload::generate::write_synthetic(&wan, &model).unwrap();
    let scenario = gen_scenario(
        dir.path(),
        "tiny-wan-torch",
        &model,
        "resolution = [\"48x32\"]\nframes = [5, 9]\nbatch = [1, 2]\n\
         cfg = [true, false]\nvae_decode = [\"full\", \"sliced\", \"tiled\"]\ntile = 16\n\
         overlap = 8\n",
    );
    let dry = vramlab()
        .args(["sweep", "--dry-run"])
        .arg(&scenario)
        .output()
        .unwrap();
    let want_ids: Vec<String> = String::from_utf8(common::ok_stdout(dry))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    for attention in ["sdpa", "eager"] {
        let out = dir.path().join(format!("wan-{attention}.csv"));
        run_generate(&scenario, &out, attention);
        let rows = generate_rows(&out, attention);
        let mut ids: Vec<String> = Vec::new();
        for r in &rows {
            if ids.last() != Some(&r.point_id) {
                ids.push(r.point_id.clone());
            }
        }
        assert_eq!(ids, want_ids, "the probe's points are vramlab's");
        for (w, h) in [(48u64, 32u64)] {
            for frames in [5u64, 9] {
                for b in [1u64, 2] {
                    for guidance in ["cfg", "nocfg"] {
                        for dec in ["full", "sliced", "tiled-t16o8"] {
                            let point = format!(
                                "tiny-wan/generate/f32/{w}x{h}/f{frames}/b{b}/{guidance}/{dec}"
                            );
                            let (denoise, decode) = check_point(
                                &rows,
                                &point,
                                &["text_encoder", "transformer", "vae"],
                                2,
                            );
                            check_steps_and_decode(&denoise, decode, b, frames, w, h);
                            assert!(rows
                                .iter()
                                .filter(|r| r.point_id == point)
                                .all(|r| r.architecture == "wan" && r.frames == Some(frames)));
                        }
                    }
                }
            }
        }
        check_loads(&rows, &wan.components(), |c| cfg.params_analytic(c));
    }
}

#[test]
fn an_unrunnable_generation_scenario_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    tiny_flux(&dir.path().join("flux"));
    let scenario = |source: &str, extra: &str| {
        format!(
            "name = \"g\"\ndevice = \"cpu\"\n[model]\nsource = \"{source}\"\n[sweep]\n\
             mode = [\"generate\"]\nprecision = [\"f32\"]\nresolution = [\"64x64\"]\nbatch = [1]\n{extra}"
        )
    };
    let flux = format!("diffusers:{}", dir.path().join("flux").display());
    let out = probe_without_torch(&scenario(&flux, "cfg = [true]\n"));
    one_line_exit_2(
        &out,
        "cfg = true: flux (FLUX) runs without classifier-free guidance",
    );
    // A scenario vramlab itself refuses is vramlab's line: the probe runs vramlab's points.
    let out = probe_without_torch(&scenario(&flux, "cfg = [false]\nattention = [\"flash\"]\n"));
    one_line_exit_2(
        &out,
        "attention `flash` is not available for this generation model",
    );
    let out = probe_without_torch(&scenario(&flux, "cfg = [false]\nframes = [5]\n"));
    one_line_exit_2(&out, "frames = 5: flux is an image model");
    // A Wan directory as far as the probe reads it without torch: what vramlab's Wan pipeline
    // refuses, the probe refuses.
    let wan = dir.path().join("wan");
    std::fs::create_dir_all(wan.join("transformer")).unwrap();
    std::fs::write(wan.join("transformer/config.json"), "{}").unwrap();
    std::fs::write(
        wan.join("model_index.json"),
        r#"{"_class_name": "WanPipeline"}"#,
    )
    .unwrap();
    let wan = format!("diffusers:{}", wan.display());
    for (extra, needle) in [
        ("", "`frames` is missing: wan is a video model"),
        ("frames = [6]\n", "frames = 6: wan decodes 4k+1 frames"),
        (
            "frames = [5]\nattention = [\"sliced\"]\n",
            "Wan's DiT has no sliced attention",
        ),
    ] {
        one_line_exit_2(&probe_without_torch(&scenario(&wan, extra)), needle);
    }
    let empty = format!("diffusers:{}", dir.path().display());
    let out = probe_without_torch(&scenario(&empty, ""));
    one_line_exit_2(&out, "neither unet/config.json nor transformer/config.json");
}
