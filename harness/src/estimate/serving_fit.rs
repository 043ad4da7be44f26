//! `vramlab fit --vllm STARTUPS.tsv`: the serving estimate's fitted terms
//! ([`crate::estimate::serving::Fitted`]) from vLLM startups, with each model's error held out.
//!
//! A startup row names the preset, the card, `vllm serve`'s settings and whether CUDA graphs
//! were captured, and gives vLLM's exact available KV bytes and KV tokens
//! (`scripts/vllm-serving-grid.sh` writes them from emulated startups). Every exact term of the
//! estimate is computed for the row; what vLLM's available bytes leave of its request is then
//! what the fitted terms must explain:
//! - on eager rows, the other buffers: `other_fixed + other_per_seq × max_num_seqs`.
//!
//! On rows with CUDA graphs vLLM's own estimate of their memory is in the row, exact (the grid
//! reads it from vLLM's `profile_cudagraph_memory`); less the 1 MiB floor of each FULL graph
//! beyond the first, it is the pool of vLLM's profiling capture, fitted on the features of
//! [`crate::estimate::cudagraphs::features`]. (With vLLM's compile cache warm a startup with
//! graphs leaves exactly the eager one's available bytes less that estimate; the grid starts
//! each such point twice and keeps the second.)
//!
//! Both are non-negative least squares ([`crate::fit::nnls`]). Held out: each model's rows predicted
//! by the terms fitted on the other models' (in KV tokens, and for the graph rows in vLLM's
//! CUDA-graph estimate itself).
use crate::error::bad_file;
use crate::estimate::cudagraphs::GRAPH_FEATURES;
use crate::estimate::serving::{self, Fitted, ServingQuery};
use crate::fit::nnls::nnls;
use crate::fit::Heldout;
use crate::gpu::Gpu;
use crate::model::Config;
use anyhow::Result;
use nalgebra::{DMatrix, DVector};
use serde::Deserialize;
use std::path::Path;

/// One startup of the corpus, as the TSV gives it.
#[derive(Clone, Debug, Deserialize)]
pub struct Row {
    pub preset: String,
    pub gpu: String,
    pub max_model_len: u64,
    pub max_num_batched_tokens: u64,
    pub max_num_seqs: u64,
    pub cuda_graphs: bool,
    pub vllm_available_kv_bytes: i64,
    pub vllm_kv_tokens: u64,
    /// vLLM's "Estimated CUDA graph memory" (`profile_cudagraph_memory`), exact; 0 when eager.
    pub vllm_cuda_graph_bytes: u64,
}

/// A row with what the estimate needs of it.
pub struct Startup {
    pub row: Row,
    config: Config,
    gpu: Gpu,
    query: ServingQuery,
}

impl Startup {
    /// "preset gpu N/S eager|graphs", the row's name in the tables.
    pub fn label(&self) -> String {
        format!(
            "{} {} {}/{} {}",
            self.row.preset,
            self.row.gpu,
            self.row.max_num_batched_tokens,
            self.row.max_num_seqs,
            if self.row.cuda_graphs {
                "graphs"
            } else {
                "eager"
            }
        )
    }

    /// The estimate's figures under `fitted`.
    pub fn estimate(&self, fitted: &Fitted) -> serving::Serving {
        serving::serving_with(&self.config, &self.gpu, &self.query, fitted)
    }

    /// What vLLM's available bytes leave of the request beyond the exact terms: the bytes the
    /// fitted terms must explain.
    fn residual(&self) -> f64 {
        let exact = self.estimate(&ZERO);
        exact.requested_bytes as f64
            - exact.non_kv_bytes as f64
            - self.row.vllm_available_kv_bytes as f64
    }

    /// What the fitted pool must explain of vLLM's CUDA-graph estimate: all but the floor of
    /// its FULL graphs.
    fn graph_pool(&self) -> f64 {
        self.row.vllm_cuda_graph_bytes as f64 - self.estimate(&ZERO).cuda_graph_bytes as f64
    }

    fn features(&self) -> [f64; GRAPH_FEATURES] {
        let c = crate::estimate::cudagraphs::captures(
            &self.gpu,
            self.row.max_num_batched_tokens,
            self.row.max_num_seqs,
        );
        serving::graph_features(&self.config, &self.gpu, &c, self.query.weight_bytes)
    }
}

/// No fitted term: the exact terms alone.
const ZERO: Fitted = Fitted {
    other_fixed: 0,
    other_per_seq: 0,
    graph_pool: [0.0; GRAPH_FEATURES],
};

