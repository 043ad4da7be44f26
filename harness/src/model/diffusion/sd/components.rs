//! SD's UNet and VAE as candle-transformers builds them (the generation path), and every
//! component's parameters counted from its config alone.
use super::clip::{clip_params, ClipText};
use super::config::{AdditionEmbed, DownBlock, SdConfig, UNetConfig, UpBlock, VaeConfig};
use crate::model::diffusion::params::{conv_params, linear_params};
use crate::model::diffusion::record;
use crate::vocab::Component;
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::{unet_2d, vae};

/// The UNet's stored tensors: candle's UNet, plus SDXL's `add_embedding` that it lacks.
pub(super) fn unet_shapes(c: &UNetConfig) -> Vec<(String, Vec<usize>)> {
    let mut v = record(|vb| {
        build_unet(c, vb, None)?;
        Ok(())
    });
    if let (Some(AdditionEmbed::TextTime), Some(input)) = (
        c.addition_embed_type,
        c.projection_class_embeddings_input_dim,
    ) {
        let t = 4 * c.block_out_channels[0];
        v.push(("add_embedding.linear_1.weight".into(), vec![t, input]));
        v.push(("add_embedding.linear_1.bias".into(), vec![t]));
        v.push(("add_embedding.linear_2.weight".into(), vec![t, t]));
        v.push(("add_embedding.linear_2.bias".into(), vec![t]));
    }
    v
}

/// candle's UNet config of a diffusers one. `sliced`: candle's sliced attention size.
fn unet_candle_config(
    c: &UNetConfig,
    sliced: Option<usize>,
) -> unet_2d::UNet2DConditionModelConfig {
    let blocks = c
        .block_out_channels
        .iter()
        .enumerate()
        .map(|(i, &out_channels)| unet_2d::BlockConfig {
            out_channels,
            use_cross_attn: (c.down_block_types[i] == DownBlock::CrossAttnDownBlock2D)
                .then(|| c.transformer_layers_per_block.at(i)),
            attention_head_dim: c.attention_head_dim.at(i),
        })
        .collect();
    unet_2d::UNet2DConditionModelConfig {
        center_input_sample: false,
        flip_sin_to_cos: true,
        freq_shift: 0.,
        blocks,
        layers_per_block: c.layers_per_block,
        downsample_padding: 1,
        mid_block_scale_factor: 1.,
        norm_num_groups: c.norm_num_groups,
        norm_eps: c.norm_eps,
        cross_attention_dim: c.cross_attention_dim,
        sliced_attention_size: sliced,
        use_linear_projection: c.use_linear_projection,
    }
}

/// candle-transformers' UNet over `vb` (generation's; the trainable [`super::SdUnet`] is checked
/// against it). `sliced`: candle's sliced attention size.
pub fn build_unet(
    c: &UNetConfig,
    vb: VarBuilder,
    sliced: Option<usize>,
) -> candle_core::Result<unet_2d::UNet2DConditionModel> {
    unet_2d::UNet2DConditionModel::new(
        vb,
        c.in_channels,
        c.out_channels,
        false,
        unet_candle_config(c, sliced),
    )
}

/// candle's AutoencoderKL (diffusers' tensor names), with or without the 1×1 `quant_conv` and
/// `post_quant_conv` (SD has both; FLUX's VAE neither).
pub fn build_vae(
    c: &VaeConfig,
    quant_conv: bool,
    post_quant_conv: bool,
    vb: VarBuilder,
) -> candle_core::Result<vae::AutoEncoderKL> {
    let cfg = vae::AutoEncoderKLConfig {
        block_out_channels: c.block_out_channels.clone(),
        layers_per_block: c.layers_per_block,
        latent_channels: c.latent_channels,
        norm_num_groups: c.norm_num_groups,
        use_quant_conv: quant_conv,
        use_post_quant_conv: post_quant_conv,
    };
    vae::AutoEncoderKL::new(vb, c.in_channels, c.out_channels, cfg)
}

/// Parameters of a component counted from its config alone, following diffusers' module
/// structure (independent of the module construction [`SdConfig::shapes`] records).
pub fn params_analytic(cfg: &SdConfig, c: Component) -> u64 {
    match c {
        Component::Unet => unet_params(&cfg.unet),
        Component::Vae => vae_params(&cfg.vae, true, true),
        Component::TextEncoder => clip_params(&cfg.text_encoder),
        Component::TextEncoder2 => cfg.text_encoder_2.as_ref().map_or(0, clip_params),
        _ => 0,
    }
}

/// A ResNet block (GroupNorm, conv3×3, [time projection], GroupNorm, conv3×3, [1×1 shortcut]).
fn resnet(i: u64, o: u64, temb: Option<u64>) -> u64 {
    2 * i
        + conv_params(i, o, 3 * 3)
        + temb.map_or(0, |t| linear_params(t, o))
        + 2 * o
        + conv_params(o, o, 3 * 3)
        + if i != o { conv_params(i, o, 1) } else { 0 }
}
/// A Transformer2DModel: GroupNorm, proj_in, `layers` × (self-attention, cross-attention,
/// GEGLU feed-forward, three LayerNorms), proj_out (1×1 conv or linear: the same count).
fn transformer(ch: u64, layers: u64, cross: u64) -> u64 {
    let block = 3 * 2 * ch
        + 3 * ch * ch
        + linear_params(ch, ch)
        + ch * ch
        + 2 * cross * ch
        + linear_params(ch, ch)
        + linear_params(ch, 8 * ch)
        + linear_params(4 * ch, ch);
    2 * ch + linear_params(ch, ch) + layers * block + linear_params(ch, ch)
}

