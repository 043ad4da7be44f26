//! bitsandbytes' optimizer state (`--optimizer adamw-8bit | paged-adamw | paged-adamw-8bit`),
//! tensor by tensor, as `bitsandbytes.optim.optimizer.Optimizer2State.init_state` allocates it:
//! - 32-bit (`PagedAdamW`, and any tensor under `min_8bit_size` = 4,096 elements): `state1`
//!   and `state2` in f32 whatever the parameter's dtype, 8 B an element;
//! - 8-bit (`AdamW8bit`, `PagedAdamW8bit`, block-wise): `state1` and `state2` in uint8 and an f32
//!   `absmax1` and `absmax2` per 256 elements (ceil(n/256) each), 2 + 8/256 B an element; the
//!   two 256-entry f32 quantization maps (`qmap1`, `qmap2`: 2 KiB) are shared by every tensor.
//!
//! Paged optimizers (`is_paged=True`) allocate the same buffers in CUDA unified memory
//! (`get_paged`): counted on the GPU, where they live until the driver evicts pages to the host
//! under memory pressure. The step is one fused kernel a tensor (`optimizer_update_32bit`,
//! `optimizer_update_8bit_blockwise`), in place: no transient.
use super::{Optimizer, Overflow};
use crate::checked::Checked;
use crate::model::Config;
use crate::vocab::{LoraTargets, Trainable};

/// bitsandbytes' `min_8bit_size`: smaller tensors keep 32-bit state.
pub const MIN_8BIT_SIZE: u64 = 4096;
/// The 8-bit state's block: one f32 absmax per 256 elements and moment.
pub const BLOCK: u64 = 256;
/// The two shared 256-entry f32 quantization maps of an 8-bit optimizer.
pub const QMAPS: u64 = 2 * 256 * 4;

/// The state bytes of one tensor of `n` elements.
pub fn tensor_state(n: u64, eight_bit: bool) -> u64 {
    if eight_bit && n >= MIN_8BIT_SIZE {
        2 * n + 2 * n.div_ceil(BLOCK) * 4
    } else {
        2 * n * 4
    }
}

/// The elements of each tensor that trainable set `set` updates: the unfrozen weights of `c`,
/// and each LoRA target's A (r, in) and B (out, r).
pub fn updated_tensors(c: &Config, set: Trainable, targets: LoraTargets) -> Vec<u64> {
    let shapes = c.tensor_shapes();
    let mut out: Vec<u64> = shapes
        .iter()
        .filter(|(n, _)| !crate::model::is_frozen(c, set, n))
        .map(|(_, s)| s.iter().map(|&d| d as u64).product())
        .collect();
    if let Some(r) = set.lora_rank() {
        for (n, s) in &shapes {
            if let Some((_, i, o)) = crate::model::lora_target_in(c, n, s, targets) {
                out.extend([u64::from(r) * i as u64, o as u64 * u64::from(r)]);
            }
        }
    }
    out
}

/// The whole state of a bitsandbytes optimizer over `set` of `c` (unsharded), or None for
/// any other optimizer (its state is bytes per parameter: `train::model_states`).
pub fn bitsandbytes_state(
    c: &Config,
    set: Trainable,
    targets: LoraTargets,
    o: Optimizer,
) -> Result<Option<u64>, Overflow> {
    if !o.is_bitsandbytes() {
        return Ok(None);
    }
    let tensors = updated_tensors(c, set, targets);
    let state: Checked = tensors
        .iter()
        .map(|&n| Checked::from(tensor_state(n, o.is_8bit())))
        .sum();
    let maps = if o.is_8bit() && tensors.iter().any(|&n| n >= MIN_8BIT_SIZE) {
        QMAPS
    } else {
        0
    };
    (state + maps).bytes("optimizer state").map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: a 4,096 × 4,096 matrix in 8 bits is 2 B an element and 2 · 65,536 f32 block
    /// maxima; a 4,095-element vector stays 32-bit (8 B an element); 32-bit everywhere is 8 B.
    #[test]
    fn eight_bit_state_by_hand() {
        let n = 4096 * 4096;
        assert_eq!(tensor_state(n, true), 2 * n + 2 * (n / 256) * 4);
        assert_eq!(tensor_state(4095, true), 4095 * 8);
        assert_eq!(tensor_state(4096, true), 2 * 4096 + 2 * 16 * 4);
        assert_eq!(tensor_state(257, false), 257 * 8);
        assert_eq!(tensor_state(4097, true), 2 * 4097 + 2 * 17 * 4);
    }
}
