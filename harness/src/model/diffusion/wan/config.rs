//! Wan2.1's configs (serde mirrors of the diffusers files), the parameter counts from the
//! configs alone, and what the estimator reads of the architecture (temporal factor, the
//! decoder's feature cache).
use crate::model::diffusion::params::{conv_params, linear_params};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// diffusers' `qk_norm` of a Wan transformer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    /// An RMSNorm over all heads' features (a weight of `heads × head_dim`) on q and on k.
    RmsNormAcrossHeads,
}

/// diffusers' `transformer/config.json` (WanTransformer3DModel).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WanTransformerConfig {
    pub patch_size: [usize; 3],
    pub num_attention_heads: usize,
    pub attention_head_dim: usize,
    pub in_channels: usize,
    pub out_channels: usize,
    pub text_dim: usize,
    pub freq_dim: usize,
    pub ffn_dim: usize,
    pub num_layers: usize,
    pub cross_attn_norm: bool,
    pub qk_norm: Option<QkNorm>,
    pub eps: f64,
    /// Image-to-video checkpoints only (CLIP image context); vramlab models T2V.
    #[serde(default)]
    pub image_dim: Option<usize>,
    #[serde(default)]
    pub added_kv_proj_dim: Option<usize>,
    #[serde(default = "rope_len")]
    pub rope_max_seq_len: usize,
}

fn rope_len() -> usize {
    1024
}

impl WanTransformerConfig {
    /// The hidden size (`heads × head_dim`).
    pub fn dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }
}

/// diffusers' `vae/config.json` (AutoencoderKLWan, Wan2.1's: not residual, no patchify).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WanVaeConfig {
    pub base_dim: usize,
    pub z_dim: usize,
    pub dim_mult: Vec<usize>,
    pub num_res_blocks: usize,
    #[serde(default)]
    pub attn_scales: Vec<f64>,
    pub temperal_downsample: Vec<bool>,
    #[serde(default)]
    pub latents_mean: Vec<f64>,
    #[serde(default)]
    pub latents_std: Vec<f64>,
}

/// transformers' `feed_forward_proj` of a T5.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FeedForwardProj {
    /// `wi_0` (GELU) × `wi_1`, then `wo`.
    #[serde(rename = "gated-gelu")]
    GatedGelu,
    /// `wi` (ReLU), then `wo`.
    #[serde(rename = "relu")]
    Relu,
}

/// transformers' `text_encoder/config.json` (UMT5EncoderModel): only the encoder is stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UmT5Config {
    pub d_model: usize,
    pub d_ff: usize,
    pub d_kv: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub vocab_size: usize,
    pub relative_attention_num_buckets: usize,
    pub relative_attention_max_distance: usize,
    pub feed_forward_proj: FeedForwardProj,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

/// The three configs of a Wan2.1 T2V pipeline.
#[derive(Clone, Debug, PartialEq)]
pub struct WanConfig {
    pub name: String,
    pub transformer: WanTransformerConfig,
    pub vae: WanVaeConfig,
    pub text_encoder: UmT5Config,
}

/// Text tokens per prompt: WanPipeline's `max_sequence_length` (the prompt embeddings are
/// padded to it).
pub const TEXT_LEN: usize = 512;

/// Frames a causal convolution keeps between chunks (diffusers' `CACHE_T`, the Wan repo's
/// `CACHE_T`): its temporal kernel (3) minus one.
pub const CACHE_FRAMES: usize = 2;

impl WanConfig {
    /// The published configs of Wan-AI/Wan2.1-T2V-1.3B-Diffusers (`transformer/`, `vae/`,
    /// `text_encoder/config.json`).
    pub fn t2v_1_3b() -> WanConfig {
        WanConfig {
            name: "wan2.1-t2v-1.3b".into(),
            transformer: WanTransformerConfig {
                patch_size: [1, 2, 2],
                num_attention_heads: 12,
                attention_head_dim: 128,
                in_channels: 16,
                out_channels: 16,
                text_dim: 4096,
                freq_dim: 256,
                ffn_dim: 8960,
                num_layers: 30,
                cross_attn_norm: true,
                qk_norm: Some(QkNorm::RmsNormAcrossHeads),
                eps: 1e-6,
                image_dim: None,
                added_kv_proj_dim: None,
                rope_max_seq_len: 1024,
            },
            vae: WanVaeConfig {
                base_dim: 96,
                z_dim: 16,
                dim_mult: vec![1, 2, 4, 4],
                num_res_blocks: 2,
                attn_scales: vec![],
                temperal_downsample: vec![false, true, true],
                latents_mean: vec![
                    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134,
                    -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
                ],
                latents_std: vec![
                    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526,
                    2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916,
                ],
            },
            text_encoder: UmT5Config {
                d_model: 4096,
                d_ff: 10240,
                d_kv: 64,
                num_heads: 64,
                num_layers: 24,
                vocab_size: 256384,
                relative_attention_num_buckets: 32,
                relative_attention_max_distance: 128,
                feed_forward_proj: FeedForwardProj::GatedGelu,
                tie_word_embeddings: false,
            },
        }
    }

