//! Row-wise and element-wise fused ops: RoPE (rotate-half), SwiGLU and softmax over the last
//! dimension. Inputs are made contiguous by the wrappers; all arithmetic is in f32.
use crate::elem::{contiguous, cpu, for_float, guards, same_dtype, storage, tensor, Elem};
use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};
use rayon::prelude::*;

/// Rows of `d` elements of the two inputs, zipped with the output rows.
fn map_rows<T: Elem>(
    a: &[T],
    b: &[T],
    d: usize,
    f: impl Fn(&mut [T], &[T], &[T]) + Sync,
) -> Vec<T> {
    let mut y = vec![T::of(0.0); a.len()];
    y.par_chunks_mut(d)
        .zip(a.par_chunks(d).zip(b.par_chunks(d)))
        .for_each(|(y, (a, b))| f(y, a, b));
    y
}

const ROW: usize = 4096;

struct Rope;

impl Rope {
    /// y = x·cos + rotate_half(x)·sin over planes of (s, d), or its transpose when `back`
    /// (the gradient: rotate_half is orthogonal up to sign).
    fn run<T: Elem>(x: &[T], cos: &[T], sin: &[T], d: usize, back: bool) -> Vec<T> {
        let (plane, half) = (cos.len(), d / 2);
        let mut y = vec![T::of(0.0); x.len()];
        y.par_chunks_mut(plane)
            .zip(x.par_chunks(plane))
            .for_each(|(y, x)| {
                for p in (0..plane).step_by(d) {
                    for e in p..p + half {
                        let (x1, x2) = (x[e].f(), x[e + half].f());
                        let (c1, c2) = (cos[e].f(), cos[e + half].f());
                        let (s1, s2) = (sin[e].f(), sin[e + half].f());
                        let (y1, y2) = if back {
                            (x1 * c1 + x2 * s2, x2 * c2 - x1 * s1)
                        } else {
                            (x1 * c1 - x2 * s1, x2 * c2 + x1 * s2)
                        };
                        y[e] = T::of(y1);
                        y[e + half] = T::of(y2);
                    }
                }
            });
        y
    }

