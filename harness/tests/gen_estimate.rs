//! The generation estimate: a fit on points measured here (tiny SD config,
//! CPU counting allocator) predicts held-out points within the margin below; constants never
//! change the exact rows; the committed SD 1.5 points' peak phases (one of them `vae_decode`)
//! are named by the estimate from the committed constants; bad inputs exit 2 with one line.
//!
//! The counter is process-global: no libtest harness (`harness = false`), `main` runs each
//! check in turn on the main thread.
mod common;

use candle_core::{DType, Device};
use common::tiny_sd;
use std::path::PathBuf;
use vramlab::estimate::generate::{self as gen, GenArch, GenQuery};
use vramlab::fit::generate::{fit_groups, point_totals, predict_heldout, GenSample, Origin};
use vramlab::fit::{Constants, ErrStats};
use vramlab::vocab::{Attention, Backend, GenModel, Phase, Resolution, Runtime, VaeDecode};
use vramlab::workload::generate::{self, GenShape};

fn constants_file() -> PathBuf {
    common::root().join("results/cpu/cpu-sd15.constants.toml")
}

fn query(side: usize, batch: usize, cfg: bool, decode: VaeDecode) -> GenQuery {
    GenQuery {
        batch: batch as u64,
        resolution: Resolution {
            width: side,
            height: side,
        },
        frames: 1,
        cfg,
        vae_decode: decode,
        tile: 32,
        overlap: 8,
        dtype: DType::F32,
        vae_dtype: DType::F32,
        runtime: Runtime::Candle,
        backend: Backend::Cpu,
        attention: Attention::Eager,
    }
}

/// Fits on tiny-SD points measured here and predicts points left out of the fit: every
/// held-out phase peak and point peak within 8 %, their median within 3 % (the
/// acceptance margin).
fn heldout_within_margin() {
    let cfg = tiny_sd();
    let arch = GenArch::sd(&cfg);
    // `_dir` holds the weights' temporary directory until the end.
    let common::TinySd {
        sd,
        loads,
        mut meter,
        dir: _dir,
    } = common::load_tiny_sd();
    let start = loads[0].1.baseline_allocated;
    let load_peak = loads.iter().map(|l| l.1.peak_allocated).max().unwrap();
    let mut points = Vec::new();
    for side in [32, 48, 64, 80, 96] {
        for batch in [1, 2] {
            for cfg in [true, false] {
                for decode in [VaeDecode::Full, VaeDecode::Sliced, VaeDecode::Tiled] {
                    points.push(query(side, batch, cfg, decode));
                }
            }
        }
    }
    // Warm-up: candle's gemm keeps per-thread buffers; the first run carries them.
    let shape = |q: &GenQuery| GenShape {
        batch: q.batch as usize,
        resolution: q.resolution,
        frames: q.frames as usize,
        cfg: q.cfg,
        steps: 2,
        vae_decode: q.vae_decode,
        tile: q.tile,
        overlap: q.overlap,
    };
    generate::run(&sd, &shape(&points[0]), &Device::Cpu, &mut meter).unwrap();
    let held = |i: usize| i % 5 == 3;
    let (mut fit, mut out) = (Vec::new(), Vec::new());
    for (i, q) in points.iter().enumerate() {
        let m = generate::run(&sd, &shape(q), &Device::Cpu, &mut meter).unwrap();
        let id = format!("{}/b{}/{}/{}", q.resolution, q.batch, q.cfg, q.vae_decode);
        let denoise = m.denoise.iter().map(|d| d.0.peak_allocated).max().unwrap();
        for (phase, peak) in [
            (Phase::Load, load_peak),
            (Phase::TextEncode, m.text_encode.0.peak_allocated),
            (Phase::Denoise, denoise),
            (Phase::VaeDecode, m.vae_decode.0.peak_allocated),
        ] {
            let s = GenSample::new(&arch, q, phase, &id, (peak - start) as f64).unwrap();
            if held(i) {
                out.push(s);
            } else {
                fit.push(s);
            }
        }
    }
    let origin = Origin {
        runtime: Runtime::Candle,
        backend: Backend::Cpu,
        device: "cpu".into(),
        csv_sha256: Default::default(),
    };
    let groups = fit_groups(&fit, &origin);
    let phases = predict_heldout(&groups, &out);
    let totals = point_totals(&groups, &out);
    assert_eq!(phases.len(), out.len(), "every held-out phase predicted");
    for h in phases.iter().chain(&totals) {
        println!(
            "  {:<40} measured {:>10} predicted {:>12.0} {:+.2}%",
            h.row,
            h.measured,
            h.predicted,
            100.0 * h.rel()
        );
    }
    for (what, h) in [("phase peaks", &phases), ("point peaks", &totals)] {
        let e = ErrStats::of(h).unwrap();
        println!("held-out {what}: {}", e.line());
        assert!(e.median <= 0.03, "held-out {what}: {}", e.line());
        assert!(e.worst <= 0.08, "held-out {what}: {}", e.line());
    }
    println!("held-out within the margin: ok");
}

fn estimate_json(extra: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(["estimate", "--model", "sd15", "--resolution", "512x512"])
        .args(["--batch", "2", "--cfg", "--precision", "f32"])
        .args(["--runtime", "candle", "--backend", "cpu", "--json"])
        .args(extra)
        .output()
        .unwrap();
    serde_json::from_slice(&common::ok_stdout(out)).unwrap()
}

