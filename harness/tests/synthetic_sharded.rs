//! Synthetic weights through the real loader: `synth-weights` writes safetensors, the sweep
//! loads them (single file and a sharded index), with exact load figures. Uses a small
//! Qwen2-shaped config so the qkv-bias path is exercised too.
mod common;
use common::vramlab;
use std::path::Path;

const CONFIG: &str = r#"{"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 64,
 "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": false}"#;

/// By hand: embed + lm_head + 2 × (q,k,v,o + biases + mlp + 2 norms) + final norm.
const PARAMS: u64 = {
    let (v, d, f, kv) = (1000u64, 64u64, 160u64, 32u64);
    2 * v * d + 2 * (d * d + 2 * d * kv + d * d + (d + 2 * kv) + 3 * d * f + 2 * d) + d
};
const TENSORS: u64 = 2 + 2 * 12 + 1;

fn scenario(dir: &Path, source: &str) -> std::path::PathBuf {
    let p = dir.join("s.toml");
    std::fs::write(
        &p,
        format!(
            "name = \"syn\"\n[model]\nsource = \"{source}\"\n[sweep]\nmode = [\"infer\"]\nprecision = [\"f32\", \"f16\"]\nbatch = [2]\ncontext = [32]\nkv_cache = [\"growing\"]\ndecode_steps = 4\n"
        ),
    )
    .unwrap();
    p
}

fn check_load(csv: &Path, source_kind: &str) {
    let rows = vramlab::export::csv::read(csv).unwrap();
    let loads: Vec<_> = rows
        .iter()
        .filter(|r| r.phase == Some(vramlab::record::Phase::Load))
        .collect();
    assert_eq!(loads.len(), 2);
    for r in loads {
        assert_eq!(r.weight_source, source_kind);
        assert_eq!(r.param_count, PARAMS);
        let bytes = if r.precision == vramlab::vocab::Precision::F32 {
            4
        } else {
            2
        };
        let live = r.end_allocated.unwrap() - r.baseline_allocated.unwrap();
        assert!(live >= PARAMS * bytes, "{live}");
        assert!((live - PARAMS * bytes) / TENSORS <= 512, "{live}");
    }
}

#[test]
fn synth_weights_then_sharded_index() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, CONFIG).unwrap();
    let single = dir.path().join("single");
    vramlab()
        .args(["synth-weights", "--dtype", "f32", "--config"])
        .arg(&cfg)
        .arg("--out")
        .arg(&single)
        .assert()
        .success()
        .stdout(predicates::str::contains(format!("{PARAMS} parameters")));

    // Split the single file into two shards plus an index, as HF publishes large models.
    let all =
        candle_core::safetensors::load(single.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    let sharded = dir.path().join("sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    std::fs::copy(single.join("config.json"), sharded.join("config.json")).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut map = serde_json::Map::new();
    for (name, t) in all {
        let shard = if name.contains("layers.1.") || name.starts_with("lm_head") {
            b.push((name.clone(), t));
            "model-00002-of-00002.safetensors"
        } else {
            a.push((name.clone(), t));
            "model-00001-of-00002.safetensors"
        };
        map.insert(name, shard.into());
    }
    for (v, f) in [
        (a, "model-00001-of-00002.safetensors"),
        (b, "model-00002-of-00002.safetensors"),
    ] {
        let m: std::collections::HashMap<_, _> = v.into_iter().collect();
        candle_core::safetensors::save(&m, sharded.join(f)).unwrap();
    }
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();

    for (src, kind) in [
        (format!("hf:{}", sharded.display()), "safetensors"),
        (format!("synthetic:{}", cfg.display()), "synthetic"),
    ] {
        let sc = scenario(dir.path(), &src);
        let out = dir.path().join(format!("{kind}.csv"));
        vramlab()
            .args(["sweep", "--quiet", "--out"])
            .arg(&out)
            .arg(&sc)
            .assert()
            .success();
        check_load(&out, kind);
    }

    // A missing shard is a clear one-line error naming the index.
    std::fs::remove_file(sharded.join("model-00002-of-00002.safetensors")).unwrap();
    let sc = scenario(dir.path(), &format!("hf:{}", sharded.display()));
    vramlab()
        .args(["sweep", "--quiet", "--out"])
        .arg(dir.path().join("x.csv"))
        .arg(&sc)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "model.safetensors.index.json: shard `model-00002-of-00002.safetensors` named by weight_map does not exist",
        ));
}

/// `synth-weights --pipeline MODEL --configs-only`: model_index.json and each component's
/// config.json, no weights, which the diffusers loader reads back as the preset itself (the
/// same components, dtypes and parameter counts from the configs alone). That folder is what the
/// emulated GPU builds from (docs/src/guides/emulator.md).
#[test]
fn synth_weights_pipeline_configs_only_reads_back_as_the_preset() {
    use candle_core::DType;
    use vramlab::model::diffusion::{from_dir, preset};
    use vramlab::vocab::GenModel;
    for (m, flag, dtype) in [
        (GenModel::Wan21T2v13b, "bf16", DType::BF16),
        (GenModel::Sdxl, "f16", DType::F16),
        (GenModel::FluxSchnell, "bf16", DType::BF16),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        vramlab()
            .args(["synth-weights", "--pipeline", m.as_str(), "--dtype", flag])
            .arg("--configs-only")
            .arg("--out")
            .arg(&dir)
            .assert()
            .success();
        let files: Vec<_> = walk(&dir);
        assert!(
            files.iter().any(|f| f.ends_with("model_index.json")),
            "{files:?}"
        );
        assert!(
            files
                .iter()
                .all(|f| f.extension().is_some_and(|e| e == "json")),
            "{m}: {files:?}"
        );
        let want = preset(m, dtype, None).unwrap();
        let read = from_dir(&dir, dtype, None).unwrap();
        assert_eq!(read.components(), want.components(), "{m}");
        for c in want.components() {
            assert_eq!(read.dtype(c), want.dtype(c), "{m} {c}");
            assert_eq!(read.params_analytic(c), want.params_analytic(c), "{m} {c}");
        }
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
