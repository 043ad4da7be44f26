//! A sparse mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE) in its grouped form:
//! route, permute the tokens so that each expert's are contiguous, run each expert on its
//! slice, weight the outputs and add them back to their tokens. The routing itself follows
//! transformers: router logits in the compute dtype, softmax in f32, the `top_k` most probable
//! experts (ties to the lower index), their weights renormalized where the config says so.
//!
//! Memory of one MoE layer over n tokens (b · s) with k experts each, hidden d, compute width
//! `e` bytes: the router's logits (n · E · e) and f32 probabilities (n · E · 4), the permuted
//! tokens (n · k · d · e), each expert's gate, up and SwiGLU product for its tokens
//! (3 · n_j · expert_size · e), the experts' outputs, concatenated (n · k · d · e each), the
//! weighted outputs (n · k · d · e) and the layer's output (n · d · e). A shared expert runs on
//! all n tokens. Under training candle's graph holds these; in inference each lives for the
//! layer.
//!
//! Top-k runs on the host (candle has no top-k op): the probabilities are copied back, n · E
//! f32 values a layer (a stream sync on CUDA). The selected weights are gathered from the
//! probabilities on the device, so the router gets its gradient.
use super::{Linear, Named};
use crate::model::config::Moe;
use candle_core::{DType, Result, Tensor, D};

/// One gated expert: gate, up and down projections (hidden → size → hidden).
pub struct Expert {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Expert {
    fn load(t: &mut Named, [g, u, d]: [String; 3]) -> anyhow::Result<Self> {
        let strip = |n: String| n.strip_suffix(".weight").map(str::to_string).unwrap_or(n);
        Ok(Expert {
            gate: t.linear(&strip(g), false)?,
            up: t.linear(&strip(u), false)?,
            down: t.linear(&strip(d), false)?,
        })
    }

    /// x (b, s, d) → (b, s, d); `act` computes the gated product of (gate, up).
    fn forward(
        &self,
        x: &Tensor,
        act: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        self.down
            .forward(&act(&self.gate.forward(x)?, &self.up.forward(x)?)?)
    }
}

/// The router, the routed experts and the shared expert of one MoE layer.
pub struct SparseMoe {
    router: Linear,
    experts: Vec<Expert>,
    shared: Option<Expert>,
    shared_gate: Option<Linear>,
    top_k: usize,
    norm_topk: bool,
}

impl SparseMoe {
    /// Takes layer prefix `p`'s MoE tensors (names as [`Moe`] gives them).
    pub fn load(t: &mut Named, m: &Moe, p: &str) -> anyhow::Result<Self> {
        let router = t.linear(&format!("{p}.{}.gate", m.module()), false)?;
        let experts = (0..m.experts)
            .map(|j| Expert::load(t, m.expert_names(p, j)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let shared = if m.shared_size > 0 {
            let q = format!("{p}.mlp.shared_expert");
            let names = ["gate_proj", "up_proj", "down_proj"].map(|w| format!("{q}.{w}"));
            Some(Expert::load(t, names)?)
        } else {
            None
        };
        let shared_gate = if m.shared_gate {
            Some(t.linear(&format!("{p}.mlp.shared_expert_gate"), false)?)
        } else {
            None
        };
        Ok(SparseMoe {
            router,
            experts,
            shared,
            shared_gate,
            top_k: m.top_k,
            norm_topk: m.norm_topk,
        })
    }

    /// x (b, s, d) → (b, s, d); `act` computes the experts' gated product of (gate, up).
    pub fn forward(
        &self,
        x: &Tensor,
        act: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let (b, s, d) = x.dims3()?;
        let (n, k, dev) = (b * s, self.top_k, x.device());
        let logits = self.router.forward(x)?.to_dtype(DType::F32)?;
        let probs = super::softmax(&logits)?.reshape((n, ()))?;
        let picked = top_k(&probs.to_vec2::<f32>()?, k);
        let weights = probs.gather(&Tensor::from_vec(picked.clone(), (n, k), dev)?, 1)?;
        let weights = if self.norm_topk {
            weights.broadcast_div(&weights.sum_keepdim(D::Minus1)?)?
        } else {
            weights
        };
        // The (token, slot) pairs grouped by expert: `order` lists slots t·k + j expert by
        // expert, `tokens` their tokens.
        let mut order: Vec<u32> = (0..(n * k) as u32).collect();
        order.sort_by_key(|&slot| picked[slot as usize]);
        let tokens: Vec<u32> = order.iter().map(|&slot| slot / k as u32).collect();
        let tokens_t = Tensor::new(tokens.as_slice(), dev)?;
        let xs = x.reshape((n, d))?.index_select(&tokens_t, 0)?;
        let mut outs = Vec::new();
        let mut start = 0;
        for (j, expert) in self.experts.iter().enumerate() {
            let len = order[start..]
                .iter()
                .take_while(|&&slot| picked[slot as usize] == j as u32)
                .count();
            if len > 0 {
                let xe = xs.narrow(0, start, len)?.unsqueeze(0)?;
                outs.push(expert.forward(&xe, act)?.squeeze(0)?);
            }
            start += len;
        }
        let ys = Tensor::cat(&outs, 0)?;
        let w = weights
            .flatten_all()?
            .index_select(&Tensor::new(order.as_slice(), dev)?, 0)?
            .to_dtype(x.dtype())?;
        let ys = ys.broadcast_mul(&w.unsqueeze(1)?)?;
        let routed = Tensor::zeros((n, d), x.dtype(), dev)?
            .index_add(&tokens_t, &ys, 0)?
            .reshape((b, s, d))?;
        match &self.shared {
            None => Ok(routed),
            Some(shared) => {
                let y = shared.forward(x, act)?;
                let y = match &self.shared_gate {
                    Some(g) => y.broadcast_mul(&candle_nn::ops::sigmoid(&g.forward(x)?)?)?,
                    None => y,
                };
                routed + y
            }
        }
    }
}

/// For each row of probabilities, the indices of its `k` largest (ties to the lower index),
/// flattened row by row.
pub fn top_k(probs: &[Vec<f32>], k: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(probs.len() * k);
    for row in probs {
        let mut idx: Vec<u32> = (0..row.len() as u32).collect();
        idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        out.extend_from_slice(&idx[..k]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_takes_the_largest_and_breaks_ties_low() {
        let p = vec![vec![0.1, 0.4, 0.4, 0.1], vec![0.7, 0.1, 0.1, 0.1]];
        assert_eq!(top_k(&p, 2), vec![1, 2, 0, 1]);
    }
}
