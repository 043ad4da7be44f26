//! Building blocks shared by the model files, all from differentiable candle ops (no fused op
//! without a backward). Weights are cast to the activations' dtype at use, which is how the
//! `mixed-*` precision policies run 16-bit compute on f32 master weights: the backward of
//! `to_dtype` brings gradients back to the f32 variables.
use crate::vocab::{Attention, QMatmul};
use candle_core::{DType, Result, Tensor, D};

/// `w` in the dtype of `x` (a no-op when they match).
pub fn cast_like(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    if w.dtype() == x.dtype() {
        Ok(w.clone())
    } else {
        w.to_dtype(x.dtype())
    }
}

/// The tensor names of module `m`'s LoRA adapter, A then B (PEFT's, without its prefix).
pub fn lora_names(m: &str) -> [String; 2] {
    [format!("{m}.lora_A.weight"), format!("{m}.lora_B.weight")]
}

/// PEFT's default `lora_alpha`: the adapter's output is scaled by alpha / rank.
pub const LORA_ALPHA: f64 = 8.0;

/// A LoRA adapter on a dense layer: y += (alpha / r) · x Aᵀ Bᵀ, with A (r, in) and B (out, r)
/// (PEFT's layout, also for GPT-2's Conv1D).
pub struct Lora {
    pub a: Tensor,
    pub b: Tensor,
}

/// `x (m, k) · wᵀ` for a weight that takes no gradient (frozen: not a variable, no op), as a
/// custom op whose backward returns x's gradient only.
///
/// candle's own `Matmul` backward computes the gradient of *both* inputs, and a gradient
/// computed for a tensor that is not on the variables' side of the graph stays in the
/// GradStore until `backward` returns: under LoRA or frozen embeddings every frozen weight's
/// gradient would be materialized (zeros, then a sum) and held through the whole backward,
/// which PyTorch's autograd never does. The forward calls the backend's own matmul on the
/// same layouts `Tensor::matmul` would use, so it allocates exactly the same output.
/// `w` is (n, k), or (k, n) when `transposed` (GPT-2's Conv1D).
struct FrozenMatmul {
    transposed: bool,
}

impl FrozenMatmul {
    /// The right-hand side's layout (k, n) and (m, n, k).
    fn dims(
        &self,
        l1: &candle_core::Layout,
        l2: &candle_core::Layout,
    ) -> Result<(candle_core::Layout, (usize, usize, usize))> {
        let (m, k) = l1.shape().dims2()?;
        let rhs = if self.transposed {
            l2.clone()
        } else {
            l2.transpose(0, 1)?
        };
        let (k2, n) = rhs.shape().dims2()?;
        if k != k2 {
            candle_core::bail!("frozen-matmul: x has {k} features, the weight {k2}");
        }
        Ok((rhs, (m, n, k)))
    }
}

