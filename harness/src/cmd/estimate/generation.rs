//! The generation estimator of `vramlab estimate` (docs/src/guides/generation.md): the exact
//! weights per component and tensors, each phase's peak from fitted (or analytic) activation
//! terms, the peak phase, and the largest batch and square resolution each GPU class holds,
//! as a [`GenReport`].
use super::overflow::{constants_flag, overflow_error, Size};
use super::report::{GenModelJson, GenReport, Row};
use super::Args;
use crate::error::InputError;
use crate::estimate::generate::{self as gen, GenArch, GenQuery};
use crate::estimate::{Attention, Backend, Mode, Overflow, Precision, Runtime};
use crate::fit::Constants;
use crate::vocab::GenModel;
use anyhow::Result;
use std::path::Path;

/// The flags of `a` as a generation query of `arch`, checked.
fn query(a: &Args, m: GenModel, arch: &GenArch) -> Result<(Precision, GenQuery)> {
    if matches!(a.mode, Mode::Train | Mode::Encode) {
        return Err(InputError::arg(format!(
            "--mode {}: {} is estimated as a generation pipeline (--mode generate); its LoRA \
             fine-tuning is measured, not estimated: `vramlab sweep` with mode = [\"train\"] \
             (SD 1.5/2.1 and Wan2.1)",
            a.mode.as_str(),
            m.as_str()
        ))
        .into());
    }
    if !(0.0..1.0).contains(&a.headroom) {
        return Err(
            InputError::arg(format!("--headroom must be in [0, 1), got {}", a.headroom)).into(),
        );
    }
    let precision = a.precision.unwrap_or(Precision::F16);
    if precision.is_mixed() || precision.is_quantized() {
        return Err(InputError::arg(format!(
            "--precision {precision}: generation models take f32, f16 or bf16"
        ))
        .into());
    }
    let dtype = precision.dtype();
    let q = GenQuery {
        batch: a.batch,
        resolution: a.resolution,
        frames: a.frames,
        cfg: a.cfg,
        vae_decode: a.vae_decode,
        tile: a.tile,
        overlap: a.overlap,
        dtype,
        // Both runtimes decode where the real pipeline does (f32 under SDXL's force_upcast,
        // and Wan's VAE, which the real pipeline loads in f32).
        vae_dtype: arch.default_vae_dtype(dtype),
        runtime: a.runtime,
        backend: a.backend,
        attention: a.attention,
    };
    gen::check(arch, &q)?;
    Ok((precision, q))
}

/// `--constants`, checked against `arch` and the query (None without it).
fn given_constants<'a>(
    a: &'a Args,
    arch: &GenArch,
    notes: &mut Vec<String>,
) -> Result<Option<(&'a Path, Constants)>> {
    let Some(p) = &a.constants else {
        return Ok(None);
    };
    let c = Constants::load(p)?;
    if c.generation.is_empty() {
        notes.push(format!(
            "{} has no generation groups; analytic priors used",
            p.display()
        ));
    } else if !c
        .generation
        .iter()
        .any(|g| g.key.architecture == arch.architecture)
    {
        return Err(crate::error::bad_file(
            p,
            format!(
                "constants fitted for other generation architectures cannot estimate {} (refit on its CSVs, or drop --constants)",
                arch.architecture
            ),
        ));
    }
    if let Some(w) = c.check_query(p, a.runtime, a.backend, a.allow_transfer)? {
        eprintln!("warning: {w}");
        notes.push(format!("warning: {w}"));
    }
    Ok(Some((p.as_path(), c)))
}

/// The `constants:` line: the file the phases were fitted on, else the analytic profile.
fn constants_line(
    a: &Args,
    arch: &GenArch,
    constants: Option<&(&Path, Constants)>,
    reference: bool,
) -> String {
    match constants {
        Some((p, c)) if !c.generation.is_empty() => {
            let sha: Vec<String> = c
                .generation
                .iter()
                .flat_map(|g| g.origin.csv_sha256.iter())
                .map(|(f, h)| format!("{f} sha256 {}", &h[..12.min(h.len())]))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            format!(
                "{}{} ({} on {}, {}; fitted on {})",
                if reference { "built-in reference " } else { "" },
                p.display(),
                c.runtime.as_str(),
                c.backend,
                c.device,
                sha.join(", ")
            )
        }
        _ => format!(
            "analytic priors (no fitted generation constants): {} profile{}",
            a.runtime.as_str(),
            match (a.runtime, a.attention) {
                (Runtime::Candle, Attention::Flash) if arch.denoise_flash => {
                    ", flash attention in the transformer (no materialized scores), VAE scores in f32"
                }
                (Runtime::Candle, _) if arch.denoise_scores_f32 => {
                    ", attention scores materialized in f32 (UNet and VAE)"
                }
                (Runtime::Candle, _) => {
                    ", attention scores materialized (transformer: in the pipeline's dtype; VAE: f32)"
                }
                (Runtime::Torch | Runtime::Vllm, Attention::Eager) =>
                    ", eager denoiser attention (scores and softmax in the pipeline's dtype), SDPA in the VAE",
                (Runtime::Torch | Runtime::Vllm, _) => ", SDPA attention (no materialized scores)",
            }
        ),
    }
}