    /// Reads a diffusers directory's three configs; an image-to-video transformer is refused
    /// (one line naming the file and key).
    pub fn from_dir(dir: &Path) -> anyhow::Result<WanConfig> {
        use crate::model::diffusion::read_json as read;
        let t = dir.join("transformer/config.json");
        let transformer: WanTransformerConfig = read(&t)?;
        if transformer.image_dim.is_some() || transformer.added_kv_proj_dim.is_some() {
            return Err(crate::error::bad_file(
                &t,
                "`image_dim`/`added_kv_proj_dim`: image-to-video Wan is not modelled (text-to-video only)",
            ));
        }
        Ok(WanConfig {
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "diffusers".into()),
            transformer,
            vae: read(&dir.join("vae/config.json"))?,
            text_encoder: read(&dir.join("text_encoder/config.json"))?,
        })
    }
}

/// The transformer's parameters as stored (diffusers' checkpoint keeps the output
/// `scale_shift_table` of 2 × dim; newer diffusers turns it into `norm_out.linear` on load).
pub fn transformer_params(c: &WanTransformerConfig) -> u64 {
    let d = c.dim() as u64;
    let patch = c.patch_size.iter().product::<usize>() as u64;
    let patch_embedding = conv_params(c.in_channels as u64, d, patch);
    // time_embedder (freq → d → d), time_proj (d → 6d), text_embedder (text → d → d).
    let condition = linear_params(c.freq_dim as u64, d)
        + linear_params(d, d)
        + linear_params(d, 6 * d)
        + linear_params(c.text_dim as u64, d)
        + linear_params(d, d);
    let qk_norm = match c.qk_norm {
        Some(QkNorm::RmsNormAcrossHeads) => 2 * d,
        None => 0,
    };
    let attention = 4 * linear_params(d, d) + qk_norm;
    let ffn = c.ffn_dim as u64;
    let block = 2 * attention
        + if c.cross_attn_norm { 2 * d } else { 0 }
        + linear_params(d, ffn)
        + linear_params(ffn, d)
        + 6 * d;
    let out = linear_params(d, c.out_channels as u64 * patch) + 2 * d;
    patch_embedding + condition + c.num_layers as u64 * block + out
}

impl WanVaeConfig {
    /// Output pixels per latent pixel along each side.
    pub fn spatial_factor(&self) -> usize {
        1 << (self.dim_mult.len() - 1)
    }

    /// Output frames per latent frame after the first (4 for Wan2.1).
    pub fn temporal_factor(&self) -> usize {
        1 << self.temperal_downsample.iter().filter(|t| **t).count()
    }

    /// The decoder's temporal upsampling per up block (the encoder's downsampling reversed).
    pub fn temporal_upsample(&self) -> Vec<bool> {
        self.temperal_downsample.iter().rev().copied().collect()
    }

    /// The decoder's channels: the mid block's, then each up block's output.
    pub fn decoder_dims(&self) -> Vec<usize> {
        let last = *self.dim_mult.last().expect("dim_mult is not empty");
        std::iter::once(last)
            .chain(self.dim_mult.iter().rev().copied())
            .map(|m| self.base_dim * m)
            .collect()
    }

    /// Up block `i`'s input channels: Wan2.1's upsamplers halve the channels, so every block
    /// after the first reads half the previous block's output.
    pub fn up_in(&self, i: usize) -> usize {
        let d = self.decoder_dims();
        if i == 0 {
            d[0]
        } else {
            d[i] / 2
        }
    }

    /// Elements of the decoder's feature cache per latent pixel of one video, once full
    /// (from the second chunk on): every causal convolution with a temporal kernel of 3 keeps
    /// the last [`CACHE_FRAMES`] frames of its input, at its level's resolution.
    pub fn decoder_cache_per_latent_pixel(&self) -> u64 {
        let d = self.decoder_dims();
        let n = self.dim_mult.len();
        let up = self.temporal_upsample();
        let frames = CACHE_FRAMES as u64;
        // conv_in, then the mid block's two residual blocks (two convolutions each).
        let mut sum = frames * (self.z_dim + 4 * d[0]) as u64;
        for i in 0..n {
            let area = 1u64 << (2 * i);
            let (cin, cout) = (self.up_in(i), d[i + 1]);
            let mut convs = cin + cout;
            convs += self.num_res_blocks * 2 * cout;
            if i + 1 < n && up[i] {
                convs += cout;
            }
            sum += frames * area * convs as u64;
        }
        sum + frames * (1u64 << (2 * (n - 1))) * d[n] as u64
    }
}

/// The residual block of the Wan VAE: two RMS norms (a gamma each), two 3×3×3 causal
/// convolutions and a 1×1×1 shortcut where the width changes.
fn vae_res(i: u64, o: u64) -> u64 {
    i + o
        + conv_params(i, o, 3 * 3 * 3)
        + conv_params(o, o, 3 * 3 * 3)
        + if i != o { conv_params(i, o, 1) } else { 0 }
}

