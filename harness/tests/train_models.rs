//! Every trainable architecture (llama, gpt2, bert) reaches every parameter in backward: each
//! loaded tensor becomes a `Var`, one forward+loss+backward runs on seeded ids (batch 2, seq 16),
//! and every variable must get a present, non-zero gradient. Once with compute = f32, once with
//! the mixed-precision policy (f32 variables, bf16 compute), where gradients must land on the f32
//! variables as f32. Llama and gpt2 use small synthetic configs; bert uses the real MiniLM.
mod common;
use candle_core::{DType, Device, Tensor, Var};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use vramlab::model::{llm::bert::Bert, llm::gpt2::Gpt2, weights, Config, Llama, Source, Trainable};

const BATCH: usize = 2;
const SEQ: usize = 16;

type Build = fn(&Config, HashMap<String, Tensor>, DType) -> anyhow::Result<Box<dyn Trainable>>;

fn llama(c: &Config, t: HashMap<String, Tensor>, d: DType) -> anyhow::Result<Box<dyn Trainable>> {
    Ok(Box::new(Llama::new(c, t, d)?))
}
fn gpt2(c: &Config, t: HashMap<String, Tensor>, d: DType) -> anyhow::Result<Box<dyn Trainable>> {
    Ok(Box::new(Gpt2::new(c, t, d)?))
}
fn bert(c: &Config, t: HashMap<String, Tensor>, d: DType) -> anyhow::Result<Box<dyn Trainable>> {
    Ok(Box::new(Bert::new(c, t, d)?))
}

/// Seeded token ids (b, s) in 0..vocab.
fn seeded_ids(seed: u64, vocab: usize) -> Tensor {
    let mut rng = StdRng::seed_from_u64(seed);
    let v: Vec<u32> = (0..BATCH * SEQ)
        .map(|_| rng.random_range(0..vocab as u32))
        .collect();
    Tensor::from_vec(v, (BATCH, SEQ), &Device::Cpu).unwrap()
}

/// Synthetic f32 weights for `cfg` written to a temp dir and loaded by the real loader.
fn synthetic(cfg: &Config) -> (tempfile::TempDir, HashMap<String, Tensor>) {
    let dir = tempfile::tempdir().unwrap();
    vramlab::model::synth::write(cfg, DType::F32, 7, dir.path()).unwrap();
    let t = weights::load(
        &Source::Hf(dir.path().into()),
        cfg,
        DType::F32,
        &Device::Cpu,
        |_, _| {},
    )
    .unwrap();
    (dir, t)
}

fn minilm() -> (Config, HashMap<String, Tensor>) {
    let dir = common::models().join("all-minilm-l6-v2");
    assert!(
        dir.join("model.safetensors").exists(),
        "{} is missing: run scripts/fetch-test-models.sh first",
        dir.display()
    );
    let cfg = Config::from_file(&dir.join("config.json")).unwrap();
    let t = weights::load(&Source::Hf(dir), &cfg, DType::F32, &Device::Cpu, |_, _| {}).unwrap();
    (cfg, t)
}

fn small_llama() -> Config {
    let v = json!({"model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": true});
    Config::from_json(Path::new("llama.json"), &v).unwrap()
}

fn small_gpt2() -> Config {
    let v = json!({"model_type": "gpt2", "vocab_size": 1000, "n_embd": 64, "n_layer": 2,
        "n_head": 4, "n_positions": 128});
    Config::from_json(Path::new("gpt2.json"), &v).unwrap()
}

