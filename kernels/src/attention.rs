//! Memory-efficient (flash-style) attention on CPU.
//!
//! Forward: each query row walks its keys in tiles of [`FLASH_TILE`] with an online softmax
//! (running max, running sum, rescaled accumulator), so no s×s matrix exists; it keeps the
//! output and one log-sum-exp per (row, head). Backward: per (batch, kv head) the scores are
//! recomputed tile by tile from q, k and the saved log-sum-exp; dK and dV accumulate in one
//! (s, head_dim) f32 buffer each. Both directions use O(s) memory.
use crate::elem::{cpu, for_float, guards, same_dtype, storage, tensor, Elem};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::OnceLock;

/// Keys per tile in both directions (CPU).
pub const FLASH_TILE: usize = 64;

/// Keys (or queries) per shared-memory tile of the CUDA kernels, for head_dim <= 128 (half
/// that up to 256): one per lane of a warp.
#[cfg(feature = "cuda")]
const FLASH_GPU_TILE_MAX: usize = 32;

/// Which keys a query sees. Queries are aligned to the end of the keys (a query at row i of
/// sq sits at absolute position i + sk − sq), as in FlashAttention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnMask {
    /// Keys after the query's position are masked.
    pub causal: bool,
    /// Only keys within `window` positions of the query (|pos − j| < window) are seen.
    pub window: Option<usize>,
}

impl AttnMask {
    pub const CAUSAL: AttnMask = AttnMask {
        causal: true,
        window: None,
    };
    pub const FULL: AttnMask = AttnMask {
        causal: false,
        window: None,
    };

    /// The half-open key range [lo, hi) query row `i` attends to.
    fn keys(&self, i: usize, sq: usize, sk: usize) -> (usize, usize) {
        let p = i + sk.saturating_sub(sq);
        let hi = if self.causal { (p + 1).min(sk) } else { sk };
        match self.window {
            Some(w) => {
                let hi = if self.causal { hi } else { (p + w).min(sk) };
                ((p + 1).saturating_sub(w), hi)
            }
            None => (0, hi),
        }
    }
}

/// Element offsets of a 4-d strided view.
#[derive(Clone, Copy)]
struct View4 {
    off: usize,
    st: [usize; 4],
}

impl View4 {
    fn new(l: &Layout) -> Result<Self> {
        let s = l.stride();
        if s.len() != 4 {
            bail!("flash_attention: expects 4-d tensors, got {:?}", l.dims())
        }
        Ok(View4 {
            off: l.start_offset(),
            st: [s[0], s[1], s[2], s[3]],
        })
    }

    #[inline(always)]
    fn at(&self, a: usize, b: usize, c: usize) -> usize {
        self.off + a * self.st[0] + b * self.st[1] + c * self.st[2]
    }

    #[inline(always)]
    fn load<T: Elem>(&self, x: &[T], a: usize, b: usize, c: usize, out: &mut [f32]) {
        let (o, sd) = (self.at(a, b, c), self.st[3]);
        for (e, y) in out.iter_mut().enumerate() {
            *y = x[o + e * sd].f();
        }
    }

    #[inline(always)]
    fn dot<T: Elem>(&self, x: &[T], a: usize, b: usize, c: usize, y: &[f32]) -> f32 {
        let (o, sd) = (self.at(a, b, c), self.st[3]);
        y.iter()
            .enumerate()
            .map(|(e, &w)| x[o + e * sd].f() * w)
            .sum()
    }

    /// acc += w · x[a, b, c, :]
    #[inline(always)]
    fn axpy<T: Elem>(&self, x: &[T], a: usize, b: usize, c: usize, w: f32, acc: &mut [f32]) {
        let (o, sd) = (self.at(a, b, c), self.st[3]);
        for (e, y) in acc.iter_mut().enumerate() {
            *y += w * x[o + e * sd].f();
        }
    }
}

#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    h: usize,
    kvh: usize,
    sq: usize,
    sk: usize,
    d: usize,
}

