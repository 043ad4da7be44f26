//! The device rows of an estimate: the CUDA context, the cuBLAS workspace and the allocator's
//! reserve (candle's assumed rounding, torch's fitted reserve model or the built-in reference fit).
use super::{Backend, Breakdown, Mode, Overflow, Query, Runtime, Stack};
use crate::checked::Checked;
use crate::fit::{self, reserve::ReserveClass, Constants};
use crate::model::Config;
use crate::record::Phase;
use crate::terms::{Term, Terms};

/// CUDA context with the runtime's kernels loaded, outside any allocator: the catalogue's
/// [`crate::gpu::CONTEXT_BYTES`], the figure the emulated GPU holds back too, so the analytic
/// and the emulated "used" count the same context.
pub const CUDA_CONTEXT: u64 = crate::gpu::CONTEXT_BYTES;
/// cuBLAS workspace per handle before Hopper: PyTorch's documented default
/// `CUBLAS_WORKSPACE_CONFIG` `:4096:2:16:8` (2 × 4096 KiB + 8 × 16 KiB; PyTorch docs,
/// "Reproducibility" / CUDA semantics, cuBLAS workspaces). Candle's row too.
pub const CUBLAS_WORKSPACE: u64 = 2 * (4096 << 10) + 8 * (16 << 10);
/// cuBLAS workspace per handle PyTorch takes on Hopper and later: `:4096:8` (32 MiB).
pub const CUBLAS_WORKSPACE_SM90: u64 = 8 * (4096 << 10);

/// The cuBLAS workspace row of a query, by the stack's torch and the card's compute capability
/// (`Query::compute_capability`), as the emulated GPU measures it (docs/src/guides/estimate.md,
/// "The cuBLAS workspace follows the card and the stack"):
/// - the default stack (torch 2.15) takes 32 MiB on compute capability 9.0 and later, else
///   8.125 MiB, for each matmul and frees it after: one at most, and none where the peak falls
///   outside a matmul (a large model's usually does), so the row is an upper bound;
/// - torch 2.2 takes 32 MiB only on 9.0 (H100, H200), else 8.125 MiB, and keeps one for each
///   thread that multiplies: training holds two (the forward's and autograd's), in every peak;
/// - torch 1.10 none in its allocator (cuBLAS allocates its own), and candle's is unmeasured:
///   both keep the pre-Hopper size.
///
/// An unknown card (no `--gpu`) takes the larger size: under-prediction is the costly way.
pub fn cublas_workspace(q: &Query) -> u64 {
    let cc = q.compute_capability;
    let (large, held) = match (q.runtime, q.stack) {
        (Runtime::Torch | Runtime::Vllm, Stack::Default) => {
            (cc.is_none_or(|(major, _)| major >= 9), 1)
        }
        (Runtime::Torch | Runtime::Vllm, Stack::Torch22) => (
            cc.is_none_or(|cc| cc == (9, 0)),
            if q.mode == Mode::Train { 2 } else { 1 },
        ),
        _ => (false, 1),
    };
    held * if large {
        CUBLAS_WORKSPACE_SM90
    } else {
        CUBLAS_WORKSPACE
    }
}
/// Candle's pool reserve on CUDA, until a device session measures it: one large segment of
/// slack, the 20 MiB `kLargeBuffer` of PyTorch's c10/cuda/CUDACachingAllocator.cpp (requests
/// of 1–10 MiB are served from 20 MiB segments). PyTorch's reserve is fitted instead
/// ([`REFERENCE_RESERVE`]).
pub const ALLOCATOR_ROUNDING: u64 = 20 << 20;

/// The caching allocator's reserve `estimate` applies to torch on CUDA without a
/// `--constants` file that carries one, per software stack: `vramlab fit` on this repository's
/// emulated sweep of four models' inference and training under that stack
/// (docs/src/results/emulated-reserve.md; PyTorch's own allocator on the emulated GPU), built
/// into the binary. The torch-2.2 stack's sweep has three of the models (its transformers 4.39
/// cannot build Llama-3.2's rope scaling) and two in inference (Qwen2's static cache reads the
/// device there).
pub const REFERENCE_RESERVE: [(Stack, &str, &str); 2] = [
    (
        Stack::Default,
        "results/emulated/a100-80gb-emu-reserve-llm.constants.toml",
        include_str!("../../../results/emulated/a100-80gb-emu-reserve-llm.constants.toml"),
    ),
    (
        Stack::Torch22,
        "results/emulated/a100-80gb-emu-reserve-llm-torch-2.2.constants.toml",
        include_str!(
            "../../../results/emulated/a100-80gb-emu-reserve-llm-torch-2.2.constants.toml"
        ),
    ),
];

