//! Wan's VAE: the causal conv3d against a naive loop, the chunked decode, the decoder's peak over frames.
use super::*;

pub(super) fn decoder_shapes(c: &WanVaeConfig) -> Shapes {
    record(|vb| WanDecoder::new(c, vb).map(|_| ()))
}

pub(super) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    common::max_abs_diff(a, b)
}

/// The causal conv3d equals a naive f64 loop over a zero-padded sequence (2 frames in front,
/// 1 pixel around), whole and in chunks through the cache.
pub(super) fn conv3d_reference() {
    let (b, i, o, t, h, w) = (2, 3, 4, 5, 6, 5);
    let shapes: Shapes = vec![
        ("weight".into(), vec![o, i, 3, 3, 3]),
        ("bias".into(), vec![o]),
    ];
    let vb = random(&shapes);
    let conv = CausalConv3d::new(i, o, 3, 3, 1, vb.clone()).unwrap();
    let x = Tensor::randn(0f32, 1.0, (b, i, t, h, w), &Device::Cpu).unwrap();
    let (y, cache) = conv.forward(&x, None).unwrap();
    assert_eq!(y.dims(), &[b, o, t, h, w]);
    assert_eq!(cache.unwrap().dims(), &[b, i, 2, h, w]);

    let wt: Vec<f32> = vb
        .get((o, i, 3, 3, 3), "weight")
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let bias: Vec<f32> = vb.get(o, "bias").unwrap().to_vec1().unwrap();
    let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    let ys: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
    let xat = |bb: usize, c: usize, f: isize, yy: isize, xx: isize| -> f64 {
        if f < 0 || yy < 0 || xx < 0 || yy >= h as isize || xx >= w as isize {
            return 0.0;
        }
        let (f, yy, xx) = (f as usize, yy as usize, xx as usize);
        xs[(((bb * i + c) * t + f) * h + yy) * w + xx] as f64
    };
    let mut worst = 0f64;
    for bb in 0..b {
        for oc in 0..o {
            for f in 0..t {
                for yy in 0..h {
                    for xx in 0..w {
                        let mut s = bias[oc] as f64;
                        for c in 0..i {
                            for kt in 0..3 {
                                for ky in 0..3 {
                                    for kx in 0..3 {
                                        let wv = wt[(((oc * i + c) * 3 + kt) * 3 + ky) * 3 + kx];
                                        s += wv as f64
                                            * xat(
                                                bb,
                                                c,
                                                f as isize + kt as isize - 2,
                                                yy as isize + ky as isize - 1,
                                                xx as isize + kx as isize - 1,
                                            );
                                    }
                                }
                            }
                        }
                        let got = ys[(((bb * o + oc) * t + f) * h + yy) * w + xx] as f64;
                        worst = worst.max((got - s).abs());
                    }
                }
            }
        }
    }
    println!("conv3d vs f64 loop: max diff {worst:e}");
    assert!(worst <= 1e-5, "conv3d vs reference: {worst}");

    // In chunks of 1, 1, 3 frames through the cache: the same output.
    let mut cache = FeatCache::default();
    let mut parts = Vec::new();
    let mut at = 0;
    for n in [1, 1, 3] {
        cache.start_chunk();
        parts.push(cache.conv(&conv, &x.narrow(2, at, n).unwrap()).unwrap());
        at += n;
    }
    let chunked = Tensor::cat(&parts, 2).unwrap();
    let d = max_diff(&chunked, &y);
    println!("conv3d chunked vs whole: max diff {d:e}");
    assert!(d <= 1e-5, "chunked conv3d: {d}");
}

/// The built decoder has the parameters counted from the config (tiny and the real Wan2.1).
pub(super) fn decoder_params() {
    for c in [common::tiny_vae(), WanConfig::t2v_1_3b().vae] {
        let built = count(&decoder_shapes(&c));
        assert_eq!(built, wan::vae_decoder_params(&c), "{c:?}");
    }
    let real = WanConfig::t2v_1_3b().vae;
    assert_eq!(
        wan::vae_encoder_params(&real) + count(&decoder_shapes(&real)),
        wan::vae_params(&real)
    );
    println!("decoder parameters: ok");
}