struct FlashAttn {
    scale: f32,
    mask: AttnMask,
    /// Log-sum-exp per (batch, query row, head), f32: what the backward needs besides q, k, v
    /// and the output.
    lse: OnceLock<Tensor>,
}

fn dims(q: &Layout, k: &Layout, v: &Layout) -> Result<Dims> {
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if qd.len() != 4 || kd.len() != 4 || kd != vd {
        bail!("flash_attention: q (b, h, sq, d), k and v (b, kvh, sk, d); got {qd:?} {kd:?} {vd:?}")
    }
    let dm = Dims {
        b: qd[0],
        h: qd[1],
        kvh: kd[1],
        sq: qd[2],
        sk: kd[2],
        d: qd[3],
    };
    if kd[0] != dm.b || kd[3] != dm.d || dm.kvh == 0 || !dm.h.is_multiple_of(dm.kvh) {
        bail!("flash_attention: q {qd:?} and k/v {kd:?} disagree (heads must be a multiple of kv heads)")
    }
    Ok(dm)
}

impl FlashAttn {
    #[allow(clippy::too_many_arguments)]
    fn fwd<T: Elem>(
        &self,
        q: &[T],
        qv: View4,
        k: &[T],
        kv: View4,
        v: &[T],
        vv: View4,
        dm: Dims,
    ) -> (Vec<T>, Vec<f32>) {
        let Dims {
            h, kvh, sq, sk, d, ..
        } = dm;
        let g = h / kvh;
        let mut out = vec![T::of(0.0); dm.b * sq * h * d];
        let mut lse = vec![0f32; dm.b * sq * h];
        out.par_chunks_mut(h * d)
            .zip(lse.par_chunks_mut(h))
            .enumerate()
            .for_each_init(
                || (vec![0f32; d], vec![0f32; d], vec![0f32; FLASH_TILE]),
                |(qr, acc, s), (row, (o, l))| {
                    let (bi, i) = (row / sq, row % sq);
                    let (lo, hi) = self.mask.keys(i, sq, sk);
                    for hh in 0..h {
                        let kh = hh / g;
                        qv.load(q, bi, hh, i, qr);
                        qr.iter_mut().for_each(|x| *x *= self.scale);
                        acc.fill(0.0);
                        let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
                        for t0 in (lo..hi).step_by(FLASH_TILE) {
                            let t1 = (t0 + FLASH_TILE).min(hi);
                            let s = &mut s[..t1 - t0];
                            for (j, x) in (t0..t1).zip(s.iter_mut()) {
                                *x = kv.dot(k, bi, kh, j, qr);
                            }
                            let m_new = s.iter().fold(m, |a, &b| a.max(b));
                            let alpha = (m - m_new).exp();
                            acc.iter_mut().for_each(|x| *x *= alpha);
                            sum *= alpha;
                            for (j, &x) in (t0..t1).zip(s.iter()) {
                                let p = (x - m_new).exp();
                                sum += p;
                                vv.axpy(v, bi, kh, j, p, acc);
                            }
                            m = m_new;
                        }
                        let o = &mut o[hh * d..(hh + 1) * d];
                        if sum > 0.0 {
                            for (y, &a) in o.iter_mut().zip(acc.iter()) {
                                *y = T::of(a / sum);
                            }
                            l[hh] = m + sum.ln();
                        } else {
                            l[hh] = f32::NEG_INFINITY;
                        }
                    }
                },
            );
        (out, lse)
    }

