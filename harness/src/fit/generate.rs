//! `fit` on generation rows (mode = "generate"): per architecture, backend,
//! precision, phase (and decode kind for `vae_decode`), non-negative least squares of each
//! point's phase peak, less its exact tensors, on the uncertain activation terms of
//! `estimate::generate`. The exact tensors (weights, context, latents, decoded
//! images, a tiled decode's strip) enter with coefficient 1 and are never fitted; a term the
//! group's points cannot identify is held at its analytic prior and the file says why, as the
//! LLM fit does (ARCHITECTURE.md §9). Each group records its origin: runtime, backend, device and
//! the sha256 of every CSV it was fitted on.
use super::{nnls, rank, ErrStats, Heldout};
use crate::error::bad_file;
use crate::record::{Record, Status};
use crate::terms::generation::{phase_terms, priors, GenArch, GenQuery, GenTerms, GEN_TERMS};
use crate::vocab::{Backend, GenModel, Mode, Phase, Precision, Runtime, VaeDecode};
use anyhow::Result;
use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// What identifies a group of generation points fitted together.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GenGroupKey {
    pub architecture: String,
    pub backend: Backend,
    /// The dtype of the phase's component: the pipeline's, or the VAE's for `vae_decode`.
    pub precision: Precision,
    pub phase: Phase,
    /// `vae_decode` groups only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vae_decode: Option<VaeDecode>,
}

impl GenGroupKey {
    pub fn of_query(a: &GenArch, q: &GenQuery, phase: Phase) -> GenGroupKey {
        let vae = phase == Phase::VaeDecode;
        GenGroupKey {
            architecture: a.architecture.to_string(),
            backend: q.backend,
            precision: Precision::of_dense(if vae { q.vae_dtype } else { q.dtype }),
            phase,
            vae_decode: vae.then_some(q.vae_decode),
        }
    }

    pub fn label(&self) -> String {
        let decode = self.vae_decode.map(|d| format!("/{d}")).unwrap_or_default();
        format!(
            "{}/{}/{}/{}{decode}",
            self.architecture, self.backend, self.precision, self.phase
        )
    }
}

/// Where a group's constants come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Origin {
    pub runtime: Runtime,
    pub backend: Backend,
    pub device: String,
    /// CSV path → sha256 of its bytes, for every CSV the group's rows came from.
    pub csv_sha256: BTreeMap<String, String>,
}

/// One fitted generation group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenGroupFit {
    #[serde(flatten)]
    pub key: GenGroupKey,
    pub points: usize,
    pub r2: f64,
    /// The phase's activations are the largest of these families (one: a linear model), each
    /// a coefficient per uncertain term (tensors of the term's shape live at the peak).
    pub families: Vec<BTreeMap<String, f64>>,
    /// Terms held at their analytic prior: term → why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<String, String>,
    /// Leave-one-point-out error of the group's phase peak.
    pub loo: Option<ErrStats>,
    pub origin: Origin,
}

impl GenGroupFit {
    /// Each family's coefficients in [`GEN_TERMS`] order (0 for a term it does not have).
    pub fn coefficients(&self) -> Families {
        self.families
            .iter()
            .map(|c| std::array::from_fn(|j| c.get(GEN_TERMS[j]).copied().unwrap_or(0.0)))
            .collect()
    }
}

/// The generation groups of a constants file.
pub type GenConstants = [GenGroupFit];

/// The group fitted for `key`.
pub fn find<'a>(c: &'a GenConstants, key: &GenGroupKey) -> Option<&'a GenGroupFit> {
    c.iter().find(|g| &g.key == key)
}