/// The built-in reserve fit of `stack` ([`REFERENCE_RESERVE`]), parsed once: its path and
/// constants.
pub fn reference_reserve(stack: Stack) -> (&'static str, &'static Constants) {
    static C: std::sync::OnceLock<Vec<Constants>> = std::sync::OnceLock::new();
    let all = C.get_or_init(|| {
        REFERENCE_RESERVE
            .iter()
            .map(|(_, path, text)| {
                Constants::parse(std::path::Path::new(path), text)
                    .expect("the committed reference reserve parses")
            })
            .collect()
    });
    let i = REFERENCE_RESERVE
        .iter()
        .position(|(s, _, _)| *s == stack)
        .expect("every stack has a reference reserve");
    (REFERENCE_RESERVE[i].1, &all[i])
}

/// The device rows of a query: the sourced defaults on CUDA, none on the CPU.
pub(super) fn device_terms(q: &Query) -> Breakdown {
    match q.backend {
        Backend::Cuda => Breakdown {
            cuda_context: CUDA_CONTEXT,
            cublas_workspace: cublas_workspace(q),
            ..Default::default()
        },
        Backend::Cpu => Breakdown::default(),
    }
}

/// `e` with the allocator's reserve over its allocated bytes (CUDA only): torch's from the
/// constants' own reserve fits where they carry them (a torch fit on CUDA), else the built-in
/// reference of the query's stack ([`REFERENCE_RESERVE`]), evaluated on the query's terms in
/// its whole-run phase ([`super::query_terms`]); candle's [`ALLOCATOR_ROUNDING`].
pub fn with_reserve(
    e: Breakdown,
    cfg: &Config,
    q: &Query,
    constants: Option<&Constants>,
) -> Result<Breakdown, Overflow> {
    let class = ReserveClass::new(
        q.mode,
        q.attention,
        q.checkpointing,
        q.trainable,
        q.precision,
        q.kv_cache,
    );
    let phase = match q.mode {
        Mode::Train => Phase::StepTotal,
        _ => Phase::Total,
    };
    let mut t = super::query_terms(cfg, q, phase)?;
    // A sharded rank's pool holds its own shard of the weights, not the model's: the weight
    // term is the rank's weights row (on one GPU the two are the same bytes).
    if q.gpus > 1 {
        t[Term::Weight.index()] = e.weights as f64;
    }
    with_reserve_of(e, q, constants, class, &t)
}

/// [`with_reserve`] for the runs of `class` with terms `t` (a loaded model:
/// [`ReserveClass::LOAD`], whose reserve reads only the weights).
pub fn with_reserve_of(
    e: Breakdown,
    q: &Query,
    constants: Option<&Constants>,
    class: ReserveClass,
    t: &Terms,
) -> Result<Breakdown, Overflow> {
    let (reserve, low, high, how) = match (q.backend, q.runtime) {
        (Backend::Cpu, _) => (0, 0, 0, String::new()),
        (Backend::Cuda, Runtime::Candle) => (
            ALLOCATOR_ROUNDING,
            ALLOCATOR_ROUNDING,
            ALLOCATOR_ROUNDING,
            "candle's pool on CUDA is not measured yet: one 20 MiB segment assumed".to_string(),
        ),
        (Backend::Cuda, Runtime::Torch | Runtime::Vllm) => {
            let (path, k) = match constants.filter(|k| !k.reserve.is_empty()) {
                Some(k) => ("--constants", k),
                None => reference_reserve(q.reserve_stack.unwrap_or(q.stack)),
            };
            let allocated = e.allocated()? as f64;
            let r = fit::reserve::reserve_for(&k.reserve, class, t, allocated)
                .expect("a reserve file has classes");
            let bytes = |b: f64| Checked::from_f64(b.ceil()).bytes("allocator reserve");
            (
                bytes(r.central)?,
                bytes(r.low)?,
                bytes(r.high)?,
                format!("fitted on {} ({path}): {}", k.device, r.how),
            )
        }
    };
    Ok(Breakdown {
        allocator_reserve: reserve,
        allocator_reserve_low: low,
        allocator_reserve_high: high,
        reserve_source: how,
        ..e
    })
}