    #[allow(clippy::too_many_arguments)]
    fn bwd_cpu<T: Elem>(
        &self,
        t: [(&[T], View4); 5],
        lse: &[f32],
        dm: Dims,
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let [(q, qv), (k, kv), (v, vv), (o, ov), (go, gv)] = t;
        let Dims {
            b,
            h,
            kvh,
            sq,
            sk,
            d,
        } = dm;
        let g = h / kvh;
        let mut dq = vec![T::of(0.0); b * h * sq * d];
        let mut dk = vec![T::of(0.0); b * kvh * sk * d];
        let mut dv = vec![T::of(0.0); b * kvh * sk * d];
        let scale = self.scale;
        dq.par_chunks_mut(g * sq * d)
            .zip(dk.par_chunks_mut(sk * d))
            .zip(dv.par_chunks_mut(sk * d))
            .enumerate()
            .for_each(|(task, ((dqc, dkc), dvc))| {
                let (bi, kh) = (task / kvh, task % kvh);
                let mut dk32 = vec![0f32; sk * d];
                let mut dv32 = vec![0f32; sk * d];
                let (mut qr, mut dor, mut dqr) = (vec![0f32; d], vec![0f32; d], vec![0f32; d]);
                let mut p = vec![0f32; FLASH_TILE];
                for (gi, hh) in (kh * g..(kh + 1) * g).enumerate() {
                    for i in 0..sq {
                        let l = lse[(bi * sq + i) * h + hh];
                        if l == f32::NEG_INFINITY {
                            continue;
                        }
                        qv.load(q, bi, hh, i, &mut qr);
                        gv.load(go, bi, i, hh, &mut dor);
                        let delta = ov.dot(o, bi, i, hh, &dor);
                        dqr.fill(0.0);
                        let (lo, hi) = self.mask.keys(i, sq, sk);
                        for t0 in (lo..hi).step_by(FLASH_TILE) {
                            let t1 = (t0 + FLASH_TILE).min(hi);
                            let p = &mut p[..t1 - t0];
                            for (j, x) in (t0..t1).zip(p.iter_mut()) {
                                *x = (scale * kv.dot(k, bi, kh, j, &qr) - l).exp();
                            }
                            for (j, &pj) in (t0..t1).zip(p.iter()) {
                                let dvj = &mut dv32[j * d..(j + 1) * d];
                                dvj.iter_mut().zip(&dor).for_each(|(a, &x)| *a += pj * x);
                                let ds = pj * (vv.dot(v, bi, kh, j, &dor) - delta);
                                kv.axpy(k, bi, kh, j, ds, &mut dqr);
                                let dkj = &mut dk32[j * d..(j + 1) * d];
                                dkj.iter_mut().zip(&qr).for_each(|(a, &x)| *a += ds * x);
                            }
                        }
                        let row = &mut dqc[(gi * sq + i) * d..(gi * sq + i + 1) * d];
                        for (y, &x) in row.iter_mut().zip(&dqr) {
                            *y = T::of(scale * x);
                        }
                    }
                }
                for (y, &x) in dkc.iter_mut().zip(&dk32) {
                    *y = T::of(scale * x);
                }
                for (y, &x) in dvc.iter_mut().zip(&dv32) {
                    *y = T::of(x);
                }
            });
        (dq, dk, dv)
    }
}