    fn check(x: &[usize], cos: &[usize], sin: &[usize]) -> Result<usize> {
        let n = x.len();
        if n < 2 || cos != sin || cos != &x[n - 2..] || !x[n - 1].is_multiple_of(2) {
            bail!("rope: x (..., s, d) with d even, cos and sin (s, d); got {x:?} {cos:?} {sin:?}")
        }
        Ok(x[n - 1])
    }
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "vramlab-rope"
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
        let d = Rope::check(l1.dims(), l2.dims(), l3.dims())?;
        for_float!(same_dtype(self.name(), &[s1.dtype(), s2.dtype(), s3.dtype()])?, T => {
            let [x, c, s] = [(s1, l1), (s2, l2), (s3, l3)].map(|(s, l)| contiguous::<T>(s, l, self.name()));
            Ok((storage(Rope::run(x?, c?, s?, d, false)), l1.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let d = Rope::check(l1.dims(), l2.dims(), l3.dims())?;
        let dtype = same_dtype(self.name(), &[s1.dtype(), s2.dtype(), s3.dtype()])?;
        let y = gpu::rope([(s1, l1), (s2, l2), (s3, l3)], dtype, d, false)?;
        Ok((y, l1.shape().clone()))
    }

    /// Keeps nothing: the gradient needs only the tables.
    fn bwd(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.to_dtype(x.dtype())?.contiguous()?;
        let d = Rope::check(x.dims(), cos.dims(), sin.dims())?;
        let gs = guards(&[&grad, cos, sin]);
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let t = gpu::storages(&gs)?;
            let dx = gpu::rope([t[0], t[1], t[2]], x.dtype(), d, true)?;
            return Ok((Some(crate::cuda::tensor(dx, x.dims())), None, None));
        }
        for_float!(x.dtype(), T => {
            let [g, c, s] = [0, 1, 2].map(|i| cpu(&gs[i]).and_then(|(s, l)| contiguous::<T>(s, l, self.name())));
            Ok((Some(tensor(Rope::run(g?, c?, s?, d, true), x.dims())?), None, None))
        })
    }
}

struct Swiglu;

impl CustomOp2 for Swiglu {
    fn name(&self) -> &'static str {
        "vramlab-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if l1.dims() != l2.dims() {
            bail!("swiglu: a {:?} and b {:?} differ", l1.dims(), l2.dims())
        }
        for_float!(same_dtype(self.name(), &[s1.dtype(), s2.dtype()])?, T => {
            let (a, b) = (contiguous::<T>(s1, l1, self.name())?, contiguous::<T>(s2, l2, self.name())?);
            let y = map_rows(a, b, ROW, |y, a, b| {
                for ((y, a), b) in y.iter_mut().zip(a).zip(b) {
                    let a = a.f();
                    *y = T::of(a / (1.0 + (-a).exp()) * b.f());
                }
            });
            Ok((storage(y), l1.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        if l1.dims() != l2.dims() {
            bail!("swiglu: a {:?} and b {:?} differ", l1.dims(), l2.dims())
        }
        let dtype = same_dtype(self.name(), &[s1.dtype(), s2.dtype()])?;
        let n = l1.shape().elem_count();
        let [y] = gpu::run("swiglu_fwd", dtype, [(s1, l1), (s2, l2)], [n], None)?;
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.to_dtype(a.dtype())?.contiguous()?;
        let gs = guards(&[a, b, &grad]);
        #[cfg(feature = "cuda")]
        if a.device().is_cuda() {
            let t = gpu::storages(&gs)?;
            let n = a.elem_count();
            let [da, db] = gpu::run("swiglu_bwd", a.dtype(), [t[0], t[1], t[2]], [n, n], None)?;
            let tensor = |s| crate::cuda::tensor(s, a.dims());
            return Ok((Some(tensor(da)), Some(tensor(db))));
        }
        for_float!(a.dtype(), T => {
            let [a_, b_, g] = [0, 1, 2].map(|i| cpu(&gs[i]).and_then(|(s, l)| contiguous::<T>(s, l, self.name())));
            let (a_, b_, g) = (a_?, b_?, g?);
            let (mut da, mut db) = (vec![T::of(0.0); a_.len()], vec![T::of(0.0); a_.len()]);
            da.par_chunks_mut(ROW)
                .zip(db.par_chunks_mut(ROW))
                .zip(a_.par_chunks(ROW).zip(b_.par_chunks(ROW)).zip(g.par_chunks(ROW)))
                .for_each(|((da, db), ((a, b), g))| {
                    for e in 0..a.len() {
                        let (x, y, g) = (a[e].f(), b[e].f(), g[e].f());
                        let sig = 1.0 / (1.0 + (-x).exp());
                        da[e] = T::of(g * y * sig * (1.0 + x * (1.0 - sig)));
                        db[e] = T::of(g * x * sig);
                    }
                });
            Ok((Some(tensor(da, a.dims())?), Some(tensor(db, b.dims())?)))
        })
    }
}

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "vramlab-softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let d = *l.dims().last().unwrap_or(&1);
        for_float!(s.dtype(), T => {
            let x = contiguous::<T>(s, l, self.name())?;
            let y = map_rows(x, x, d, |y, x, _| {
                let m = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(v.f()));
                let sum: f32 = x.iter().map(|v| (v.f() - m).exp()).sum();
                for (y, x) in y.iter_mut().zip(x) {
                    *y = T::of((x.f() - m).exp() / sum);
                }
            });
            Ok((storage(y), l.shape().clone()))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let n = l.shape().elem_count();
        let d = *l.dims().last().unwrap_or(&1);
        let [y] = gpu::run("softmax_fwd", s.dtype(), [(s, l)], [n], Some(d))?;
        Ok((y, l.shape().clone()))
    }

    /// dx = y · (g − Σ g·y): only the output is needed.
    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.to_dtype(res.dtype())?.contiguous()?;
        let d = res.dims().last().copied().unwrap_or(1);
        let gs = guards(&[res, &grad]);
        #[cfg(feature = "cuda")]
        if res.device().is_cuda() {
            let t = gpu::storages(&gs)?;
            let [dx] = gpu::run(
                "softmax_bwd",
                res.dtype(),
                [t[0], t[1]],
                [res.elem_count()],
                Some(d),
            )?;
            return Ok(Some(crate::cuda::tensor(dx, res.dims())));
        }
        for_float!(res.dtype(), T => {
            let [y, g] = [0, 1].map(|i| cpu(&gs[i]).and_then(|(s, l)| contiguous::<T>(s, l, self.name())));
            let dx = map_rows(y?, g?, d, |dx, y, g| {
                let dot: f32 = y.iter().zip(g).map(|(y, g)| y.f() * g.f()).sum();
                for ((dx, y), g) in dx.iter_mut().zip(y).zip(g) {
                    *dx = T::of(y.f() * (g.f() - dot));
                }
            });
            Ok(Some(tensor(dx, res.dims())?))
        })
    }
}

/// The CUDA kernels of kernels/cuda/rowwise.cu.
#[cfg(feature = "cuda")]
mod gpu {
    use crate::cuda::{self, launch, start, suffix, Grid, ROWWISE};
    use candle_core::backend::BackendStorage;
    use candle_core::{CudaStorage, DType, Layout, Result, StorageRef};

    pub(super) type Arg<'a> = (&'a CudaStorage, &'a Layout);

    pub(super) fn storages<'a>(gs: &'a [(StorageRef<'a>, &'a Layout)]) -> Result<Vec<Arg<'a>>> {
        gs.iter().map(cuda::storage).collect()
    }

