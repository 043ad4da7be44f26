//! The vision towers multimodal checkpoints store beside their text decoder (Llama 4's ViT,
//! Gemma 3's SigLIP), with the projector into the text model. vramlab counts them as stored
//! weights (in the tensor list, so in the weights row and every quantization of it) and never
//! runs them: a text query's activations and KV cache are the decoder's alone. Shapes are
//! transformers' (`Llama4VisionModel`, `SiglipVisionModel`), checked against the parameter
//! counts transformers builds from the same configs (tests/architectures.rs).
use crate::error::bad_file;
use crate::model::arch::parse_json;
use anyhow::Result;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// A vision tower with its projector into the text model, as the checkpoint stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct Vision {
    pub kind: VisionKind,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub num_channels: usize,
    /// Llama 4's pixel-shuffle adapter and projector: (projector_input_dim,
    /// projector_output_dim, vision_output_dim); zeros for SigLIP.
    pub projector: (usize, usize, usize),
}

/// The vision towers vramlab counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionKind {
    /// Llama 4's ViT (`llama4_vision_model`): a class token, learned positions, a linear patch
    /// embedding, pre and post LayerNorms, biased attention and GELU MLP layers, then a
    /// pixel-shuffle MLP adapter and a linear projector to the text width.
    Llama4,
    /// SigLIP (`siglip_vision_model`, Gemma 3): a convolutional patch embedding with a bias,
    /// learned positions, biased layers and a post LayerNorm; the projector is one matrix and
    /// an RMSNorm.
    Siglip,
}

impl VisionKind {
    /// The `model_type` of its `vision_config`.
    pub fn model_type(self) -> &'static str {
        match self {
            VisionKind::Llama4 => "llama4_vision_model",
            VisionKind::Siglip => "siglip_vision_model",
        }
    }
}

/// The keys of a `vision_config`.
#[derive(Deserialize)]
struct VisionJson {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    image_size: usize,
    patch_size: usize,
    num_channels: Option<usize>,
    projector_input_dim: Option<usize>,
    projector_output_dim: Option<usize>,
    vision_output_dim: Option<usize>,
    multi_modal_projector_bias: Option<bool>,
    vision_use_head: Option<bool>,
}

impl Vision {
    /// The tower `config.json`'s `vision_config` describes (`path` for errors), of `kind`.
    pub fn from_json(path: &Path, kind: VisionKind, v: &Value) -> Result<Vision> {
        let j: VisionJson = parse_json(path, v)?;
        let unsupported = |what: &str| {
            bad_file(
                path,
                format!(
                    "vision_config: {what} is not counted (vramlab counts transformers' defaults)"
                ),
            )
        };
        if j.vision_use_head == Some(true) {
            return Err(unsupported("SigLIP's pooling head (`vision_use_head`)"));
        }
        if j.multi_modal_projector_bias == Some(true) {
            return Err(unsupported("a projector bias"));
        }
        let projector = match kind {
            VisionKind::Llama4 => {
                let need = |v: Option<usize>, key: &str| {
                    v.ok_or_else(|| bad_file(path, format!("vision_config: missing key `{key}`")))
                };
                (
                    need(j.projector_input_dim, "projector_input_dim")?,
                    need(j.projector_output_dim, "projector_output_dim")?,
                    need(j.vision_output_dim, "vision_output_dim")?,
                )
            }
            VisionKind::Siglip => (0, 0, 0),
        };
        Ok(Vision {
            kind,
            hidden_size: j.hidden_size,
            intermediate_size: j.intermediate_size,
            num_layers: j.num_hidden_layers,
            image_size: j.image_size,
            patch_size: j.patch_size,
            num_channels: j.num_channels.unwrap_or(3),
            projector,
        })
    }

    /// The `vision_config` it was read from (the keys vramlab reads).
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::json!({
            "model_type": self.kind.model_type(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "image_size": self.image_size,
            "patch_size": self.patch_size,
            "num_channels": self.num_channels,
        });
        match self.kind {
            VisionKind::Llama4 => {
                let (i, o, out) = self.projector;
                v["projector_input_dim"] = i.into();
                v["projector_output_dim"] = o.into();
                v["vision_output_dim"] = out.into();
            }
            VisionKind::Siglip => v["vision_use_head"] = false.into(),
        }
        v
    }

    /// Sizes far from overflow, and a patch that tiles the image.
    pub fn validate(&self) -> Result<(), String> {
        let (i, o, out) = self.projector;
        for (key, v, max) in [
            ("vision hidden_size", self.hidden_size, 1usize << 16),
            ("vision intermediate_size", self.intermediate_size, 1 << 18),
            ("vision num_hidden_layers", self.num_layers, 1 << 10),
            ("vision image_size", self.image_size, 1 << 14),
            ("vision num_channels", self.num_channels, 1 << 4),
            ("projector_input_dim", i, 1 << 18),
            ("projector_output_dim", o, 1 << 18),
            ("vision_output_dim", out, 1 << 18),
        ] {
            if v > max {
                return Err(format!("{key} = {v} is implausibly large (at most {max})"));
            }
        }
        if self.patch_size == 0 || self.patch_size > self.image_size {
            return Err(format!(
                "vision patch_size = {} must be between 1 and image_size ({})",
                self.patch_size, self.image_size
            ));
        }
        Ok(())
    }

