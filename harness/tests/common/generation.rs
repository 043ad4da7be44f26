//! Shared helpers of the generation tests: tiny SD and Wan configs, synthetic diffusers
//! directories loaded under a counting meter, and the checks their phases share.
#![allow(dead_code)]
use super::*;

use vramlab::model::diffusion::sd::{
    ClipAct, ClipArch, ClipConfig, DownBlock, PerBlock, SdConfig, UNetConfig, UpBlock, VaeConfig,
};

/// A two-block UNet, a four-block VAE (the SD factor of 8) and a two-layer CLIP.
pub fn tiny_sd() -> SdConfig {
    SdConfig {
        name: "tiny".into(),
        unet: UNetConfig {
            in_channels: 4,
            out_channels: 4,
            block_out_channels: vec![32, 64],
            layers_per_block: 1,
            down_block_types: vec![DownBlock::CrossAttnDownBlock2D, DownBlock::DownBlock2D],
            up_block_types: vec![UpBlock::UpBlock2D, UpBlock::CrossAttnUpBlock2D],
            cross_attention_dim: 32,
            attention_head_dim: PerBlock::One(2),
            transformer_layers_per_block: PerBlock::One(1),
            use_linear_projection: false,
            norm_num_groups: 32,
            norm_eps: 1e-5,
            addition_embed_type: None,
            projection_class_embeddings_input_dim: None,
            sample_size: 8,
        },
        vae: VaeConfig {
            in_channels: 3,
            out_channels: 3,
            latent_channels: 4,
            block_out_channels: vec![32, 32, 32, 32],
            layers_per_block: 1,
            norm_num_groups: 32,
            force_upcast: true,
            scaling_factor: 0.18215,
            sample_size: 64,
        },
        text_encoder: ClipConfig {
            architectures: vec![ClipArch::CLIPTextModel],
            vocab_size: 100,
            hidden_size: 32,
            intermediate_size: 64,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            max_position_embeddings: 77,
            hidden_act: ClipAct::QuickGelu,
            layer_norm_eps: 1e-5,
            projection_dim: 32,
        },
        text_encoder_2: None,
    }
}

/// The tiny SD pipeline in f32 with synthetic weights in a temporary diffusers directory,
/// loaded under a fresh counting meter: the load rows per component, and the meter to measure
/// the phases with.
pub struct TinySd {
    pub sd: vramlab::model::diffusion::sd::Sd,
    pub loads: Vec<(vramlab::vocab::Component, vramlab::meter::PhaseMemory, f64)>,
    pub meter: vramlab::meter::cpu::CpuMeter,
    pub dir: tempfile::TempDir,
}

pub fn load_tiny_sd() -> TinySd {
    use candle_core::{DType, Device};
    use vramlab::workload::generate;
    let dir = tempfile::tempdir().unwrap();
    let mut sd = vramlab::model::diffusion::sd::Sd::new(tiny_sd(), DType::F32, DType::F32);
    generate::write_synthetic(&sd, dir.path()).unwrap();
    let mut meter = vramlab::meter::cpu::CpuMeter::new();
    let loads = generate::load(
        &mut sd,
        dir.path(),
        vramlab::vocab::Attention::Eager,
        &Device::Cpu,
        &mut meter,
    )
    .unwrap();
    TinySd {
        sd,
        loads,
        meter,
        dir,
    }
}

/// A generation pipeline written as a synthetic diffusers directory, read back through the real
/// loader (`pipeline::from_dir`: `model_index.json` → the family) in `dtype`, and loaded under a
/// fresh counting meter: the load rows per component, and the meter to measure the phases with.
pub struct Lab {
    pub p: Box<dyn vramlab::model::diffusion::Pipeline>,
    pub loads: Vec<(vramlab::vocab::Component, vramlab::meter::PhaseMemory, f64)>,
    pub meter: vramlab::meter::cpu::CpuMeter,
    pub dir: tempfile::TempDir,
}

/// [`Lab`] of `written` (a pipeline whose VAE is f32), which must read back as `architecture`.
pub fn load_lab(
    written: &dyn vramlab::model::diffusion::Pipeline,
    dtype: candle_core::DType,
    architecture: &str,
) -> Lab {
    use candle_core::{DType, Device};
    use vramlab::model::diffusion;
    use vramlab::vocab::Component;
    use vramlab::workload::generate;
    let dir = tempfile::tempdir().unwrap();
    generate::write_synthetic(written, dir.path()).unwrap();
    let mut p = diffusion::from_dir(dir.path(), dtype, None).unwrap();
    assert_eq!(p.architecture(), architecture);
    assert_eq!(p.dtype(Component::Vae), DType::F32);
    let mut meter = vramlab::meter::cpu::CpuMeter::new();
    let loads = generate::load(
        p.as_mut(),
        dir.path(),
        vramlab::vocab::Attention::Eager,
        &Device::Cpu,
        &mut meter,
    )
    .unwrap();
    Lab {
        p,
        loads,
        meter,
        dir,
    }
}

impl Lab {
    /// `vramlab sweep` on a scenario over this lab's diffusers directory: `mode = ["generate"]`,
    /// f32, batch 1, then `sweep`'s own lines (from line 9 on). The
    /// scenario and its output `o.csv` live in `tmp`.
    pub fn sweep_cli(&self, tmp: &std::path::Path, sweep: &str) -> std::process::Output {
        let scenario = tmp.join("s.toml");
        std::fs::write(
            &scenario,
            format!(
                "name = \"lab\"\ndevice = \"cpu\"\n[model]\nsource = \"diffusers:{}\"\n[sweep]\n\
                 mode = [\"generate\"]\nprecision = [\"f32\"]\nbatch = [1]\n{sweep}",
                self.dir.path().display()
            ),
        )
        .unwrap();
        let out = tmp.join("o.csv");
        vramlab()
            .args(["sweep", "--out"])
            .arg(&out)
            .arg(&scenario)
            .output()
            .unwrap()
    }
}