impl candle_core::CustomOp2 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "frozen-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &candle_core::CpuStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CpuStorage,
        l2: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use candle_core::backend::BackendStorage;
        let (rhs, (m, n, k)) = self.dims(l1, l2)?;
        Ok((s1.matmul(s2, (1, m, n, k), l1, &rhs)?, (m, n).into()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CudaStorage,
        l2: &candle_core::Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
        use candle_core::backend::BackendStorage;
        let (rhs, (m, n, k)) = self.dims(l1, l2)?;
        Ok((s1.matmul(s2, (1, m, n, k), l1, &rhs)?, (m, n).into()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // d(x·rhs)/dx = grad · rhsᵀ, with rhs = wᵀ (or w for Conv1D).
        let w = if self.transposed { w.t()? } else { w.clone() };
        Ok((Some(grad.matmul(&w)?), None))
    }
}

/// A convolution whose kernel takes no gradient (frozen, under LoRA): the output is computed
/// by candle's own `conv2d` on a detached input, then handed out by this op, whose backward
/// returns the input's gradient only (the transposed convolution candle's backward runs).
///
/// candle's `Conv2D` backward computes the kernel's gradient too, and, as for
/// [`FrozenMatmul`], one computed for a tensor that is not a variable stays in the GradStore
/// until `backward` returns: every frozen kernel of a UNet would be held as a gradient through
/// the backward. The cost here is one output-sized copy (a transient).
struct FrozenConv2d {
    kernel: Tensor,
    padding: usize,
    stride: usize,
    out: std::sync::Mutex<Option<Tensor>>,
}

impl FrozenConv2d {
    /// The precomputed output's storage (a copy) and shape.
    fn take<S>(
        &self,
        pick: impl Fn(&candle_core::Storage) -> Option<Result<S>>,
    ) -> Result<(S, candle_core::Shape)> {
        let y = self
            .out
            .lock()
            .map_err(|_| candle_core::Error::Msg("frozen-conv2d: poisoned".into()))?
            .take()
            .ok_or_else(|| candle_core::Error::Msg("frozen-conv2d: forward ran twice".into()))?;
        let (st, l) = y.storage_and_layout();
        if !l.is_contiguous() || l.start_offset() != 0 {
            candle_core::bail!("frozen-conv2d: a strided convolution output");
        }
        let s = pick(&st)
            .ok_or_else(|| candle_core::Error::Msg("frozen-conv2d: another device".into()))??;
        Ok((s, y.shape().clone()))
    }
}

impl candle_core::CustomOp1 for FrozenConv2d {
    fn name(&self) -> &'static str {
        "frozen-conv2d"
    }

    fn cpu_fwd(
        &self,
        _s: &candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use candle_core::backend::BackendStorage;
        self.take(|st| match st {
            candle_core::Storage::Cpu(s) => Some(s.try_clone(l)),
            _ => None,
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _s: &candle_core::CudaStorage,
        l: &candle_core::Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::Shape)> {
        use candle_core::backend::BackendStorage;
        self.take(|st| match st {
            candle_core::Storage::Cuda(s) => Some(s.try_clone(l)),
            _ => None,
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        // As candle's Conv2D backward (dilation 1), the input's part only.
        let (k_h, g_h) = (self.kernel.dim(2)?, grad.dim(2)?);
        let out_size = (g_h - 1) * self.stride + k_h - 2 * self.padding;
        let out_padding = x.dim(2)? - out_size;
        let k = cast_like(&self.kernel, grad)?;
        Ok(Some(grad.conv_transpose2d(
            &k,
            self.padding,
            out_padding,
            self.stride,
            1,
        )?))
    }
}

/// A 2D convolution with a bias (torch's `Conv2d`, groups 1, dilation 1); a frozen kernel
/// under training takes no gradient (see `FrozenConv2d`).
pub struct Conv2d {
    pub w: Tensor,
    pub b: Tensor,
    pub padding: usize,
    pub stride: usize,
}

impl Conv2d {
    /// A `k`×`k` convolution from `i` to `o` channels over `vb`'s `weight` and `bias`.
    pub fn new(
        i: usize,
        o: usize,
        k: usize,
        padding: usize,
        stride: usize,
        vb: candle_nn::VarBuilder,
    ) -> Result<Self> {
        Ok(Conv2d {
            w: vb.get((o, i, k, k), "weight")?,
            b: vb.get(o, "bias")?,
            padding,
            stride,
        })
    }

    /// x: (b, i, h, w) → (b, o, h', w').
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let w = cast_like(&self.w, x)?;
        let y = if x.track_op() && !w.track_op() {
            let out = x.detach().conv2d(&w, self.padding, self.stride, 1, 1)?;
            x.apply_op1(FrozenConv2d {
                kernel: w,
                padding: self.padding,
                stride: self.stride,
                out: std::sync::Mutex::new(Some(out)),
            })?
        } else {
            x.conv2d(&w, self.padding, self.stride, 1, 1)?
        };
        y.broadcast_add(&cast_like(&self.b, &y)?.reshape((1, (), 1, 1))?)
    }
}

/// A layer's weight: a dense tensor, or a quantized one (a GGUF point at a quantized
/// precision) multiplied through candle's `QMatMul` or, under [`QMatmul::Dequantize`],
/// dequantized for each product.
#[derive(Clone)]
pub enum Weight {
    Dense(Tensor),
    Quant(std::sync::Arc<candle_core::quantized::QTensor>, QMatmul),
}

/// `q` dequantized to `dtype` on its device (16-bit: through f32 on CPU, f16 directly on
/// CUDA).
fn dequantized(q: &candle_core::quantized::QTensor, dtype: DType) -> Result<Tensor> {
    let dev = q.device();
    match dtype {
        DType::F16 => q.dequantize_f16(&dev),
        DType::F32 => q.dequantize(&dev),
        _ => q.dequantize(&dev)?.to_dtype(dtype),
    }
}

/// HF-named quantized tensors (a quantized point's matrices and embedding).
pub type QTensors =
    std::collections::HashMap<String, std::sync::Arc<candle_core::quantized::QTensor>>;

/// A linear layer. `w` is (out, in) like torch's Linear, or (in, out) for GPT-2's Conv1D.
pub struct Linear {
    pub w: Weight,
    pub b: Option<Tensor>,
    pub transposed: bool,
    pub lora: Option<Lora>,
}

impl Linear {
    pub fn new(w: Tensor, b: Option<Tensor>) -> Self {
        Linear {
            w: Weight::Dense(w),
            b,
            transposed: false,
            lora: None,
        }
    }

    /// x: (b, s, in) → (b, s, out).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, s, i) = x.dims3()?;
        let x = x.reshape((b * s, i))?;
        let y = match &self.w {
            // candle's quantized matmul (inference only: it records no backward). It takes f32,
            // f16 or bf16 activations and returns their dtype.
            Weight::Quant(q, QMatmul::Auto) => candle_core::Module::forward(
                &candle_core::quantized::QMatMul::QTensor(q.clone()),
                &x,
            )?,
            // The dense weight lives for this product only (dropped at the end of the arm).
            Weight::Quant(q, QMatmul::Dequantize) => x.matmul(&dequantized(q, x.dtype())?.t()?)?,
            Weight::Dense(w) => {
                let w = cast_like(w, &x)?;
                if x.track_op() && !w.track_op() {
                    // A frozen weight under training: no gradient for it (see FrozenMatmul).
                    x.apply_op2(
                        &w,
                        FrozenMatmul {
                            transposed: self.transposed,
                        },
                    )?
                } else if self.transposed {
                    x.matmul(&w)?
                } else {
                    x.matmul(&w.t()?)?
                }
            }
        };
        let y = match &self.b {
            Some(bias) => y.broadcast_add(&cast_like(bias, &y)?)?,
            None => y,
        };
        let y = match &self.lora {
            Some(l) => {
                let scale = LORA_ALPHA / l.a.dim(0)? as f64;
                let down = x.matmul(&cast_like(&l.a, &x)?.t()?)?;
                (y + (down.matmul(&cast_like(&l.b, &x)?.t()?)? * scale)?)?
            }
            None => y,
        };
        y.reshape((b, s, ()))
    }
}

/// LayerNorm weight and bias (applied by [`layer_norm`]).
pub struct Norm {
    pub w: Tensor,
    pub b: Tensor,
}

impl Norm {
    pub fn forward(&self, x: &Tensor, eps: f64) -> Result<Tensor> {
        layer_norm(x, &self.w, &self.b, eps)
    }
}

/// The HF-named tensors a model constructor consumes, by name: dense ones, and (for a
/// quantized point) quantized ones with how their products run.
pub struct Named(
    pub std::collections::HashMap<String, Tensor>,
    pub QTensors,
    pub QMatmul,
);

impl Named {
    /// Dense tensors only.
    pub fn dense(t: std::collections::HashMap<String, Tensor>) -> Self {
        Named(t, QTensors::new(), QMatmul::Auto)
    }

    pub fn take(&mut self, name: &str) -> anyhow::Result<Tensor> {
        self.0
            .remove(name)
            .ok_or_else(|| anyhow::anyhow!("weights lack tensor `{name}`"))
    }

    /// A weight: quantized when the map holds it quantized, else dense.
    pub fn weight(&mut self, name: &str) -> anyhow::Result<Weight> {
        match self.1.remove(name) {
            Some(q) => Ok(Weight::Quant(q, self.2)),
            None => self.take(name).map(Weight::Dense),
        }
    }

    /// Module `m`'s `.weight` (and `.bias` when `bias`), plus its LoRA adapter
    /// (`m.lora_A.weight`, `m.lora_B.weight`) when the map holds one.
    pub fn linear(&mut self, m: &str, bias: bool) -> anyhow::Result<Linear> {
        let w = self.weight(&format!("{m}.weight"))?;
        let b = if bias {
            Some(self.take(&format!("{m}.bias"))?)
        } else {
            None
        };
        let [a_name, b_name] = lora_names(m);
        let lora = match self.0.remove(&a_name) {
            Some(a) => Some(Lora {
                a,
                b: self.take(&b_name)?,
            }),
            None => None,
        };
        Ok(Linear {
            w,
            b,
            transposed: false,
            lora,
        })
    }

    /// GPT-2's Conv1D module `m`: weight stored (in, out), with a bias.
    pub fn conv1d(&mut self, m: &str) -> anyhow::Result<Linear> {
        Ok(Linear {
            transposed: true,
            ..self.linear(m, true)?
        })
    }

    /// LayerNorm module `m` (`.weight`, `.bias`).
    pub fn norm(&mut self, m: &str) -> anyhow::Result<Norm> {
        Ok(Norm {
            w: self.take(&format!("{m}.weight"))?,
            b: self.take(&format!("{m}.bias"))?,
        })
    }
}

/// RMSNorm in f32, cast back (HF's LlamaRMSNorm).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let var = x32.sqr()?.mean_keepdim(D::Minus1)?;
    let y = x32.broadcast_div(&(var + eps)?.sqrt()?)?;
    let y = y.to_dtype(x.dtype())?;
    y.broadcast_mul(&cast_like(w, &y)?)
}

/// LayerNorm in f32, cast back.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let mean = x32.mean_keepdim(D::Minus1)?;
    let xc = x32.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    let y = xc
        .broadcast_div(&(var + eps)?.sqrt()?)?
        .to_dtype(x.dtype())?;
    y.broadcast_mul(&cast_like(w, &y)?)?
        .broadcast_add(&cast_like(b, &y)?)
}

/// Softmax over the last dimension, in f32, cast back.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let max = x32.max_keepdim(D::Minus1)?.detach();
    let e = x32.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.to_dtype(x.dtype())
}

