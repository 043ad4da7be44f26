//! Training memory, checked exactly against analytic figures (tiny synthetic llama through the
//! real binary), gradient equivalence of checkpointing and accumulation (in process), and
//! real steps on real MiniLM weights.
mod common;
use candle_core::{DType, Device};
use common::{root, vramlab};
use std::collections::HashMap;
use vramlab::model::{weights, Config, Source};
use vramlab::record::{Phase, Record, Status};
use vramlab::scenario::spec::{Checkpointing, Trainable};
use vramlab::workload::training;

/// tiny-llama.json by hand: tied embedding 512×64 + 4 layers × (q 64×64, k 32×64, v 32×64,
/// o 64×64, gate/up/down 3×64×128, 2 norms) + final norm.
const TINY_PARAMS: u64 = 512 * 64 + 4 * (64 * 64 * 2 + 32 * 64 * 2 + 3 * 64 * 128 + 2 * 64) + 64;
const TINY_TENSORS: u64 = 1 + 4 * 9 + 1;
const KIB: u64 = 1024;

fn sweep(scenario: &str, name: &str) -> (tempfile::TempDir, Vec<Record>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("{name}.csv"));
    vramlab()
        .args(["sweep", "--quiet", scenario, "--out"])
        .arg(&out)
        .assert()
        .success();
    let rows = vramlab::export::csv::read(&out).unwrap();
    (dir, rows)
}

type Rows<'a> = HashMap<(Phase, u64), &'a Record>;

