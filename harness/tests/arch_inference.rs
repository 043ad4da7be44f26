//! Inference for every kind of architecture, through the real binary on scenarios/archs.toml:
//! GPT-2 decode with both cache kinds (synthetic weights with the published gpt2 shapes), a
//! BERT encoder's `encode` mode on real MiniLM weights, and a tiny Mistral whose decode runs past
//! its sliding window. Every figure is checked against a derivation by hand, exactly.
//! Also (library API): a sliding-window model decodes the same logits with its cache capped at
//! the window (ring buffer), uncapped, and without any cache.
mod common;
use common::*;
use std::sync::OnceLock;
use vramlab::model::config::KvWindow;
use vramlab::model::{Config, InferenceModel, KvCache, KvKind};
use vramlab::record::{Phase, Record, Status};

fn run() -> &'static Vec<Record> {
    static RUN: OnceLock<Vec<Record>> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("archs.csv");
        assert!(
            models().join("all-minilm-l6-v2/model.safetensors").exists(),
            "run scripts/fetch-test-models.sh first"
        );
        vramlab()
            .args(["sweep", "scenarios/archs.toml", "--out"])
            .arg(&out)
            .assert()
            .success();
        vramlab::export::csv::read(&out).unwrap()
    })
}

/// The rows of point `id` in `phase`, in order.
fn rows(id: &str, phase: Phase) -> Vec<&'static Record> {
    run()
        .iter()
        .filter(|r| r.point_id == id && r.phase == Some(phase))
        .collect()
}

fn one(id: &str, phase: Phase) -> &'static Record {
    let v = rows(id, phase);
    assert_eq!(v.len(), 1, "{id} {phase:?}");
    v[0]
}

fn grown(r: &Record) -> u64 {
    r.end_allocated.unwrap() - r.baseline_allocated.unwrap()
}

/// GPT-2 small by hand: 12 layers × (2 LayerNorms, c_attn d→3d, c_proj d→d, c_fc d→4d,
/// c_proj 4d→d, with biases) + wte (50257 × 768) + wpe (1024 × 768) + ln_f. The checkpoint's 12
/// causal-mask buffers (1 × 1 × 1024 × 1024) are not parameters: not counted, never loaded.
const GPT2_PARAMS: u64 = {
    let (v, p, d, l) = (50_257u64, 1_024u64, 768u64, 12u64);
    let layer =
        2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
    v * d + p * d + l * layer + 2 * d
};
/// K and V of 12 layers × 12 heads × 64 dims, f32.
const GPT2_KV_PER_TOKEN: u64 = 2 * 12 * 12 * 64 * 4;

#[test]
fn every_point_ok() {
    assert!(run().iter().all(|r| r.status == Some(Status::Ok)));
    let ids: std::collections::BTreeSet<&str> = run().iter().map(|r| r.point_id.as_str()).collect();
    assert_eq!(ids.len(), 4 + 4 + 4, "{ids:?}");
    assert_eq!(GPT2_PARAMS, 124_439_808);
}