/// Makes every tensor a variable, runs forward+loss+backward with activations in `compute`,
/// and asserts that every variable gets a present, non-zero gradient in the variable's dtype.
/// Returns (parameter count, loss).
fn grads_reach_every_var(
    arch: &str,
    cfg: &Config,
    tensors: &HashMap<String, Tensor>,
    build: Build,
    compute: DType,
) -> (usize, f32) {
    let vars: Vec<(String, Var)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), Var::from_tensor(t).unwrap()))
        .collect();
    assert_eq!(vars.len(), cfg.tensor_count(), "{arch}: tensor count");
    let params: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    assert_eq!(params as u64, cfg.param_count(), "{arch}: parameter count");
    let model = build(
        cfg,
        vars.iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect(),
        compute,
    )
    .unwrap();
    let ids = seeded_ids(1, cfg.vocab_size);
    let targets = seeded_ids(2, cfg.vocab_size);
    let loss = model.forward_loss(&ids, &targets).unwrap();
    assert_eq!(loss.dtype(), DType::F32, "{arch}: loss dtype");
    let value = loss.to_scalar::<f32>().unwrap();
    assert!(value.is_finite(), "{arch} {compute:?}: loss {value}");
    let grads = loss.backward().unwrap();
    let mut missing = Vec::new();
    let mut zero = Vec::new();
    for (name, var) in &vars {
        match grads.get(var.as_tensor()) {
            None => missing.push(name.clone()),
            Some(g) => {
                assert_eq!(g.dtype(), var.dtype(), "{arch}: gradient dtype of {name}");
                assert_eq!(g.dims(), var.dims(), "{arch}: gradient shape of {name}");
                let m = common::max_abs(g);
                assert!(m.is_finite(), "{arch}: gradient of {name} is not finite");
                if m <= 0.0 {
                    zero.push(name.clone());
                }
            }
        }
    }
    assert!(
        missing.is_empty() && zero.is_empty(),
        "{arch} {compute:?}: {} of {} variables lack a gradient {missing:?}, {} have a zero one {zero:?}",
        missing.len(),
        vars.len(),
        zero.len()
    );
    eprintln!(
        "{arch} compute={compute:?}: {} tensors, {params} parameters, loss {value:.6}",
        vars.len()
    );
    (params, value)
}

/// The f32 check, then the mixed-precision one (f32 variables, bf16 compute); returns the f32
/// (parameter count, loss).
fn both_policies(
    arch: &str,
    cfg: &Config,
    t: &HashMap<String, Tensor>,
    build: Build,
) -> (usize, f32) {
    let (params, l32) = grads_reach_every_var(arch, cfg, t, build, DType::F32);
    let (_, l16) = grads_reach_every_var(arch, cfg, t, build, DType::BF16);
    // Same weights, same ids: the mixed policy's loss is the f32 loss up to bf16 rounding.
    assert!(
        (l32 - l16).abs() <= 0.05 * l32.abs().max(0.01),
        "{arch}: f32 loss {l32} vs mixed-bf16 loss {l16}"
    );
    (params, l32)
}

#[test]
fn llama_every_parameter_gets_a_gradient() {
    let cfg = small_llama();
    let (_dir, t) = synthetic(&cfg);
    both_policies("llama", &cfg, &t, llama);
}

#[test]
fn gpt2_every_parameter_gets_a_gradient() {
    let cfg = small_gpt2();
    let (_dir, t) = synthetic(&cfg);
    // Untrained uniform weights: the loss is close to ln(vocab).
    let (params, loss) = grads_reach_every_var("gpt2", &cfg, &t, gpt2, DType::F32);
    assert_eq!(
        params,
        1000 * 64 + 128 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64
    );
    assert!((loss - (1000f32).ln()).abs() < 0.1, "gpt2 loss {loss}");
    both_policies("gpt2", &cfg, &t, gpt2);
}

#[test]
fn minilm_every_parameter_gets_a_gradient() {
    let (cfg, t) = minilm();
    assert_eq!(cfg.param_count(), 22_713_216);
    both_policies("bert", &cfg, &t, bert);
}

