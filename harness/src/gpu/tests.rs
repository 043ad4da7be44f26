use super::*;

#[test]
fn every_entry_resolves_and_fits_its_marketed_class() {
    for k in names() {
        let g = by_name(k).unwrap();
        assert_eq!(g.key, k);
        assert!(g.usable_bytes() > 0 && g.usable_bytes() < g.total_bytes);
        // The reported memory is below the marketed size in GiB, and within 15% of it in GB.
        let marketed = g.marketed_gb * 1_000_000_000;
        let gib = (g.marketed_gb << 30) as f64;
        assert!((g.total_bytes as f64) <= gib * 1.0001, "{k}");
        assert!(g.total_bytes as f64 > marketed as f64 * 0.85, "{k}");
        // Every name a GPU answers to finds that GPU, and no other's.
        for n in aliases(k)
            .into_iter()
            .chain([g.label.as_str(), g.name.as_str()])
        {
            assert_eq!(by_name(n).map(|g| g.key), Some(k.to_string()), "{n}");
        }
    }
}

#[test]
fn the_names_people_type() {
    for (typed, key) in [
        ("rtx4090", "rtx-4090"),
        ("RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("h100-80", "h100-80gb"),
        ("H100", "h100-80gb"),
        ("a100-40", "a100-40gb"),
        ("A100_80GB", "a100-80gb"),
        ("v100-32", "v100-32gb"),
        ("rtx6000-ada", "rtx-6000-ada"),
    ] {
        assert_eq!(
            by_name(typed).map(|g| g.key),
            Some(key.to_string()),
            "{typed}"
        );
    }
    for unknown in ["a100", "toaster", "", "--"] {
        assert!(by_name(unknown).is_none(), "{unknown}");
    }
    assert_eq!(
        name_or_size("l4"),
        Some(("l4".into(), by_name("l4").unwrap().total_bytes))
    );
    assert_eq!(name_or_size("48gb").unwrap().1, 48_000_000_000);
    assert!(name_or_size("18446744074gb").is_none());
}

#[test]
fn classes_judge_by_their_smallest_member() {
    let c24 = classes().iter().find(|c| c.gb == 24).unwrap();
    let members: Vec<u64> = all()
        .iter()
        .filter(|g| g.marketed_gb == 24)
        .map(|g| g.total_bytes)
        .collect();
    assert_eq!(c24.bytes, *members.iter().min().unwrap());
    assert!(members.len() >= 3);
    let just = budget(c24.bytes, 0.1);
    assert_eq!(smallest_class(just, 0.1).unwrap().gb, 24);
    assert!(smallest_class(just + 1, 0.1).unwrap().gb > 24);
    assert!(smallest_class(u64::MAX, 0.1).is_none());
    let sizes: Vec<u64> = classes().iter().map(|c| c.gb).collect();
    assert!(sizes.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn shared_memory_opt_in_is_the_published_figure() {
    // cudaDeviceProp::sharedMemPerBlockOptin as deviceQuery prints it per architecture.
    for (cc, optin) in [
        ((7, 0), 98_304),
        ((8, 0), 166_912),
        ((8, 6), 101_376),
        ((8, 9), 101_376),
        ((9, 0), 232_448),
    ] {
        assert_eq!(smem_optin(cc), optin, "{cc:?}");
    }
}

#[test]
fn an_amd_gpu_is_estimated_never_emulated() {
    assert_eq!(by_name("mi300x").unwrap().vendor, Vendor::Amd);
    assert!(resolve(Some("mi300x"), None)
        .unwrap_err()
        .contains("AMD GPU"));
}

#[test]
fn gpu_memory_overrides_or_describes_a_custom_device() {
    let g = resolve(Some("a100-40gb"), Some(8 << 30)).unwrap();
    assert_eq!((g.total_bytes, g.compute_capability), (8 << 30, (8, 0)));
    let c = resolve(None, Some(4 << 30)).unwrap();
    assert_eq!(c.total_bytes, 4 << 30);
    assert!(c.name.starts_with("Custom GPU"));
    assert!(resolve(Some("tpu-v5"), None)
        .unwrap_err()
        .contains("unknown GPU `tpu-v5`"));
    assert!(resolve(None, None).is_err());
    assert!(resolve(None, Some(CONTEXT_BYTES)).is_err());
}
