//! `--emulate GPU`: the LLM query run under PyTorch on an emulated GPU (needs the torch
//! environment); its figures go into the report beside the estimate's.
use super::Args;
use crate::emulate::query::Emulated;
use crate::error::InputError;
use crate::estimate::{Precision, Runtime, Sharding, Trainable};
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
    use crate::emulate::query;
    use crate::gpu as catalogue;
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
    if a.runtime != Runtime::Torch {
        return Err(InputError::arg("--emulate runs PyTorch (--runtime torch)").into());
    }
    if a.gpus > 1 && !matches!(a.sharding, Sharding::Fsdp | Sharding::Zero3) {
        return Err(InputError::arg(format!(
            "--emulate --gpus {}: the emulated ranks run FSDP full shard (--sharding fsdp or \
             zero3), not --sharding {}",
            a.gpus,
            clap::ValueEnum::to_possible_value(&a.sharding)
                .map(|v| v.get_name().to_string())
                .unwrap_or_default()
        ))
        .into());
    }
    if a.gpus > 1
        && (a.mode != crate::vocab::Mode::Train || matches!(a.trainable, Trainable::Lora(_)))
    {
        return Err(InputError::arg(format!(
            "--emulate --gpus {}: FSDP full shard is emulated for full and frozen-embeddings \
             training (--mode train, --trainable full or frozen-embeddings)",
            a.gpus
        ))
        .into());
    }
    let python = match a.stack {
        Some(stack) => crate::emulate::stack_python(stack)?,
        None => {
            let explicit = a
                .python
                .clone()
                .or_else(|| std::env::var_os("VRAMLAB_TORCH_PYTHON").map(PathBuf::from));
            match explicit {
                Some(p) => crate::emulate::python_for(&[], Some(&p))?,
                None => crate::emulate::default_python()?,
            }
        }
    };
    // After the stack's python: one that is not installed says so first.
    if let Some(stack) = a.stack.filter(|s| s.one_layer_static_cache()) {
        if a.mode == crate::vocab::Mode::Infer && a.kv_cache == crate::vocab::KvKind::Preallocated {
            return Err(InputError::arg(format!(
                "--emulate --stack {stack}: its transformers' StaticCache holds one layer's keys \
                 and values (every layer would share it), so the preallocated cache cannot run \
                 there: pass --kv-cache growing"
            ))
            .into());
        }
    }
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
        lora_targets: a.lora_targets,
        lora_dropout: a.lora_dropout,
        attention: a.attention,
        kv_cache: a.kv_cache,
        gpus: a.gpus,
        offload: a.offload,
        timeout: a.emulate_timeout.0,
    };
    query::run(&q, &g, &python, &stubs)
}