/// A group of the same architecture, phase and decode at another precision or on another
/// backend: the same backend first, then the query's precision, then its width (bf16 from f16), then f32. The terms are bytes in
/// the query's dtypes, so the tensor counts carry over; what the backend changes (a CUDA
/// kernel's workspace against a CPU one's) is the transfer's risk, which the caller states.
pub fn find_transfer<'a>(c: &'a GenConstants, key: &GenGroupKey) -> Option<&'a GenGroupFit> {
    c.iter()
        .filter(|g| {
            g.key.architecture == key.architecture
                && g.key.phase == key.phase
                && g.key.vae_decode == key.vae_decode
        })
        .min_by_key(|g| {
            (
                g.key.backend != key.backend,
                g.key.precision != key.precision,
                // A 16-bit query keeps its width (bf16 from f16): candle-nn's norms upcast
                // 16-bit inputs alike, so an f32 group halves where they do not.
                g.key.precision.dtype().size_in_bytes() != key.precision.dtype().size_in_bytes(),
                g.key.precision != Precision::F32,
            )
        })
}

/// The architecture of a generation row, from its model id (the synthetic presets).
pub fn arch_of(r: &Record) -> Option<GenArch> {
    let m: GenModel = r.model_id.parse().ok()?;
    Some(GenArch::preset(m))
}

/// One point's measured phase, with its terms.
#[derive(Clone, Debug)]
pub struct GenSample {
    pub key: GenGroupKey,
    pub point: String,
    /// Measured peak over the point's starting allocation.
    pub y: f64,
    pub exact: f64,
    pub x: GenTerms,
    pub prior: GenTerms,
}

impl GenSample {
    /// A point's measured phase peak `y` (over the point's starting allocation), with the
    /// exact tensors and uncertain terms of `q` on `arch` (an overflow: they exceed 2^64 B).
    pub fn new(
        arch: &GenArch,
        q: &GenQuery,
        phase: Phase,
        point: &str,
        y: f64,
    ) -> Result<GenSample, crate::checked::Overflow> {
        let t = phase_terms(arch, q, phase)?;
        Ok(GenSample {
            key: GenGroupKey::of_query(arch, q, phase),
            point: point.to_string(),
            y,
            exact: t.exact.iter().map(|e| e.1 as f64).sum(),
            x: t.x,
            prior: priors(arch, q.runtime),
        })
    }

    pub fn predict(&self, families: &[GenTerms]) -> f64 {
        self.exact + activation(families, &self.x)
    }
}

/// The query a generation point ran.
pub fn query_of(r: &Record, tile: (usize, usize)) -> Option<GenQuery> {
    let dtype = r.precision.dtype();
    Some(GenQuery {
        batch: r.batch,
        resolution: r.resolution?,
        frames: r.frames.unwrap_or(1),
        cfg: r.cfg?,
        vae_decode: r.vae_decode?,
        tile: tile.0,
        overlap: tile.1,
        dtype,
        vae_dtype: r.vae_precision.map(|p| p.dtype()).unwrap_or(dtype),
        runtime: r.meter.runtime(),
        backend: r.backend,
        attention: r.attention,
    })
}

/// The samples of generation rows: per point, the peak of each phase (the largest of its rows)
/// over the allocation at the point's start (its first row's baseline). `tiles` maps the
/// tiled points to their tile and overlap. Points that failed, or whose model is unknown, are
/// skipped; a point whose terms exceed 2^64 B is an error naming it.
pub fn samples(
    records: &[Record],
    tiles: &BTreeMap<String, (usize, usize)>,
) -> anyhow::Result<Vec<GenSample>> {
    let mut points: BTreeMap<(&str, &str), Vec<&Record>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.mode == Mode::Generate) {
        points
            .entry((r.run_id.as_str(), r.point_id.as_str()))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((_, point), rows) in points {
        if rows.iter().any(|r| r.status != Some(Status::Ok)) {
            continue;
        }
        let r0 = rows[0];
        let (Some(arch), Some(start)) = (arch_of(r0), r0.baseline_allocated) else {
            continue;
        };
        let tile = tiles.get(point).copied().unwrap_or((0, 0));
        let Some(q) = query_of(r0, tile) else {
            continue;
        };
        if q.vae_decode == VaeDecode::Tiled && tile.0 == 0 {
            continue;
        }
        for phase in crate::terms::generation::GEN_PHASES {
            let peak = rows
                .iter()
                .filter(|r| r.phase == Some(phase))
                .filter_map(|r| r.peak_allocated)
                .max();
            let Some(peak) = peak else { continue };
            let y = peak.saturating_sub(start) as f64;
            let s = GenSample::new(&arch, &q, phase, point, y)
                .map_err(|e| anyhow::anyhow!("generation point {point}, {phase}: {e}"))?;
            out.push(s);
        }
    }
    Ok(out)
}