fn unet_params(c: &UNetConfig) -> u64 {
    let ch: Vec<u64> = c.block_out_channels.iter().map(|&x| x as u64).collect();
    let n = ch.len();
    let l = c.layers_per_block as u64;
    let t = 4 * ch[0];
    let x = c.cross_attention_dim as u64;
    let mut p = conv_params(c.in_channels as u64, ch[0], 3 * 3)
        + linear_params(ch[0], t)
        + linear_params(t, t);
    if let (Some(AdditionEmbed::TextTime), Some(input)) = (
        c.addition_embed_type,
        c.projection_class_embeddings_input_dim,
    ) {
        p += linear_params(input as u64, t) + linear_params(t, t);
    }
    for i in 0..n {
        let cross = c.down_block_types[i] == DownBlock::CrossAttnDownBlock2D;
        let tl = c.transformer_layers_per_block.at(i) as u64;
        let mut inp = if i == 0 { ch[0] } else { ch[i - 1] };
        for _ in 0..l {
            p += resnet(inp, ch[i], Some(t));
            if cross {
                p += transformer(ch[i], tl, x);
            }
            inp = ch[i];
        }
        if i + 1 < n {
            p += conv_params(ch[i], ch[i], 3 * 3);
        }
    }
    let last = ch[n - 1];
    let mid_layers = c.transformer_layers_per_block.at(n - 1) as u64;
    p += 2 * resnet(last, last, Some(t)) + transformer(last, mid_layers, x);
    let mut prev = last;
    for (u, kind) in c.up_block_types.iter().enumerate() {
        let r = n - 1 - u;
        let out = ch[r];
        let inp = if r == 0 { ch[0] } else { ch[r - 1] };
        let tl = c.transformer_layers_per_block.at(r) as u64;
        for j in 0..=l {
            let skip = if j == l { inp } else { out };
            let res_in = if j == 0 { prev } else { out };
            p += resnet(res_in + skip, out, Some(t));
            if *kind == UpBlock::CrossAttnUpBlock2D {
                p += transformer(out, tl, x);
            }
        }
        if u + 1 < n {
            p += conv_params(out, out, 3 * 3);
        }
        prev = out;
    }
    p + 2 * ch[0] + conv_params(ch[0], c.out_channels as u64, 3 * 3)
}

/// An AutoencoderKL's parameters from its config (with or without the 1×1 quant convs).
pub fn vae_params(c: &VaeConfig, quant_conv: bool, post_quant_conv: bool) -> u64 {
    let ch: Vec<u64> = c.block_out_channels.iter().map(|&x| x as u64).collect();
    let n = ch.len();
    let l = c.layers_per_block as u64;
    let lat = c.latent_channels as u64;
    let last = ch[n - 1];
    // The mid block: two ResNets around one single-head self-attention (GroupNorm, q, k, v, out).
    let mid = 2 * resnet(last, last, None) + 2 * last + 4 * linear_params(last, last);
    let mut enc = conv_params(c.in_channels as u64, ch[0], 3 * 3);
    let mut inp = ch[0];
    for (i, &c) in ch.iter().enumerate() {
        for _ in 0..l {
            enc += resnet(inp, c, None);
            inp = c;
        }
        if i + 1 < n {
            enc += conv_params(c, c, 3 * 3);
        }
    }
    enc += mid + 2 * last + conv_params(last, 2 * lat, 3 * 3);
    let quant = if quant_conv {
        conv_params(2 * lat, 2 * lat, 1)
    } else {
        0
    } + if post_quant_conv {
        conv_params(lat, lat, 1)
    } else {
        0
    };
    let mut dec = conv_params(lat, last, 3 * 3) + mid;
    let mut prev = last;
    for u in 0..n {
        let out = ch[n - 1 - u];
        for _ in 0..=l {
            dec += resnet(prev, out, None);
            prev = out;
        }
        if u + 1 < n {
            dec += conv_params(out, out, 3 * 3);
        }
    }
    dec += 2 * ch[0] + conv_params(ch[0], c.out_channels as u64, 3 * 3);
    enc + quant + dec
}

/// The components' stored tensors, built here from the configs (`config.rs` holds the configs
/// alone, so that it depends on no builder).
impl SdConfig {
    /// Stored tensors of a component, with their diffusers names and shapes, in load order.
    pub fn shapes(&self, c: Component) -> Vec<(String, Vec<usize>)> {
        match c {
            Component::Unet => unet_shapes(&self.unet),
            Component::Vae => record(|vb| {
                build_vae(&self.vae, true, true, vb)?;
                Ok(())
            }),
            Component::TextEncoder => record(|vb| {
                ClipText::new(&self.text_encoder, vb)?;
                Ok(())
            }),
            Component::TextEncoder2 => match &self.text_encoder_2 {
                Some(cfg) => record(|vb| {
                    ClipText::new(cfg, vb)?;
                    Ok(())
                }),
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// Parameters of a component, from the stored shapes.
    pub fn params(&self, c: Component) -> u64 {
        crate::model::diffusion::count(&self.shapes(c))
    }
}
