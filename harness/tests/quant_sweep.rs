//! Quantized GGUF inference, measured by the real binary (its own process, so the counting
//! allocator sees only the sweep): SmolLM2-135M Q4_1 kept in its blocks (`native`, f32 and
//! bf16 compute) and re-quantized to Q8_0. The weight bytes are derived here from the GGUF
//! tensor table, parsed by this file (not by the loader's code path), with the block sizes of
//! the GGUF specification.
mod common;
use common::*;
use std::collections::HashMap;
use std::io::Read;
use std::sync::OnceLock;
use vramlab::record::{Phase, Record, Status};
use vramlab::vocab::{Compute, Precision, QMatmul};

/// (block size in weights, bytes per block) of a GGML type id, from the GGUF specification.
fn block(type_id: u32) -> (u64, u64) {
    match type_id {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        30 => (1, 2),     // BF16
        t => panic!("type {t} is not in this test's table"),
    }
}

/// One entry of a GGUF tensor table: name, dims (GGUF order: fastest first), type id.
struct Info {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
}

/// Parses the GGUF header (v2/v3) up to the end of the tensor table.
fn tensor_table(path: &std::path::Path) -> Vec<Info> {
    let mut f = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    fn u32_(f: &mut impl Read) -> u32 {
        let mut b = [0u8; 4];
        f.read_exact(&mut b).unwrap();
        u32::from_le_bytes(b)
    }
    fn u64_(f: &mut impl Read) -> u64 {
        let mut b = [0u8; 8];
        f.read_exact(&mut b).unwrap();
        u64::from_le_bytes(b)
    }
    fn string(f: &mut impl Read) -> String {
        let n = u64_(f) as usize;
        let mut b = vec![0u8; n];
        f.read_exact(&mut b).unwrap();
        String::from_utf8(b).unwrap()
    }
    fn skip(f: &mut impl Read, t: u32) {
        let n = match t {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => {
                string(f);
                return;
            }
            9 => {
                let (et, n) = (u32_(f), u64_(f));
                for _ in 0..n {
                    skip(f, et);
                }
                return;
            }
            t => panic!("metadata type {t}"),
        };
        let mut b = vec![0u8; n];
        f.read_exact(&mut b).unwrap();
    }
    assert_eq!(u32_(&mut f), 0x4655_4747, "GGUF magic");
    assert!(u32_(&mut f) >= 2, "GGUF v2 or later");
    let (tensors, kvs) = (u64_(&mut f), u64_(&mut f));
    for _ in 0..kvs {
        string(&mut f);
        let t = u32_(&mut f);
        skip(&mut f, t);
    }
    (0..tensors)
        .map(|_| {
            let name = string(&mut f);
            let n = u32_(&mut f);
            let dims = (0..n).map(|_| u64_(&mut f)).collect();
            let type_id = u32_(&mut f);
            let _offset = u64_(&mut f);
            Info {
                name,
                dims,
                type_id,
            }
        })
        .collect()
}

/// Loaded weight bytes of SmolLM2 at a quantized precision: every matrix as blocks of its
/// type (`requant`: this (block, bytes) instead of the file's), every 1-D tensor dense at
/// `compute_bytes`. Also the tensor count.
fn expected_weight_bytes(requant: Option<(u64, u64)>, compute_bytes: u64) -> (u64, u64) {
    let table = tensor_table(&smollm2_gguf());
    let mut total = 0;
    for t in &table {
        let elems: u64 = t.dims.iter().product();
        total += if t.dims.len() == 1 {
            elems * compute_bytes
        } else {
            let (bs, bb) = requant.unwrap_or(block(t.type_id));
            assert_eq!(elems % bs, 0, "{}", t.name);
            elems / bs * bb
        };
    }
    (total, table.len() as u64)
}

struct Run {
    rows: Vec<Record>,
    /// The scenario the rows came from (its directory lives as long as the run).
    scenario: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// Sweeps `scenario` with the real binary into a CSV beside it and reads the rows back.
fn sweep(scenario: &std::path::Path) -> Vec<Record> {
    let out = scenario.with_extension("csv");
    vramlab()
        .args(["sweep", "--quiet", "--out"])
        .arg(&out)
        .arg(scenario)
        .assert()
        .success();
    vramlab::export::csv::read(&out).unwrap()
}

fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        smollm2_gguf();
        let dir = tempfile::tempdir().unwrap();
        let scenario = dir.path().join("quant.toml");
        std::fs::write(
            &scenario,
            r#"name = "quant"
device = "cpu"
[model]
source = "gguf:${VRAMLAB_MODELS}/SmolLM2-135M-Instruct.Q4_1.gguf"
[[sweep]]
mode = ["infer"]
precision = ["native"]
compute = ["f32", "bf16"]
batch = [1, 2]
context = [24]
kv_cache = ["preallocated", "growing"]
decode_steps = 4
decode_every = 1
[[sweep]]
mode = ["infer"]
precision = ["native"]
qmatmul = ["dequantize"]
batch = [1, 2]
context = [24]
kv_cache = ["preallocated", "growing"]
decode_steps = 4
decode_every = 1
[[sweep]]
mode = ["infer"]
precision = ["q8_0"]
batch = [1]
context = [24]
kv_cache = ["growing"]
decode_steps = 4
decode_every = 1
"#,
        )
        .unwrap();
        Run {
            rows: sweep(&scenario),
            scenario,
            _dir: dir,
        }
    })
}

