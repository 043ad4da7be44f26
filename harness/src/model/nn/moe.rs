//! A sparse mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss, Llama 4) in its
//! grouped form:
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
use crate::model::config::{Moe, MoeNaming, Routing};
use candle_core::{DType, Result, Tensor, D};

/// An expert's gate and up projections: two matrices, or one stacked matrix whose output holds
/// both as `Stacking` says.
enum GateUp {
    Split { gate: Linear, up: Linear },
    Stacked(Linear, Stacking),
}

/// How a stacked gate/up output holds the two: gpt-oss interleaves them (gate in the even
/// columns, up in the odd ones), Llama 4 concatenates them (gate, then up).
#[derive(Clone, Copy)]
enum Stacking {
    Interleaved,
    Halves,
}

/// One gated expert: gate, up and down projections (hidden → size → hidden).
pub struct Expert {
    gate_up: GateUp,
    down: Linear,
}

impl Expert {
    fn load(t: &mut Named, [g, u, d]: [String; 3]) -> anyhow::Result<Self> {
        let strip = |n: String| n.strip_suffix(".weight").map(str::to_string).unwrap_or(n);
        Ok(Expert {
            gate_up: GateUp::Split {
                gate: t.linear(&strip(g), false)?,
                up: t.linear(&strip(u), false)?,
            },
            down: t.linear(&strip(d), false)?,
        })
    }

    /// Expert `j` of stacked tensors (views of them, so gradients reach the stacks):
    /// `x @ gate_up[j] (+ bias[j])`, `x @ down[j] (+ bias[j])`; `stacks` holds gate_up and
    /// down, then their biases where there are (gpt-oss).
    fn stacked(stacks: &[Tensor], how: Stacking, j: usize) -> Result<Self> {
        let lin = |w: usize| -> Result<Linear> {
            Ok(Linear {
                w: super::Weight::Dense(stacks[w].get(j)?),
                b: stacks.get(w + 2).map(|b| b.get(j)).transpose()?,
                transposed: true,
                lora: None,
            })
        };
        Ok(Expert {
            gate_up: GateUp::Stacked(lin(0)?, how),
            down: lin(1)?,
        })
    }

    /// x (b, s, d) → (b, s, d); `act` computes the gated product of (gate, up), or gpt-oss's
    /// clamped GLU with (alpha, limit) `glu`.
    fn forward(
        &self,
        x: &Tensor,
        act: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>,
        glu: Option<(f64, f64)>,
    ) -> Result<Tensor> {
        let h = match &self.gate_up {
            GateUp::Split { gate, up } => act(&gate.forward(x)?, &up.forward(x)?)?,
            GateUp::Stacked(gu, how) => {
                let y = gu.forward(x)?;
                let (b, s, two_f) = y.dims3()?;
                let f = two_f / 2;
                let (gate, up) = match how {
                    Stacking::Interleaved => {
                        let y = y.reshape((b, s, f, 2))?;
                        (
                            y.narrow(3, 0, 1)?.squeeze(3)?,
                            y.narrow(3, 1, 1)?.squeeze(3)?,
                        )
                    }
                    Stacking::Halves => (y.narrow(2, 0, f)?, y.narrow(2, f, f)?),
                };
                match glu {
                    Some((alpha, limit)) => clamped_glu(&gate, &up, alpha, limit)?,
                    None => act(&gate, &up)?,
                }
            }
        };
        self.down.forward(&h)
    }
}

/// gpt-oss's expert activation: gate clamped above at `limit`, up to ±`limit`, then
/// (up + 1) · gate · σ(alpha · gate).
fn clamped_glu(gate: &Tensor, up: &Tensor, alpha: f64, limit: f64) -> Result<Tensor> {
    let gate = gate.minimum(limit)?;
    let up = up.clamp(-limit, limit)?;
    let glu = (&gate * candle_nn::ops::sigmoid(&(&gate * alpha)?)?)?;
    (up + 1.0)? * glu
}

/// The router, the routed experts and the shared expert of one MoE layer.
pub struct SparseMoe {
    router: Linear,
    experts: Vec<Expert>,
    shared: Option<Expert>,
    shared_gate: Option<Linear>,
    top_k: usize,
    norm_topk: bool,
    routing: Routing,
    glu: Option<(f64, f64)>,
}