/// Reads a startups TSV; an unusable row is one line naming the file, the line and why.
pub fn read(path: &Path) -> Result<Vec<Startup>> {
    let mut r = csv::ReaderBuilder::new()
        .delimiter(b'\t')
        .from_path(path)
        .map_err(|e| bad_file(path, format!("cannot read: {e}")))?;
    let mut out = Vec::new();
    for (i, rec) in r.deserialize::<Row>().enumerate() {
        let line = i + 2;
        let row = rec.map_err(|e| bad_file(path, format!("line {line}: {e}")))?;
        let fail = |why: String| bad_file(path, format!("line {line}: {why}"));
        let model = crate::estimate::resolve(&row.preset).map_err(|e| fail(e.to_string()))?;
        if row.cuda_graphs != (row.vllm_cuda_graph_bytes > 0) {
            return Err(fail(
                "vllm_cuda_graph_bytes must be given (above 0) exactly where cuda_graphs is true"
                    .into(),
            ));
        }
        let gpu = crate::gpu::by_name(&row.gpu)
            .ok_or_else(|| fail(format!("unknown gpu `{}`", row.gpu)))?;
        let query = ServingQuery::new(
            0.9,
            (
                row.max_model_len,
                row.max_num_batched_tokens,
                row.max_num_seqs,
            ),
            2,
            2,
        )
        .map_err(fail)?
        .eager(!row.cuda_graphs);
        if let Some(why) = serving::unsupported(&model.config) {
            return Err(fail(why));
        }
        out.push(Startup {
            row,
            config: model.config,
            gpu,
            query,
        });
    }
    if !out.iter().any(|s| !s.row.cuda_graphs) {
        return Err(bad_file(
            path,
            "no eager startup to fit the other buffers on",
        ));
    }
    Ok(out)
}

/// The fit: the terms, and the held-out predictions.
pub struct ServingFit {
    pub fitted: Fitted,
    /// Each model's rows, KV tokens predicted by the terms fitted without that model.
    pub heldout_tokens: Vec<Heldout>,
    /// Each model's CUDA-graph rows: vLLM's graph estimate, predicted without that model.
    pub heldout_graphs: Vec<Heldout>,
}

/// Fits the terms on `rows` (every row; `None` where there are none to fit on).
pub fn fit_terms(rows: &[&Startup]) -> Option<Fitted> {
    let eager: Vec<&&Startup> = rows.iter().filter(|s| !s.row.cuda_graphs).collect();
    if eager.is_empty() {
        return None;
    }
    let a = DMatrix::from_fn(eager.len(), 2, |i, j| {
        if j == 0 {
            1.0
        } else {
            eager[i].row.max_num_seqs as f64
        }
    });
    let b = DVector::from_iterator(eager.len(), eager.iter().map(|s| s.residual()));
    let x = nnls(&a, &b);
    let mut fitted = Fitted {
        other_fixed: x[0].round() as u64,
        other_per_seq: x[1].round() as u64,
        graph_pool: [0.0; GRAPH_FEATURES],
    };
    let graphs: Vec<&&Startup> = rows.iter().filter(|s| s.row.cuda_graphs).collect();
    if !graphs.is_empty() {
        let a = DMatrix::from_fn(graphs.len(), GRAPH_FEATURES, |i, j| graphs[i].features()[j]);
        let b = DVector::from_iterator(graphs.len(), graphs.iter().map(|s| s.graph_pool()));
        let x = nnls(&a, &b);
        for (j, c) in fitted.graph_pool.iter_mut().enumerate() {
            *c = x[j];
        }
    }
    Some(fitted)
}

/// The fit on every row, and each model held out in turn.
pub fn fit(startups: &[Startup]) -> ServingFit {
    let all: Vec<&Startup> = startups.iter().collect();
    let fitted = fit_terms(&all).expect("read() requires an eager row");
    let mut models: Vec<&str> = startups.iter().map(|s| s.row.preset.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    let (mut heldout_tokens, mut heldout_graphs) = (Vec::new(), Vec::new());
    for m in &models {
        let train: Vec<&Startup> = all.iter().copied().filter(|s| s.row.preset != *m).collect();
        let Some(f) = fit_terms(&train) else {
            continue;
        };
        let has_graphs = train.iter().any(|s| s.row.cuda_graphs);
        for s in all.iter().filter(|s| s.row.preset == *m) {
            if s.row.cuda_graphs && !has_graphs {
                continue;
            }
            let group = if s.row.cuda_graphs {
                "cuda graphs"
            } else {
                "eager"
            };
            let e = s.estimate(&f);
            heldout_tokens.push(Heldout {
                group: group.into(),
                row: s.label(),
                measured: s.row.vllm_kv_tokens as f64,
                predicted: e.kv_tokens as f64,
            });
            if s.row.cuda_graphs {
                heldout_graphs.push(Heldout {
                    group: group.into(),
                    row: s.label(),
                    measured: s.row.vllm_cuda_graph_bytes as f64,
                    predicted: e.cuda_graph_bytes as f64,
                });
            }
        }
    }
    ServingFit {
        fitted,
        heldout_tokens,
        heldout_graphs,
    }
}