impl CustomOp3 for FlashAttn {
    fn name(&self) -> &'static str {
        "vramlab-flash-attention"
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
        let dm = dims(l1, l2, l3)?;
        let dtype = same_dtype(self.name(), &[s1.dtype(), s2.dtype(), s3.dtype()])?;
        let (v1, v2, v3) = (View4::new(l1)?, View4::new(l2)?, View4::new(l3)?);
        for_float!(dtype, T => {
            let (out, lse) = self.fwd::<T>(
                s1.as_slice()?, v1, s2.as_slice()?, v2, s3.as_slice()?, v3, dm,
            );
            let lse = Tensor::from_vec(lse, (dm.b, dm.sq, dm.h), &Device::Cpu)?;
            if self.lse.set(lse).is_err() {
                bail!("flash_attention: one op instance ran twice")
            }
            Ok((storage(out), Shape::from((dm.b, dm.sq, dm.h, dm.d))))
        })
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
        let dm = dims(l1, l2, l3)?;
        let dtype = same_dtype(self.name(), &[s1.dtype(), s2.dtype(), s3.dtype()])?;
        let (out, lse) = gpu::fwd(self, [(s1, l1), (s2, l2), (s3, l3)], dtype, dm)?;
        if self.lse.set(lse).is_err() {
            bail!("flash_attention: one op instance ran twice")
        }
        Ok((out, Shape::from((dm.b, dm.sq, dm.h, dm.d))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let Some(lse) = self.lse.get() else {
            bail!("flash_attention: backward before forward")
        };
        let grad = grad.to_dtype(q.dtype())?;
        let dm = dims(q.layout(), k.layout(), v.layout())?;
        let gs = guards(&[q, k, v, res, &grad, lse]);
        #[cfg(feature = "cuda")]
        if q.device().is_cuda() {
            let (dq, dk, dv) = gpu::bwd(self, &gs, q.dtype(), dm)?;
            return Ok((Some(dq), Some(dk), Some(dv)));
        }
        let (ls, ll) = cpu(&gs[5])?;
        let lse = &ls.as_slice::<f32>()?[ll.start_offset()..];
        for_float!(q.dtype(), T => {
            let mut t: Vec<(&[T], View4)> = Vec::with_capacity(5);
            for g in &gs[..5] {
                let (s, l) = cpu(g)?;
                t.push((s.as_slice::<T>()?, View4::new(l)?));
            }
            let (dq, dk, dv) = self.bwd_cpu([t[0], t[1], t[2], t[3], t[4]], lse, dm);
            Ok((
                Some(tensor(dq, q.dims())?),
                Some(tensor(dk, k.dims())?),
                Some(tensor(dv, v.dims())?),
            ))
        })
    }
}

/// The CUDA kernels of kernels/cuda/attention.cu: same layouts, same masks, same outputs.
#[cfg(feature = "cuda")]
mod gpu {
    use super::{Dims, FlashAttn, FLASH_GPU_TILE_MAX};
    use crate::cuda::{self, launch, suffix, u32_of, Grid, ATTENTION};
    use candle_core::backend::BackendStorage;
    use candle_core::{bail, CudaStorage, DType, Layout, Result, StorageRef, Tensor};

    /// Query or key rows per block (one warp each), as WARPS in attention.cu.
    const WARPS: usize = 8;

    /// Keys (or queries) per shared-memory tile: at most 32 (one per lane), fewer for wide
    /// heads so that two (tile, d) f32 tiles stay within 32 KiB.
    fn tile(d: usize) -> Result<usize> {
        if d > 256 {
            bail!("flash_attention: CUDA kernels take head_dim <= 256, got {d}")
        }
        Ok(if d <= 128 {
            FLASH_GPU_TILE_MAX
        } else {
            FLASH_GPU_TILE_MAX / 2
        })
    }

    fn view(l: &Layout, ints: &mut Vec<i64>) {
        ints.push(l.start_offset() as i64);
        ints.extend(l.stride().iter().map(|&s| s as i64));
    }

    fn shape_ints(f: &FlashAttn, dm: Dims, ft: usize, ints: &mut Vec<i64>) {
        let w = f.mask.window.map_or(-1, |w| w as i64);
        ints.extend([dm.b, dm.h, dm.kvh, dm.sq, dm.sk, dm.d, ft].map(|x| x as i64));
        ints.extend([f.mask.causal as i64, w]);
    }

    fn grid(rows: usize, heads: usize, b: usize, shared: usize) -> Result<Grid> {
        Ok(Grid {
            grid: (u32_of(rows.div_ceil(WARPS))?, u32_of(heads)?, u32_of(b)?),
            block: (32 * WARPS) as u32,
            shared: u32_of(shared * 4)?,
        })
    }