fn by_point(rows: &[Record]) -> Vec<(String, Rows<'_>)> {
    let mut out: Vec<(String, Rows<'_>)> = Vec::new();
    for r in rows.iter().filter(|r| r.phase != Some(Phase::Load)) {
        if out.last().map(|(id, _)| id != &r.point_id).unwrap_or(true) {
            out.push((r.point_id.clone(), HashMap::new()));
        }
        out.last_mut()
            .unwrap()
            .1
            .insert((r.phase.unwrap(), r.step.unwrap()), r);
    }
    out
}

fn loss(r: &Record) -> f32 {
    r.message.strip_prefix("loss=").unwrap().parse().unwrap()
}

/// The exact figures of a point's first step, both minus the live bytes before it: gradients
/// at the end of backward == `storage` (the trainable parameters' bytes), AdamW's state at the
/// end of the optimizer phase == 2 × `storage` (and `feature_optimizer_bytes` says so; SGD has
/// none), each plus at most 1 KiB of bookkeeping per trainable tensor. AdamW lowers the loss
/// (under LoRA, B starts at zero, so step 1 moves B only; the loss still falls).
fn assert_grads_and_state(id: &str, p: &Rows<'_>, storage: u64, tensors: u64) {
    let o1 = p[&(Phase::Optimizer, 1)];
    let (grads, state) = grads_and_state(p);
    let (storage, slack) = (storage as i64, (KIB * tensors) as i64);
    assert!(
        grads >= storage && grads - storage <= slack,
        "{id}: gradients {grads}, storage {storage}"
    );
    if id.contains("/adamw/") {
        let expected = 2 * storage;
        assert_eq!(o1.feature_optimizer_bytes, Some(expected as u64), "{id}");
        assert!(
            state >= expected && state - expected <= slack,
            "{id}: optimizer state {state}, expected {expected}"
        );
        assert!(
            loss(p[&(Phase::StepTotal, 2)]) < loss(p[&(Phase::StepTotal, 1)]),
            "{id}: the loss does not fall"
        );
    } else {
        assert_eq!(o1.feature_optimizer_bytes, Some(0), "{id}");
        assert!(state.abs() <= slack, "{id}: sgd state {state}");
    }
}

/// Gradient bytes (end of step 1's backward) and optimizer-state bytes (end of its optimizer
/// phase) of a point, each over the live bytes before step 1.
fn grads_and_state(p: &Rows<'_>) -> (i64, i64) {
    let before = p[&(Phase::Forward, 1)].baseline_allocated.unwrap() as i64;
    let end = |ph| p[&(ph, 1)].end_allocated.unwrap() as i64 - before;
    (end(Phase::Backward), end(Phase::Optimizer))
}

#[test]
fn tiny_llama_training_figures_are_exact() {
    let (_d, rows) = sweep("harness/tests/data/train-tiny.toml", "tiny");
    assert!(rows.iter().all(|r| r.status == Some(Status::Ok)));
    let points = by_point(&rows);
    assert_eq!(points.len(), 3 * 2 * 2 * 2);
    let peak = |id: &str, ph: Phase| -> u64 {
        let (_, p) = points.iter().find(|(i, _)| i == id).unwrap();
        p[&(ph, 1)].peak_allocated.unwrap()
    };
    for (id, p) in &points {
        for step in [1, 2] {
            for ph in [
                Phase::Forward,
                Phase::Backward,
                Phase::Optimizer,
                Phase::StepTotal,
            ] {
                assert!(
                    p.contains_key(&(ph, step)),
                    "{id}: no {ph:?} row for step {step}"
                );
            }
        }
        let f1 = p[&(Phase::Forward, 1)];
        assert_eq!(f1.param_count, TINY_PARAMS);
        // Variables (weights, gradients, AdamW's m and v) are f32 under f32 and mixed-bf16.
        let var_bytes = if f1.precision == vramlab::vocab::Precision::Bf16 {
            2
        } else {
            4
        };
        let storage = TINY_PARAMS * var_bytes;
        assert_grads_and_state(id, p, storage, TINY_TENSORS);
        // SGD keeps no state, so step 2 repeats step 1 on the same live set: the step's peak
        // over its own baseline is the same to the byte (a gradient, graph or buffer kept
        // across steps would raise step 2's).
        if id.contains("/sgd/") {
            let over = |step| {
                p[&(Phase::StepTotal, step)].peak_allocated.unwrap()
                    - p[&(Phase::Forward, step)].baseline_allocated.unwrap()
            };
            assert_eq!(over(2), over(1), "{id}: step 2's peak over its baseline");
        }

        // Layer checkpointing lowers the backward peak; accumulation lowers the forward peak.
        if id.contains("/none/") {
            let layer = id.replace("/none/", "/layer/");
            assert!(
                peak(&layer, Phase::Backward) < peak(id, Phase::Backward),
                "{id}"
            );
        }
        if id.contains("/ga1/") {
            let ga4 = id.replace("/ga1/", "/ga4/");
            assert!(
                peak(&ga4, Phase::Forward) < peak(id, Phase::Forward),
                "{id}"
            );
        }
    }
    // Exact across precisions: a gradient's or a state tensor's bookkeeping does not depend on
    // its dtype, so between the f32 and bf16 runs of a point the gradients differ by exactly
    // TINY_PARAMS × (4 − 2) B and AdamW's m and v by twice that; SGD has no state. The mixed
    // policy keeps f32 variables: its figures equal f32's to the byte.
    let figures = |id: &str| grads_and_state(&points.iter().find(|(i, _)| i == id).unwrap().1);
    let mut checked = 0;
    for (id, p) in points.iter().filter(|(id, _)| id.contains("/f32/")) {
        let (g32, s32) = grads_and_state(p);
        let (g16, s16) = figures(&id.replace("/f32/", "/bf16/"));
        let delta = (TINY_PARAMS * 2) as i64;
        let state_delta = if id.contains("/adamw/") { 2 * delta } else { 0 };
        assert_eq!(g32 - g16, delta, "{id}: f32 - bf16 gradient bytes");
        assert_eq!(
            s32 - s16,
            state_delta,
            "{id}: f32 - bf16 optimizer state bytes"
        );
        let mixed = figures(&id.replace("/f32/", "/mixed-bf16/"));
        assert_eq!(
            mixed,
            (g32, s32),
            "{id}: mixed-bf16 vs f32 (gradients, state)"
        );
        checked += 1;
    }
    assert_eq!(checked, 2 * 2 * 2);
}

/// LoRA r4 on q (64→64) and v (64→32) of 4 layers: A (4, in) and B (out, 4) each.
const TINY_LORA_PARAMS: u64 = 4 * 4 * ((64 + 64) + (64 + 32));
const TINY_LORA_TENSORS: u64 = 4 * 2 * 2;

#[test]
fn lora_adapters_alone_carry_gradients_and_optimizer_state() {
    let (_d, rows) = sweep("harness/tests/data/train-tiny-lora.toml", "lora");
    assert!(rows.iter().all(|r| r.status == Some(Status::Ok)));
    let points = by_point(&rows);
    assert_eq!(points.len(), 3 * 2 * 2);
    let row = |id: &str, ph: Phase| -> &Record {
        let (_, p) = points.iter().find(|(i, _)| i == id).unwrap();
        p[&(ph, 1)]
    };
    let mut checked = 0;
    for (id, p) in points.iter().filter(|(id, _)| id.ends_with("/lora-r4")) {
        let (f1, b1, o1) = (
            p[&(Phase::Forward, 1)],
            p[&(Phase::Backward, 1)],
            p[&(Phase::Optimizer, 1)],
        );
        assert_eq!(f1.trainable, Some(vramlab::vocab::Trainable::Lora(4)));
        let var_bytes = if f1.precision == vramlab::vocab::Precision::Bf16 {
            2
        } else {
            4
        };
        let adapters = TINY_LORA_PARAMS * var_bytes;
        assert_eq!(
            f1.feature_weight_bytes,
            Some((TINY_PARAMS + TINY_LORA_PARAMS) * var_bytes),
            "{id}"
        );
        // Only the adapters get gradients and state: the frozen base weights' would be 100×.
        assert_grads_and_state(id, p, adapters, TINY_LORA_TENSORS);
        // Against full training of the same point: lower backward end and optimizer peak.
        // (Not the backward peak: on this tiny model activations dominate, and the adapters'
        // own activations make LoRA's backward peak a little higher than full training's.)
        let full = id.replace("/lora-r4", "/full");
        assert!(
            b1.end_allocated < row(&full, Phase::Backward).end_allocated,
            "{id}"
        );
        assert!(
            o1.peak_allocated < row(&full, Phase::Optimizer).peak_allocated,
            "{id}"
        );
        checked += 1;
    }
    assert_eq!(checked, 3 * 2);
}

#[test]
fn checkpointing_and_accumulation_give_the_same_gradients() {
    let cfg = Config::from_file(&root().join("harness/tests/data/tiny-llama.json")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    vramlab::model::synth::write(&cfg, DType::F32, 3, dir.path()).unwrap();
    let t = weights::load(
        &Source::Hf(dir.path().into()),
        &cfg,
        DType::F32,
        &Device::Cpu,
        |_, _| {},
    )
    .unwrap();
    let vars = vramlab::model::trainable::to_vars(t).unwrap();
    let (model, trainable) = vramlab::model::trainable::trainable_model(
        &cfg,
        &vars,
        Trainable::Full,
        DType::F32,
        Default::default(),
    )
    .unwrap();
    assert_eq!(trainable.len() as u64, TINY_TENSORS);
    let (ids, targets) = training::batch_ids(cfg.vocab_size, 4, 32, 11, &Device::Cpu).unwrap();
    let run =
        |ckpt, n| training::gradients(model.as_ref(), &trainable, &ids, &targets, ckpt, n).unwrap();
    let (l0, g0) = run(Checkpointing::None, 1);
    for (ckpt, n) in [
        (Checkpointing::Layer, 1),
        (Checkpointing::None, 4),
        (Checkpointing::Layer, 4),
    ] {
        let (l, g) = run(ckpt, n);
        assert!((l - l0).abs() <= 1e-5, "{ckpt:?} x{n}: loss {l} vs {l0}");
        for v in &trainable {
            let (a, b) = (
                g0.get(v.as_tensor()).unwrap(),
                g.get(v.as_tensor()).unwrap(),
            );
            let d = common::max_abs_diff(a, b);
            assert!(d <= 1e-5, "{ckpt:?} x{n}: gradient differs by {d}");
        }
    }
    // Every variable got a non-zero gradient.
    for v in &trainable {
        assert!(common::max_abs(g0.get(v.as_tensor()).unwrap()) > 0.0);
    }
    // Full training: the trainable set is every parameter of the checkpoint.
    let params: usize = trainable.iter().map(|v| v.elem_count()).sum();
    assert_eq!(params as u64, TINY_PARAMS);
}

#[test]
fn minilm_real_weights_train_and_the_loss_falls() {
    let minilm = common::models().join("all-minilm-l6-v2/model.safetensors");
    assert!(minilm.exists(), "run scripts/fetch-test-models.sh first");
    let (_d, rows) = sweep("harness/tests/data/train-minilm.toml", "minilm");
    let points = by_point(&rows);
    assert_eq!(points.len(), 1);
    let p = &points[0].1;
    let losses: Vec<f32> = (1..=5).map(|s| loss(p[&(Phase::StepTotal, s)])).collect();
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
    let f1 = p[&(Phase::Forward, 1)];
    assert_eq!(f1.architecture, "bert");
    assert_eq!(f1.param_count, 22_713_216);
    assert_eq!(f1.weight_source, "safetensors");
}

/// Flash attention keeps no b·heads·s² tensor for the backward (vramlab-kernels saves the
/// output and one log-sum-exp per row), eager keeps six per layer. By the code of
/// `model::nn::attention` and `nn::softmax`: QKᵀ, its scaled copy and the masked scores in the
/// compute dtype, then the softmax in f32 (the cast, x − max, exp and the normalized
/// probabilities) and the probabilities cast back: 6 × 4 B in f32, and 3 × 2 + 4 × 4 + 2 = 24 B
/// in bf16 (f32 skips both casts). So the saved activations (live bytes at the start of the
/// backward minus those at the start of the forward) differ by layers · b · heads · s² · 24 B,
/// within 5 % (the O(s·d) tensors of the two kernels differ too), and flash's forward peak is
/// lower.
#[test]
fn flash_attention_drops_the_score_tensors_from_the_saved_activations() {
    let (_d, rows) = sweep("harness/tests/data/train-flash.toml", "flash");
    assert!(rows.iter().all(|r| r.status == Some(Status::Ok)));
    let points = by_point(&rows);
    assert_eq!(points.len(), 4);
    let (layers, heads, b, s) = (4u64, 4u64, 2u64, 256u64);
    let expected = (layers * b * heads * s * s * 24) as f64;
    for (id, eager) in points.iter().filter(|(id, _)| !id.ends_with("/flash")) {
        let flash = &points
            .iter()
            .find(|(i, _)| *i == format!("{id}/flash"))
            .unwrap_or_else(|| panic!("{id}: no flash point"))
            .1;
        let saved = |p: &Rows<'_>| {
            p[&(Phase::Backward, 1)].baseline_allocated.unwrap() as f64
                - p[&(Phase::Forward, 1)].baseline_allocated.unwrap() as f64
        };
        let drop = saved(eager) - saved(flash);
        let ratio = drop / expected;
        eprintln!("{id}: eager − flash saved activations {drop} B = {ratio:.4} × {expected} B");
        assert!(
            (0.95..=1.05).contains(&ratio),
            "{id}: eager − flash saved activations {drop} B, expected {expected} B (ratio {ratio:.4})"
        );
        let fwd = |p: &Rows<'_>| p[&(Phase::Forward, 1)].peak_allocated.unwrap();
        assert!(fwd(flash) < fwd(eager), "{id}: flash forward peak");
    }
}