/// Additive causal mask (s, total) for queries at positions pos..pos+s.
/// A causal mask for queries at positions pos..pos+s over keys at positions 0..total: a query
/// at position p sees keys in (p - window, p] (all keys up to p without a window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Causal {
    pub pos: usize,
    pub window: Option<usize>,
}

pub fn causal_mask(
    c: Causal,
    s: usize,
    total: usize,
    dtype: DType,
    dev: &candle_core::Device,
) -> Result<Tensor> {
    let w = c.window.unwrap_or(usize::MAX);
    let m: Vec<f32> = (0..s)
        .flat_map(|i| {
            let p = c.pos + i;
            (0..total).map(move |j| {
                if j > p || p - j >= w {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_vec(m, (s, total), dev)?.to_dtype(dtype)
}

/// Multi-head attention core. q: (b, h, s, hd), k and v: (b, kvh, total, hd) with h a multiple
/// of kvh (GQA without copying K/V: the query heads sharing a KV head become rows).
/// `causal`: a causal (and possibly windowed) mask for queries at pos..pos+s; a single query
/// (a decode step) is given only the keys it may see, so it takes no mask. `fused_softmax`
/// runs vramlab-kernels' softmax (it keeps only its output) instead of the f32 composition.
/// Returns (b, s, h·hd).
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: Option<Causal>,
    fused_softmax: bool,
) -> Result<Tensor> {
    let (b, h, s, hd) = q.dims4()?;
    let (kvh, total) = (k.dim(1)?, k.dim(2)?);
    let g = h / kvh;
    let q = q.contiguous()?.reshape((b, kvh, g * s, hd))?;
    let scores = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
    let scores = match causal {
        Some(c) if s > 1 => {
            let mask = causal_mask(c, s, total, scores.dtype(), q.device())?;
            scores
                .reshape((b, kvh, g, s, total))?
                .broadcast_add(&mask)?
                .reshape((b, kvh, g * s, total))?
        }
        _ => scores,
    };
    let p = if fused_softmax {
        vramlab_kernels::softmax_last_dim(&scores)?
    } else {
        softmax(&scores)?
    };
    let out = p.matmul(v)?;
    out.reshape((b, h, s, hd))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((b, s, h * hd))
}

/// Unmasked attention of q (b, heads, n, hd) over k, v (b, heads, m, hd), all contiguous,
/// scale 1/√hd → (b, n, heads·hd). [`Attention::Flash`] runs vramlab-kernels' tiled attention
/// (online softmax, no (n, m) scores); anything else materializes the scores in the
/// activations' dtype and runs vramlab-kernels' softmax (fused, with a backward). q and k are
/// dropped once the scores exist.
pub fn attend(q: Tensor, k: Tensor, v: &Tensor, kind: Attention) -> Result<Tensor> {
    let (b, heads, n, hd) = q.dims4()?;
    let scale = 1.0 / (hd as f64).sqrt();
    match kind {
        Attention::Flash => vramlab_kernels::flash_attention(
            &q,
            &k,
            v,
            scale as f32,
            vramlab_kernels::AttnMask::FULL,
        )?
        .reshape((b, n, heads * hd)),
        _ => {
            let scores = (q.matmul(&k.t()?)? * scale)?;
            drop((q, k));
            let p = vramlab_kernels::softmax_last_dim(&scores)?;
            drop(scores);
            p.matmul(v)?.transpose(1, 2)?.reshape((b, n, heads * hd))
        }
    }
}

/// (b, s, n·hd) → (b, n, s, hd), contiguous.
pub fn split_heads(x: &Tensor, n: usize) -> Result<Tensor> {
    let (b, s, _) = x.dims3()?;
    x.reshape((b, s, n, ()))?.transpose(1, 2)?.contiguous()
}

/// Mean token cross-entropy of logits (b, s, V) against targets (b, s) u32, in f32.
pub fn lm_loss(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (b, s, v) = logits.dims3()?;
    let logits = logits.to_dtype(DType::F32)?.reshape((b * s, v))?;
    candle_nn::loss::cross_entropy(&logits, &targets.flatten_all()?)
}

/// Rows `ids` (b, s) u32 of an embedding table (V, d) → (b, s, d) in `dtype`. The rows are
/// gathered in the table's dtype and then cast, so under a mixed policy the gradient lands on
/// the f32 table without a 16-bit copy of the whole table.
pub fn embedding(table: &Tensor, ids: &Tensor, dtype: DType) -> Result<Tensor> {
    let (b, s) = ids.dims2()?;
    table
        .index_select(&ids.flatten_all()?, 0)?
        .reshape((b, s, ()))?
        .to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Through a frozen weight, x's gradient equals the one candle's own matmul gives (weight
    /// as a variable), for both layouts, and the weight gets none.
    #[test]
    fn frozen_matmul_backward_matches_matmul() {
        let dev = Device::Cpu;
        for transposed in [false, true] {
            let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (2, 3, 5), &dev).unwrap()).unwrap();
            let shape = if transposed { (5, 4) } else { (4, 5) };
            let w = Tensor::randn(0f32, 1.0, shape, &dev).unwrap();
            let b = Some(Tensor::randn(0f32, 1.0, 4, &dev).unwrap());
            let run = |w: Tensor| {
                let lin = Linear {
                    w: Weight::Dense(w),
                    b: b.clone(),
                    transposed,
                    lora: None,
                };
                let y = lin.forward(x.as_tensor()).unwrap();
                let g = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
                (y, g)
            };
            let (y_ref, g_ref) = run(Var::from_tensor(&w).unwrap().as_tensor().clone());
            let (y, g) = run(w.clone());
            let diff = |a: &Tensor, b: &Tensor| {
                (a - b)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
            };
            assert!(diff(&y, &y_ref) < 1e-6, "forward, transposed={transposed}");
            let (gx, gx_ref) = (
                g.get(x.as_tensor()).unwrap(),
                g_ref.get(x.as_tensor()).unwrap(),
            );
            assert!(
                diff(gx, gx_ref) < 1e-5,
                "x gradient, transposed={transposed}"
            );
            // No gradient of the weight's size is computed or held (candle's Matmul backward
            // would hold one for wᵀ until `backward` returns).
            let weight_sized = |g: &candle_core::backprop::GradStore| {
                g.get_ids()
                    .filter_map(|id| g.get_id(*id))
                    .filter(|t| t.elem_count() == w.elem_count())
                    .count()
            };
            assert_eq!(weight_sized(&g), 0, "transposed={transposed}");
            assert!(weight_sized(&g_ref) > 0);
        }
    }
}