/// A group's activation model: the largest of its families, each a coefficient per term
/// (one family: a linear model).
pub type Families = Vec<GenTerms>;

/// The activation bytes `families` predict at `x`: the largest family.
pub fn activation(families: &[GenTerms], x: &GenTerms) -> f64 {
    families
        .iter()
        .map(|c| c.iter().zip(x).map(|(c, x)| c * x).sum::<f64>())
        .fold(f64::NEG_INFINITY, f64::max)
}

/// The families a max model chooses between in a phase. The denoiser's step peaks either at
/// an image-independent transient (candle lowers a convolution through a copy of its kernel:
/// the largest kernel, at the lowest resolution) with the little activation there, or at the
/// full-resolution feature maps and attention scores. The VAE decode peaks either in its
/// full-resolution up blocks (feature maps) or in its mid-block attention (the scores over
/// every latent pixel), which are never alive at once.
fn max_families(phase: Phase) -> Option<[&'static [usize]; 2]> {
    match phase {
        Phase::Denoise => Some([&[5, 1], &[1, 3]]),
        Phase::VaeDecode => Some([&[2, 5], &[4]]),
        _ => None,
    }
}

/// Whether a phase's max model is physics, not a choice: kept even when the measured points
/// never reach its second family (which then holds its prior).
fn always_max(phase: Phase) -> bool {
    phase == Phase::VaeDecode
}

/// NNLS of one group's uncertain terms: on row i, the terms of `families[assign[i]]`. Columns
/// present (non-zero somewhere) are admitted in family then [`GEN_TERMS`] order while they
/// raise the rank and stay fewer than the points; the others are held at their prior.
pub fn solve(
    samples: &[GenSample],
    families: &[&[usize]],
    assign: &[usize],
) -> (Families, BTreeMap<String, String>) {
    let n = samples.len();
    let cols: Vec<(usize, usize)> = families
        .iter()
        .enumerate()
        .flat_map(|(f, fam)| fam.iter().map(move |&j| (f, j)))
        .collect();
    let full = DMatrix::from_fn(n, cols.len(), |i, k| {
        let (f, j) = cols[k];
        if assign[i] == f {
            samples[i].x[j]
        } else {
            0.0
        }
    });
    let present: Vec<usize> = (0..cols.len())
        .filter(|&k| full.column(k).iter().any(|v| *v != 0.0))
        .collect();
    let mut keep: Vec<usize> = Vec::new();
    // A family's term that no point assigned to it shows: its prior.
    let mut held: Vec<usize> = (0..cols.len())
        .filter(|k| !present.contains(k) && samples.iter().any(|s| s.x[cols[*k].1] != 0.0))
        .collect();
    for &k in &present {
        let mut trial = keep.clone();
        trial.push(k);
        if trial.len() < n.max(2) && rank(&full, &trial) == trial.len() {
            keep = trial;
        } else {
            held.push(k);
        }
    }
    let prior = samples[0].prior;
    let a = DMatrix::from_fn(n, keep.len(), |i, k| full[(i, keep[k])]);
    let b = DVector::from_iterator(
        n,
        samples.iter().enumerate().map(|(i, s)| {
            s.y - s.exact
                - held
                    .iter()
                    .map(|&k| prior[cols[k].1] * full[(i, k)])
                    .sum::<f64>()
        }),
    );
    let sol = nnls::nnls(&a, &b);
    let mut out: Families = vec![[0.0; GEN_TERMS.len()]; families.len()];
    for (i, &k) in keep.iter().enumerate() {
        out[cols[k].0][cols[k].1] = sol[i];
    }
    for &k in &held {
        out[cols[k].0][cols[k].1] = prior[cols[k].1];
    }
    let tag = |f: usize| {
        if families.len() > 1 {
            format!(" (family {f})")
        } else {
            String::new()
        }
    };
    let why = held
        .iter()
        .map(|&k| {
            let (f, j) = cols[k];
            let why = if present.contains(&k) {
                format!(
                    "not identified ({} of {} terms identifiable from {n} points)",
                    keep.len(),
                    present.len()
                )
            } else {
                "its family holds the peak of none of the fitted points".into()
            };
            (
                format!("{}{}", GEN_TERMS[j], tag(f)),
                format!("held at analytic prior {}: {why}", prior[j]),
            )
        })
        .collect();
    (out, why)
}

