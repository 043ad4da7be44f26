//! Generation rows (SDXL): estimates and their constants.
use super::*;

#[test]
fn sdxl_pipeline_rows_are_generation_estimates() {
    let r = report(&[]);
    // fp16 with the VAE decoding in f32 (the SDXL pipeline's force_upcast): the weights are
    // the published counts at 2 and 4 bytes; 4 images of 1024x1024 with CFG.
    let fp16 = terms(&r, "hf-blog-sdxl-fp16-sdpa-b4");
    assert_eq!(term(&fp16, "unet"), 2 * SDXL_UNET);
    assert_eq!(term(&fp16, "text_encoder"), 2 * SDXL_TE);
    assert_eq!(term(&fp16, "text_encoder_2"), 2 * SDXL_TE2);
    assert_eq!(term(&fp16, "vae"), 4 * SDXL_VAE);
    assert_eq!(term(&fp16, "decoded images"), 4 * 3 * 1024 * 1024 * 4);
    // The peak is the full decode, whose activations are at least one f32 feature map of the
    // decoder's output width (128 channels) per output pixel of the 4 images.
    assert!(term(&fp16, "vae_decode activations") >= 4 * 1024 * 1024 * 128 * 4);
    // max_memory_allocated counts no context.
    assert!(!fp16.iter().any(|t| t.0 == "CUDA context"));
    // fp32: the same tensors at 4 bytes; the decode is f32 either way.
    let fp32 = terms(&r, "hf-blog-sdxl-fp32-eager-b4");
    assert_eq!(term(&fp32, "unet"), 4 * SDXL_UNET);
    assert_eq!(
        term(&fp32, "vae_decode activations"),
        term(&fp16, "vae_decode activations")
    );
    // Slicing decodes one image at a time: fewer activations than the 4 at once.
    let sliced = terms(&r, "hf-blog-sdxl-fp16-sdpa-vae-slicing-b4");
    if let Some(a) = sliced.iter().find(|t| t.0 == "vae_decode activations") {
        assert!(a.1 < term(&fp16, "vae_decode activations"), "{sliced:?}");
    }
    assert!(
        estimate(&r, "hf-blog-sdxl-fp16-sdpa-vae-slicing-b4")
            < estimate(&r, "hf-blog-sdxl-fp16-sdpa-b4")
    );
    // What the estimator does not model is listed with its reason.
    for (id, why) in [
        ("hf-blog-sdxl-fp16-sdpa-model-offload-b4", "offloading"),
        (
            "hf-blog-sdxl-fp16-sdpa-tiny-autoencoder-b4",
            "Tiny AutoEncoder",
        ),
        ("hf-blog-sdxl-fp16-sdpa-torchcompile-b4", "torch.compile"),
    ] {
        assert_eq!(row(&r, id)["kind"], "not_expressible");
        assert!(
            row(&r, id)["reason"].as_str().unwrap().contains(why),
            "{id}"
        );
    }
}

/// Without --constants the generation rows use the torch runtime's built-in reference
/// constants (named in the report), and --constants of another architecture leave them to it.
#[test]
fn generation_rows_name_their_constants() {
    use vramlab::terms::generation::GenTerm;
    let r = report(&[]);
    let estimator = r["estimator"].as_str().unwrap();
    assert!(
        estimator.contains("results/cpu/torch-cpu-sd15.constants.toml"),
        "{estimator}"
    );
    // The reference's full-decode coefficient, from the committed file: the decode's
    // activations are its vae_act × images × output pixels × 128 channels × 4 bytes, plus its
    // const, for the 4 f32 images of 1024x1024.
    let text =
        std::fs::read_to_string(root().join("results/cpu/torch-cpu-sd15.constants.toml")).unwrap();
    let c = vramlab::fit::Constants::parse(Path::new("reference"), &text).unwrap();
    let g = c
        .generation
        .iter()
        .find(|g| {
            g.key.phase == vramlab::vocab::Phase::VaeDecode
                && g.key.vae_decode == Some(vramlab::vocab::VaeDecode::Full)
        })
        .unwrap();
    let x = (4u64 * 1024 * 1024 * 128 * 4) as f64;
    let predicted = g
        .coefficients()
        .iter()
        .map(|f| f[GenTerm::VaeAct.index()] * x + f[GenTerm::Const.index()])
        .fold(0.0, f64::max);
    let act = term(
        &terms(&r, "hf-blog-sdxl-fp16-sdpa-b4"),
        "vae_decode activations",
    ) as f64;
    assert!(
        (act - predicted.round()).abs() <= 1.0,
        "{act} vs {predicted}"
    );
}
