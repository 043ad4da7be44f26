//! Reading a diffusers `transformer/` through the names of BFL's reference checkpoint, which
//! candle's FLUX model reads: [`diffusers_names`] maps one name, [`DiffusersNames`] serves a
//! whole `VarBuilder`.
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

/// The diffusers tensors (FluxTransformer2DModel's names) that hold BFL's tensor `bfl`, in the
/// order they concatenate along the first axis, and whether the result's two halves swap
/// (`norm_out` is (scale, shift) where BFL's `final_layer.adaLN_modulation.1` is (shift,
/// scale)). None: not a FLUX transformer tensor. The inverse of diffusers'
/// `scripts/convert_flux_to_diffusers.py`, with the guidance embedder its single-file loader
/// adds (`guidance_in` → `time_text_embed.guidance_embedder`).
pub fn diffusers_names(bfl: &str) -> Option<(Vec<String>, bool)> {
    let (stem, leaf) = bfl.rsplit_once('.')?;
    let leaf = if leaf == "scale" { "weight" } else { leaf };
    let names = |v: &[&str], prefix: &str| {
        Some((
            v.iter().map(|n| format!("{prefix}{n}.{leaf}")).collect(),
            false,
        ))
    };
    let path: Vec<&str> = stem.split('.').collect();
    match path.as_slice() {
        ["img_in"] => names(&["x_embedder"], ""),
        ["txt_in"] => names(&["context_embedder"], ""),
        [e @ ("time_in" | "guidance_in" | "vector_in"), l @ ("in_layer" | "out_layer")] => {
            let e = match *e {
                "time_in" => "timestep_embedder",
                "guidance_in" => "guidance_embedder",
                _ => "text_embedder",
            };
            let l = if *l == "in_layer" {
                "linear_1"
            } else {
                "linear_2"
            };
            names(&[l], &format!("time_text_embed.{e}."))
        }
        ["double_blocks", i, rest @ ..] => {
            let b = format!("transformer_blocks.{i}.");
            let n = match rest {
                ["img_attn", "qkv"] => return names(&["attn.to_q", "attn.to_k", "attn.to_v"], &b),
                ["txt_attn", "qkv"] => {
                    let qkv = ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"];
                    return names(&qkv, &b);
                }
                ["img_mod", "lin"] => "norm1.linear",
                ["txt_mod", "lin"] => "norm1_context.linear",
                ["img_attn", "norm", "query_norm"] => "attn.norm_q",
                ["img_attn", "norm", "key_norm"] => "attn.norm_k",
                ["txt_attn", "norm", "query_norm"] => "attn.norm_added_q",
                ["txt_attn", "norm", "key_norm"] => "attn.norm_added_k",
                ["img_attn", "proj"] => "attn.to_out.0",
                ["txt_attn", "proj"] => "attn.to_add_out",
                ["img_mlp", "0"] => "ff.net.0.proj",
                ["img_mlp", "2"] => "ff.net.2",
                ["txt_mlp", "0"] => "ff_context.net.0.proj",
                ["txt_mlp", "2"] => "ff_context.net.2",
                _ => return None,
            };
            names(&[n], &b)
        }
        ["single_blocks", i, rest @ ..] => {
            let b = format!("single_transformer_blocks.{i}.");
            let n = match rest {
                ["linear1"] => {
                    return names(&["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"], &b)
                }
                ["linear2"] => "proj_out",
                ["norm", "query_norm"] => "attn.norm_q",
                ["norm", "key_norm"] => "attn.norm_k",
                ["modulation", "lin"] => "norm.linear",
                _ => return None,
            };
            names(&[n], &b)
        }
        ["final_layer", "linear"] => names(&["proj_out"], ""),
        ["final_layer", "adaLN_modulation", "1"] => {
            Some((vec![format!("norm_out.linear.{leaf}")], true))
        }
        _ => None,
    }
}

/// A [`SimpleBackend`](candle_nn::var_builder::SimpleBackend) that serves BFL's tensor names
/// from a diffusers-layout FLUX transformer (the `VarBuilder` over its files): each requested
/// tensor is read under its diffusers names ([`diffusers_names`]) and concatenated.
pub struct DiffusersNames(pub VarBuilder<'static>);

impl candle_nn::var_builder::SimpleBackend for DiffusersNames {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        _: &Device,
    ) -> candle_core::Result<Tensor> {
        let Some((parts, swap)) = diffusers_names(name) else {
            candle_core::bail!("`{name}` is not a FLUX transformer tensor")
        };
        let ts = parts
            .iter()
            .map(|p| self.0.get_unchecked_dtype(p, dtype))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let t = match ts.len() {
            1 => ts.into_iter().next().expect("one part"),
            _ => Tensor::cat(&ts, 0)?,
        };
        let t = if swap {
            let n = t.dim(0)? / 2;
            Tensor::cat(&[t.narrow(0, n, n)?, t.narrow(0, 0, n)?], 0)?
        } else {
            t
        };
        if t.dims() != s.dims() {
            candle_core::bail!(
                "`{}` has shape {:?}, expected {:?} for `{name}`",
                parts.join(" + "),
                t.dims(),
                s.dims()
            )
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("`{name}` requested without a shape")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        diffusers_names(name).is_some_and(|(p, _)| p.iter().all(|n| self.0.contains_tensor(n)))
    }
}