/// A fitted activation model and the terms held at their prior (term → why).
pub type Fitted = (Families, BTreeMap<String, String>);

/// Every term present in one family.
pub fn fit_linear(samples: &[GenSample]) -> Fitted {
    let all: Vec<usize> = (0..GEN_TERMS.len()).collect();
    solve(samples, &[&all], &vec![0; samples.len()])
}

fn sse(fam: &[GenTerms], samples: &[GenSample]) -> f64 {
    samples
        .iter()
        .map(|s| (s.y - s.exact - activation(fam, &s.x)).powi(2))
        .sum()
}

/// The largest of the phase's `max_families`, fitted by alternating NNLS for a fixed
/// assignment of points to families with re-assigning each point to its largest family
/// (several starts split by the denoiser's activation term; the lowest squared error wins).
pub fn fit_max(samples: &[GenSample]) -> Option<Fitted> {
    let fams = max_families(samples.first()?.key.phase)?;
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by(|&i, &j| samples[i].x[1].total_cmp(&samples[j].x[1]));
    let mut best: Option<(f64, Fitted)> = None;
    let phase = samples[0].key.phase;
    // A physics max starts with every point in the first family: the second takes only
    // points where it is larger at its prior (no free fit of a family nothing shows).
    let starts: &[f64] = if always_max(phase) {
        &[1.0]
    } else {
        &[0.0, 0.25, 0.5, 0.75, 1.0]
    };
    for &q in starts {
        let cut = (q * samples.len() as f64).round() as usize;
        let mut assign = vec![1; samples.len()];
        for &i in &order[..cut] {
            assign[i] = 0;
        }
        let mut m = solve(samples, &fams, &assign);
        for _ in 0..25 {
            let next: Vec<usize> = samples
                .iter()
                .map(|s| usize::from(activation(&m.0[1..], &s.x) > activation(&m.0[..1], &s.x)))
                .collect();
            if next == assign {
                break;
            }
            assign = next;
            m = solve(samples, &fams, &assign);
        }
        let e = sse(&m.0, samples);
        if best.as_ref().is_none_or(|(b, _)| e < *b) {
            best = Some((e, m));
        }
    }
    best.map(|b| b.1)
}

type Fitter = fn(&[GenSample]) -> Fitted;

fn heldout_row(s: &GenSample, fam: &[GenTerms]) -> Heldout {
    Heldout {
        group: s.key.label(),
        row: format!("{} {}", s.point, s.key.phase),
        measured: s.y,
        predicted: s.exact + activation(fam, &s.x),
    }
}

/// Each point of the group predicted by a fit on the others.
pub fn leave_one_out(samples: &[GenSample], fitter: Fitter) -> Vec<Heldout> {
    if samples.len() < 2 {
        return Vec::new();
    }
    (0..samples.len())
        .map(|i| {
            let rest: Vec<GenSample> = samples
                .iter()
                .enumerate()
                .filter(|(k, _)| *k != i)
                .map(|(_, s)| s.clone())
                .collect();
            heldout_row(&samples[i], &fitter(&rest).0)
        })
        .collect()
}

fn fit_max_or_linear(samples: &[GenSample]) -> Fitted {
    fit_max(samples).unwrap_or_else(|| fit_linear(samples))
}