/// Runs generation point `g` on the CPU meter and checks that its two denoising steps have the
/// same peak (±0.1 %); returns the point's phases.
pub fn equal_steps(
    p: &dyn vramlab::model::diffusion::Pipeline,
    g: &vramlab::workload::generate::GenShape,
    meter: &mut vramlab::meter::cpu::CpuMeter,
) -> vramlab::workload::generate::Measured {
    let m = vramlab::workload::generate::run(p, g, &candle_core::Device::Cpu, meter).unwrap();
    let (a, c) = (act(&m.denoise[0].0), act(&m.denoise[1].0));
    assert!((a - c).abs() / a <= 0.001, "steps differ: {a} vs {c}");
    m
}

/// The decode's output tensor, exact to the byte, for each of `shapes`: b·3·H·W·4, and the
/// phase leaves live exactly what a fresh (b, 3, H, W) f32 tensor holds (measured here: the
/// data bytes plus candle's tensor header, a few hundred bytes).
pub fn decode_output_exact(
    p: &dyn vramlab::model::diffusion::Pipeline,
    meter: &mut vramlab::meter::cpu::CpuMeter,
    shapes: &[vramlab::workload::generate::GenShape],
) {
    use candle_core::{DType, Device, Tensor};
    for g in shapes {
        let (w, h, b, d) = (
            g.resolution.width,
            g.resolution.height,
            g.batch,
            g.vae_decode,
        );
        let m = vramlab::workload::generate::run(p, g, &Device::Cpu, meter).unwrap();
        let want = (b * 3 * w * h * 4) as u64;
        assert_eq!(m.output_bytes, want, "{w}x{h} b{b} {d}");
        let (t, fresh, _) = vramlab::meter::measure(meter, || {
            Ok(Tensor::zeros((b, 3, h, w), DType::F32, &Device::Cpu)?)
        })
        .unwrap();
        drop(t);
        let fresh = fresh.end_allocated - fresh.baseline_allocated;
        assert!(fresh >= want && fresh - want < 1024, "{fresh} vs {want}");
        let kept = m.vae_decode.0.end_allocated - m.vae_decode.0.baseline_allocated;
        assert_eq!(
            kept, fresh,
            "{w}x{h} b{b} {d}: the phase keeps exactly the output"
        );
    }
    println!("decode output exact: ok");
}

/// A component's load row keeps its `weights` bytes plus the modules' own structs: under 512 B
/// per stored tensor (candle's `Tensor` and storage headers, the layer vectors).
pub fn load_keeps(
    c: vramlab::vocab::Component,
    m: &vramlab::meter::PhaseMemory,
    weights: u64,
    tensors: u64,
) {
    let kept = m.end_allocated - m.baseline_allocated;
    assert!(
        kept >= weights && kept - weights <= 512 * tensors,
        "{c}: load kept {kept} B for {weights} B of weights in {tensors} tensors"
    );
    println!("load {c}: weights {weights} B, kept {kept} B");
}

/// A Wan2.1-shaped VAE (4 levels, temporal upsampling in the first two up blocks: stride
/// 4 × 8 × 8), narrow.
pub fn tiny_vae() -> vramlab::model::diffusion::wan::WanVaeConfig {
    vramlab::model::diffusion::wan::WanVaeConfig {
        base_dim: 8,
        z_dim: 4,
        dim_mult: vec![1, 2, 4, 4],
        num_res_blocks: 1,
        attn_scales: vec![],
        temperal_downsample: vec![false, true, true],
        latents_mean: vec![],
        latents_std: vec![],
    }
}

/// A Wan2.1-shaped pipeline, narrow: the tiny VAE (4 latent channels, with latents
/// statistics), a two-block DiT of 2 heads × 12 over 4 channels, a two-layer umT5 of width 16.
pub fn tiny_wan() -> vramlab::model::diffusion::wan::WanConfig {
    let mut c = vramlab::model::diffusion::wan::WanConfig::t2v_1_3b();
    c.name = "tiny-wan".into();
    let t = &mut c.transformer;
    (t.num_attention_heads, t.attention_head_dim, t.ffn_dim) = (2, 12, 40);
    (t.num_layers, t.text_dim, t.freq_dim) = (2, 16, 8);
    (t.in_channels, t.out_channels) = (4, 4);
    c.vae = vramlab::model::diffusion::wan::WanVaeConfig {
        latents_mean: vec![0.1, -0.2, 0.3, -0.4],
        latents_std: vec![1.5, 2.0, 0.5, 1.0],
        ..tiny_vae()
    };
    let e = &mut c.text_encoder;
    (e.d_model, e.d_ff, e.d_kv, e.num_heads) = (16, 24, 4, 4);
    (e.num_layers, e.vocab_size) = (2, 50);
    c
}

/// Random tensors of `shapes` (norm gammas around 1).
pub fn random(shapes: &vramlab::model::diffusion::Shapes) -> candle_nn::VarBuilder<'static> {
    let dev = candle_core::Device::Cpu;
    let map: std::collections::HashMap<String, candle_core::Tensor> = shapes
        .iter()
        .map(|(n, s)| {
            let mean = if n.ends_with("gamma") { 1.0 } else { 0.0 };
            let std = if n.ends_with("gamma") { 0.1 } else { 0.2 };
            (
                n.clone(),
                candle_core::Tensor::randn(mean, std, s.as_slice(), &dev).unwrap(),
            )
        })
        .collect();
    candle_nn::VarBuilder::from_tensors(map, candle_core::DType::F32, &dev)
}
