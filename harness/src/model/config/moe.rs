//! The mixture-of-experts part of a [`Config`](super::Config): the experts, their routing and
//! their checkpoint names.
use crate::checked::Checked;

/// A sparse mixture-of-experts MLP: a router (`experts` × hidden, no bias) picks `top_k` of
/// `experts` gated MLPs for each token; a shared expert, where there is one, sees every token.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    /// Routed experts a MoE layer holds (`num_local_experts`, `num_experts`).
    pub experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each routed expert's intermediate size (`moe_intermediate_size`; Mixtral's experts are
    /// `intermediate_size` wide).
    pub expert_size: usize,
    /// The shared expert's intermediate size; 0: none (Qwen2-MoE's
    /// `shared_expert_intermediate_size`).
    pub shared_size: usize,
    /// A sigmoid gate (1 × hidden) on the shared expert's output (Qwen2-MoE).
    pub shared_gate: bool,
    /// The top-k routing weights renormalized to sum to 1 (Mixtral always; Qwen's
    /// `norm_topk_prob`).
    pub norm_topk: bool,
    /// Layers whose MLP is dense (`intermediate_size` wide) instead, ascending (Qwen's
    /// `mlp_only_layers` and `decoder_sparse_step`).
    pub dense_layers: Vec<usize>,
    /// How the checkpoint names the tensors.
    pub naming: MoeNaming,
    /// How the router's logits become the top-k weights.
    pub routing: Routing,
    /// gpt-oss's clamped GLU in the experts: (alpha, limit), with biases on the router and on
    /// every expert's projections. None: SiLU gating, no biases.
    pub clamped_glu: Option<(f64, f64)>,
}

/// How a router turns its logits into the top-k experts and their weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over every expert (in f32), then the top k (renormalized with `norm_topk`):
    /// Mixtral, Qwen.
    SoftmaxTopK,
    /// The top k logits, then a softmax over those k: gpt-oss.
    TopKSoftmax,
    /// DeepSeek-V3's: sigmoid scores plus a learned correction bias choose the top k within
    /// the best expert groups; the weights are the plain scores, renormalized and scaled.
    SigmoidGrouped,
    /// Llama 4's: the top k logits, each through a sigmoid, scale the expert's input (not its
    /// output).
    SigmoidTopKInput,
}

/// The tensor names of a MoE layer, as the published checkpoints store them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeNaming {
    /// Mixtral: `block_sparse_moe.gate`, `block_sparse_moe.experts.N.{w1,w3,w2}` (gate, up, down).
    Mixtral,
    /// Qwen: `mlp.gate`, `mlp.experts.N.{gate,up,down}_proj`, `mlp.shared_expert.*`,
    /// `mlp.shared_expert_gate`.
    Qwen,
    /// gpt-oss (transformers' names of the dequantized model): `mlp.router` with a bias, and
    /// every expert in one tensor each: `mlp.experts.gate_up_proj` (E, hidden, 2·f; gate and
    /// up interleaved), `mlp.experts.down_proj` (E, f, hidden), and their biases.
    GptOss,
    /// DeepSeek: `mlp.gate`, `mlp.experts.N.{gate,up,down}_proj`, and the shared experts as
    /// one MLP, `mlp.shared_experts.*` (no gate).
    DeepSeek,
    /// Llama 4: `feed_forward.router`, every expert in two stacked tensors,
    /// `feed_forward.experts.gate_up_proj` (E, hidden, 2·f; gate then up) and
    /// `feed_forward.experts.down_proj` (E, f, hidden), and `feed_forward.shared_expert.*`.
    Llama4,
}

impl Moe {
    /// Whether layer `i`'s MLP is the sparse one.
    pub fn is_sparse(&self, i: usize) -> bool {
        self.dense_layers.binary_search(&i).is_err()
    }

    /// The module holding the router and the experts (`block_sparse_moe` or `mlp`).
    pub fn module(&self) -> &'static str {
        match self.naming {
            MoeNaming::Mixtral => "block_sparse_moe",
            MoeNaming::Qwen | MoeNaming::GptOss | MoeNaming::DeepSeek => "mlp",
            MoeNaming::Llama4 => "feed_forward",
        }
    }

    /// The shared expert's module under layer prefix `p`.
    pub fn shared_module(&self, p: &str) -> String {
        match self.naming {
            MoeNaming::DeepSeek => format!("{p}.mlp.shared_experts"),
            _ => format!("{p}.{}.shared_expert", self.module()),
        }
    }

    /// Whether transformers runs every expert on every token (Llama 4: the routed input is
    /// zero for the experts a token is not sent to): E rows a token instead of k.
    pub fn dense_dispatch(&self) -> bool {
        self.naming == MoeNaming::Llama4
    }

    /// Whether transformers' router hands the experts f32 weights (DeepSeek's, computed and
    /// scaled in f32), so the weighted outputs are f32; the others cast them to the
    /// activations' dtype.
    pub fn f32_routing_weights(&self) -> bool {
        self.naming == MoeNaming::DeepSeek
    }

    /// Whether the checkpoint stores every expert in one tensor per projection (gpt-oss,
    /// Llama 4) rather than one module per expert.
    pub fn stacked(&self) -> bool {
        matches!(self.naming, MoeNaming::GptOss | MoeNaming::Llama4)
    }

    /// Routed expert `j`'s (gate, up, down) weight names under layer prefix `p` (for the
    /// [`Moe::stacked`] namings, the names a per-expert checkpoint would use).
    pub fn expert_names(&self, p: &str, j: usize) -> [String; 3] {
        let m = self.module();
        match self.naming {
            MoeNaming::Mixtral => {
                ["w1", "w3", "w2"].map(|w| format!("{p}.{m}.experts.{j}.{w}.weight"))
            }
            MoeNaming::Qwen | MoeNaming::GptOss | MoeNaming::DeepSeek | MoeNaming::Llama4 => {
                ["gate_proj", "up_proj", "down_proj"]
                    .map(|w| format!("{p}.{m}.experts.{j}.{w}.weight"))
            }
        }
    }

    /// The MoE keys' bounds: at least one expert, `num_experts_per_tok` between 1 and the
    /// number of experts, sizes far from overflow, dense layers inside the model.
    pub(super) fn validate(&self, layers: usize) -> Result<(), String> {
        for (key, v, max) in [
            ("the number of experts", self.experts, 1usize << 16),
            ("moe_intermediate_size", self.expert_size, 1 << 22),
            (
                "the shared expert's intermediate size",
                self.shared_size,
                1 << 22,
            ),
        ] {
            if v > max {
                return Err(format!("{key} = {v} is implausibly large (at most {max})"));
            }
        }
        if self.experts == 0 || self.expert_size == 0 {
            return Err("a mixture of experts needs at least one expert of positive size".into());
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return Err(format!(
                "num_experts_per_tok = {} must be between 1 and the number of experts ({})",
                self.top_k, self.experts
            ));
        }
        if let Some(&i) = self.dense_layers.iter().find(|&&i| i >= layers) {
            return Err(format!(
                "dense (mlp_only) layer {i} is outside the model's {layers} layers"
            ));
        }
        Ok(())
    }

    /// Parameters of one routed expert: gate, up and down, each hidden × expert_size, and
    /// gpt-oss's biases (2 · expert_size + hidden).
    pub fn expert_params(&self, hidden: usize) -> Checked {
        let biases = match self.clamped_glu {
            Some(_) => Checked::new(2) * self.expert_size + hidden,
            None => Checked::ZERO,
        };
        Checked::new(3) * hidden * self.expert_size + biases
    }
}
