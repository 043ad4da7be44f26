//! The checks of a diffusion pipeline's `[sweep]` table: its generation axes, and its
//! fine-tuning (LoRA on the denoiser) axes.
use super::validate::{MAX_BATCH, MAX_REPEATS, MAX_STEPS};
use super::{Attention, SweepSpec, TrainableKind, VaeDecode};

pub use crate::model::diffusion::denoiser::NO_LORA_REASON;

/// Whether a model source is a diffusion pipeline (`diffusers:DIR`, or `synthetic:` with a
/// generation preset's name).
pub fn is_pipeline_source(src: &str) -> bool {
    src.starts_with("diffusers:")
        || src
            .strip_prefix("synthetic:")
            .is_some_and(|m| m.parse::<crate::vocab::GenModel>().is_ok())
}

/// The axes of a fine-tuning table (mode = "train" on a diffusion pipeline): one line naming
/// the key for each mistake (the model itself is checked when the sweep reads it).
pub(super) fn validate_finetune(s: &SweepSpec) -> std::result::Result<(), (&'static str, String)> {
    super::validate::estimate_only(s)?;
    if s.mode.len() > 1 {
        return Err((
            "mode",
            "[sweep] mode \"train\" on a diffusion pipeline runs alone in its [sweep] table".into(),
        ));
    }
    for (key, n) in [
        ("precision", s.precision.len()),
        ("batch", s.batch.len()),
        ("resolution", s.resolution.len()),
        ("attention", s.attention.len()),
        ("optimizer", s.optimizer.len()),
        ("trainable", s.trainable.len()),
        ("checkpointing", s.checkpointing.len()),
        ("grad_accum", s.grad_accum.len()),
    ] {
        if n == 0 {
            return Err((
                key,
                format!("[sweep] `{key}` is an empty list (or missing): a denoiser's fine-tuning needs it"),
            ));
        }
    }
    if let Some(a) = s
        .attention
        .iter()
        .find(|a| !matches!(a, Attention::Eager | Attention::Flash))
    {
        return Err((
            "attention",
            format!("[sweep] attention `{a}`: a denoiser trains with `eager` or `flash`"),
        ));
    }
    if let Some(p) = s
        .precision
        .iter()
        .find(|p| p.is_mixed() || p.is_quantized())
    {
        return Err((
            "precision",
            format!("[sweep] precision `{p}`: a denoiser's LoRA points run f32, f16 or bf16 (base weights and adapters in that dtype)"),
        ));
    }
    if let Some(t) = s.trainable.iter().find(|t| t.kind() != TrainableKind::Lora) {
        return Err((
            "trainable",
            format!("[sweep] trainable `{t}`: a denoiser is fine-tuned with LoRA only (`lora-rN`)"),
        ));
    }
    if let Some(o) = s.optimizer.iter().find(|o| !o.is_scenario_choice()) {
        return Err((
            "optimizer",
            format!("[sweep] optimizer `{o}` is not a scenario choice: use `sgd`, `adamw` or `adamw-fused`"),
        ));
    }
    if s.train_steps == 0 || s.train_steps as i64 > MAX_STEPS {
        return Err((
            "train_steps",
            format!("[sweep] `train_steps` must be from 1 to {MAX_STEPS}"),
        ));
    }
    if !(s.lr.is_finite() && s.lr > 0.0) {
        return Err((
            "lr",
            format!("[sweep] `lr` must be a positive number, got {}", s.lr),
        ));
    }
    for &b in &s.batch {
        if !(1..=MAX_BATCH).contains(&b) {
            return Err((
                "batch",
                format!("[sweep] `batch` must be from 1 to {MAX_BATCH}, got {b}"),
            ));
        }
        if let Some(n) = s.grad_accum.iter().find(|&&n| n <= 0 || b % n != 0) {
            return Err((
                "grad_accum",
                format!("[sweep] grad_accum {n} must be positive and divide batch {b}"),
            ));
        }
    }
    if s.repeats == 0 || s.repeats as i64 > MAX_REPEATS {
        return Err((
            "repeats",
            format!("[sweep] `repeats` must be from 1 to {MAX_REPEATS}"),
        ));
    }
    Ok(())
}