fn rows_of(id: &str, phase: Phase) -> Vec<&'static Record> {
    run()
        .rows
        .iter()
        .filter(|r| r.point_id == id && r.phase == Some(phase))
        .collect()
}

fn points() -> Vec<String> {
    let mut ids: Vec<String> = run().rows.iter().map(|r| r.point_id.clone()).collect();
    ids.dedup();
    ids
}

fn compute_bytes(r: &Record) -> u64 {
    match r.compute {
        Some(Compute::F32) => 4,
        Some(Compute::Bf16 | Compute::F16) => 2,
        None => panic!("{}: no compute dtype", r.point_id),
    }
}

/// `vramlab features` (what the torch probe asks for its rows' figures) gives every row's
/// `feature_*` columns as the sweep wrote them, the GGUF's block bytes included.
#[test]
fn features_are_the_rows() {
    for id in points() {
        let rows: Vec<&Record> = run().rows.iter().filter(|r| r.point_id == id).collect();
        let mut cmd = vramlab();
        cmd.args(["features", "--json", "--point", &id])
            .arg(&run().scenario);
        for r in &rows {
            let phase = r.phase.expect("every row has a phase");
            cmd.arg("--row")
                .arg(format!("{phase}@{}", r.kv_tokens.unwrap_or(0)));
        }
        let out = cmd.assert().success().get_output().stdout.clone();
        let got: Vec<serde_json::Value> = serde_json::from_slice(&out).unwrap();
        assert_eq!(got.len(), rows.len(), "{id}");
        for (f, r) in got.iter().zip(&rows) {
            let want = [
                ("feature_weight_bytes", r.feature_weight_bytes),
                ("feature_kv_bytes", r.feature_kv_bytes),
                ("feature_act_bytes", r.feature_act_bytes),
                ("feature_logits_bytes", r.feature_logits_bytes),
                ("feature_optimizer_bytes", r.feature_optimizer_bytes),
            ];
            for (k, v) in want {
                assert_eq!(f[k].as_u64(), v, "{id} {:?} {k}", r.phase);
            }
        }
    }
}

#[test]
fn every_point_ok() {
    let ids = points();
    assert_eq!(ids.len(), 13, "{ids:?}");
    assert!(run().rows.iter().all(|r| r.status == Some(Status::Ok)));
    assert!(ids.iter().any(|i| i.contains("/native-bf16/")));
    assert!(ids.iter().any(|i| i.contains("/q8_0-f32/")));
    assert!(ids.iter().any(|i| i.contains("/native-f32-dequantize/")));
}

/// Load row: `feature_weight_bytes` is the GGUF block bytes (the file mixes Q4_1 matrices
/// and a Q8_0 embedding) plus the F32 norms in the compute dtype, to the byte; the live bytes
/// the load leaves are that plus at most 512 B of metadata per tensor.
#[test]
fn load_is_the_gguf_block_bytes_plus_bounded_metadata() {
    for id in points() {
        let r = rows_of(&id, Phase::Load)[0];
        let requant = (r.precision == Precision::Q8_0).then_some((32, 34));
        let (weights, tensors) = expected_weight_bytes(requant, compute_bytes(r));
        assert_eq!(r.feature_weight_bytes, Some(weights), "{id}");
        let live = r.end_allocated.unwrap() - r.baseline_allocated.unwrap();
        assert!(live >= weights, "{id}: live {live} < weights {weights}");
        assert!(
            live - weights <= 512 * tensors,
            "{id}: {} B of metadata for {tensors} tensors",
            live - weights
        );
        let types = if r.precision == Precision::Q8_0 {
            "211 Q8_0"
        } else {
            "210 Q4_1"
        };
        assert!(r.message.contains(types), "{id}: {}", r.message);
    }
    // Native Q4_1 is about 18 % of the f32 model (4.5 + scales vs 32 bits per weight).
    let native = rows_of(&points()[0], Phase::Load)[0];
    assert!(native.feature_weight_bytes.unwrap() * 5 < SMOLLM2_PARAMS * 4);
}