impl SparseMoe {
    /// Takes layer prefix `p`'s MoE tensors (names as [`Moe`] gives them).
    pub fn load(t: &mut Named, m: &Moe, p: &str) -> anyhow::Result<Self> {
        let (router, experts) = if m.stacked() {
            let q = format!("{p}.{}", m.module());
            // gpt-oss's biases (on the router and every expert's projections).
            let biased = m.clamped_glu.is_some();
            let names: &[&str] = match biased {
                true => &[
                    "gate_up_proj",
                    "down_proj",
                    "gate_up_proj_bias",
                    "down_proj_bias",
                ],
                false => &["gate_up_proj", "down_proj"],
            };
            let stacks = names
                .iter()
                .map(|n| t.take(&format!("{q}.experts.{n}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let how = match m.naming {
                MoeNaming::GptOss => Stacking::Interleaved,
                _ => Stacking::Halves,
            };
            let experts = (0..m.experts)
                .map(|j| Expert::stacked(&stacks, how, j))
                .collect::<Result<Vec<_>>>()?;
            (t.linear(&format!("{q}.router"), biased)?, experts)
        } else {
            let experts = (0..m.experts)
                .map(|j| Expert::load(t, m.expert_names(p, j)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            (
                t.linear(&format!("{p}.{}.gate", m.module()), false)?,
                experts,
            )
        };
        let shared = if m.shared_size > 0 {
            let q = m.shared_module(p);
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
            routing: m.routing,
            glu: m.clamped_glu,
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
        let logits = self.router.forward(x)?.reshape((n, ()))?;
        let (picked, weights) = match self.routing {
            Routing::SoftmaxTopK => {
                let probs = super::softmax(&logits.to_dtype(DType::F32)?)?;
                let picked = top_k(&probs.to_vec2::<f32>()?, k);
                let w = probs.gather(&Tensor::from_vec(picked.clone(), (n, k), dev)?, 1)?;
                let w = if self.norm_topk {
                    w.broadcast_div(&w.sum_keepdim(D::Minus1)?)?
                } else {
                    w
                };
                (picked, w)
            }
            Routing::SigmoidGrouped => {
                candle_core::bail!(
                    "DeepSeek-V3's grouped sigmoid routing runs in the estimate only"
                )
            }
            Routing::TopKSoftmax | Routing::SigmoidTopKInput => {
                let picked = top_k(&logits.to_dtype(DType::F32)?.to_vec2::<f32>()?, k);
                let top = logits.gather(&Tensor::from_vec(picked.clone(), (n, k), dev)?, 1)?;
                let w = match self.routing {
                    Routing::TopKSoftmax => super::softmax(&top)?,
                    _ => candle_nn::ops::sigmoid(&top.to_dtype(DType::F32)?)?,
                };
                (picked, w)
            }
        };
        // Llama 4 weights each expert's input, the others its output.
        let on_input = self.routing == Routing::SigmoidTopKInput;
        // The (token, slot) pairs grouped by expert: `order` lists slots t·k + j expert by
        // expert, `tokens` their tokens.
        let mut order: Vec<u32> = (0..(n * k) as u32).collect();
        order.sort_by_key(|&slot| picked[slot as usize]);
        let tokens: Vec<u32> = order.iter().map(|&slot| slot / k as u32).collect();
        let tokens_t = Tensor::new(tokens.as_slice(), dev)?;
        let w = weights
            .flatten_all()?
            .index_select(&Tensor::new(order.as_slice(), dev)?, 0)?
            .to_dtype(x.dtype())?
            .unsqueeze(1)?;
        let xs = x.reshape((n, d))?.index_select(&tokens_t, 0)?;
        let xs = if on_input { xs.broadcast_mul(&w)? } else { xs };
        let mut outs = Vec::new();
        let mut start = 0;
        for (j, expert) in self.experts.iter().enumerate() {
            let len = order[start..]
                .iter()
                .take_while(|&&slot| picked[slot as usize] == j as u32)
                .count();
            if len > 0 {
                let xe = xs.narrow(0, start, len)?.unsqueeze(0)?;
                outs.push(expert.forward(&xe, act, self.glu)?.squeeze(0)?);
            }
            start += len;
        }
        let ys = Tensor::cat(&outs, 0)?;
        let ys = if on_input { ys } else { ys.broadcast_mul(&w)? };
        let routed = Tensor::zeros((n, d), x.dtype(), dev)?
            .index_add(&tokens_t, &ys, 0)?
            .reshape((b, s, d))?;
        match &self.shared {
            None => Ok(routed),
            Some(shared) => {
                let y = shared.forward(x, act, None)?;
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
