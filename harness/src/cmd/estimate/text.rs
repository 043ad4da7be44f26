//! The text rendering of a [`Report`]: the tables and lines `vramlab estimate` prints without
//! `--json`.
use super::report::{BestFormat, EmulatedFit, GenReport, LlmReport, Report};
use crate::estimate::{Backend, Mode, Verdict, MAX_GPUS};
use crate::units::{gb, gb_gib, gib, signed_pct};
use crate::vocab::VaeDecode;
use std::fmt::Write;

/// `r` as text, every line ending in a newline.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    match r {
        Report::Llm(r) => llm(&mut s, r),
        Report::Generation(r) => generation(&mut s, r),
        Report::Serving(r) => super::serving::render(&mut s, r),
    }
    .expect("writing to a String cannot fail");
    s
}

/// An LLM report: the `--best-format` table, the breakdown, the GPU verdicts, the notes and
/// the emulated comparison.
fn llm(s: &mut String, r: &LlmReport) -> std::fmt::Result {
    if let Some(b) = &r.best_format {
        best_format(s, b)?;
    }
    let q = &r.query;
    let params = r.model.params;
    let total = r.total_bytes;
    let active = if r.model.active_params < params {
        format!(", {} active", r.model.active_params)
    } else {
        String::new()
    };
    writeln!(
        s,
        "{} ({}, {} params{active}): {} {}, batch {}, context {}{}",
        r.model.name,
        r.model.architecture,
        params,
        if q.mode == Mode::Train {
            "train"
        } else {
            "infer"
        },
        q.precision.as_str(),
        q.batch,
        q.context,
        if q.mode == Mode::Train {
            format!(
                ", optimizer {}, checkpointing {}, trainable {}, {:?} over {} GPU(s){}",
                q.runtime_optimizer(),
                q.checkpointing,
                q.trainable.label(),
                q.sharding,
                q.gpus,
                if q.offload { ", CPU offload" } else { "" }
            )
            .to_lowercase()
        } else {
            String::new()
        }
    )?;
    if let Some(stored) = r.model.stored_bytes {
        writeln!(
            s,
            "stored checkpoint: {} of safetensors on the Hub ({:.2} B/param)",
            gb_gib(stored),
            stored as f64 / params as f64
        )?;
    }
    writeln!(s, "constants: {}", r.constants)?;
    writeln!(
        s,
        "{:<24} {:>12} {:>12} {:>10}",
        "per GPU", "GB", "GiB", "B/param"
    )?;
    let rows = r.breakdown.iter().map(|row| (row.name.as_str(), row.bytes));
    for (name, bytes) in rows.chain([("total", total)]) {
        if bytes == 0 && !matches!(name, "weights" | "KV cache" | "activations" | "total") {
            continue;
        }
        writeln!(
            s,
            "{:<24} {:>12} {:>12} {:>10.2}",
            name,
            gb(bytes),
            gib(bytes),
            bytes as f64 / params as f64
        )?;
    }
    writeln!(s, "total: {}", gb_gib(total))?;
    if q.backend == Backend::Cuda {
        writeln!(
            s,
            "allocated {}; reserved {}; NVML used {} (reserved + CUDA context)",
            gb_gib(r.allocated_bytes),
            gb_gib(r.reserved_bytes),
            gb_gib(total)
        )?;
        if r.nvml_high_bytes != r.nvml_low_bytes {
            writeln!(
                s,
                "NVML used over the allocator reserve's fitted range: {} GB to {} GB; the GPU \
                 verdicts below judge its high end",
                gb(r.nvml_low_bytes),
                gb(r.nvml_high_bytes)
            )?;
        }
        writeln!(s, "allocator reserve: {}", r.reserve_source)?;
    }
    if let Some(states) = r.model_states_bytes {
        writeln!(
            s,
            "model states (weights + gradients + optimizer): {} = {:.2} B/param per GPU",
            gb_gib(states),
            states as f64 / params as f64
        )?;
    }
    if let Some(host) = r.host_offloaded_bytes {
        writeln!(
            s,
            "offloaded to host memory per rank (FSDP CPU offload): {} of weight, gradient and \
             optimizer-state shards, in no GPU figure",
            gb_gib(host)
        )?;
    }
    let headroom = 100.0 * r.headroom;
    match (r.smallest_gpu_gb, r.smallest_gpu_examples) {
        (Some(gb), Some(examples)) => writeln!(
            s,
            "smallest GPU with {headroom:.0}% headroom: {gb} GB ({examples})"
        )?,
        _ => writeln!(
            s,
            "smallest GPU with {headroom:.0}% headroom: none of the catalog (largest is {} GB)",
            r.largest_gpu_gb
        )?,
    }
    if let Some(f) = &r.gpu {
        let verdict = match f.verdict {
            Verdict::Fits => "fits".to_string(),
            Verdict::DoesNotFit => "does NOT fit".to_string(),
            Verdict::Borderline => format!(
                "borderline: NVML used is {} GB to {} GB over the allocator reserve's fitted \
                 range (its error held out by model)",
                gb(f.total_low_bytes),
                gb(f.total_high_bytes)
            ),
        };
        writeln!(
            s,
            "{}: {} usable of {}: {verdict}",
            f.gpu,
            gb_gib(f.budget_bytes),
            gb_gib(f.gpu_bytes),
        )?;
        if let Some(cmd) = &r.settle_with {
            writeln!(s, "settle it under PyTorch's own allocator: {cmd}")?;
        }
        if q.mode == Mode::Train && !f.fits {
            match (f.min_fsdp_gpus, r.unsharded_bytes) {
                (Some(n), _) => writeln!(
                    s,
                    "smallest FSDP (ZeRO-3) degree that fits {}: {n} GPUs",
                    f.gpu
                )?,
                (None, unsharded) => writeln!(
                    s,
                    "no FSDP degree up to {MAX_GPUS} fits {}: activations and logits alone need {}; try --checkpointing or a smaller batch/context",
                    f.gpu,
                    gb_gib(unsharded.unwrap_or_default())
                )?,
            }
        }
        writeln!(
            s,
            "largest batch at context {}: {}",
            q.context, f.largest_batch
        )?;
        let beyond = if f.largest_context > r.max_position_embeddings {
            format!(
                " (beyond the model's max_position_embeddings, {})",
                r.max_position_embeddings
            )
        } else {
            String::new()
        };
        writeln!(
            s,
            "largest context at batch {}: {}{beyond}",
            q.batch, f.largest_context
        )?;
        if let (Some(t), Some(c)) = (f.kv_capacity_tokens, f.max_concurrency) {
            writeln!(
                s,
                "KV cache capacity: {t} tokens; maximum concurrency at {} tokens: {c:.2}x",
                q.context
            )?;
        }
    }
    if let Some(w) = &r.weights {
        let types: Vec<String> = w
            .types
            .iter()
            .map(|(t, n, b)| format!("{n} {t} = {b} B"))
            .collect();
        writeln!(
            s,
            "note: weights: {:.3} bits per weight (scales and dense norms included): {}",
            w.bits_per_weight,
            types.join(", ")
        )?;
    }
    for n in &r.notes {
        writeln!(s, "note: {n}")?;
    }
    if let Some(em) = &r.emulated {
        emulated(s, em, r)?;
    }
    Ok(())
}

