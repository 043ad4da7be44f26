//! Drives the real binary on scenarios/smoke.toml (real SmolLM2 weights) and checks the
//! measured figures against analytic ones, exactly.
mod common;
use common::*;
use std::collections::HashMap;
use std::sync::OnceLock;
use vramlab::record::{Phase, Record, Status};
use vramlab::vocab::{Attention, Backend, MeterKind, Mode, Precision};

struct Run {
    rows: Vec<Record>,
    header: Vec<String>,
    stdout: String,
    dir: tempfile::TempDir,
}

/// One sweep shared by every test of this file.
fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        smollm2_gguf();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("smoke.csv");
        let res = vramlab()
            .args(["sweep", "scenarios/smoke.toml", "--out"])
            .arg(&out)
            .assert()
            .success();
        let stdout = String::from_utf8(res.get_output().stdout.clone()).unwrap();
        let rows = vramlab::export::csv::read(&out).unwrap();
        let mut rd = csv::Reader::from_path(&out).unwrap();
        let header = rd.headers().unwrap().iter().map(str::to_string).collect();
        Run {
            rows,
            header,
            stdout,
            dir,
        }
    })
}

fn dtype_bytes(r: &Record) -> u64 {
    match r.precision.as_str() {
        "f32" => 4,
        "f16" | "bf16" => 2,
        p => panic!("precision {p}"),
    }
}

fn phase_rows<'a>(point: &str, phase: Phase) -> Vec<&'a Record> {
    run()
        .rows
        .iter()
        .filter(|r| r.point_id == point && r.phase == Some(phase))
        .collect()
}

/// Inference point ids, in order.
fn points() -> Vec<String> {
    let mut ids: Vec<String> = run()
        .rows
        .iter()
        .filter(|r| r.mode == Mode::Infer)
        .map(|r| r.point_id.clone())
        .collect();
    ids.dedup();
    ids
}

#[test]
fn every_point_ok_with_all_phases() {
    let ids = points();
    assert_eq!(ids.len(), 16);
    for id in &ids {
        for ph in [Phase::Load, Phase::Prefill, Phase::Total] {
            assert_eq!(phase_rows(id, ph).len(), 1, "{id} {ph:?}");
        }
        // decode_every = 1, decode_steps = 8: one row per step.
        assert_eq!(phase_rows(id, Phase::Decode).len(), 8, "{id}");
    }
    assert!(run().rows.iter().all(|r| r.status == Some(Status::Ok)));
}

#[test]
fn load_is_the_exact_weight_storage_plus_bounded_bookkeeping() {
    for id in points() {
        let r = phase_rows(&id, Phase::Load)[0];
        let storage = SMOLLM2_PARAMS * dtype_bytes(r);
        assert_eq!(r.feature_weight_bytes, Some(storage), "{id}");
        assert_eq!(r.param_count, 134_515_008);
        let live = r.end_allocated.unwrap() - r.baseline_allocated.unwrap();
        assert!(live >= storage, "{id}: live {live} < storage {storage}");
        let per_tensor = (live - storage) / SMOLLM2_TENSORS;
        assert!(
            per_tensor <= 512,
            "{id}: {per_tensor} B bookkeeping per tensor (live {live}, storage {storage})"
        );
        assert!(r.peak_allocated.unwrap() >= r.end_allocated.unwrap());
    }
}

#[test]
fn preallocated_kv_is_exact_and_constant() {
    for id in points().iter().filter(|i| i.contains("/preallocated")) {
        let pre = phase_rows(id, Phase::Prefill)[0];
        let bytes = SMOLLM2_KV_ELEMS_PER_TOKEN * dtype_bytes(pre);
        if pre.precision == Precision::F32 {
            assert_eq!(bytes, 46_080);
        }
        check_preallocated_kv(id, pre, &phase_rows(id, Phase::Decode), bytes);
    }
}

#[test]
fn growing_kv_grows_by_exactly_one_token_per_step() {
    for id in points().iter().filter(|i| i.contains("/growing")) {
        let pre = phase_rows(id, Phase::Prefill)[0];
        let bpt = SMOLLM2_KV_ELEMS_PER_TOKEN * dtype_bytes(pre);
        check_growing_kv(id, pre, &phase_rows(id, Phase::Decode), bpt);
    }
}

