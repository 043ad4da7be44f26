//! Row-wise and element-wise fused ops: RoPE (rotate-half), SwiGLU and softmax over the last
//! dimension. Inputs are made contiguous by the wrappers; all arithmetic is in f32.
use crate::elem::{contiguous, cpu, for_float, guards, same_dtype, storage, tensor, Elem};
use candle_core::backend::BackendStorage;
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

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.to_dtype(a.dtype())?.contiguous()?;
        let gs = guards(&[a, b, &grad]);
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

    /// dx = y · (g − Σ g·y): only the output is needed.
    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.to_dtype(res.dtype())?.contiguous()?;
        let d = res.dims().last().copied().unwrap_or(1);
        let gs = guards(&[res, &grad]);
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
