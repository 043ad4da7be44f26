//! What the training workload needs from a model: an embedding, a stack of layers that can be
//! run (and re-run, for checkpointing) one at a time, and a head with its loss.
use super::Config;
use candle_core::{Result, Tensor};

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
