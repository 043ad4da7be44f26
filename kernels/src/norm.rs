//! Fused RMSNorm and LayerNorm over the last dimension. One kernel serves both: RMSNorm is a
//! LayerNorm that does not centre and has no bias. The forward keeps the per-row statistics
//! (rstd, and the mean for LayerNorm) for the backward, which also needs the input.
use crate::elem::{contiguous, cpu, for_float, guards, same_dtype, storage, tensor, Elem};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::OnceLock;

struct Norm {
    eps: f32,
    /// LayerNorm (subtract the mean) rather than RMSNorm.
    center: bool,
    /// (rows, 2) f32: mean (0 for RMSNorm) and rstd per row.
    stats: OnceLock<Tensor>,
}

impl Norm {
    fn new(eps: f64, center: bool) -> Self {
        Norm {
            eps: eps as f32,
            center,
            stats: OnceLock::new(),
        }
    }

    fn name(&self) -> &'static str {
        if self.center {
            "vramlab-layer-norm"
        } else {
            "vramlab-rms-norm"
        }
    }

    /// The normalised width d, checked against the weight and bias.
    fn check(&self, x: &Layout, w: &Layout, b: Option<&Layout>) -> Result<usize> {
        let d = *x.dims().last().unwrap_or(&0);
        if w.dims() != [d] || b.is_some_and(|b| b.dims() != [d]) {
            bail!(
                "{}: weight and bias must be ({d}), got {:?}",
                self.name(),
                w.dims()
            )
        }
        Ok(d)
    }

    fn fwd<T: Elem>(&self, x: &[T], w: &[T], b: Option<&[T]>) -> (Vec<T>, Vec<f32>) {
        let d = w.len();
        let mut y = vec![T::of(0.0); x.len()];
        let mut st = vec![0f32; x.len() / d * 2];
        y.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .zip(st.par_chunks_mut(2))
            .for_each(|((y, x), st)| {
                let mean = if self.center {
                    x.iter().map(|v| v.f()).sum::<f32>() / d as f32
                } else {
                    0.0
                };
                let var = x.iter().map(|v| (v.f() - mean).powi(2)).sum::<f32>() / d as f32;
                let r = 1.0 / (var + self.eps).sqrt();
                for (e, (y, x)) in y.iter_mut().zip(x).enumerate() {
                    let bias = b.map_or(0.0, |b| b[e].f());
                    *y = T::of((x.f() - mean) * r * w[e].f() + bias);
                }
                st[0] = mean;
                st[1] = r;
            });
        (y, st)
    }

    /// (dx, dw, db) for upstream gradient `g`.
    fn bwd_cpu<T: Elem>(
        &self,
        x: &[T],
        w: &[T],
        g: &[T],
        st: &[f32],
    ) -> (Vec<T>, Vec<f32>, Vec<f32>) {
        let d = w.len();
        let mut dx = vec![T::of(0.0); x.len()];
        let zero = || (vec![0f32; d], vec![0f32; d]);
        let (dw, db) = dx
            .par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .zip(g.par_chunks(d))
            .zip(st.par_chunks(2))
            .fold(zero, |(mut dw, mut db), (((dx, x), g), st)| {
                let (mean, r) = (st[0], st[1]);
                let (mut sg, mut sgx) = (0f32, 0f32);
                for e in 0..d {
                    let (xh, gw) = ((x[e].f() - mean) * r, g[e].f() * w[e].f());
                    sg += gw;
                    sgx += gw * xh;
                    dw[e] += g[e].f() * xh;
                    db[e] += g[e].f();
                }
                let (cg, cgx) = (
                    if self.center { sg / d as f32 } else { 0.0 },
                    sgx / d as f32,
                );
                for e in 0..d {
                    let (xh, gw) = ((x[e].f() - mean) * r, g[e].f() * w[e].f());
                    dx[e] = T::of(r * (gw - cg - xh * cgx));
                }
                (dw, db)
            })
            .reduce(zero, |(mut a, mut b), (c, e)| {
                a.iter_mut().zip(c).for_each(|(a, c)| *a += c);
                b.iter_mut().zip(e).for_each(|(b, e)| *b += e);
                (a, b)
            });
        (dx, dw, db)
    }

    fn cpu_fwd(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let mut dts = vec![x.0.dtype(), w.0.dtype()];
        dts.extend(b.map(|b| b.0.dtype()));
        let dtype = same_dtype(self.name(), &dts)?;
        let d = self.check(x.1, w.1, b.map(|b| b.1))?;
        for_float!(dtype, T => {
            let xs = contiguous::<T>(x.0, x.1, self.name())?;
            let ws = contiguous::<T>(w.0, w.1, self.name())?;
            let bs = match b {
                Some(b) => Some(contiguous::<T>(b.0, b.1, self.name())?),
                None => None,
            };
            let (y, st) = self.fwd(xs, ws, bs);
            let st = Tensor::from_vec(st, (xs.len() / d.max(1), 2), &Device::Cpu)?;
            if self.stats.set(st).is_err() {
                bail!("{}: one op instance ran twice", self.name())
            }
            Ok((storage(y), x.1.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: (&candle_core::CudaStorage, &Layout),
        w: (&candle_core::CudaStorage, &Layout),
        b: Option<(&candle_core::CudaStorage, &Layout)>,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{self, launch, start, suffix, Grid, NORM};
        let mut dts = vec![x.0.dtype(), w.0.dtype()];
        dts.extend(b.map(|b| b.0.dtype()));
        let dtype = same_dtype(self.name(), &dts)?;
        let d = self.check(x.1, w.1, b.map(|b| b.1))?;
        let (n, dev) = (x.1.shape().elem_count(), x.0.device());
        let rows = n / d.max(1);
        let y = cuda::zeros(dev, dtype, n)?;
        let st = cuda::zeros(dev, candle_core::DType::F32, rows * 2)?;
        let bb = b.unwrap_or(w);
        if n > 0 {
            let ints = [
                start(x.1, self.name())?,
                start(w.1, self.name())?,
                start(bb.1, self.name())?,
                d as i64,
                b.is_some() as i64,
                self.center as i64,
            ];
            launch(
                dev,
                &NORM,
                &format!("norm_fwd_{}", suffix(dtype)?),
                Grid::rows(rows, 256)?,
                &[x.0, w.0, bb.0, &y, &st],
                &ints,
                &[self.eps],
            )?;
        }
        if self.stats.set(cuda::tensor(st, (rows, 2))).is_err() {
            bail!("{}: one op instance ran twice", self.name())
        }
        Ok((y, x.1.shape().clone()))
    }

    /// (dx, dw, db) on CUDA from the guards of (x, w, grad, stats).
    #[cfg(feature = "cuda")]
    fn bwd_cuda(
        &self,
        gs: &[(candle_core::StorageRef<'_>, &Layout)],
        dtype: candle_core::DType,
        x: &Tensor,
        w: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        use crate::cuda::{self, launch, start, suffix, u32_of, Grid, NORM};
        let t = gs.iter().map(cuda::storage).collect::<Result<Vec<_>>>()?;
        let (n, d, dev) = (x.elem_count(), w.elem_count(), t[0].0.device());
        let rows = n / d.max(1);
        let dx = cuda::zeros(dev, dtype, n)?;
        let dw = cuda::zeros(dev, dtype, d)?;
        let db = cuda::zeros(dev, dtype, d)?;
        if n > 0 {
            let sfx = suffix(dtype)?;
            let [xo, wo, go] = [0, 1, 2].map(|i| start(t[i].1, self.name()));
            let (xo, wo, go) = (xo?, wo?, go?);
            launch(
                dev,
                &NORM,
                &format!("norm_bwd_dx_{sfx}"),
                Grid::rows(rows, 256)?,
                &[t[0].0, t[1].0, t[2].0, t[3].0, &dx],
                &[xo, wo, go, d as i64, self.center as i64],
                &[],
            )?;
            let cols = Grid {
                grid: (u32_of(d.div_ceil(256))?, 1, 1),
                block: 256,
                shared: 0,
            };
            launch(
                dev,
                &NORM,
                &format!("norm_bwd_dw_{sfx}"),
                cols,
                &[t[0].0, t[2].0, t[3].0, &dw, &db],
                &[xo, go, rows as i64, d as i64],
                &[],
            )?;
        }
        Ok((
            cuda::tensor(dx, x.dims()),
            cuda::tensor(dw, w.dims()),
            cuda::tensor(db, w.dims()),
        ))
    }

    /// (dx, dw, db) as tensors shaped like x and w.
    fn bwd(&self, x: &Tensor, w: &Tensor, grad: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let Some(st) = self.stats.get() else {
            bail!("{}: backward before forward", self.name())
        };
        let grad = grad.to_dtype(x.dtype())?.contiguous()?;
        let gs = guards(&[x, w, &grad, st]);
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return self.bwd_cuda(&gs, x.dtype(), x, w);
        }
        let (ss, sl) = cpu(&gs[3])?;
        let st = contiguous::<f32>(ss, sl, self.name())?;
        for_float!(x.dtype(), T => {
            let [xs, ws, g] = [0, 1, 2].map(|i| cpu(&gs[i]).and_then(|(s, l)| contiguous::<T>(s, l, self.name())));
            let (dx, dw, db) = self.bwd_cpu(xs?, ws?, g?, st);
            let cast = |v: Vec<f32>| -> Vec<T> { v.into_iter().map(T::of).collect() };
            Ok((tensor(dx, x.dims())?, tensor(cast(dw), w.dims())?, tensor(cast(db), w.dims())?))
        })
    }
}

struct RmsNorm(Norm);
struct LayerNorm(Norm);

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.0.cpu_fwd((s1, l1), (s2, l2), None)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.0.cuda_fwd((s1, l1), (s2, l2), None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = self.0.bwd(x, w, grad)?;
        Ok((Some(dx), Some(dw)))
    }
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.0.cpu_fwd((s1, l1), (s2, l2), Some((s3, l3)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.0.cuda_fwd((s1, l1), (s2, l2), Some((s3, l3)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = self.0.bwd(x, w, grad)?;
        Ok((Some(dx), Some(dw), Some(db)))
    }
}

/// RMSNorm over the last dimension: x · rsqrt(mean(x²) + eps) · w, computed in f32 and cast
/// once. `w` (d) is cast to x's dtype (the cast records its own backward, so a mixed policy's
/// f32 weight still gets its gradient). Keeps one rstd per row for the backward.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let w = w.to_dtype(x.dtype())?;
    x.contiguous()?
        .apply_op2(&w.contiguous()?, RmsNorm(Norm::new(eps, false)))
}

/// LayerNorm over the last dimension, (x − mean) · rstd · w + b, computed in f32 and cast once.
/// Keeps the mean and rstd per row.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Tensor> {
    let (w, b) = (w.to_dtype(x.dtype())?, b.to_dtype(x.dtype())?);
    x.contiguous()?.apply_op3(
        &w.contiguous()?,
        &b.contiguous()?,
        LayerNorm(Norm::new(eps, true)),
    )
}