/// The exact rows (weights per component, context, latents, decoded images) are the same
/// bytes with and without constants; the phases are not (the constants are used).
fn constants_keep_exact_rows() {
    let file = constants_file();
    let with = estimate_json(&["--constants", file.to_str().unwrap()]);
    let without = estimate_json(&["--priors"]);
    assert_eq!(with["exact"], without["exact"]);
    assert_ne!(with["phases"], without["phases"]);
    let cfg = vramlab::model::diffusion::sd::SdConfig::preset(GenModel::Sd15);
    let unet = common::named_u64(&with, "exact", "unet", "bytes");
    assert_eq!(unet, cfg.params(vramlab::vocab::Component::Unet) * 4);
    let phases: Vec<&str> = with["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["load", "text_encode", "denoise", "vae_decode"]);
    println!("constants keep the exact rows: ok");
}

/// Torch on CUDA says that cuDNN's first-call workspace is not in the estimate; candle on the
/// CPU (no cuDNN) does not.
fn cudnn_workspace_note() {
    let has_note = |v: &serde_json::Value| {
        v["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("cuDNN"))
    };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args([
            "estimate",
            "--model",
            "sdxl",
            "--batch",
            "1",
            "--precision",
            "f16",
        ])
        .args(["--runtime", "torch", "--backend", "cuda", "--json"])
        .output()
        .unwrap();
    let torch: serde_json::Value = serde_json::from_slice(&common::ok_stdout(out)).unwrap();
    assert!(has_note(&torch), "{}", torch["notes"]);
    assert!(!has_note(&estimate_json(&["--priors"])));
    println!("cuDNN workspace note: ok");
}

/// Every committed SD 1.5 point: the estimate from the committed constants names the phase
/// that held the measured peak, and at least one of them is `vae_decode` (also through the
/// CLI).
fn committed_peak_phases() {
    let c = Constants::load(&constants_file()).unwrap();
    let arch = GenArch::sd(&vramlab::model::diffusion::sd::SdConfig::preset(
        GenModel::Sd15,
    ));
    let mut vae_point = None;
    let mut n = 0;
    for name in ["cpu-sd15.csv", "cpu-sd15-res.csv"] {
        let csv = common::root().join("results/cpu").join(name);
        let tiles = vramlab::cmd::fit::tiles_of(&csv).unwrap();
        for r in vramlab::export::csv::read(&csv).unwrap() {
            if r.phase != Some(Phase::Total) || r.status != Some(vramlab::record::Status::Ok) {
                continue;
            }
            let tile = tiles.get(&r.point_id).copied().unwrap_or((0, 0));
            let q = vramlab::fit::generate::query_of(&r, tile).unwrap();
            let e = gen::estimate(&arch, &q, Some(&c.generation)).unwrap();
            assert_eq!(Some(e.peak_phase), r.peak_phase, "{}", r.point_id);
            if e.peak_phase == Phase::VaeDecode {
                vae_point = Some(q);
            }
            n += 1;
        }
    }
    assert!(n >= 20, "{n} committed points");
    let q = vae_point.expect("a committed point whose peak is vae_decode");
    let r = q.resolution.to_string();
    let b = q.batch.to_string();
    let file = constants_file();
    let mut args = vec![
        "--vae-decode",
        q.vae_decode.as_str(),
        "--resolution",
        &r,
        "--batch",
        &b,
        "--constants",
        file.to_str().unwrap(),
    ];
    if q.cfg {
        args.push("--cfg");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(["estimate", "--model", "sd15", "--precision", "f32"])
        .args(["--runtime", "candle", "--backend", "cpu", "--json"])
        .args(&args)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["peak_phase"], "vae_decode");
    println!("committed peak phases ({n} points): ok");
}

/// Bad inputs: one line on stderr, exit 2.
fn bad_inputs() {
    let file = constants_file();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_vramlab"))
            .args(["estimate", "--model", "sd15"])
            .args(args)
            .output()
            .unwrap()
    };
    let one_line = |o: &std::process::Output, needle: &str| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    };
    // The committed constants are candle on the CPU; the default query is torch on CUDA.
    let o = run(&["--constants", file.to_str().unwrap()]);
    one_line(&o, "--allow-transfer");
    let o = run(&["--constants", file.to_str().unwrap(), "--allow-transfer"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    one_line(&run(&["--resolution", "500x512"]), "--resolution 500x512");
    // A training estimate of a pipeline is not a generation estimate in disguise.
    one_line(&run(&["--mode", "train"]), "--mode train");
    one_line(&run(&["--mode", "encode"]), "--mode encode");
    assert!(run(&["--mode", "generate"]).status.success());
    one_line(
        &run(&[
            "--resolution",
            "256x256",
            "--vae-decode",
            "tiled",
            "--tile",
            "512",
        ]),
        "--tile 512",
    );
    println!("bad inputs: ok");
}

fn main() {
    // One compute thread: every peak is reproducible (see tests/generate.rs).
    std::env::set_var("RAYON_NUM_THREADS", "1");
    bad_inputs();
    constants_keep_exact_rows();
    cudnn_workspace_note();
    committed_peak_phases();
    heldout_within_margin();
    println!("gen_estimate: all checks passed");
}