/// The report of the generation pipeline `m` at the flags of `a`.
pub fn report(a: &Args, m: GenModel) -> Result<GenReport> {
    let arch = GenArch::preset(m);
    let (precision, q) = query(a, m, &arch)?;
    let mut notes = Vec::new();
    if a.runtime == Runtime::Torch && a.backend == Backend::Cuda {
        // PyTorch's cuDNN v8 path tries the heuristics' engines in order, each allocating its
        // own workspace (counted by max_memory_allocated), and moves on at an out-of-memory
        // error: a workspace that grows into free memory, which no CPU measurement shows.
        notes.push(
            "torch on CUDA: cuDNN may allocate a convolution workspace on a shape's first call, \
             as large as free memory allows, and it is not in this estimate (HF's SDXL \
             VAE-slicing row on an A100 40GB measured above it: docs/src/guides/validate.md)"
                .to_string(),
        );
    }
    let constants = given_constants(a, &arch, &mut notes)?;
    // Without --constants (or --priors): the runtime's built-in reference constants, where they
    // cover the architecture; used across backends and precisions without --allow-transfer,
    // and said so.
    let reference = (a.constants.is_none() && !a.priors)
        .then(|| gen::reference(a.runtime))
        .filter(|(_, c)| {
            c.generation
                .iter()
                .any(|g| g.key.architecture == arch.architecture)
        });
    let constants = match (constants, &reference) {
        (None, Some((path, c))) => {
            if c.backend != a.backend {
                notes.push(format!(
                    "built-in reference constants measured on {} ({}), used for {}",
                    c.backend, c.device, a.backend
                ));
            }
            Some((Path::new(*path), c.clone()))
        }
        (c, _) => c,
    };
    let groups = constants.as_ref().map(|(_, c)| c.generation.as_slice());
    // A figure past 2^64 B: bad input, naming the flags that cause it.
    let bad = |o: Overflow| {
        let f = arch.factor;
        let sizes = [
            Size::of("--batch", q.batch, q.batch > 1),
            Size::of(
                "--resolution",
                q.resolution,
                q.resolution.width.max(q.resolution.height) > f,
            ),
            Size::of("--frames", q.frames, q.frames > 1),
            Size::of("--constants", constants_flag(a), a.constants.is_some()),
        ];
        overflow_error(o, &a.model, &sizes, |reset| {
            let smallest = crate::vocab::Resolution {
                width: f,
                height: f,
            };
            let q = GenQuery {
                batch: if reset[0] { 1 } else { q.batch },
                resolution: if reset[1] { smallest } else { q.resolution },
                frames: if reset[2] { 1 } else { q.frames },
                ..q
            };
            gen::estimate(&arch, &q, groups.filter(|_| !reset[3])).is_ok()
        })
    };
    let e = gen::estimate(&arch, &q, groups).map_err(bad)?;
    let denoiser_batch = arch.pass_batch(&q).bytes("denoiser batch").map_err(bad)?;
    let used = constants_line(a, &arch, constants.as_ref(), reference.is_some());
    for p in &e.phases {
        if p.source == "analytic" && groups.is_some_and(|g| !g.is_empty()) {
            notes.push(format!("{}: no fitted group; analytic priors used", p.name));
        }
        if let Some(g) = groups.and_then(|g| {
            crate::fit::generate::find(
                g,
                &crate::fit::generate::GenGroupKey::of_query(&arch, &q, p.name),
            )
        }) {
            for (t, why) in &g.held {
                notes.push(format!("{}: term {t} {why}", g.key.label()));
            }
        }
    }
    let gpus = gen::gpu_fits(&arch, &q, groups, a.headroom);
    Ok(GenReport {
        model: GenModelJson {
            name: m.as_str(),
            architecture: arch.architecture,
            params: arch.params(),
        },
        query: q,
        denoiser_batch,
        headroom: a.headroom,
        constants: used,
        exact: Row::all(&e.exact),
        breakdown: Row::all(&e.breakdown),
        phases: e.phases,
        peak_phase: e.peak_phase,
        total_bytes: e.total_bytes,
        gpus,
        notes,
        precision,
        device: Row::all(&e.device),
        video: arch.temporal_factor > 1,
    })
}