/// The mid block: residual, single-head attention (norm, 1×1 qkv and projection), residual.
fn vae_mid(d: u64) -> u64 {
    2 * vae_res(d, d) + d + conv_params(d, 3 * d, 1) + conv_params(d, d, 1)
}

/// The VAE decoder's parameters (with `post_quant_conv`).
pub fn vae_decoder_params(c: &WanVaeConfig) -> u64 {
    let d: Vec<u64> = c.decoder_dims().iter().map(|&x| x as u64).collect();
    let n = c.dim_mult.len();
    let up = c.temporal_upsample();
    let z = c.z_dim as u64;
    let mut p = conv_params(z, z, 1) + conv_params(z, d[0], 3 * 3 * 3) + vae_mid(d[0]);
    for i in 0..n {
        let mut cin = c.up_in(i) as u64;
        for _ in 0..=c.num_res_blocks {
            p += vae_res(cin, d[i + 1]);
            cin = d[i + 1];
        }
        if i + 1 < n {
            // A 3×3 conv to half the channels after a nearest ×2; upsample3d adds a (3, 1, 1)
            // causal conv doubling the channels (the two new frames).
            p += conv_params(cin, cin / 2, 3 * 3);
            if up[i] {
                p += conv_params(cin, 2 * cin, 3);
            }
        }
    }
    p + d[n] + conv_params(d[n], 3, 3 * 3 * 3)
}

/// The VAE encoder's parameters (with `quant_conv`): loaded with the VAE, unused by T2V.
pub fn vae_encoder_params(c: &WanVaeConfig) -> u64 {
    let dims: Vec<u64> = std::iter::once(1)
        .chain(c.dim_mult.iter().copied())
        .map(|m| (c.base_dim * m) as u64)
        .collect();
    let n = c.dim_mult.len();
    let mut p = conv_params(3, dims[0], 3 * 3 * 3);
    for i in 0..n {
        let mut cin = dims[i];
        for _ in 0..c.num_res_blocks {
            p += vae_res(cin, dims[i + 1]);
            cin = dims[i + 1];
        }
        if i + 1 < n {
            p += conv_params(cin, cin, 3 * 3);
            if c.temperal_downsample[i] {
                p += conv_params(cin, cin, 3);
            }
        }
    }
    let z2 = 2 * c.z_dim as u64;
    p + vae_mid(dims[n]) + dims[n] + conv_params(dims[n], z2, 3 * 3 * 3) + conv_params(z2, z2, 1)
}

/// The whole AutoencoderKLWan (encoder and decoder: the checkpoint loads both).
pub fn vae_params(c: &WanVaeConfig) -> u64 {
    vae_encoder_params(c) + vae_decoder_params(c)
}

/// umT5's encoder: the token embedding, per layer a relative-attention bias (umT5 has one in
/// every layer, T5 only in the first), q/k/v/o without bias, two RMS norms and the (gated)
/// feed-forward, and the final norm.
pub fn umt5_params(c: &UmT5Config) -> u64 {
    let (d, inner) = (c.d_model as u64, (c.num_heads * c.d_kv) as u64);
    let ff = c.d_ff as u64;
    let wi = match c.feed_forward_proj {
        FeedForwardProj::GatedGelu => 2,
        FeedForwardProj::Relu => 1,
    };
    let layer = 2 * d
        + 4 * d * inner
        + (c.relative_attention_num_buckets * c.num_heads) as u64
        + (wi + 1) * d * ff;
    c.vocab_size as u64 * d + c.num_layers as u64 * layer + d
}

impl WanConfig {
    /// The components in load order.
    pub fn components(&self) -> Vec<crate::vocab::Component> {
        use crate::vocab::Component;
        vec![
            Component::TextEncoder,
            Component::Transformer,
            Component::Vae,
        ]
    }

    /// A component's parameters from its config alone.
    pub fn params_analytic(&self, c: crate::vocab::Component) -> u64 {
        use crate::vocab::Component;
        match c {
            Component::TextEncoder => umt5_params(&self.text_encoder),
            Component::Transformer => transformer_params(&self.transformer),
            Component::Vae => vae_params(&self.vae),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counts of the real checkpoints (Wan-AI/Wan2.1-T2V-1.3B-Diffusers: the tensors of
    /// `transformer/diffusion_pytorch_model.safetensors`, `vae/diffusion_pytorch_model.safetensors`
    /// and `text_encoder/model-*.safetensors`, summed), against the counts from the configs.
    #[test]
    fn published_counts() {
        let c = WanConfig::t2v_1_3b();
        assert_eq!(transformer_params(&c.transformer), 1_418_996_800);
        assert_eq!(vae_params(&c.vae), 126_892_531);
        assert_eq!(umt5_params(&c.text_encoder), 5_680_910_336);
        assert_eq!(c.vae.spatial_factor(), 8);
        assert_eq!(c.vae.temporal_factor(), 4);
    }
}