/// `--emulate GPU`: PyTorch's three figures beside the estimate's, and the verdict.
fn emulated(s: &mut String, fit: &EmulatedFit, r: &LlmReport) -> std::fmt::Result {
    let em = &fit.run;
    writeln!(s)?;
    writeln!(
        s,
        "emulated on {} (PyTorch {}'s allocator over a stub CUDA runtime; not a GPU measurement):",
        em.gpu,
        em.torch.as_deref().unwrap_or("?")
    )?;
    for (name, b, analytic) in [
        (
            "max_memory_allocated",
            em.max_memory_allocated,
            r.allocated_bytes,
        ),
        (
            "max_memory_reserved",
            em.max_memory_reserved,
            r.reserved_bytes,
        ),
        ("nvml_used", em.nvml_used, r.total_bytes),
    ] {
        let pct = (b as f64 / analytic.max(1) as f64 - 1.0) * 100.0;
        writeln!(
            s,
            "  {name:<21} {:>24}  ({} vs the estimate's {})",
            gb_gib(b),
            signed_pct(pct),
            gb_gib(analytic)
        )?;
    }
    let verdict = if !em.fits {
        format!(
            "no ({}: {}; the figures above are where it stopped, lower bounds: \
             --emulate-memory runs it at a capacity it fits)",
            em.status, em.message
        )
    } else if fit.fits_with_headroom {
        format!(
            "yes: NVML used {} GB, within the {} GB usable with {:.0}% headroom",
            gb(em.nvml_used),
            gb(fit.budget_bytes),
            100.0 * r.headroom
        )
    } else {
        format!(
            "no with {:.0}% headroom: NVML used {} GB is past the {} GB usable (the run \
             itself completed at the card's full capacity)",
            100.0 * r.headroom,
            gb(em.nvml_used),
            gb(fit.budget_bytes)
        )
    };
    writeln!(s, "fits on {}: {verdict}", em.gpu)
}