#[test]
fn gpt2_decode_kv_is_exact_for_both_cache_kinds() {
    for b in [1u64, 2] {
        let pre_id = format!("synthetic-gpt2/infer/f32/b{b}/c32/preallocated");
        let load = one(&pre_id, Phase::Load);
        assert_eq!(load.architecture, "gpt2");
        assert_eq!(load.param_count, GPT2_PARAMS);
        assert_eq!(load.feature_weight_bytes, Some(GPT2_PARAMS * 4));
        // The whole 32-token cache exists after the prefill; decode adds nothing.
        let pre = one(&pre_id, Phase::Prefill);
        let kv = GPT2_KV_PER_TOKEN * 32 * b;
        assert_eq!(pre.feature_kv_bytes, Some(kv));
        // 24 cache tensors' metadata and the (b, 1) next-token ids on top.
        assert!(
            grown(pre) >= kv && grown(pre) - kv <= 512 * 24,
            "{pre_id}: {}",
            grown(pre)
        );
        for d in rows(&pre_id, Phase::Decode) {
            assert_eq!(
                d.end_allocated, pre.end_allocated,
                "{pre_id} step {:?}",
                d.step
            );
        }
        // Growing: one token per step, exactly.
        let gro_id = format!("synthetic-gpt2/infer/f32/b{b}/c32/growing");
        let pre = one(&gro_id, Phase::Prefill);
        assert_eq!(pre.kv_tokens, Some(26));
        let decodes = rows(&gro_id, Phase::Decode);
        assert_eq!(decodes.len(), 6);
        for d in decodes {
            let t = d.step.unwrap();
            assert_eq!(d.kv_tokens, Some(26 + t));
            assert_eq!(
                d.end_allocated.unwrap() - pre.end_allocated.unwrap(),
                GPT2_KV_PER_TOKEN * t * b,
                "{gro_id} step {t}"
            );
            assert_eq!(d.feature_kv_bytes, Some(GPT2_KV_PER_TOKEN * (26 + t) * b));
        }
    }
}

#[test]
fn bert_encode_keeps_nothing_and_its_load_is_the_weights() {
    // all-MiniLM-L6-v2: 22,713,216 parameters (docs/src/reference/architectures.md).
    for p in ["f32", "bf16"] {
        let bytes: u64 = if p == "f32" { 4 } else { 2 };
        for b in [1u64, 4] {
            let id = format!("all-minilm-l6-v2/encode/{p}/b{b}/c128");
            let load = one(&id, Phase::Load);
            assert_eq!(load.mode, vramlab::vocab::Mode::Encode);
            assert_eq!(load.architecture, "bert");
            assert_eq!(load.feature_weight_bytes, Some(22_713_216 * bytes));
            let f = one(&id, Phase::Forward);
            // One forward over the batch: nothing survives it, and it needed activations.
            assert_eq!(f.end_allocated, f.baseline_allocated, "{id}");
            assert!(f.peak_allocated > f.end_allocated, "{id}");
            assert_eq!(f.feature_act_bytes, Some(b * 128 * 384 * 6 * bytes));
            assert_eq!((f.feature_kv_bytes, f.kv_tokens), (Some(0), None));
            let total = one(&id, Phase::Total);
            assert_eq!(total.peak_allocated, f.peak_allocated);
        }
        // A larger batch needs more at its peak.
        let peak = |b: u64| {
            one(
                &format!("all-minilm-l6-v2/encode/{p}/b{b}/c128"),
                Phase::Forward,
            )
            .peak_allocated
        };
        assert!(peak(4) > peak(1));
    }
}

/// The tiny Mistral of harness/tests/data/tiny-mistral: 2 layers, 2 KV heads of 16 dims, f32,
/// batch 2; window 8, context 24, prompt 4, 20 decode steps.
const MISTRAL_KV_PER_TOKEN: u64 = 2 * 2 * 2 * 16 * 4;
const WINDOW: u64 = 8;

