//! `--best-format`: the query's total at each candidate weight format, sorted by bits per
//! weight, against a budget.
use super::{estimate, Precision, Query};
use crate::fit::Constants;
use crate::model::Config;
use serde::Serialize;

/// The quantized formats `--best-format` weighs after the unquantized one (the GGUF's own
/// types, or a preset's bf16), roughly most bits first; the table is sorted by the bits per
/// weight each actually gets.
pub const BEST_FORMATS: [Precision; 6] = [
    Precision::Q8_0,
    Precision::Q6k,
    Precision::Q5k,
    Precision::Q4k,
    Precision::Q4_1,
    Precision::Q4_0,
];

/// One format of `--best-format`: its exact weights, the query's total with them, and
/// whether that fits the budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FormatFit {
    pub precision: Precision,
    /// None when the format is impossible for this model.
    pub weight_bytes: Option<u64>,
    pub bits_per_weight: Option<f64>,
    pub total_bytes: Option<u64>,
    pub fits: bool,
    /// Why the format cannot hold this model (a row that is not whole blocks).
    pub impossible: Option<String>,
}

/// Each candidate `(precision, exact weight bytes)` at the query `q` (its batch and context),
/// against `budget` bytes (already less the headroom): sorted by bits per weight, most first,
/// impossible formats last. `Ok(None)` weight bytes: a dense precision, at its dtype. The best
/// format is the first that fits.
pub fn format_fits(
    cfg: &Config,
    q: &Query,
    c: Option<&Constants>,
    candidates: &[(Precision, std::result::Result<Option<u64>, String>)],
    budget: u64,
) -> Vec<FormatFit> {
    let params = cfg.param_count().max(1) as f64;
    let mut out: Vec<FormatFit> = candidates
        .iter()
        .map(|(p, w)| {
            let query = |w: &Option<u64>| Query {
                precision: *p,
                weight_bytes: *w,
                ..*q
            };
            // A format whose estimate overflows cannot hold the query either.
            let total = w.as_ref().map_err(Clone::clone).and_then(|w| {
                let e = estimate(cfg, &query(w), c).map_err(|e| e.to_string())?;
                let total = e.total().map_err(|e| e.to_string())?;
                Ok((e.weights, total))
            });
            match total {
                Ok((weights, total)) => FormatFit {
                    precision: *p,
                    weight_bytes: Some(weights),
                    bits_per_weight: Some(weights as f64 * 8.0 / params),
                    total_bytes: Some(total),
                    fits: total <= budget,
                    impossible: None,
                },
                Err(why) => FormatFit {
                    precision: *p,
                    weight_bytes: None,
                    bits_per_weight: None,
                    total_bytes: None,
                    fits: false,
                    impossible: Some(why),
                },
            }
        })
        .collect();
    out.sort_by(|a, b| {
        let bits = |f: &FormatFit| f.bits_per_weight.unwrap_or(-1.0);
        bits(b).total_cmp(&bits(a))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::test_support::{estimate, matrices_and_vectors, preset};

    /// `--best-format` on llama-3.1-8b at batch 1, context 4096 (f32 compute) and a 16 GB GPU
    /// with 10 % headroom (14.4 GB): f32 (32.1 GB of weights) does not fit, Q8_0 does, and
    /// its weights are, by hand, every matrix at 34 B per 32 weights and every vector in f32.
    #[test]
    fn best_format_is_the_most_bits_that_fit() {
        let cfg = preset("llama-3.1-8b");
        let q = Query {
            context: 4096,
            ..Query::default()
        };
        let candidates: Vec<_> = std::iter::once(Precision::F32)
            .chain(BEST_FORMATS)
            .map(|p| {
                let w = match p.quantized() {
                    Some(crate::vocab::Quantized::To(t)) => {
                        crate::model::gguf::plan_config(&cfg, t).map(|plan| {
                            Some(crate::model::gguf::plan_bytes(
                                &plan,
                                candle_core::DType::F32,
                            ))
                        })
                    }
                    _ => Ok(None),
                };
                (p, w)
            })
            .collect();
        // A budget of exactly Q8_0's total: f32 cannot fit it, Q8_0 just does.
        let unbounded = format_fits(&cfg, &q, None, &candidates, u64::MAX);
        let budget = unbounded[1].total_bytes.unwrap();
        let fits = format_fits(&cfg, &q, None, &candidates, budget);
        let order: Vec<Precision> = fits.iter().map(|f| f.precision).collect();
        use Precision::*;
        // Bits per weight as obtained: f32 32, Q8_0 8.5, Q6_K 6.56, Q5_K 5.5, Q4_1 5, Q4_K and
        // Q4_0 4.5 (a tie, kept in candidate order), plus the f32 norms.
        assert_eq!(order, [F32, Q8_0, Q6k, Q5k, Q4_1, Q4k, Q4_0]);
        let (matrices, vectors) = matrices_and_vectors(&cfg);
        let q8 = &fits[1];
        assert_eq!(q8.weight_bytes, Some(matrices / 32 * 34 + vectors * 4));
        assert!(!fits[0].fits && q8.fits, "{fits:?}");
        assert_eq!(fits.iter().find(|f| f.fits).unwrap().precision, Q8_0);
        // Fewer bits never cost more.
        for w in fits.windows(2) {
            assert!(w[0].total_bytes >= w[1].total_bytes, "{w:?}");
        }
        // The total is the estimate of the query at that format.
        let e = estimate(
            &cfg,
            &Query {
                precision: Q8_0,
                weight_bytes: q8.weight_bytes,
                ..q
            },
            None,
        );
        assert_eq!(q8.total_bytes, Some(e.total().unwrap()));
    }
}