#[test]
fn repeated_points_have_identical_peaks() {
    type Key = (String, Option<Phase>, Option<u64>);
    let mut by: HashMap<Key, Vec<(u64, u64)>> = HashMap::new();
    for r in run().rows.iter().filter(|r| r.mode == Mode::Infer) {
        let base = r.point_id.rsplit_once('/').unwrap().0.to_string();
        by.entry((base, r.phase, r.step))
            .or_default()
            .push((r.peak_allocated.unwrap(), r.end_allocated.unwrap()));
    }
    assert!(!by.is_empty());
    for (k, v) in by {
        assert_eq!(v.len(), 2, "{k:?}");
        assert_eq!(v[0], v[1], "{k:?}: repeat differs");
    }
}

#[test]
fn csv_has_the_full_schema_and_roundtrips() {
    let r = run();
    assert_eq!(r.header, vramlab::record::columns());
    // The 48 columns of version 1 (docs/src/reference/csv.md), plus `attention` (version 2),
    // `kv_window` (version 3), `compute` (version 4), `qmatmul` (version 5) and the 7 generation
    // columns (version 6).
    assert_eq!(r.header.len(), 59);
    assert_eq!(vramlab::record::columns_of(5).len(), 52);
    assert_eq!(vramlab::record::columns_of(4).len(), 51);
    assert_eq!(vramlab::record::columns_of(1).len(), 48);
    for rec in &r.rows {
        assert_eq!(rec.schema_version, vramlab::record::SCHEMA_VERSION);
        assert_eq!(rec.attention, Attention::Eager);
        assert_eq!(rec.compute, None, "dense precisions have no compute column");
        assert_eq!(rec.qmatmul, None, "dense precisions have no qmatmul column");
        assert_eq!(rec.backend, Backend::Cpu);
        assert_eq!(rec.meter, MeterKind::CpuAlloc);
        assert_eq!(rec.weight_source, "gguf");
        assert_eq!(rec.architecture, "llama");
        if rec.mode == Mode::Infer {
            assert!(rec.grad_accum.is_none() && rec.checkpointing.is_none());
        } else {
            assert_eq!(rec.grad_accum, Some(1));
            assert!(rec.kv_cache.is_none() && rec.prompt_len.is_none());
        }
    }
    // Write the records again and read them back: identical.
    let p = r.dir.path().join("again.csv");
    let mut w = csv::Writer::from_path(&p).unwrap();
    for rec in &r.rows {
        w.serialize(rec).unwrap();
    }
    w.flush().unwrap();
    assert_eq!(vramlab::export::csv::read(&p).unwrap(), r.rows);
    // The manifest sits beside the CSV.
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(r.dir.path().join("smoke.manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(m["scenario_hash"], r.rows[0].scenario_hash.as_str());
    assert_eq!(m["status_counts"]["ok"], 17);
    assert_eq!(m["weights"][0]["bytes"], 98_362_432);
    assert!(m["scenario_text"]
        .as_str()
        .unwrap()
        .contains("name = \"smoke\""));
    assert!(m["versions"]["candle"]
        .as_str()
        .unwrap()
        .starts_with("0.11."));
}

#[test]
fn summary_table_in_gb_and_gib() {
    let out = &run().stdout;
    assert!(out.contains("GB") && out.contains("GiB"), "{out}");
    // f32 weights: 538,060,032 B = 0.538 GB = 0.501 GiB.
    assert!(
        out.lines()
            .any(|l| l.contains("/f32/b1/") && l.contains("0.538") && l.contains("0.501")),
        "{out}"
    );
}

#[test]
fn real_smollm2_training_step_runs_every_phase_and_the_loss_falls() {
    let train: Vec<&Record> = run()
        .rows
        .iter()
        .filter(|r| r.mode == Mode::Train)
        .collect();
    let id = "SmolLM2-135M-Instruct.Q4_1/train/f32/b1/c64/adamw/none/ga1/full";
    assert!(train
        .iter()
        .all(|r| r.point_id == id && r.status == Some(Status::Ok)));
    let losses: Vec<f32> = train
        .iter()
        .filter(|r| r.phase == Some(Phase::StepTotal))
        .map(|r| r.message.strip_prefix("loss=").unwrap().parse().unwrap())
        .collect();
    assert_eq!(losses.len(), 5);
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
    for ph in [
        Phase::Load,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
    ] {
        assert!(train.iter().any(|r| r.phase == Some(ph)), "{ph:?}");
    }
    // AdamW state in f32: m and v, 8 B per parameter, exactly as the feature says.
    let opt = train
        .iter()
        .find(|r| r.phase == Some(Phase::Optimizer) && r.step == Some(1))
        .unwrap();
    assert_eq!(opt.feature_optimizer_bytes, Some(2 * SMOLLM2_PARAMS * 4));
}
