//! What vLLM loads where it differs from the checkpoint: its MXFP4 mixture-of-experts kernels
//! pad the experts' hidden and intermediate sizes to their tiles, so gpt-oss takes more
//! memory in vLLM than its checkpoint holds (the first part of the serving estimate in vLLM's
//! terms, issue 43).
//!
//! vLLM 0.33 picks the kernel by the GPU's compute capability
//! (`vllm/model_executor/layers/fused_moe/oracle/mxfp4.py`, `_get_priority_backends_for_gpt_oss`
//! and `mxfp4_round_up_hidden_size_and_intermediate_size`):
//! - sm100 (B200, GB200): FlashInfer's TRT-LLM kernel; hidden to a multiple of 256,
//!   intermediate to 128;
//! - sm90 and sm12x (H100, H200, RTX 5090): the OpenAI Triton kernels (`matmul_ogs`);
//!   intermediate to 64, hidden as it is;
//! - older (A100, L40S, RTX 4090; no FP4 in hardware): Marlin, weight-only FP4; hidden to
//!   256, intermediate to 128.
//!
//! The padded experts keep the checkpoint's form: E2M1 values (half a byte each) and one E8M0
//! scale per 32, and their biases in the dense dtype. On gpt-oss-20b (hidden and intermediate
//! 2,880) Marlin's padding (3,072 and 2,944) adds 0.92 GB; vLLM on an A100 reports "Model
//! loading took 13.72 GiB" for it (myoceane.fr, April 2026), and this gives 13.67 GiB.
use crate::model::config::MoeNaming;
use crate::model::quant::{Format, Plan};
use crate::model::Config;

/// vLLM's MXFP4 MoE kernel on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mxfp4Kernel {
    /// Weight-only FP4 through Marlin (no FP4 in hardware: sm80, sm86, sm89).
    Marlin,
    /// The OpenAI Triton kernels (sm90, sm12x).
    Triton,
    /// FlashInfer's TRT-LLM kernel (sm100, sm103).
    TrtLlm,
}

impl Mxfp4Kernel {
    /// The kernel vLLM 0.33 picks for gpt-oss on a GPU of compute capability `cc`.
    pub fn for_capability(cc: (u32, u32)) -> Self {
        match cc.0 {
            10 => Mxfp4Kernel::TrtLlm,
            9 | 12 => Mxfp4Kernel::Triton,
            _ => Mxfp4Kernel::Marlin,
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mxfp4Kernel::Marlin => "Marlin",
            Mxfp4Kernel::Triton => "Triton (matmul_ogs)",
            Mxfp4Kernel::TrtLlm => "FlashInfer TRT-LLM",
        }
    }

    /// (hidden, intermediate) padded to its tiles.
    pub fn pad(self, hidden: u64, intermediate: u64) -> (u64, u64) {
        let up = |v: u64, m: u64| v.div_ceil(m) * m;
        match self {
            Mxfp4Kernel::Marlin | Mxfp4Kernel::TrtLlm => (up(hidden, 256), up(intermediate, 128)),
            Mxfp4Kernel::Triton => (hidden, up(intermediate, 64)),
        }
    }
}

/// The weights vLLM holds for an MXFP4 checkpoint of stacked experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VllmMxfp4 {
    pub kernel: Mxfp4Kernel,
    /// The padded hidden and intermediate sizes.
    pub hidden: u64,
    pub intermediate: u64,
    /// Every weight vLLM holds: the dense tensors as the checkpoint keeps them, the experts
    /// padded.
    pub bytes: u64,
}

/// vLLM's weights for `cfg` loaded as `plan` (an MXFP4 checkpoint of gpt-oss's stacked experts,
/// whose biases `plan` holds at `dense` bytes an element) on a GPU of compute capability `cc`;
/// None for another format or layout.
pub fn mxfp4_weights(cfg: &Config, plan: &Plan, dense: u64, cc: (u32, u32)) -> Option<VllmMxfp4> {
    let m = cfg.moe.as_ref().filter(|m| m.naming == MoeNaming::GptOss)?;
    if plan.format != Format::Mxfp4 {
        return None;
    }
    let kernel = Mxfp4Kernel::for_capability(cc);
    let (d, f) = (cfg.hidden_size as u64, m.expert_size as u64);
    let (h, i) = kernel.pad(d, f);
    // Per expert: gate_up (2i × h) and down (h × i) at 4.25 bits a value; their biases.
    let packed = |h: u64, i: u64| 3 * i * h / 2 + 3 * i * h / 32;
    let biases = |h: u64, i: u64| (2 * i + h) * dense;
    let sparse = (0..cfg.num_layers).filter(|&l| m.is_sparse(l)).count() as u64;
    let experts = sparse * m.experts as u64;
    let grown = experts * (packed(h, i) + biases(h, i) - packed(d, f) - biases(d, f));
    Some(VllmMxfp4 {
        kernel,
        hidden: h,
        intermediate: i,
        bytes: plan.bytes() + grown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::test_support::preset;
    use crate::model::quant::Checkpoint;

    /// gpt-oss-20b on each kernel, from the checkpoint's exact bytes and the padding by hand.
    #[test]
    fn gpt_oss_20b_padded_by_hand() {
        let c = preset("presets/gpt-oss-20b");
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../../presets/gpt-oss-20b/config.json")).unwrap();
        let k = Checkpoint::from_config_json(std::path::Path::new("c.json"), &v)
            .unwrap()
            .unwrap();
        let plan = k.plan(&c, 2).unwrap();
        // 24 layers × 32 experts; per expert gate_up 2I × H and down H × I at 17/32 B a
        // value, biases (2I + H) × 2 B.
        let per = |h: u64, i: u64| 3 * i * h * 17 / 32 + (2 * i + h) * 2;
        let base = plan.bytes() - 768 * per(2880, 2880);
        let marlin = mxfp4_weights(&c, &plan, 2, (8, 0)).unwrap();
        assert_eq!((marlin.hidden, marlin.intermediate), (3072, 2944));
        assert_eq!(marlin.bytes, base + 768 * per(3072, 2944));
        let hopper = mxfp4_weights(&c, &plan, 2, (9, 0)).unwrap();
        assert_eq!(
            (hopper.kernel, hopper.bytes),
            (Mxfp4Kernel::Triton, plan.bytes())
        );
        let blackwell = mxfp4_weights(&c, &plan, 2, (10, 0)).unwrap();
        assert_eq!(blackwell.bytes, marlin.bytes);
        assert!(mxfp4_weights(&preset("presets/mixtral-8x7b"), &plan, 2, (8, 0)).is_none());
    }
}