#[test]
fn minilm_forward_is_sane() {
    let (cfg, t) = minilm();
    let model = Bert::new(&cfg, t, DType::F32).unwrap();
    let ids = seeded_ids(1, cfg.vocab_size);
    let e1 = model.encode(&ids).unwrap();
    let e2 = model.encode(&ids).unwrap();
    assert_eq!(e1.dims(), &[BATCH, cfg.hidden_size]);
    // Deterministic.
    let d = (&e1 - &e2).unwrap().abs().unwrap().max_all().unwrap();
    assert_eq!(d.to_scalar::<f32>().unwrap(), 0.0);
    // Rows are independent: the same sequence in both rows gives the same embedding.
    let row = ids.narrow(0, 0, 1).unwrap();
    let same = model
        .encode(&Tensor::cat(&[&row, &row], 0).unwrap())
        .unwrap();
    let d = common::max_abs_diff(&same.get(0).unwrap(), &same.get(1).unwrap());
    assert!(d < 1e-5, "batch rows differ by {d}");
    let d = common::max_abs_diff(&same.get(0).unwrap(), &e1.get(0).unwrap());
    assert!(d < 1e-5, "embedding depends on the other row: {d}");
    // Norms of un-normalized MiniLM sentence embeddings are of order one to ten.
    let norms: Vec<f32> = e1
        .sqr()
        .unwrap()
        .sum(1)
        .unwrap()
        .sqrt()
        .unwrap()
        .to_vec1()
        .unwrap();
    eprintln!("minilm mean-pooled embedding norms {norms:?}");
    for n in &norms {
        assert!(n.is_finite() && *n > 0.5 && *n < 50.0, "norm {n}");
    }
    // Positions matter: reversing the sequence changes the embedding.
    let rev: Vec<u32> = ids
        .get(0)
        .unwrap()
        .to_vec1::<u32>()
        .unwrap()
        .into_iter()
        .rev()
        .collect();
    let rev = Tensor::from_vec(rev, (1, SEQ), &Device::Cpu).unwrap();
    let er = model.encode(&rev).unwrap().get(0).unwrap();
    let d = common::max_abs_diff(&er, &e1.get(0).unwrap());
    assert!(d > 1e-3, "reversed sequence gives the same embedding ({d})");
}

/// The reference values of the two tests below, read from harness/tests/data/
/// train-models-ref.json. Written by scripts/reference/train_models_ref.py (transformers'
/// BertModel and GPT2LMHeadModel in float64 on the same weights and inputs):
/// `$(scripts/torch-env.sh) scripts/reference/train_models_ref.py`.
fn reference(model: &str) -> serde_json::Value {
    let p = common::root().join("harness/tests/data/train-models-ref.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v[model].take()
}

fn json_vec<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Vec<T> {
    serde_json::from_value(v.clone()).unwrap()
}

/// `got` against the reference `want`, element by element within `tol`.
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() < tol,
            "{what} {i}: {g} vs reference {w}"
        );
    }
}

/// MiniLM against transformers' BertModel (float64, same safetensors) for "[CLS] the cat sat
/// on the mat . [SEP]": every mean-pooled value, the norm, and the pooled-regression loss.
#[test]
fn minilm_matches_a_reference_implementation() {
    let want = reference("minilm");
    let (cfg, t) = minilm();
    let model = Bert::new(&cfg, t, DType::F32).unwrap();
    let ids: Vec<u32> = json_vec(&want["ids"]);
    let ids = Tensor::from_vec(ids.clone(), (1, ids.len()), &Device::Cpu).unwrap();
    let e: Vec<f32> = model
        .encode(&ids)
        .unwrap()
        .get(0)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_close("dim", &e, &json_vec::<f64>(&want["mean_pooled"]), 1e-4);
    let norm = e.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert_close("norm", &[norm], &[want["norm"].as_f64().unwrap()], 1e-4);
    assert_eq!(
        want["pooled_target"].as_f64(),
        Some(vramlab::model::llm::bert::POOLED_TARGET)
    );
    let loss = model
        .forward_loss(&ids, &ids)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_close("loss", &[loss], &[want["loss"].as_f64().unwrap()], 1e-5);
}