/// `estimate --model FILE.gguf` reads the same tensor types: its weights are the load row's.
#[test]
fn estimate_reads_the_gguf_types() {
    let out = vramlab()
        .arg("estimate")
        .arg("--model")
        .arg(smollm2_gguf())
        .arg("--json")
        .assert()
        .success();
    let j: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let native = run()
        .rows
        .iter()
        .find(|r| {
            r.phase == Some(Phase::Load)
                && r.precision == Precision::Native
                && r.compute == Some(Compute::F32)
        })
        .unwrap();
    assert_eq!(j["weights"]["bytes"].as_u64(), native.feature_weight_bytes);
    assert_eq!(
        j["breakdown"][0]["bytes"].as_u64(),
        native.feature_weight_bytes
    );
    assert_eq!(j["query"]["precision"], "native");
}

/// KV in the compute dtype: the preallocated cache is allocated whole in the prefill, the
/// growing one grows by one token's K and V per decode step, exactly.
#[test]
fn kv_is_exact_in_the_compute_dtype() {
    for id in points() {
        let pre = rows_of(&id, Phase::Prefill)[0];
        let bpt = SMOLLM2_KV_ELEMS_PER_TOKEN * compute_bytes(pre);
        let decodes = rows_of(&id, Phase::Decode);
        assert_eq!(decodes.len(), 4, "{id}");
        if id.contains("/preallocated") {
            check_preallocated_kv(&id, pre, &decodes, bpt);
        } else {
            check_growing_kv(&id, pre, &decodes, bpt);
        }
    }
}

/// Every row carries its compute dtype and product path, the ones its point id names.
#[test]
fn rows_carry_the_compute_and_qmatmul_columns() {
    let by: HashMap<&str, (&str, Option<QMatmul>)> = run()
        .rows
        .iter()
        .map(|r| {
            (
                r.point_id.as_str(),
                (r.compute.map_or("", |c| c.as_str()), r.qmatmul),
            )
        })
        .collect();
    for (id, (c, q)) in by {
        match q {
            Some(QMatmul::Dequantize) => assert!(id.contains(&format!("-{c}-dequantize/")), "{id}"),
            Some(QMatmul::Auto) => assert!(id.contains(&format!("-{c}/")), "{id} {c}"),
            None => panic!("{id}: a quantized row without a qmatmul"),
        }
    }
}

