//! The weighted layers: [`Linear`] (dense, quantized or with a LoRA adapter) and [`Conv2d`],
//! whose frozen weights take no gradient: their products run as custom ops whose backward
//! computes only the input's gradient.
use super::cast_like;
use crate::vocab::QMatmul;
use candle_core::{DType, Result, Tensor};

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