/// The generation axes: one line naming the key for each mistake.
pub(super) fn validate_generate(
    s: &SweepSpec,
    sources: &[String],
) -> std::result::Result<(), (&'static str, String)> {
    if s.mode.len() > 1 {
        return Err((
            "mode",
            "[sweep] mode \"generate\" runs alone in its [sweep] table (its axes differ)".into(),
        ));
    }
    if s.resolution.is_empty() {
        return Err((
            "resolution",
            "[sweep] `resolution` is an empty list (or missing): mode \"generate\" needs e.g. [\"512x512\"]".into(),
        ));
    }
    if let Some(r) = s
        .resolution
        .iter()
        .find(|r| !r.width.is_multiple_of(8) || !r.height.is_multiple_of(8))
    {
        return Err((
            "resolution",
            format!("[sweep] resolution `{r}` is not a multiple of 8 (the VAE's factor)"),
        ));
    }
    if s.frames.as_ref().is_some_and(|f| f.is_empty()) {
        return Err((
            "frames",
            "[sweep] `frames` is an empty list: nothing to run".into(),
        ));
    }
    if s.vae_decode.contains(&VaeDecode::Tiled) {
        if s.tile == 0
            || !s.tile.is_multiple_of(8)
            || !s.overlap.is_multiple_of(8)
            || s.overlap >= s.tile
        {
            return Err((
                "tile",
                format!(
                    "[sweep] tile {} / overlap {}: both multiples of 8 pixels, overlap smaller than the tile",
                    s.tile, s.overlap
                ),
            ));
        }
        if let Some(r) = s.resolution.iter().find(|r| s.tile > r.width.min(r.height)) {
            return Err((
                "tile",
                format!(
                    "[sweep] tile {} is larger than the image {r} (vae_decode = \"tiled\")",
                    s.tile
                ),
            ));
        }
    }
    // Wan's DiT is vramlab's own and runs vramlab-kernels' flash attention; SD's UNet and
    // FLUX's transformer are candle-transformers'.
    let wan_only = sources.iter().all(|src| {
        src.strip_prefix("synthetic:")
            .and_then(|m| m.parse::<crate::vocab::GenModel>().ok())
            == Some(crate::vocab::GenModel::Wan21T2v13b)
    });
    if let Some(a) = s.attention.iter().find(|a| {
        let runs = matches!(a, Attention::Eager | Attention::Sliced)
            || (wan_only && **a == Attention::Flash);
        !runs
    }) {
        return Err((
            "attention",
            format!("[sweep] attention `{a}` is not available for this generation model: SD's UNet and FLUX's transformer attend through candle-transformers (vramlab-kernels' flash attention runs in the llama family and Wan2.1's DiT); use `eager` or `sliced`"),
        ));
    }
    if let Some(p) = s
        .precision
        .iter()
        .chain(&s.vae_precision)
        .find(|p| p.is_mixed() || p.is_quantized())
    {
        return Err((
            "precision",
            format!("[sweep] precision `{p}`: generation points run f32, f16 or bf16"),
        ));
    }
    if s.denoise_steps < 2 {
        return Err((
            "denoise_steps",
            "[sweep] `denoise_steps` must be at least 2 (the test that a step's peak does not grow needs two)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::scenario::Spec;
    use std::path::Path;

    /// Wan2.1 fine-tunes (mode train, no `context`) and generates with flash attention; SD 1.5
    /// fine-tunes but generates without flash, FLUX does not fine-tune, each refused on the
    /// key's line.
    #[test]
    fn wan_trains_and_runs_flash_sd_trains_flux_does_not() {
        let wan = "name = \"w\"\n[model]\nsource = \"synthetic:wan2.1-t2v-1.3b\"\n[sweep]\nmode = [\"train\"]\nprecision = [\"f32\"]\nbatch = [1]\nresolution = [\"128x128\"]\nframes = [5]\ntrainable = [\"lora-r16\"]\nattention = [\"flash\"]\n";
        let s = Spec::parse(Path::new("w.toml"), wan).unwrap();
        assert_eq!(s.sweep.0[0].frames, Some(vec![5]));
        let gen = wan
            .replace("[\"train\"]", "[\"generate\"]")
            .replace("trainable = [\"lora-r16\"]\n", "");
        Spec::parse(Path::new("w.toml"), &gen).unwrap();
        Spec::parse(Path::new("s.toml"), &wan.replace("wan2.1-t2v-1.3b", "sd15")).unwrap();
        let flux = wan.replace("wan2.1-t2v-1.3b", "flux-dev");
        let e = Spec::parse(Path::new("f.toml"), &flux)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "line 5: [sweep] mode `train` on the diffusion pipeline `synthetic:flux-dev`"
            ),
            "{e}"
        );
        let e = Spec::parse(Path::new("s.toml"), &gen.replace("wan2.1-t2v-1.3b", "sd15"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 10: [sweep] attention `flash` is not available"),
            "{e}"
        );
        let e = Spec::parse(Path::new("w.toml"), &wan.replace("lora-r16", "full"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 10: [sweep] trainable `full`"), "{e}");
    }
}