#[test]
fn mistral_cache_is_capped_at_the_window_to_the_byte() {
    let id = |kind: &str, full: bool| {
        format!(
            "synthetic-tiny-mistral/infer/f32/b2/c24/{kind}{}",
            if full { "/kv-full" } else { "" }
        )
    };
    let step = MISTRAL_KV_PER_TOKEN * 2;
    for kind in ["preallocated", "growing"] {
        // Capped: past the window, every decode row ends with the same bytes.
        let capped = rows(&id(kind, false), Phase::Decode);
        assert_eq!(capped.len(), 20);
        let past: Vec<_> = capped
            .iter()
            .filter(|d| 4 + d.step.unwrap() >= WINDOW)
            .collect();
        assert_eq!(past.len(), 17);
        for d in &past {
            assert_eq!(d.kv_tokens, Some(WINDOW));
            assert_eq!(
                d.end_allocated, past[0].end_allocated,
                "{kind} step {:?}",
                d.step
            );
            assert_eq!(d.feature_kv_bytes, Some(WINDOW * step));
            assert_eq!(d.kv_window, Some(KvWindow::Model));
        }
        // Full: the cache keeps every token.
        let full = rows(&id(kind, true), Phase::Decode);
        let last = full.last().unwrap();
        assert_eq!(last.kv_tokens, Some(24));
        assert_eq!(last.feature_kv_bytes, Some(24 * step));
        assert_eq!(last.kv_window, Some(KvWindow::Full));
    }
    // Growing and full: one token more per step, past the window too.
    let full = rows(&id("growing", true), Phase::Decode);
    for w in full.windows(2) {
        assert_eq!(
            w[1].end_allocated.unwrap() - w[0].end_allocated.unwrap(),
            step
        );
    }
    // Growing and capped: one token per step up to the window, then none.
    let pre = one(&id("growing", false), Phase::Prefill);
    for d in rows(&id("growing", false), Phase::Decode) {
        let held = (4 + d.step.unwrap()).min(WINDOW);
        assert_eq!(
            d.end_allocated.unwrap() - pre.end_allocated.unwrap(),
            (held - 4) * step
        );
    }
    // Preallocated: the capped cache is (context - window) tokens smaller, exactly.
    let capped = one(&id("preallocated", false), Phase::Prefill);
    let full = one(&id("preallocated", true), Phase::Prefill);
    assert_eq!(grown(full) - grown(capped), (24 - WINDOW) * step);
    assert_eq!(capped.feature_kv_bytes, Some(WINDOW * step));
    assert_eq!(full.feature_kv_bytes, Some(24 * step));
}

/// Logits of the last position, as f32.
fn last_logits(t: &candle_core::Tensor) -> Vec<f32> {
    let s = t.dim(1).unwrap();
    t.narrow(1, s - 1, 1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

#[test]
fn a_capped_window_decodes_what_the_uncapped_model_does() {
    use candle_core::{DType, Device, Tensor};
    let path = root().join("harness/tests/data/tiny-mistral/config.json");
    let cfg = Config::from_file(&path).unwrap();
    assert_eq!(cfg.sliding_window, Some(WINDOW as usize));
    let dev = Device::Cpu;
    let weights = vramlab::model::synth::generate(&cfg, DType::F32, 7, &dev).unwrap();
    let InferenceModel::Decoder(model) = cfg
        .architecture
        .inference(&cfg, weights, DType::F32)
        .unwrap()
    else {
        panic!("mistral is a decoder");
    };
    // 12 prompt tokens (longer than the window) and 6 decoded ones.
    let ids: Vec<u32> = (0..18u32).map(|i| (i * 37 + 11) % 512).collect();
    let all = Tensor::new(ids.as_slice(), &dev)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    for (kind, window) in [
        (KvKind::Preallocated, KvWindow::Model),
        (KvKind::Growing, KvWindow::Model),
        (KvKind::Preallocated, KvWindow::Full),
        (KvKind::Growing, KvWindow::Full),
    ] {
        let mut cache = KvCache::new(kind, &cfg, 1, 18, window, DType::F32, &dev).unwrap();
        model
            .forward(&all.narrow(1, 0, 12).unwrap(), 0, Some(&mut cache), true)
            .unwrap();
        for pos in 12..18 {
            let step = all.narrow(1, pos, 1).unwrap();
            let got = last_logits(&model.forward(&step, pos, Some(&mut cache), true).unwrap());
            // Without a cache: the whole sequence up to `pos`, windowed by the causal mask.
            let reference = model
                .forward(&all.narrow(1, 0, pos + 1).unwrap(), 0, None, true)
                .unwrap();
            let want = last_logits(&reference);
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-4, "{kind:?} {window:?} position {pos}: {diff}");
        }
        let held = if window == KvWindow::Model {
            WINDOW as usize
        } else {
            18
        };
        assert_eq!(cache.held(), held);
    }
}
