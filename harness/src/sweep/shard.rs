//! `sweep --shard K/N`: a deterministic 1/N of a scenario's points, balanced by cost, with the
//! points that share loaded weights kept together. Every mode shards: language models by the
//! estimator's cost ([`cost`]), generation and fine-tuning points by their work
//! ([`gen_cost`], [`ft_cost`]).
//!
//! Selection lives here, not in `scenario/`: it does not change what a scenario expands to
//! (ids, order, hash), it splits one run's work between processes, and a shard is a property
//! of the run (the `--shard` flag, the manifest's `shard`).
use crate::estimate::{estimate, Attention, Query};
use crate::model::Config;
use crate::scenario::ft_points::FtPoint;
use crate::scenario::gen_points::GenPoint;
use crate::scenario::{Mode, Point};
use std::collections::BTreeMap;

/// Shard K of N, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub k: usize,
    pub n: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let (k, n) = s
            .split_once('/')
            .and_then(|(k, n)| Some((k.trim().parse().ok()?, n.trim().parse().ok()?)))
            .ok_or_else(|| format!("--shard `{s}`: expected K/N, e.g. 2/8"))?;
        if n == 0 || k == 0 || k > n {
            return Err(format!(
                "--shard {s}: K must be between 1 and N ({n}); shards are numbered 1/{n} to {n}/{n}"
            ));
        }
        Ok(Shard { k, n })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}

/// The estimator's cost of a point: its estimated peak bytes times the passes it measures
/// (prefill + decode steps; micro-batches × three phases per training step). Bytes moved
/// track time well enough to balance shards.
pub fn cost(config: &Config, p: &Point) -> u64 {
    let q = Query {
        mode: p.mode,
        precision: p.precision,
        batch: p.batch as u64,
        context: p.context as u64,
        optimizer: p.train.optimizer,
        checkpointing: p.train.checkpointing,
        trainable: p.train.trainable,
        attention: Attention::Eager,
        kv_cache: p.kv_cache,
        kv_window: p.kv_window,
        ..Query::default()
    };
    let passes = match p.mode {
        Mode::Infer => 1 + p.decode_steps as u64,
        Mode::Train => 3 * (p.train.steps * p.train.grad_accum) as u64,
        Mode::Encode | Mode::Generate => 1,
    };
    // A cost, not a figure shown: a point past 2^64 B is simply the costliest.
    estimate(config, &q, None)
        .and_then(|e| e.total())
        .map_or(u64::MAX, |t| t.max(1))
        .saturating_mul(passes.max(1))
}

/// A generation point's work: output pixels × frames × images run (twice the batch under
/// CFG) × (denoising steps + the decode); a proxy for time that needs no model file, so a
/// dry run shards without reading the weights.
pub fn gen_cost(p: &GenPoint) -> u64 {
    let g = &p.shape;
    let px = (g.resolution.width * g.resolution.height * g.frames.max(1)) as u64;
    let images = (g.batch * if g.cfg { 2 } else { 1 }) as u64;
    px * images * (g.steps as u64 + 1) + 1
}

/// A fine-tuning point's work: latent pixels × frames × batch × three passes per step.
pub fn ft_cost(p: &FtPoint) -> u64 {
    let px = (p.resolution.width * p.resolution.height * p.frames.unwrap_or(1)) as u64;
    px * p.batch as u64 * 3 * p.steps.max(1) as u64 + 1
}

/// The key of the points that share loaded weights: model source, precision and mode.
pub fn llm_key(p: &Point) -> String {
    format!("{}\u{0}{:?}\u{0}{:?}", p.source, p.precision, p.mode)
}

/// The key of generation points that load the same weights: source, precision and the VAE's.
pub fn gen_key(p: &GenPoint) -> String {
    format!(
        "{}\u{0}{:?}\u{0}{:?}",
        p.source, p.precision, p.vae_precision
    )
}

/// The key of fine-tuning points that load the same denoiser: source and precision.
pub fn ft_key(p: &FtPoint) -> String {
    format!("{}\u{0}{:?}", p.source, p.precision)
}