    /// Runs `{func}_{dtype}` on the inputs (contiguous, passed with their start offsets) and
    /// returns its outputs, of the given lengths. `row`: None for an element-wise kernel (a
    /// grid-stride loop over the first output's length), Some(d) for one block per row of d.
    pub(super) fn run<const I: usize, const O: usize>(
        func: &str,
        dtype: DType,
        inputs: [Arg<'_>; I],
        outputs: [usize; O],
        row: Option<usize>,
    ) -> Result<[CudaStorage; O]> {
        let dev = inputs[0].0.device();
        let outs = outputs.map(|n| cuda::zeros(dev, dtype, n));
        let outs = outs.into_iter().collect::<Result<Vec<_>>>()?;
        let n = outputs[0];
        if n > 0 {
            let mut ints = Vec::with_capacity(I + 1);
            for (_, l) in &inputs {
                ints.push(start(l, func)?);
            }
            let grid = match row {
                None => Grid::flat(n),
                Some(d) => Grid::rows(n / d.max(1), 256)?,
            };
            ints.push(row.unwrap_or(n) as i64);
            let mut bufs: Vec<&CudaStorage> = inputs.iter().map(|(s, _)| *s).collect();
            bufs.extend(outs.iter());
            launch(
                dev,
                &ROWWISE,
                &format!("{func}_{}", suffix(dtype)?),
                grid,
                &bufs,
                &ints,
                &[],
            )?;
        }
        outs.try_into()
            .map_err(|_| candle_core::Error::Msg(format!("{func}: output count")))
    }

    /// y = x·cos + rotate_half(x)·sin, or its transpose when `back`.
    pub(super) fn rope(t: [Arg<'_>; 3], dtype: DType, d: usize, back: bool) -> Result<CudaStorage> {
        let dev = t[0].0.device();
        let n = t[0].1.shape().elem_count();
        let y = cuda::zeros(dev, dtype, n)?;
        if n > 0 {
            let mut ints = Vec::with_capacity(7);
            for (_, l) in &t {
                ints.push(start(l, "rope")?);
            }
            let plane = t[1].1.shape().elem_count();
            ints.extend([n / 2, plane, d, back as usize].map(|x| x as i64));
            launch(
                dev,
                &ROWWISE,
                &format!("rope_{}", suffix(dtype)?),
                Grid::flat(n / 2),
                &[t[0].0, t[1].0, t[2].0, &y],
                &ints,
                &[],
            )?;
        }
        Ok(y)
    }
}

/// silu(a) · b, element-wise (SwiGLU's gate). Keeps a and b (its inputs) for the backward.
pub fn swiglu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.contiguous()?.apply_op2(&b.contiguous()?, Swiglu)
}

/// Softmax over the last dimension, in f32, cast once. Its backward needs only its output.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(Softmax)
}

/// Rotary embedding, rotate-half layout: x·cos + rotate_half(x)·sin with x (..., s, d) and
/// cos, sin (s, d) (each frequency repeated in both halves, as HF builds them). Keeps nothing
/// for the backward beyond the tables.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    x.contiguous()?
        .apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope)
}