    /// Every tensor of the tower and its projector into a text model of width `text`, with
    /// the checkpoint's names, in load order.
    pub fn shapes(&self, text: usize) -> Vec<(String, Vec<usize>)> {
        let (d, f, c, p) = (
            self.hidden_size,
            self.intermediate_size,
            self.num_channels,
            self.patch_size,
        );
        let patches = (self.image_size / p) * (self.image_size / p);
        let mut out = Vec::new();
        let mut push = |name: String, shape: Vec<usize>| out.push((name, shape));
        // (prefix of a layer, its attention's output projection, its two norms)
        let (root, layer, o_proj, norms) = match self.kind {
            VisionKind::Llama4 => {
                let r = "vision_model";
                push(format!("{r}.class_embedding"), vec![d]);
                push(
                    format!("{r}.positional_embedding_vlm"),
                    vec![patches + 1, d],
                );
                push(
                    format!("{r}.patch_embedding.linear.weight"),
                    vec![d, c * p * p],
                );
                for n in ["layernorm_pre", "layernorm_post"] {
                    push(format!("{r}.{n}.weight"), vec![d]);
                    push(format!("{r}.{n}.bias"), vec![d]);
                }
                (
                    r,
                    "model.layers",
                    "o_proj",
                    ["input_layernorm", "post_attention_layernorm"],
                )
            }
            VisionKind::Siglip => {
                let r = "vision_tower.vision_model";
                push(
                    format!("{r}.embeddings.patch_embedding.weight"),
                    vec![d, c, p, p],
                );
                push(format!("{r}.embeddings.patch_embedding.bias"), vec![d]);
                push(
                    format!("{r}.embeddings.position_embedding.weight"),
                    vec![patches, d],
                );
                (
                    r,
                    "encoder.layers",
                    "out_proj",
                    ["layer_norm1", "layer_norm2"],
                )
            }
        };
        for i in 0..self.num_layers {
            let q = format!("{root}.{layer}.{i}");
            for proj in ["q_proj", "k_proj", "v_proj", o_proj] {
                push(format!("{q}.self_attn.{proj}.weight"), vec![d, d]);
                push(format!("{q}.self_attn.{proj}.bias"), vec![d]);
            }
            push(format!("{q}.mlp.fc1.weight"), vec![f, d]);
            push(format!("{q}.mlp.fc1.bias"), vec![f]);
            push(format!("{q}.mlp.fc2.weight"), vec![d, f]);
            push(format!("{q}.mlp.fc2.bias"), vec![d]);
            for n in norms {
                push(format!("{q}.{n}.weight"), vec![d]);
                push(format!("{q}.{n}.bias"), vec![d]);
            }
        }
        match self.kind {
            VisionKind::Llama4 => {
                let (i, o, v) = self.projector;
                push(format!("{root}.vision_adapter.mlp.fc1.weight"), vec![i, f]);
                push(format!("{root}.vision_adapter.mlp.fc2.weight"), vec![o, o]);
                push(
                    "multi_modal_projector.linear_1.weight".into(),
                    vec![text, v],
                );
            }
            VisionKind::Siglip => {
                push(format!("{root}.post_layernorm.weight"), vec![d]);
                push(format!("{root}.post_layernorm.bias"), vec![d]);
                let m = "multi_modal_projector";
                push(format!("{m}.mm_input_projection_weight"), vec![d, text]);
                push(format!("{m}.mm_soft_emb_norm.weight"), vec![d]);
            }
        }
        out
    }
}

/// The parts of a multimodal `config.json` (`text_config` and `vision_config` under the
/// outer model type, as Llama 4's and Gemma 3's checkpoints write them): the text decoder's
/// keys, with the outer `tie_word_embeddings` where the text keys lack one and the
/// architecture's `defaults` for keys it omits (transformers' defaults), and the tower of
/// `kind`. A text-only config is its own text part, with no tower.
pub fn multimodal_parts(
    path: &Path,
    v: &Value,
    kind: VisionKind,
    defaults: &[(&str, Value)],
) -> Result<(Value, Option<Vision>)> {
    let (mut text, vision) = match v.get("text_config") {
        Some(t) if t.is_object() => {
            let vision = match v.get("vision_config") {
                Some(vc) => Some(Vision::from_json(path, kind, vc)?),
                None => None,
            };
            let mut text = t.clone();
            if let (None, Some(tie)) = (
                text.get("tie_word_embeddings"),
                v.get("tie_word_embeddings"),
            ) {
                text["tie_word_embeddings"] = tie.clone();
            }
            (text, vision)
        }
        Some(_) => return Err(bad_file(path, "text_config is not an object")),
        None => (v.clone(), None),
    };
    for (key, value) in defaults {
        if text.get(*key).is_none() {
            text[*key] = value.clone();
        }
    }
    Ok((text, vision))
}

/// A text decoder's `config.json` keys `text` nested as a multimodal config's (`outer` model
/// type, `class` its `architectures`) with tower `vision`; `text` alone without one.
pub fn nest_multimodal(text: Value, vision: Option<&Vision>, outer: &str, class: &str) -> Value {
    match vision {
        None => text,
        Some(vis) => serde_json::json!({
            "architectures": [class],
            "model_type": outer,
            "tie_word_embeddings": text["tie_word_embeddings"].clone(),
            "text_config": text,
            "vision_config": vis.to_json(),
        }),
    }
}