    /// (out, lse): out (b, sq, h, d) in q's dtype, lse (b, sq, h) f32.
    pub(super) fn fwd(
        f: &FlashAttn,
        t: [(&CudaStorage, &Layout); 3],
        dtype: DType,
        dm: Dims,
    ) -> Result<(CudaStorage, Tensor)> {
        let dev = t[0].0.device();
        let ft = tile(dm.d)?;
        let out = cuda::zeros(dev, dtype, dm.b * dm.sq * dm.h * dm.d)?;
        let lse = cuda::zeros(dev, DType::F32, dm.b * dm.sq * dm.h)?;
        if dm.b * dm.sq * dm.h * dm.d > 0 {
            let mut ints = Vec::with_capacity(24);
            t.iter().for_each(|(_, l)| view(l, &mut ints));
            shape_ints(f, dm, ft, &mut ints);
            launch(
                dev,
                &ATTENTION,
                &format!("flash_fwd_{}", suffix(dtype)?),
                grid(dm.sq, dm.h, dm.b, 2 * ft * dm.d)?,
                &[t[0].0, t[1].0, t[2].0, &out, &lse],
                &ints,
                &[f.scale],
            )?;
        }
        Ok((out, cuda::tensor(lse, (dm.b, dm.sq, dm.h))))
    }

    /// (dq, dk, dv) from the guards of (q, k, v, out, dout, lse): `flash_bwd_dq` (which also
    /// writes delta = Σ out·dout per row, b·sq·h f32), then `flash_bwd_dkv`.
    pub(super) fn bwd(
        f: &FlashAttn,
        gs: &[(StorageRef<'_>, &Layout)],
        dtype: DType,
        dm: Dims,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let t = gs.iter().map(cuda::storage).collect::<Result<Vec<_>>>()?;
        let dev = t[0].0.device();
        let ft = tile(dm.d)?;
        let (nq, nk) = (dm.b * dm.h * dm.sq * dm.d, dm.b * dm.kvh * dm.sk * dm.d);
        let dq = cuda::zeros(dev, dtype, nq)?;
        let dk = cuda::zeros(dev, dtype, nk)?;
        let dv = cuda::zeros(dev, dtype, nk)?;
        let delta = cuda::zeros(dev, DType::F32, dm.b * dm.sq * dm.h)?;
        let sfx = suffix(dtype)?;
        if nq > 0 && nk > 0 {
            let mut ints = Vec::with_capacity(34);
            t[..5].iter().for_each(|(_, l)| view(l, &mut ints));
            shape_ints(f, dm, ft, &mut ints);
            launch(
                dev,
                &ATTENTION,
                &format!("flash_bwd_dq_{sfx}"),
                grid(dm.sq, dm.h, dm.b, 2 * ft * dm.d)?,
                &[t[0].0, t[1].0, t[2].0, t[3].0, t[4].0, t[5].0, &dq, &delta],
                &ints,
                &[f.scale],
            )?;
            let mut ints = Vec::with_capacity(29);
            [0, 1, 2, 4].iter().for_each(|&i| view(t[i].1, &mut ints));
            shape_ints(f, dm, ft, &mut ints);
            launch(
                dev,
                &ATTENTION,
                &format!("flash_bwd_dkv_{sfx}"),
                grid(dm.sk, dm.kvh, dm.b, 2 * ft * dm.d + 2 * ft)?,
                &[t[0].0, t[1].0, t[2].0, t[4].0, t[5].0, &delta, &dk, &dv],
                &ints,
                &[f.scale],
            )?;
        }
        let kd = (dm.b, dm.kvh, dm.sk, dm.d);
        Ok((
            cuda::tensor(dq, (dm.b, dm.h, dm.sq, dm.d)),
            cuda::tensor(dk, kd),
            cuda::tensor(dv, kd),
        ))
    }
}

/// Attention softmax(q·kᵀ·scale + mask)·v without materializing the scores.
///
/// q: (b, h, sq, d); k, v: (b, kvh, sk, d) with h a multiple of kvh (GQA); any strides. Returns
/// (b, sq, h, d), contiguous, so `reshape((b, sq, h·d))` is free. f32, bf16 or f16 (computed in
/// f32). The gradient flows to q, k and v.
pub fn flash_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    mask: AttnMask,
) -> Result<Tensor> {
    q.apply_op3(
        k,
        v,
        FlashAttn {
            scale,
            mask,
            lse: OnceLock::new(),
        },
    )
}
