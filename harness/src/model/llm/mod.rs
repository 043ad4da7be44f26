//! The language-model architectures, one file each, every one registered in
//! [`REGISTRY`](super::arch::REGISTRY): its `config.json` and how it normalizes into
//! [`Config`](super::Config), its tensor shapes, the HF-json export, its LoRA targets, and its
//! trainable and inference models.
pub mod bert;
pub mod gpt2;
pub mod gpt_bigcode;
pub mod llama;
pub mod mistral;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