/// GPT-2 against transformers' GPT2LMHeadModel (float64) on formula weights: element k of the
/// ti-th tensor, in the reference's tensor order (HF's), is 0.2·sin(0.37·k + 1.3·ti), plus 1
/// for LayerNorm weights. Every logit of the last position, and the loss.
#[test]
fn gpt2_matches_a_reference_implementation() {
    let want = reference("gpt2");
    let cfg = Config::from_json(Path::new("gpt2.json"), &want["config"]).unwrap();
    let mut shapes: HashMap<String, Vec<usize>> = cfg.tensor_shapes().into_iter().collect();
    let names: Vec<String> = json_vec(&want["tensors"]);
    let t: HashMap<String, Tensor> = names
        .iter()
        .enumerate()
        .map(|(ti, name)| {
            let shape = shapes
                .remove(name)
                .unwrap_or_else(|| panic!("reference tensor {name} is not in tensor_shapes()"));
            let base = if name.contains("ln_") && name.ends_with(".weight") {
                1.0
            } else {
                0.0
            };
            let n: usize = shape.iter().product();
            let vals: Vec<f32> = (0..n)
                .map(|k| (base + 0.2 * (0.37 * k as f64 + 1.3 * ti as f64).sin()) as f32)
                .collect();
            (
                name.clone(),
                Tensor::from_vec(vals, shape, &Device::Cpu).unwrap(),
            )
        })
        .collect();
    assert!(shapes.is_empty(), "not in the reference: {shapes:?}");
    let model = Gpt2::new(&cfg, t, DType::F32).unwrap();
    let ids: Vec<u32> = json_vec(&want["ids"]);
    let targets: Vec<u32> = json_vec(&want["targets"]);
    let s = ids.len();
    let ids = Tensor::from_vec(ids, (1, s), &Device::Cpu).unwrap();
    let targets = Tensor::from_vec(targets, (1, s), &Device::Cpu).unwrap();
    let logits: Vec<f32> = model
        .forward(&ids)
        .unwrap()
        .get(0)
        .unwrap()
        .get(s - 1)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_close(
        "logit",
        &logits,
        &json_vec::<f64>(&want["last_logits"]),
        1e-4,
    );
    let loss = model
        .forward_loss(&ids, &targets)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_close("loss", &[loss], &[want["loss"].as_f64().unwrap()], 1e-4);
}

/// `lora-r4` on each architecture: the adapters are the only trainable variables, they add
/// exactly `features::adapter_params`, the adapted model starts equal to the base model (B is
/// zero), and backward reaches every B (A's gradient is B-weighted, so zero at the start).
fn lora_attaches(arch: &str, cfg: &Config, tensors: HashMap<String, Tensor>) {
    use vramlab::scenario::spec::Trainable as Set;
    let vars = vramlab::model::trainable::to_vars(tensors).unwrap();
    let ids = seeded_ids(1, cfg.vocab_size);
    let targets = seeded_ids(2, cfg.vocab_size);
    let (base, _) = vramlab::model::trainable::trainable_model(
        cfg,
        &vars,
        Set::Full,
        DType::F32,
        Default::default(),
    )
    .unwrap();
    let base_loss = base.forward_loss(&ids, &targets).unwrap();
    let (model, adapters) = vramlab::model::trainable::trainable_model(
        cfg,
        &vars,
        Set::Lora(4),
        DType::F32,
        Default::default(),
    )
    .unwrap();
    let targets_per_layer = cfg.architecture.lora_targets().len();
    assert_eq!(
        adapters.len(),
        2 * targets_per_layer * cfg.num_layers,
        "{arch}"
    );
    let params: usize = adapters.iter().map(|v| v.elem_count()).sum();
    assert_eq!(
        Ok(params as u64),
        vramlab::features::adapter_params(cfg, Set::Lora(4)),
        "{arch}"
    );
    let loss = model.forward_loss(&ids, &targets).unwrap();
    let diff = (loss.to_scalar::<f32>().unwrap() - base_loss.to_scalar::<f32>().unwrap()).abs();
    assert!(
        diff < 1e-6,
        "{arch}: LoRA with B = 0 changed the loss by {diff}"
    );
    let grads = loss.backward().unwrap();
    let max_abs = |v: &Var| -> f32 {
        common::max_abs(
            grads
                .get(v.as_tensor())
                .expect("every adapter has a gradient"),
        )
    };
    // Adapters come as (A, B) pairs per module.
    for pair in adapters.chunks(2) {
        assert_eq!(max_abs(&pair[0]), 0.0, "{arch}: A's gradient while B = 0");
        assert!(max_abs(&pair[1]) > 0.0, "{arch}: B gets no gradient");
    }
    // The frozen base weights get none.
    assert!(vars.iter().all(|(_, v)| grads.get(v.as_tensor()).is_none()));
}

#[test]
fn lora_attaches_to_every_architecture() {
    let cfg = small_llama();
    let (_d1, t) = synthetic(&cfg);
    lora_attaches("llama", &cfg, t);
    let cfg = small_gpt2();
    let (_d2, t) = synthetic(&cfg);
    lora_attaches("gpt2", &cfg, t);
    let (cfg, t) = minilm();
    lora_attaches("bert", &cfg, t);
}
