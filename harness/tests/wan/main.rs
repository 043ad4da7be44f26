//! Wan2.1 T2V: the causal conv3d from conv2d against a naive f64 loop, the chunked
//! VAE decode against a two-chunk decode, the decoder's peak over frames with the CPU counting
//! allocator, `vramlab estimate --model wan2.1-t2v-1.3b`, and the generation pipeline
//! (`WanPipeline`) on a tiny config written as a synthetic diffusers directory: load rows,
//! equal denoising steps, CFG's second transformer call, the decode's output and its peak over
//! frames, the 16-bit text encoder and transformer, and `vramlab sweep` with `frames`; the DiT's
//! flash attention against its eager attention (values, and the scores missing from the peak);
//! LoRA training of the DiT (adapter count, gradients, AdamW state, steps, through the binary on
//! a tiny diffusers directory). Every expected figure is derived from the configs or measured
//! here.
//!
//! The counter is process-global: this binary has no libtest harness (`harness = false`),
//! `main` runs each check in turn on the main thread.
#[path = "../common/mod.rs"]
mod common;
use common::{random, Lab};

use candle_core::{DType, Device, Tensor};
use vramlab::meter::cpu::CpuMeter;
use vramlab::model::diffusion::wan::{
    self, CausalConv3d, FeatCache, UmT5Encoder, Wan, WanConfig, WanDecoder, WanDit,
    WanTransformerConfig, WanVaeConfig,
};
use vramlab::model::diffusion::{self, count, record, Pipeline, Shapes};
use vramlab::record::Phase;
use vramlab::vocab::{
    Attention, Checkpointing, Component, GenModel, Optimizer, Resolution, VaeDecode,
};
use vramlab::workload::generate::{self, GenShape};

fn main() {
    // One compute thread: every peak is reproducible.
    std::env::set_var("RAYON_NUM_THREADS", "1");
    conv3d_reference();
    decoder_params();
    let c = common::tiny_vae();
    let dec = WanDecoder::new(&c, random(&decoder_shapes(&c))).unwrap();
    chunked_decode(&dec, &c);
    decode_peak_flat(&dec, &c);
    dit();
    dit_flash();
    dit_lora();
    lora_sweep_cli();
    umt5();
    estimate_cli();
    pipeline_counts();
    let mut l = load_tiny(DType::F32);
    load_rows(&l);
    // Warm-up: candle's gemm keeps per-thread buffers; the first run carries them.
    generate::run(
        l.p.as_ref(),
        &gshape(48, 9, 2, true, VaeDecode::Full),
        &Device::Cpu,
        &mut l.meter,
    )
    .unwrap();
    steps_and_output(&mut l);
    decode_flat_in_pipeline(&mut l);
    tiled_in_pipeline(&mut l);
    cfg_on_off(&mut l);
    cli_sweep(&l);
    sixteen_bit();
    println!("wan: all checks passed");
}

mod dit;
mod pipeline;
mod vae;
use dit::*;
use pipeline::*;
use vae::*;