/// `--best-format`'s table: every format's weights and total, and whether it fits.
fn best_format(s: &mut String, b: &BestFormat) -> std::fmt::Result {
    let best = match b.best {
        Some(p) => p.to_string(),
        None => "none of these fits".to_string(),
    };
    writeln!(
        s,
        "best format for {} ({} usable): {best}",
        b.gpu,
        gb_gib(b.budget_bytes)
    )?;
    writeln!(
        s,
        "{:<8} {:>12} {:>12} {:>12}  fits",
        "format", "bits/weight", "weights GB", "total GB"
    )?;
    for f in &b.formats {
        match (f.bits_per_weight, f.weight_bytes, f.total_bytes) {
            (Some(bits), Some(w), Some(t)) => writeln!(
                s,
                "{:<8} {:>12.3} {:>12} {:>12}  {}",
                f.precision.as_str(),
                bits,
                gb(w),
                gb(t),
                if f.fits { "yes" } else { "no" }
            )?,
            _ => writeln!(
                s,
                "{:<8} {:>12} {:>12} {:>12}  impossible: {}",
                f.precision.as_str(),
                "-",
                "-",
                "-",
                f.impossible.as_deref().unwrap_or_default()
            )?,
        }
    }
    Ok(())
}

/// A generation report: the query line, the exact tensors, each phase's peak and the GPU
/// classes' largest batch and resolution.
fn generation(s: &mut String, r: &GenReport) -> std::fmt::Result {
    let q = &r.query;
    let res = q.resolution;
    writeln!(
        s,
        "{} ({}, {} params) {res}{}, batch {}{} (denoiser batch {}), {}, VAE {}, decode {}{}; {} on {}",
        r.model.name,
        r.model.architecture,
        r.model.params,
        if q.frames > 1 {
            format!(", {} frames", q.frames)
        } else {
            String::new()
        },
        q.batch,
        if q.cfg { ", cfg" } else { "" },
        r.denoiser_batch,
        r.precision,
        crate::estimate::Precision::of_dense(q.vae_dtype),
        q.vae_decode,
        if q.vae_decode == VaeDecode::Tiled {
            format!(" (tile {}, overlap {})", q.tile, q.overlap)
        } else {
            String::new()
        },
        q.runtime.as_str(),
        q.backend
    )?;
    writeln!(s, "constants: {}", r.constants)?;
    writeln!(s, "{:<26} {:>16} {:>10}", "exact tensor", "bytes", "GiB")?;
    for row in r.exact.iter().chain(&r.device) {
        writeln!(
            s,
            "{:<26} {:>16} {:>10}",
            row.name,
            row.bytes,
            gib(row.bytes)
        )?;
    }
    writeln!(
        s,
        "{:<12} {:>16} {:>10} {:>16}  coefficients from",
        "phase", "peak bytes", "GiB", "activations"
    )?;
    for p in &r.phases {
        writeln!(
            s,
            "{:<12} {:>16} {:>10} {:>16}  {}",
            p.name.to_string(),
            p.peak_bytes,
            gib(p.peak_bytes),
            p.activation_bytes,
            p.source
        )?;
    }
    writeln!(
        s,
        "peak phase: {}; total {}",
        r.peak_phase,
        gb_gib(r.total_bytes)
    )?;
    let frames_head = if r.video {
        format!("  {:>20}", format!("max frames@{res} b{}", q.batch))
    } else {
        String::new()
    };
    writeln!(
        s,
        "{:>5}  {:<30} {:>5} {:>14} {:>22}{frames_head}",
        "GB",
        "GPUs",
        "fits",
        format!("max batch@{res}"),
        format!("max square@b{}", q.batch)
    )?;
    let or_none = |v: Option<String>| v.unwrap_or_else(|| "none".into());
    for g in &r.gpus {
        let frames = if r.video {
            format!("  {:>20}", or_none(g.largest_frames.map(|f| f.to_string())))
        } else {
            String::new()
        };
        writeln!(
            s,
            "{:>5}  {:<30} {:>5} {:>14} {:>22}{frames}",
            g.gb,
            g.examples,
            if g.fits { "yes" } else { "no" },
            g.largest_batch,
            or_none(g.largest_square.map(|s| s.to_string()))
        )?;
    }
    writeln!(s, "(with {:.0}% of each GPU kept free)", 100.0 * r.headroom)?;
    for n in &r.notes {
        writeln!(s, "note: {n}")?;
    }
    Ok(())
}