/// One latent frame per chunk (Wan's decode) equals a first chunk of one frame and a second of
/// all the rest; the feature cache holds what the estimator counts.
pub(super) fn chunked_decode(dec: &WanDecoder, c: &WanVaeConfig) {
    let (h, w, t) = (4, 6, 4);
    let z = Tensor::randn(0f32, 1.0, (1, c.z_dim, t, h, w), &Device::Cpu).unwrap();
    let per_frame = dec.decode(&z).unwrap();
    let s = c.spatial_factor();
    assert_eq!(per_frame.dims(), &[1, 3, dec.frames(t), h * s, w * s]);
    let two = dec.decode_chunks(&z, &[1, t - 1]).unwrap();
    let d = max_diff(&per_frame, &two);
    println!("decode per frame vs two chunks: max diff {d:e}");
    assert!(d <= 1e-5, "two-chunk decode: {d}");

    // After three chunks every causal convolution holds 2 frames of its input.
    let mut cache = FeatCache::default();
    for i in 0..3 {
        dec.decode_chunk(&z.narrow(2, i, 1).unwrap(), &mut cache)
            .unwrap();
    }
    let want = c.decoder_cache_per_latent_pixel() as usize * h * w * 4;
    assert_eq!(cache.bytes(), want, "feature cache bytes");
    println!("feature cache: {want} bytes, as counted from the config");
}

/// The decode's peak minus its output is the same for 9, 13 and 17 frames (it stops growing
/// once the caches are full, from the third chunk on), lower at 5 frames by less than the
/// cache; the output is exactly frames × 3 × H × W × 4 bytes.
pub(super) fn decode_peak_flat(dec: &WanDecoder, c: &WanVaeConfig) {
    let mut meter = CpuMeter::new();
    let (h, w) = (8, 8);
    let s = c.spatial_factor();
    let z = |t: usize| Tensor::randn(0f32, 1.0, (1, c.z_dim, t, h, w), &Device::Cpu).unwrap();
    // Warm-up: candle's gemm keeps per-thread buffers; the first run carries them.
    drop(dec.decode(&z(2)).unwrap());
    let mut rest = Vec::new();
    for frames in [5usize, 9, 13, 17] {
        let zt = z((frames - 1) / 4 + 1);
        let (out, m, _) = vramlab::meter::measure(&mut meter, || Ok(dec.decode(&zt)?)).unwrap();
        let out_bytes = (frames * 3 * h * s * w * s * 4) as u64;
        assert_eq!(out.dims(), &[1, 3, frames, h * s, w * s]);
        assert_eq!(
            (out.elem_count() * out.dtype().size_in_bytes()) as u64,
            out_bytes
        );
        let kept = m.end_allocated - m.baseline_allocated;
        assert!(
            kept >= out_bytes && kept - out_bytes < 1024,
            "{frames} frames: the decode keeps {kept}, the output is {out_bytes}"
        );
        let act = (m.peak_allocated - m.baseline_allocated) as f64 - out_bytes as f64;
        println!("{frames} frames: peak − output {act}");
        rest.push(act);
    }
    // From the third chunk (9 frames) on, every cache holds 2 frames: the peak is flat.
    for r in &rest[2..] {
        let err = (r - rest[1]).abs() / rest[1];
        assert!(err <= 0.01, "peak − output by frames {rest:?}");
    }
    // The second chunk (5 frames) runs with caches the first chunk filled with 1 frame: its
    // peak is lower, by less than the full cache.
    let cache = (c.decoder_cache_per_latent_pixel() as usize * h * w * 4) as f64;
    assert!(
        rest[0] <= rest[1] && rest[1] - rest[0] <= cache,
        "peak − output by frames {rest:?}, cache {cache}"
    );
}