/// Fits every generation group of `samples`: linear, or for the denoiser the max of two
/// families where its leave-one-point-out error (median + worst) is smaller.
pub fn fit_groups(samples: &[GenSample], origin: &Origin) -> Vec<GenGroupFit> {
    let mut groups: BTreeMap<&GenGroupKey, Vec<GenSample>> = BTreeMap::new();
    for s in samples {
        groups.entry(&s.key).or_default().push(s.clone());
    }
    let score = |h: &[Heldout]| {
        ErrStats::of(h)
            .map(|e| e.median + e.worst)
            .unwrap_or(f64::INFINITY)
    };
    groups
        .into_iter()
        .map(|(key, g)| {
            let lin = leave_one_out(&g, fit_linear);
            let (fitter, loo): (Fitter, _) = match max_families(key.phase) {
                Some(_) => {
                    let max = leave_one_out(&g, fit_max_or_linear);
                    if always_max(key.phase) || score(&max) < score(&lin) {
                        (fit_max_or_linear, max)
                    } else {
                        (fit_linear, lin)
                    }
                }
                None => (fit_linear, lin),
            };
            let (fam, held) = fitter(&g);
            let mean = g.iter().map(|s| s.y).sum::<f64>() / g.len() as f64;
            let ss_tot: f64 = g.iter().map(|s| (s.y - mean).powi(2)).sum();
            let ss_res = sse(&fam, &g);
            let present = |j: usize| g.iter().any(|s| s.x[j] != 0.0);
            GenGroupFit {
                key: key.clone(),
                points: g.len(),
                r2: if ss_tot > 0.0 {
                    1.0 - ss_res / ss_tot
                } else {
                    f64::from(u8::from(ss_res == 0.0))
                },
                families: fam
                    .iter()
                    .map(|c| {
                        (0..GEN_TERMS.len())
                            .filter(|&j| present(j) && (fam.len() == 1 || c[j] != 0.0))
                            .map(|j| (GEN_TERMS[j].to_string(), c[j]))
                            .collect()
                    })
                    .collect(),
                held,
                loo: ErrStats::of(&loo),
                origin: origin.clone(),
            }
        })
        .collect()
}

/// The held-out check: each sample predicted by `groups` (exactly its group, else a
/// transferred one).
pub fn predict_heldout(groups: &GenConstants, samples: &[GenSample]) -> Vec<Heldout> {
    samples
        .iter()
        .filter_map(|s| {
            let g = find(groups, &s.key).or_else(|| find_transfer(groups, &s.key))?;
            Some(heldout_row(s, &g.coefficients()))
        })
        .collect()
}

/// sha256 of a file's bytes, hex.
pub fn sha256_file(p: &Path) -> Result<String> {
    use sha2::Digest;
    let bytes = std::fs::read(p).map_err(|e| bad_file(p, format!("cannot read: {e}")))?;
    Ok(format!("{:x}", sha2::Sha256::digest(&bytes)))
}

/// Each held-out point's peak (the largest phase) against the largest predicted phase.
pub fn point_totals(groups: &GenConstants, samples: &[GenSample]) -> Vec<Heldout> {
    let mut points: BTreeMap<&str, (f64, f64, Phase, Phase)> = BTreeMap::new();
    for s in samples {
        let Some(g) = find(groups, &s.key).or_else(|| find_transfer(groups, &s.key)) else {
            continue;
        };
        let p = s.predict(&g.coefficients());
        let e = points
            .entry(s.point.as_str())
            .or_insert((0.0, 0.0, s.key.phase, s.key.phase));
        if s.y > e.0 {
            (e.0, e.2) = (s.y, s.key.phase);
        }
        if p > e.1 {
            (e.1, e.3) = (p, s.key.phase);
        }
    }
    points
        .into_iter()
        .map(|(point, (y, p, mp, pp))| Heldout {
            group: "total".into(),
            row: format!("{point} total (peak {mp}, predicted {pp})"),
            measured: y,
            predicted: p,
        })
        .collect()
}
