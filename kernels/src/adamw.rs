//! AdamW that updates the parameter, m and v in place (candle `InplaceOp2/3`), so a step
//! allocates nothing beyond the state created on the first step. Same update, same order of
//! f32 operations, as candle-nn's `AdamW` (decoupled weight decay, bias-corrected moments).
//!
//! Three passes per tensor, each a read-modify-write of one buffer: m ← β₁m + (1−β₁)g,
//! v ← β₂v + (1−β₂)g², θ ← θ(1−lr·λ) − lr·m̂/(√v̂ + ε). The mixed variant keeps the f32 master,
//! m and v, and then writes the 16-bit working copy from the master (a fourth pass).
use crate::elem::{for_float, Elem};
use candle_core::backend::BackendStorage;
use candle_core::backprop::GradStore;
use candle_core::{bail, CpuStorage, InplaceOp2, InplaceOp3, Layout, Result, Tensor, Var};
use rayon::prelude::*;

const CHUNK: usize = 1 << 14;

/// candle-nn's `ParamsAdamW`, with the same defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWParams {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWParams {
    fn default() -> Self {
        AdamWParams {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

trait MutElem: Elem {
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut Vec<Self>>;
}

macro_rules! mut_elem {
    ($t:ty, $v:ident) => {
        impl MutElem for $t {
            fn slice_mut(s: &mut CpuStorage) -> Option<&mut Vec<Self>> {
                match s {
                    CpuStorage::$v(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
mut_elem!(f32, F32);
mut_elem!(half::bf16, BF16);
mut_elem!(half::f16, F16);

/// The contiguous elements `l` covers in a mutable storage.
fn dst<'a, T: MutElem>(s: &'a mut CpuStorage, l: &Layout, op: &str) -> Result<&'a mut [T]> {
    match (l.contiguous_offsets(), T::slice_mut(s)) {
        (Some((a, b)), Some(v)) => Ok(&mut v[a..b]),
        _ => bail!("{op}: expects a contiguous destination"),
    }
}

fn src<'a, T: Elem>(s: &'a CpuStorage, l: &Layout, n: usize, op: &str) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) if b - a == n => Ok(&s.as_slice::<T>()?[a..b]),
        _ => bail!("{op}: expects a contiguous source of {n} elements"),
    }
}

/// An element-wise in-place update of x from one other tensor s.
#[derive(Clone, Copy)]
enum Elementwise {
    /// x ← x·β + (1−β)·s (or s² when `square`): one moment.
    Moment {
        beta: f32,
        one_minus: f32,
        square: bool,
    },
    /// x ← s cast to x's dtype (the mixed variant's working copy).
    Cast,
}

impl Elementwise {
    #[inline(always)]
    fn apply(self, x: f32, s: f32) -> f32 {
        match self {
            Elementwise::Moment {
                beta,
                one_minus,
                square,
            } => x * beta + if square { s * s } else { s } * one_minus,
            Elementwise::Cast => s,
        }
    }
}

impl InplaceOp2 for Elementwise {
    fn name(&self) -> &'static str {
        match self {
            Elementwise::Moment { .. } => "vramlab-adamw-moment",
            Elementwise::Cast => "vramlab-cast-into",
        }
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let op = self.name();
        for_float!(s2.dtype(), S => {
            for_float!(s1.dtype(), T => {
                let x = dst::<T>(s1, l1, op)?;
                let s = src::<S>(s2, l2, x.len(), op)?;
                x.par_chunks_mut(CHUNK).zip(s.par_chunks(CHUNK)).for_each(|(x, s)| {
                    for (x, s) in x.iter_mut().zip(s) {
                        *x = T::of(self.apply(x.f(), s.f()));
                    }
                });
                Ok(())
            })
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        let (mode, beta, one_minus) = match *self {
            Elementwise::Moment {
                beta,
                one_minus,
                square,
            } => (square as i64, beta, one_minus),
            Elementwise::Cast => (2, 0.0, 0.0),
        };
        gpu::run(
            "moment",
            self.name(),
            (s1, l1),
            &[(s2, l2)],
            mode,
            &[beta, one_minus],
        )
    }
}

/// θ ← θ·decay − (m·sm / (√(v·sv) + ε))·lr, in place.
struct Update {
    decay: f32,
    scale_m: f32,
    scale_v: f32,
    eps: f32,
    lr: f32,
}

impl InplaceOp3 for Update {
    fn name(&self) -> &'static str {
        "vramlab-adamw-update"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let op = self.name();
        for_float!(s2.dtype(), M => {
            for_float!(s1.dtype(), T => {
                let x = dst::<T>(s1, l1, op)?;
                let m = src::<M>(s2, l2, x.len(), op)?;
                let v = src::<M>(s3, l3, x.len(), op)?;
                x.par_chunks_mut(CHUNK)
                    .zip(m.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
                    .for_each(|(x, (m, v))| {
                        for (x, (m, v)) in x.iter_mut().zip(m.iter().zip(v)) {
                            let adj = (m.f() * self.scale_m) / ((v.f() * self.scale_v).sqrt() + self.eps);
                            *x = T::of(x.f() * self.decay - adj * self.lr);
                        }
                    });
                Ok(())
            })
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        if s2.dtype() != s3.dtype() {
            bail!("{}: m and v must share one dtype", self.name())
        }
        let f = [self.decay, self.scale_m, self.scale_v, self.eps, self.lr];
        gpu::run(
            "update",
            self.name(),
            (s1, l1),
            &[(s2, l2), (s3, l3)],
            -1,
            &f,
        )
    }
}

/// The CUDA passes of kernels/cuda/adamw.cu.
#[cfg(feature = "cuda")]
mod gpu {
    use crate::cuda::{launch, start, suffix, Grid, ADAMW};
    use candle_core::backend::BackendStorage;
    use candle_core::{bail, CudaStorage, Layout, Result};

    /// `{func}_{x dtype}_{source dtype}` over x's n elements, in place: buffers x then the
    /// sources, integers their start offsets, n, then `mode` (when >= 0), then `floats`.
    pub(super) fn run(
        func: &str,
        op: &str,
        (x, xl): (&mut CudaStorage, &Layout),
        srcs: &[(&CudaStorage, &Layout)],
        mode: i64,
        floats: &[f32],
    ) -> Result<()> {
        let n = xl.shape().elem_count();
        let mut ints = vec![start(xl, op)?];
        for (_, l) in srcs {
            if l.shape().elem_count() != n {
                bail!("{op}: expects a contiguous source of {n} elements")
            }
            ints.push(start(l, op)?);
        }
        ints.push(n as i64);
        if mode >= 0 {
            ints.push(mode);
        }
        if n == 0 {
            return Ok(());
        }
        let name = format!(
            "{func}_{}_{}",
            suffix(x.dtype())?,
            suffix(srcs[0].0.dtype())?
        );
        let x: &CudaStorage = x;
        let mut bufs = vec![x];
        bufs.extend(srcs.iter().map(|(s, _)| *s));
        launch(
            x.device(),
            &ADAMW,
            &name,
            Grid::flat(n),
            &bufs,
            &ints,
            floats,
        )
    }
}

fn moments(m: &Tensor, v: &Tensor, grad: &Tensor, p: &AdamWParams) -> Result<()> {
    m.inplace_op2(
        grad,
        &Elementwise::Moment {
            beta: p.beta1 as f32,
            one_minus: (1.0 - p.beta1) as f32,
            square: false,
        },
    )?;
    v.inplace_op2(
        grad,
        &Elementwise::Moment {
            beta: p.beta2 as f32,
            one_minus: (1.0 - p.beta2) as f32,
            square: true,
        },
    )
}

fn update(p: &AdamWParams, t: usize) -> Update {
    Update {
        decay: (1.0 - p.lr * p.weight_decay) as f32,
        scale_m: (1.0 / (1.0 - p.beta1.powi(t as i32))) as f32,
        scale_v: (1.0 / (1.0 - p.beta2.powi(t as i32))) as f32,
        eps: p.eps as f32,
        lr: p.lr as f32,
    }
}

/// One AdamW step (number `t`, from 1) on `param` with moments `m` and `v`, all updated in
/// place. `param`, `m` and `v` share one dtype (f32, bf16 or f16) and must be contiguous;
/// `grad` may be any float dtype.
pub fn adamw_step(
    param: &Tensor,
    m: &Tensor,
    v: &Tensor,
    grad: &Tensor,
    p: &AdamWParams,
    t: usize,
) -> Result<()> {
    moments(m, v, grad, p)?;
    param.inplace_op3(m, v, &update(p, t))
}

/// Mixed precision: steps the f32 `master` with f32 `m` and `v` in place, then writes the
/// 16-bit working copy `work` from it, in place.
#[allow(clippy::too_many_arguments)]
pub fn adamw_step_mixed(
    master: &Tensor,
    m: &Tensor,
    v: &Tensor,
    grad: &Tensor,
    work: &Tensor,
    p: &AdamWParams,
    t: usize,
) -> Result<()> {
    adamw_step(master, m, v, grad, p, t)?;
    work.inplace_op2(master, &Elementwise::Cast)
}

/// A drop-in for candle-nn's `AdamW` over `Var`s: m and v are created (zeros, the variables'
/// dtype) when the optimizer is, and every step is in place.
pub struct AdamWState {
    params: AdamWParams,
    t: usize,
    slots: Vec<(Var, Tensor, Tensor)>,
}

impl AdamWState {
    pub fn new(vars: Vec<Var>, params: AdamWParams) -> Result<Self> {
        let slots = vars
            .into_iter()
            .filter(|v| v.dtype().is_float())
            .map(|var| {
                let m = var.zeros_like()?;
                let v = var.zeros_like()?;
                Ok((var, m, v))
            })
            .collect::<Result<_>>()?;
        Ok(AdamWState {
            params,
            t: 0,
            slots,
        })
    }

    /// One step with the gradients in `grads`; variables without a gradient are skipped.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.t += 1;
        for (var, m, v) in &self.slots {
            if let Some(g) = grads.get(var.as_tensor()) {
                adamw_step(var.as_tensor(), m, v, g, &self.params, self.t)?;
            }
        }
        Ok(())
    }
}
