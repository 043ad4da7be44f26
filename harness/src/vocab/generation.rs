//! Generation (image and video pipelines): the resolution, the VAE decode, the pipeline's
//! components and the models vramlab knows the configs of.
use serde::{Deserialize, Serialize};

/// An image size in pixels, written `WxH` (`512x512`): the `resolution` axis and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Resolution {
    pub width: usize,
    pub height: usize,
}

impl Resolution {
    pub fn pixels(&self) -> usize {
        self.width * self.height
    }
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

impl std::str::FromStr for Resolution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("resolution `{s}` must be WIDTHxHEIGHT in pixels, e.g. 512x512");
        let (w, h) = s.split_once('x').ok_or_else(bad)?;
        let (width, height) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
        if width == 0 || height == 0 {
            return Err(bad());
        }
        Ok(Resolution { width, height })
    }
}

serde_as_text!(Resolution);

vocab! {
    /// How a generation point decodes its latents (docs/src/guides/generation.md).
    #[derive(Default, clap::ValueEnum)]
    case = "lowercase";
    pub enum VaeDecode {
        /// The whole batch at once.
        #[default]
        Full,
        /// One image of the batch at a time.
        Sliced,
        /// Overlapping spatial tiles, one at a time, blended into the output.
        Tiled,
    }
}

vocab! {
    /// A component of a generation pipeline: diffusers' directory names.
    case = "snake_case";
    pub enum Component {
        TextEncoder,
        #[serde(rename = "text_encoder_2")]
        #[strum(serialize = "text_encoder_2")]
        TextEncoder2,
        Unet,
        /// A DiT denoiser (FLUX, Wan).
        Transformer,
        Vae,
    }
}

vocab! {
    /// The generation models vramlab knows the published configs of (`synthetic:NAME`,
    /// `estimate --model`).
    #[derive(clap::ValueEnum)]
    case = "lowercase";
    pub enum GenModel {
        /// runwayml/stable-diffusion-v1-5
        Sd15,
        /// stabilityai/stable-diffusion-2-1
        Sd21,
        /// stabilityai/stable-diffusion-xl-base-1.0
        Sdxl,
        /// black-forest-labs/FLUX.1-dev (guidance-distilled DiT)
        #[serde(rename = "flux-dev")]
        #[strum(serialize = "flux-dev")]
        #[value(name = "flux-dev")]
        FluxDev,
        /// black-forest-labs/FLUX.1-schnell (timestep-distilled: no guidance embedding)
        #[serde(rename = "flux-schnell")]
        #[strum(serialize = "flux-schnell")]
        #[value(name = "flux-schnell")]
        FluxSchnell,
        /// Wan-AI/Wan2.1-T2V-1.3B-Diffusers (text to video)
        #[serde(rename = "wan2.1-t2v-1.3b")]
        #[strum(serialize = "wan2.1-t2v-1.3b")]
        #[value(name = "wan2.1-t2v-1.3b")]
        Wan21T2v13b,
    }
}

impl GenModel {
    /// Whether `mode = "train"` fine-tunes its denoiser with LoRA (Wan2.1's DiT, SD 1.5/2.1's
    /// UNet; not FLUX's transformer nor SDXL's UNet).
    pub fn trains(self) -> bool {
        matches!(
            self,
            GenModel::Wan21T2v13b | GenModel::Sd15 | GenModel::Sd21
        )
    }
}
