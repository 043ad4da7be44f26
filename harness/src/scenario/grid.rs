//! Pure grid expansion: a [`Spec`] → the ordered list of points. Points are ordered model-major,
//! then precision, so the points that share loaded weights are contiguous.
use super::spec::{Mode, Precision, Spec};
use crate::model::KvKind;
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Point {
    /// Stable id: `model/mode/precision/bB/cC/kv[/rR]`.
    pub id: String,
    /// The model source string as written in the scenario (before `${VAR}` expansion).
    pub source: String,
    /// Short model name for ids and the `model_id` column.
    pub model_id: String,
    pub mode: Mode,
    pub precision: Precision,
    pub batch: usize,
    pub context: usize,
    pub prompt_len: usize,
    pub decode_steps: usize,
    pub decode_every: usize,
    pub kv_cache: KvKind,
    pub repeat: usize,
}

/// The model id of a source string, without touching the file system.
pub fn model_id_of(source: &str) -> String {
    crate::model::Source::parse(source)
        .map(|s| s.model_id())
        .unwrap_or_else(|_| source.to_string())
}

pub fn expand(spec: &Spec) -> Vec<Point> {
    let s = &spec.sweep;
    let mut out = Vec::new();
    for source in spec.model.source.to_vec() {
        let model_id = model_id_of(&source);
        for &precision in &s.precision {
            for &mode in &s.mode {
                for &batch in &s.batch {
                    for &context in &s.context {
                        for &kv in &s.kv_cache {
                            for repeat in 0..s.repeats {
                                let (batch, context) = (batch as usize, context as usize);
                                let mut id = format!(
                                    "{model_id}/{}/{}/b{batch}/c{context}/{}",
                                    mode.as_str(),
                                    precision.as_str(),
                                    kv.as_str()
                                );
                                if s.repeats > 1 {
                                    id.push_str(&format!("/r{repeat}"));
                                }
                                out.push(Point {
                                    id,
                                    source: source.clone(),
                                    model_id: model_id.clone(),
                                    mode,
                                    precision,
                                    batch,
                                    context,
                                    prompt_len: s.prompt_len.unwrap_or(context - s.decode_steps),
                                    decode_steps: s.decode_steps,
                                    decode_every: s.decode_every,
                                    kv_cache: kv,
                                    repeat,
                                });
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
    fn repeats_and_prompt_len() {
        let pts = expand(&spec("repeats = 2\nprompt_len = 16\n"));
        assert_eq!(pts.len(), 64);
        assert_eq!(pts[0].id, "A/infer/f32/b1/c128/preallocated/r0");
        assert_eq!(pts[1].id, "A/infer/f32/b1/c128/preallocated/r1");
        assert!(pts.iter().all(|p| p.prompt_len == 16));
    }
}
