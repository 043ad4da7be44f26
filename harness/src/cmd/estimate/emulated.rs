//! `--emulate GPU`: the LLM query run under PyTorch on an emulated GPU (needs the torch
//! environment); its figures go into the report beside the estimate's.
use super::Args;
use crate::emulate::query::Emulated;
use crate::error::InputError;
use crate::estimate::{Precision, Runtime};
use crate::model::Config;
use anyhow::Result;
use std::path::PathBuf;

/// `--emulate GPU`: the query under PyTorch on that emulated GPU.
pub fn emulate_query(
    a: &Args,
    gpu: &str,
    m: &Config,
    precision: Precision,
    quantized: bool,
) -> Result<Emulated> {
    use crate::emulate::{catalogue, query};
    let mut g = catalogue::resolve(Some(gpu), a.emulate_memory).map_err(InputError::arg)?;
    if let Some(m) = a.emulate_memory {
        // The verdict names the capacity it was run at, not the catalogued card's.
        g.name = format!("{} at {} ({m} B)", g.name, crate::units::human(m));
    }
    if quantized {
        return Err(InputError::arg(
            "--emulate runs dense precisions (PyTorch keeps no GGUF blocks): pass --precision",
        )
        .into());
    }
    if a.runtime != Runtime::Torch || a.gpus != 1 {
        return Err(InputError::arg(
            "--emulate runs one GPU under torch (--runtime torch, --gpus 1)",
        )
        .into());
    }
    let python = match a.stack {
        Some(stack) => crate::emulate::stack_python(stack)?,
        None => {
            let explicit = a
                .python
                .clone()
                .or_else(|| std::env::var_os("VRAMLAB_TORCH_PYTHON").map(PathBuf::from));
            crate::emulate::python_for(&[], explicit.as_deref())?
        }
    };
    let stubs = crate::emulate::stubs_for(&python)?;
    let config = m.to_hf_json();
    let q = query::Query {
        config: &config,
        mode: a.mode,
        precision,
        batch: a.batch,
        context: a.context,
        optimizer: a.optimizer,
        optimizer_impl: a.optimizer_impl,
        checkpointing: a.checkpointing,
        trainable: a.trainable,
        attention: a.attention,
        kv_cache: a.kv_cache,
    };
    query::run(&q, &g, &python, &stubs)
}
