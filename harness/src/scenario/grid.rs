//! Pure grid expansion: a [`Spec`] → the ordered list of points. Points are ordered model-major,
//! then precision, so the points that share loaded weights are contiguous.
use super::spec::{
    Attention, Checkpointing, Compute, Kernels, KvWindow, Mode, Ops, Optimizer, Precision, QMatmul,
    Spec, SweepSpec, Trainable,
};
use crate::model::KvKind;
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Point {
    /// Stable id: `model/infer/precision/bB/cC/kv[/kv-full][/fused][/flash][/rR]`,
    /// `model/train/precision/bB/cC/optimizer/checkpointing/gaN/trainable[/fused][/flash][/rR]`
    /// or `model/encode/precision/bB/cC[/rR]`.
    pub id: String,
    /// The model source string as written in the scenario (before `${VAR}` expansion).
    pub source: String,
    /// Short model name for ids and the `model_id` column.
    pub model_id: String,
    pub mode: Mode,
    pub precision: Precision,
    /// A quantized precision's compute dtype (activations, KV, dense tensors); `None` for a
    /// dense precision, which computes in its own.
    pub compute: Option<Compute>,
    /// A quantized precision's product path; `None` for a dense precision.
    pub qmatmul: Option<QMatmul>,
    pub batch: usize,
    pub context: usize,
    pub prompt_len: usize,
    pub decode_steps: usize,
    pub decode_every: usize,
    pub kv_cache: KvKind,
    /// Whether a sliding-window model's cache is capped at its window (inference).
    pub kv_window: KvWindow,
    pub repeat: usize,
    /// Training axes (meaningful when `mode` is train).
    pub train: TrainAxes,
    /// The op implementations (`kernels`, `attention`); both modes.
    pub ops: Ops,
    /// The index of the `[sweep]` table the point comes from (the torch probe reads that
    /// table's own keys: an `attention` it does not set is the probe's `--attention`).
    pub table: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TrainAxes {
    pub optimizer: Optimizer,
    pub checkpointing: Checkpointing,
    pub grad_accum: usize,
    pub trainable: Trainable,
    pub steps: usize,
    pub lr: f64,
}

/// Whether two points share loaded weights (model source, precision, compute, qmatmul and
/// mode): the one
/// grouping rule of the runner, the supervisor and the sweep command. `expand` keeps a
/// group's points contiguous.
pub fn same_group(a: &Point, b: &Point) -> bool {
    a.source == b.source
        && a.precision == b.precision
        && a.compute == b.compute
        && a.qmatmul == b.qmatmul
        && a.mode == b.mode
}

impl Point {
    /// (dense weights, activations and KV) dtypes of the point.
    pub fn dtypes(&self) -> (candle_core::DType, candle_core::DType) {
        self.precision.dtypes(self.compute.unwrap_or_default())
    }
}

/// The model id of a source string, without touching the file system.
pub fn model_id_of(source: &str) -> String {
    crate::model::Source::parse(source)
        .map(|s| s.model_id())
        .unwrap_or_else(|_| source.to_string())
}

/// kernels × attention of one sweep table.
fn ops_axes(s: &SweepSpec) -> Vec<Ops> {
    let mut v = Vec::new();
    for &kernels in &s.kernels {
        for &attention in &s.attention {
            v.push(Ops { kernels, attention });
        }
    }
    v
}

pub fn expand(spec: &Spec) -> Vec<Point> {
    spec.sweep
        .0
        .iter()
        .enumerate()
        .flat_map(|(table, s)| expand_one(spec, table, s))
        .collect()
}

fn expand_one(spec: &Spec, table: usize, s: &SweepSpec) -> Vec<Point> {
    // The per-mode axes: KV cache kinds for inference; optimizer × checkpointing ×
    // accumulation × trainable set for training.
    type Axes = (String, KvKind, KvWindow, Option<TrainAxes>);
    let mut infer_axes: Vec<Axes> = Vec::new();
    for &kv in &s.kv_cache {
        for &w in &s.kv_window {
            // Ids of the default window stay as they were before this axis.
            let tag = match w {
                KvWindow::Model => kv.as_str().to_string(),
                KvWindow::Full => format!("{}/kv-full", kv.as_str()),
            };
            infer_axes.push((tag, kv, w, None));
        }
    }
    let encode_axes: Vec<Axes> = vec![(String::new(), KvKind::Preallocated, KvWindow::Model, None)];
    let mut train_axes = Vec::new();
    for &optimizer in &s.optimizer {
        for &checkpointing in &s.checkpointing {
            for &n in &s.grad_accum {
                for &trainable in &s.trainable {
                    let t = TrainAxes {
                        optimizer,
                        checkpointing,
                        grad_accum: n as usize,
                        trainable,
                        steps: s.train_steps,
                        lr: s.lr,
                    };
                    let tag = format!(
                        "{}/{}/ga{n}/{}",
                        optimizer.as_str(),
                        checkpointing.as_str(),
                        trainable.label()
                    );
                    train_axes.push((tag, KvKind::Preallocated, KvWindow::Model, Some(t)));
                }
            }
        }
    }
    let default_train = TrainAxes {
        optimizer: Optimizer::Adamw,
        checkpointing: Checkpointing::None,
        grad_accum: 1,
        trainable: Trainable::Full,
        steps: s.train_steps,
        lr: s.lr,
    };
    let mut out = Vec::new();
    for source in s.source.as_ref().unwrap_or(&spec.model.source).to_vec() {
        let model_id = model_id_of(&source);
        // A quantized precision runs once per compute dtype and product path; a dense one
        // computes in its own.
        let precisions = s.precision.iter().flat_map(|&p| {
            if p.is_quantized() {
                let mut v = Vec::new();
                for &c in &s.compute {
                    for &q in &s.qmatmul {
                        v.push((p, Some(c), Some(q)));
                    }
                }
                v
            } else {
                vec![(p, None, None)]
            }
        });
        for (precision, compute, qmatmul) in precisions {
            // Ids of `auto` stay as they were before the qmatmul axis.
            let precision_tag = match (compute, qmatmul) {
                (Some(c), Some(QMatmul::Dequantize)) => {
                    format!("{}-{}-dequantize", precision.as_str(), c.as_str())
                }
                (Some(c), _) => format!("{}-{}", precision.as_str(), c.as_str()),
                (None, _) => precision.as_str().to_string(),
            };
            for &mode in &s.mode {
                let axes = match mode {
                    Mode::Infer => &infer_axes,
                    Mode::Train => &train_axes,
                    Mode::Encode | Mode::Generate => &encode_axes,
                };
                for &batch in &s.batch {
                    for &context in &s.context {
                        for (tag, kv, kv_window, train) in axes {
                            for ops in ops_axes(s) {
                                for repeat in 0..s.repeats {
                                    let (batch, context) = (batch as usize, context as usize);
                                    let mut id = format!(
                                        "{model_id}/{}/{}/b{batch}/c{context}",
                                        mode.as_str(),
                                        precision_tag,
                                    );
                                    if !tag.is_empty() {
                                        id.push_str(&format!("/{tag}"));
                                    }
                                    // Ids of default ops stay as they were before these axes.
                                    if ops.kernels != Kernels::Reference {
                                        id.push_str(&format!("/{}", ops.kernels.as_str()));
                                    }
                                    if ops.attention != Attention::Eager {
                                        id.push_str(&format!("/{}", ops.attention.as_str()));
                                    }
                                    if s.repeats > 1 {
                                        id.push_str(&format!("/r{repeat}"));
                                    }
                                    out.push(Point {
                                        id,
                                        source: source.clone(),
                                        model_id: model_id.clone(),
                                        mode,
                                        precision,
                                        compute,
                                        qmatmul,
                                        batch,
                                        context,
                                        prompt_len: s
                                            .prompt_len
                                            .unwrap_or(context.saturating_sub(s.decode_steps)),
                                        decode_steps: s.decode_steps,
                                        decode_every: s.decode_every,
                                        kv_cache: *kv,
                                        kv_window: *kv_window,
                                        repeat,
                                        train: train.unwrap_or(default_train),
                                        ops,
                                        table,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn spec(extra: &str) -> Spec {
        let text = format!(
            "name = \"g\"\n[model]\nsource = [\"gguf:/a/A.gguf\", \"hf:/b/B\"]\n[sweep]\nmode = [\"infer\"]\nprecision = [\"f32\", \"bf16\"]\nbatch = [1, 4]\ncontext = [128, 512]\nkv_cache = [\"preallocated\", \"growing\"]\ndecode_steps = 8\n{extra}"
        );
        Spec::parse(Path::new("g.toml"), &text).unwrap()
    }

    #[test]
    fn cartesian_product_in_order() {
        let pts = expand(&spec(""));
        assert_eq!(pts.len(), 2 * 2 * 2 * 2 * 2);
        assert_eq!(pts[0].id, "A/infer/f32/b1/c128/preallocated");
        assert_eq!(pts[1].id, "A/infer/f32/b1/c128/growing");
        assert_eq!(pts[2].id, "A/infer/f32/b1/c512/preallocated");
        assert_eq!(pts[8].id, "A/infer/bf16/b1/c128/preallocated");
        assert_eq!(pts[16].id, "B/infer/f32/b1/c128/preallocated");
        assert_eq!(pts[0].prompt_len, 120);
        // Ids are unique.
        let mut ids: Vec<_> = pts.iter().map(|p| &p.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), pts.len());
        // Points sharing (model, precision) are contiguous.
        let groups: Vec<_> = pts.iter().map(|p| (&p.source, p.precision)).collect();
        let mut seen = Vec::new();
        for g in groups {
            if seen.last() != Some(&g) {
                assert!(!seen.contains(&g), "group {g:?} split");
                seen.push(g);
            }
        }
        assert_eq!(seen.len(), 4);
    }

    #[test]
    fn training_axes() {
        let text = "name = \"t\"\n[model]\nsource = \"hf:/m/M\"\n[sweep]\nmode = [\"infer\", \"train\"]\nprecision = [\"bf16\"]\nbatch = [4]\ncontext = [64]\noptimizer = [\"sgd\", \"adamw\"]\ncheckpointing = [\"none\", \"layer\"]\ngrad_accum = [1, 4]\ntrainable = [\"full\", \"frozen-embeddings\"]\n";
        let pts = expand(&Spec::parse(Path::new("t.toml"), text).unwrap());
        assert_eq!(pts.len(), 1 + 16);
        assert_eq!(pts[0].id, "M/infer/bf16/b4/c64/preallocated");
        assert_eq!(pts[1].id, "M/train/bf16/b4/c64/sgd/none/ga1/full");
        assert_eq!(
            pts[16].id,
            "M/train/bf16/b4/c64/adamw/layer/ga4/frozen-embeddings"
        );
        assert_eq!(pts[16].train.grad_accum, 4);
        let bad = text.replace("grad_accum = [1, 4]", "grad_accum = [3]");
        let e = Spec::parse(Path::new("t.toml"), &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("grad_accum 3 does not divide batch 4"), "{e}");
        let bad = text.replace("[\"bf16\"]", "[\"mixed-bf16\"]");
        let e = Spec::parse(Path::new("t.toml"), &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("training policy"), "{e}");
    }

    #[test]
    fn kernels_attention_and_fused_optimizer_axes() {
        let text = "name = \"k\"\n[model]\nsource = \"hf:/m/M\"\n[sweep]\nmode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\ncontext = [64]\noptimizer = [\"adamw\", \"adamw-fused\"]\nkernels = [\"reference\", \"fused\"]\nattention = [\"eager\", \"flash\"]\n";
        let pts = expand(&Spec::parse(Path::new("k.toml"), text).unwrap());
        let ids: Vec<&str> = pts.iter().map(|p| p.id.as_str()).collect();
        // Default ops keep the ids they had before the axes existed.
        assert_eq!(
            ids[..4],
            [
                "M/train/f32/b1/c64/adamw/none/ga1/full",
                "M/train/f32/b1/c64/adamw/none/ga1/full/flash",
                "M/train/f32/b1/c64/adamw/none/ga1/full/fused",
                "M/train/f32/b1/c64/adamw/none/ga1/full/fused/flash",
            ]
        );
        assert_eq!(
            ids[7],
            "M/train/f32/b1/c64/adamw-fused/none/ga1/full/fused/flash"
        );
        assert_eq!(pts[7].train.optimizer, Optimizer::AdamwFused);
        assert_eq!(
            pts[7].ops,
            Ops {
                kernels: Kernels::Fused,
                attention: Attention::Flash
            }
        );
        let bad = text.replace("\"flash\"]", "\"sdpa\"]");
        let e = Spec::parse(Path::new("k.toml"), &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sdpa"), "{e}");
    }

    #[test]
    fn repeats_and_prompt_len() {
        let pts = expand(&spec("repeats = 2\nprompt_len = 16\n"));
        assert_eq!(pts.len(), 64);
        assert_eq!(pts[0].id, "A/infer/f32/b1/c128/preallocated/r0");
        assert_eq!(pts[1].id, "A/infer/f32/b1/c128/preallocated/r1");
        assert!(pts.iter().all(|p| p.prompt_len == 16));
    }
}