/// `qmatmul = "dequantize"` holds each weight dequantized in f32 for the length of its
/// product; candle's `QMatMul` (`auto`) never does on CPU. The largest matrix in f32 is
/// rows × cols × 4 B from the GGUF tensor table (the tied embedding as the LM head:
/// 49,152 × 576 × 4 = 113,246,208 B). In every prefill and decode phase the dequantize
/// point's rise above its baseline is at least that weight plus the logits it is multiplied
/// into (b × vocab × 4 B, live with it), and at most the auto point's rise plus that weight
/// plus 16 KiB for the dense product's own small buffers (measured: 9,210 B in decode):
/// dequantizing adds the weight to the peak, nothing else. It does not always add it on top
/// of auto's own peak: in the prefill auto peaks elsewhere in the layer stack, where
/// dequantize holds a smaller weight (at b1 c24 the difference is 562,606 B under the weight).
#[test]
fn dequantize_adds_the_largest_weight_to_the_peak() {
    let table = tensor_table(&smollm2_gguf());
    let largest = table
        .iter()
        .filter(|t| t.dims.len() == 2)
        .map(|t| t.dims[0] * t.dims[1] * 4)
        .max()
        .unwrap();
    let vocab = table
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .unwrap()
        .dims[1];
    let mut compared = 0;
    for id in points().iter().filter(|i| i.contains("-dequantize/")) {
        let auto = id.replace("-dequantize/", "/");
        for phase in [Phase::Prefill, Phase::Decode] {
            for (d, a) in rows_of(id, phase).iter().zip(rows_of(&auto, phase)) {
                assert_eq!(
                    (d.qmatmul, a.qmatmul),
                    (Some(QMatmul::Dequantize), Some(QMatmul::Auto))
                );
                let rise = |r: &Record| r.peak_allocated.unwrap() - r.baseline_allocated.unwrap();
                let (rd, ra) = (rise(d), rise(a));
                let logits = d.batch * vocab * 4;
                println!(
                    "{id} {phase:?} step {:?}: dequantize rise {rd}, auto rise {ra}, difference {}, largest weight {largest}",
                    d.step,
                    rd as i64 - ra as i64
                );
                assert!(
                    rd >= largest + logits && rd <= ra + largest + 16 * 1024,
                    "{id} {phase:?} {:?}: dequantize rises {rd}, auto {ra}; expected {largest} + {logits} <= it <= auto + {largest} + 16 KiB",
                    d.step
                );
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 4 * 5, "4 points × (prefill + 4 decode rows)");
}

/// Re-quantization to K-quants, which SmolLM2 cannot take (its 576-wide rows are not whole
/// 256-weight blocks): a tiny llama GGUF written here with candle's GGUF writer, every row a
/// multiple of 256 weights, F32 in the file. Swept at q4k and q8_0, the load row's weight
/// bytes are the block formula of the tensor table parsed above, to the byte: every matrix
/// (the tied embedding too) at 144 B per 256 weights (Q4_K) or 34 B per 32 (Q8_0), every 1-D
/// norm dense in f32; the live bytes add at most 512 B of metadata per tensor.
#[test]
fn requantizing_to_q4k_and_q8_0_is_the_block_formula() {
    use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
    use candle_core::{Device, Tensor};
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny-k.gguf");
    let (d, ffn, layers, vocab, heads, kv) = (256usize, 512usize, 2usize, 512usize, 4u32, 2u32);
    let kv_dim = d / heads as usize * kv as usize;
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![vocab, d]),
        ("output_norm.weight".into(), vec![d]),
    ];
    for l in 0..layers {
        for (n, s) in [
            ("attn_norm", vec![d]),
            ("ffn_norm", vec![d]),
            ("attn_q", vec![d, d]),
            ("attn_k", vec![kv_dim, d]),
            ("attn_v", vec![kv_dim, d]),
            ("attn_output", vec![d, d]),
            ("ffn_gate", vec![ffn, d]),
            ("ffn_up", vec![ffn, d]),
            ("ffn_down", vec![d, ffn]),
        ] {
            shapes.push((format!("blk.{l}.{n}.weight"), s));
        }
    }
    let tensors: Vec<(String, QTensor)> = shapes
        .iter()
        .map(|(n, s)| {
            let t = Tensor::randn(0f32, 0.02, s.as_slice(), &Device::Cpu).unwrap();
            (n.clone(), QTensor::quantize(&t, GgmlDType::F32).unwrap())
        })
        .collect();
    use gguf_file::Value;
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.embedding_length", Value::U32(d as u32)),
        ("llama.feed_forward_length", Value::U32(ffn as u32)),
        ("llama.block_count", Value::U32(layers as u32)),
        ("llama.attention.head_count", Value::U32(heads)),
        ("llama.attention.head_count_kv", Value::U32(kv)),
        ("llama.context_length", Value::U32(256)),
        ("llama.vocab_size", Value::U32(vocab as u32)),
        ("llama.rope.freq_base", Value::F32(10_000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    let mut f = std::fs::File::create(&gguf).unwrap();
    gguf_file::write(
        &mut f,
        &meta.iter().map(|(k, v)| (*k, v)).collect::<Vec<_>>(),
        &tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    drop(f);
    let scenario = dir.path().join("k.toml");
    std::fs::write(
        &scenario,
        format!(
            "name = \"k\"\n[model]\nsource = \"gguf:{}\"\n[sweep]\nmode = [\"infer\"]\n\
             precision = [\"q4k\", \"q8_0\"]\ncompute = [\"f32\"]\nbatch = [1]\ncontext = [16]\n\
             decode_steps = 2\n",
            gguf.display()
        ),
    )
    .unwrap();
    let rows = sweep(&scenario);
    let table = tensor_table(&gguf);
    assert_eq!(table.len(), shapes.len());
    let mut checked = 0;
    for r in rows.iter().filter(|r| r.phase == Some(Phase::Load)) {
        assert_eq!(r.status, Some(Status::Ok), "{}: {}", r.point_id, r.message);
        let (bs, bb) = match r.precision {
            Precision::Q4k => (256, 144),
            Precision::Q8_0 => (32, 34),
            p => panic!("{p}"),
        };
        let weights: u64 = table
            .iter()
            .map(|t| {
                let elems: u64 = t.dims.iter().product();
                assert_eq!(block(t.type_id), (1, 4), "{}: F32 in the file", t.name);
                if t.dims.len() == 1 {
                    elems * 4
                } else {
                    elems / bs * bb
                }
            })
            .sum();
        assert_eq!(r.feature_weight_bytes, Some(weights), "{}", r.point_id);
        let live = r.end_allocated.unwrap() - r.baseline_allocated.unwrap();
        assert!(live >= weights, "{}: live {live} < {weights}", r.point_id);
        assert!(
            live - weights <= 512 * table.len() as u64,
            "{}: {} B of metadata",
            r.point_id,
            live - weights
        );
        checked += 1;
    }
    assert_eq!(checked, 2);
}
