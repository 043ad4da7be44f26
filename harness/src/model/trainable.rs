//! What the training workload needs from a model: an embedding, a stack of layers that can be
//! run (and re-run, for checkpointing) one at a time, and a head with its loss; and the
//! assembly of a training point's model from the loaded weights (variables, frozen views,
//! LoRA adapters).
use super::Config;
use crate::vocab::{Ops, Trainable as TrainableSet};
use candle_core::{DType, Result, Tensor, Var};
use std::collections::HashMap;

pub trait Trainable {
    fn config(&self) -> &Config;
    /// Token ids (b, s) u32 → hidden states (b, s, d) in the compute dtype.
    fn embed(&self, ids: &Tensor) -> Result<Tensor>;
    fn num_layers(&self) -> usize;
    /// Layer `i` on hidden states (b, s, d) for positions 0..s, without a KV cache.
    fn layer(&self, i: usize, x: &Tensor) -> Result<Tensor>;
    /// Final norm, head, and the scalar f32 loss. `targets` (b, s) u32 are the next-token ids
    /// for decoders; encoders may ignore them (see each model's doc).
    fn loss(&self, x: &Tensor, targets: &Tensor) -> Result<Tensor>;

    /// The whole forward pass and its loss.
    fn forward_loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let mut x = self.embed(ids)?;
        for i in 0..self.num_layers() {
            x = self.layer(i, &x)?;
        }
        self.loss(&x, targets)
    }
}

/// Turns loaded tensors into variables (each is copied once; the copy is a load transient).
pub fn to_vars(t: HashMap<String, Tensor>) -> anyhow::Result<Vec<(String, Var)>> {
    let mut names: Vec<String> = t.keys().cloned().collect();
    names.sort();
    let mut t = t;
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let tensor = t.remove(&n).expect("listed above");
        out.push((n, Var::from_tensor(&tensor)?));
    }
    Ok(out)
}

/// The seed of LoRA's A matrices (B starts at zero, as in PEFT, so the adapted model starts
/// equal to the base model).
const LORA_SEED: u64 = 0x10_4a;

/// Rank-`rank` LoRA adapters for `targets` (module name, in, out features), in that order: A
/// (r, in) uniform in ±1/√in (PEFT's Kaiming-uniform bound), B (out, r) zero, both in `dtype`
/// on `dev`, named by `nn::lora_names`.
pub fn lora_adapters(
    targets: &[(String, usize, usize)],
    rank: u32,
    dtype: DType,
    dev: &candle_core::Device,
) -> anyhow::Result<Vec<(String, Var)>> {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(LORA_SEED);
    let r = rank as usize;
    let mut out = Vec::with_capacity(2 * targets.len());
    for (module, i, o) in targets {
        let (i, o) = (*i, *o);
        let bound = 1.0 / (i as f32).sqrt();
        let a: Vec<f32> = (0..r * i)
            .map(|_| rng.random_range(-bound..bound))
            .collect();
        let a = Tensor::from_vec(a, (r, i), dev)?.to_dtype(dtype)?;
        let [a_name, b_name] = super::nn::lora_names(module);
        out.push((a_name, Var::from_tensor(&a)?));
        out.push((b_name, Var::zeros((o, r), dtype, dev)?));
    }
    Ok(out)
}

/// The model of one training point: frozen tensors are detached views of their variable
/// (same storage, no gradient); `lora-rN` adds fresh adapter variables, the only trainable
/// ones. Returns the model and the trainable variables.
pub fn trainable_model(
    cfg: &Config,
    vars: &[(String, Var)],
    set: TrainableSet,
    compute: DType,
    ops: Ops,
) -> anyhow::Result<(Box<dyn Trainable>, Vec<Var>)> {
    let adapters = match (set, vars.first()) {
        (TrainableSet::Lora(r), Some((_, v0))) => {
            let targets: Vec<(String, usize, usize)> = vars
                .iter()
                .filter_map(|(n, v)| super::lora_target(cfg, n, v.dims()))
                .map(|(m, i, o)| (m.to_string(), i, o))
                .collect();
            lora_adapters(&targets, r, v0.dtype(), v0.device())?
        }
        _ => Vec::new(),
    };
    let mut tensors = HashMap::with_capacity(vars.len() + adapters.len());
    let mut trainable = Vec::with_capacity(vars.len());
    for (n, v) in vars.iter().chain(&adapters) {
        if super::is_frozen(cfg, set, n) {
            tensors.insert(n.clone(), v.as_tensor().detach());
        } else {
            tensors.insert(n.clone(), v.as_tensor().clone());
            trainable.push(v.clone());
        }
    }
    Ok((
        cfg.architecture.trainable(cfg, tensors, compute, ops)?,
        trainable,
    ))
}