/// The points (indices into `points`, ascending) of `shard`. Units of work are the groups of
/// points that load the same weights (`key`: for a language model, the groups a worker loads
/// weights once for); only when there are fewer groups than shards is the costliest group
/// split into two contiguous halves, repeatedly. Units go, costliest first, to the shard with
/// the least cost so far (longest processing time first), ties to the lower shard and the
/// earlier unit: the same points always land in the same shard.
pub fn select<P>(
    points: &[P],
    key: impl Fn(&P) -> String,
    cost: impl Fn(&P) -> u64,
    shard: Shard,
) -> Vec<usize> {
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, p) in points.iter().enumerate() {
        groups.entry(key(p)).or_default().push(i);
    }
    let costs: Vec<u64> = points.iter().map(&cost).collect();
    let unit_cost = |u: &[usize]| u.iter().map(|&i| costs[i]).sum::<u64>();
    let mut units: Vec<Vec<usize>> = groups.into_values().collect();
    units.sort_by_key(|u| u[0]);
    while units.len() < shard.n {
        let Some((j, _)) = units
            .iter()
            .enumerate()
            .filter(|(_, u)| u.len() > 1)
            .max_by_key(|(j, u)| (unit_cost(u), std::cmp::Reverse(*j)))
        else {
            break;
        };
        let u = units.remove(j);
        let total = unit_cost(&u);
        // Split where the first half's cost first reaches half the total.
        let mut acc = 0;
        let mut cut = 1;
        for (m, &i) in u.iter().enumerate().take(u.len() - 1) {
            acc += costs[i];
            cut = m + 1;
            if 2 * acc >= total {
                break;
            }
        }
        let (a, b) = u.split_at(cut);
        units.insert(j, b.to_vec());
        units.insert(j, a.to_vec());
    }
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by_key(|&j| (std::cmp::Reverse(unit_cost(&units[j])), units[j][0]));
    let mut load = vec![0u64; shard.n];
    let mut mine = Vec::new();
    for j in order {
        let s = (0..shard.n).min_by_key(|&s| (load[s], s)).unwrap_or(0);
        load[s] += unit_cost(&units[j]);
        if s + 1 == shard.k {
            mine.extend_from_slice(&units[j]);
        }
    }
    mine.sort_unstable();
    mine
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::spec::Precision;

    fn pts(spec: &[(&str, Precision, usize)]) -> Vec<Point> {
        let proto = crate::scenario::expand(
            &crate::scenario::Spec::parse(
                std::path::Path::new("t.toml"),
                "name = \"t\"\n[model]\nsource = \"synthetic:a.json\"\n[sweep]\nmode = [\"infer\"]\nprecision = [\"f32\"]\nbatch = [1]\ncontext = [8]\ndecode_steps = 1\n",
            )
            .unwrap(),
        )[0]
        .clone();
        spec.iter()
            .enumerate()
            .map(|(i, (src, prec, b))| Point {
                id: format!("p{i}"),
                source: src.to_string(),
                precision: *prec,
                batch: *b,
                ..proto.clone()
            })
            .collect()
    }

    #[test]
    fn parse_rejects_out_of_range() {
        assert_eq!("2/8".parse::<Shard>(), Ok(Shard { k: 2, n: 8 }));
        for bad in ["3/2", "0/2", "1/0", "x", "1/2/3"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
        assert!("3/2"
            .parse::<Shard>()
            .unwrap_err()
            .contains("between 1 and N (2)"));
    }

    #[test]
    fn shards_partition_balance_and_keep_groups() {
        use Precision::*;
        let p = pts(&[
            ("a", F32, 1),
            ("a", F32, 8),
            ("a", Bf16, 1),
            ("a", Bf16, 8),
            ("b", F32, 1),
            ("b", F32, 2),
            ("c", F32, 4),
        ]);
        let cost = |q: &Point| q.batch as u64;
        let all: Vec<Vec<usize>> = (1..=3)
            .map(|k| select(&p, llm_key, cost, Shard { k, n: 3 }))
            .collect();
        let mut union: Vec<usize> = all.concat();
        union.sort_unstable();
        assert_eq!(union, (0..p.len()).collect::<Vec<_>>());
        // Groups (a,f32)=9, (a,bf16)=9, (b,f32)=3, (c,f32)=4: LPT gives {9}, {9}, {4,3}.
        assert_eq!(all, vec![vec![0, 1], vec![2, 3], vec![4, 5, 6]]);
        // Deterministic.
        assert_eq!(select(&p, llm_key, cost, Shard { k: 3, n: 3 }), all[2]);
        // Fewer groups than shards: the costliest group is split.
        let one = pts(&[("a", F32, 1), ("a", F32, 1), ("a", F32, 2)]);
        let s1 = select(&one, llm_key, cost, Shard { k: 1, n: 2 });
        let s2 = select(&one, llm_key, cost, Shard { k: 2, n: 2 });
        assert_eq!((s1, s2), (vec![0, 1], vec![2]));
    }
}
