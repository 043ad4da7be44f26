//! The GPUs `vramlab emulate --gpu` presents: each with the figures the CUDA runtime reports
//! for it, and where each figure comes from (docs/src/reference/gpu-catalogue.md lists the
//! sources in full). Memory is `cudaDeviceProp::totalGlobalMem` as deviceQuery prints it: it
//! varies a little with the driver and ECC, so the catalogue takes the published reading, and
//! where two readings disagree, the smaller (the emulated device then runs out first, never
//! later).

/// One catalogued GPU, as the stub runtime presents it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// The `--gpu` name.
    pub key: String,
    /// The name CUDA reports (`torch.cuda.get_device_name`).
    pub name: String,
    /// `totalGlobalMem`, bytes.
    pub total_bytes: u64,
    pub compute_capability: (u32, u32),
    pub sms: u32,
    pub l2_bytes: u64,
    /// `sharedMemPerBlockOptin`, bytes (the default per block is 48 KiB on all of them).
    pub smem_optin: u64,
    /// Where the figures come from.
    pub source: String,
}

/// The bytes a CUDA context and its loaded modules hold on the device before the program
/// allocates anything: 426 MiB, measured by `torch.cuda.mem_get_info` on an RTX 6000 Ada with
/// PyTorch 2.10+cu130 and lazy module loading (github.com/unslothai/unsloth-zoo/pull/1053).
/// The same figure for every GPU until a device session measures each; it is in NVML's "used",
/// not in PyTorch's reserved, and the emulated device's usable memory is its total less this.
pub const CONTEXT_BYTES: u64 = 426 << 20;

/// Where [`CONTEXT_BYTES`] comes from, for reports.
pub const CONTEXT_SOURCE: &str =
    "426 MiB: torch.cuda context with lazy loading, RTX 6000 Ada, PyTorch 2.10+cu130 \
     (github.com/unslothai/unsloth-zoo/pull/1053); not measured on the emulated GPU";

struct Entry {
    key: &'static str,
    name: &'static str,
    total: u64,
    cc: (u32, u32),
    sms: u32,
    l2: u64,
    source: &'static str,
}

const ENTRIES: &[Entry] = &[
    Entry {
        key: "h200",
        name: "NVIDIA H200",
        // PyTorch's total_memory of 143156 MiB (to the MiB; no deviceQuery byte count found).
        total: 143_156 << 20,
        cc: (9, 0),
        sms: 132,
        l2: 60 << 20,
        source: "memory, SMs, L2: PyTorch device properties in github.com/ai-bot-pro/achatbot \
                 deploy/modal/src/llm/vllm/vlm/skywork_r1v.py (143156 MiB, 132 SMs, 60 MB L2; \
                 XLA's h200.txtpb says 50 MiB L2); name: github.com/NVIDIA/cuda-samples/issues/311",
    },
    Entry {
        key: "h100-80gb",
        name: "NVIDIA H100 80GB HBM3",
        total: 85_045_477_376,
        cc: (9, 0),
        sms: 132,
        l2: 50 << 20,
        source: "deviceQuery H100SXMx8_deviceQuery.py (driver 12.7, runtime 12.4), \
                 github.com/thamada/nvidia-smi; XLA h100_sxm.txtpb",
    },
    Entry {
        key: "h100-pcie",
        name: "NVIDIA H100 PCIe",
        total: 84_942_979_072,
        cc: (9, 0),
        sms: 114,
        l2: 50 << 20,
        source: "XLA h100_pcie.txtpb (device_memory_size; nvaccelinfo reads 85,045,477,376)",
    },
    Entry {
        key: "a100-80gb",
        name: "NVIDIA A100-SXM4-80GB",
        total: 85_100_068_864,
        cc: (8, 0),
        sms: 108,
        l2: 40 << 20,
        source: "deviceQuery A100SXMx4_deviceQuery.py (driver 12.5, runtime 12.4), \
                 github.com/thamada/nvidia-smi; XLA a100_sxm_80.txtpb",
    },
    Entry {
        key: "a100-40gb",
        name: "NVIDIA A100-SXM4-40GB",
        total: 42_298_834_944,
        cc: (8, 0),
        sms: 108,
        l2: 40 << 20,
        source: "deviceQuery in github.com/bottlerocket-os/bottlerocket/pull/3873 \
                 (driver 12.2, runtime 11.4); XLA a100_sxm_40.txtpb",
    },
    Entry {
        key: "l40s",
        name: "NVIDIA L40S",
        total: 47_803_596_800,
        cc: (8, 9),
        sms: 142,
        l2: 96 << 20,
        source: "deviceQuery L40S_deviceQuery.py (driver 12.4, runtime 12.4), \
                 github.com/thamada/nvidia-smi",
    },
    Entry {
        key: "l4",
        name: "NVIDIA L4",
        total: 23_570_219_008,
        cc: (8, 9),
        sms: 58,
        l2: 48 << 20,
        source: "deviceQuery L4_deviceQuery.py (driver 12.4, runtime 11.8), \
                 github.com/thamada/nvidia-smi",
    },
    Entry {
        key: "rtx-4090",
        name: "NVIDIA GeForce RTX 4090",
        total: 25_386_352_640,
        cc: (8, 9),
        sms: 128,
        l2: 72 << 20,
        source: "deviceQuery RTX4090_deviceQuery.py (driver 12.4, runtime 12.4, no display), \
                 github.com/thamada/nvidia-smi",
    },
    Entry {
        key: "rtx-3090",
        name: "NVIDIA GeForce RTX 3090",
        total: 25_327_697_920,
        cc: (8, 6),
        sms: 82,
        l2: 6 << 20,
        source: "deviceQuery RTX3090_deviceQuery.py (driver 12.6, runtime 12.4), \
                 github.com/thamada/nvidia-smi",
    },
    Entry {
        key: "v100-16gb",
        name: "Tesla V100-PCIE-16GB",
        total: 16_928_342_016,
        cc: (7, 0),
        sms: 80,
        l2: 6 << 20,
        source: "mt4g report, github.com/caps-tum/mt4g sample_results/Tesla V100-PCIE-16GB; \
                 XLA v100.txtpb",
    },
    Entry {
        key: "v100-32gb",
        name: "Tesla V100-PCIE-32GB",
        total: 34_079_899_648,
        cc: (7, 0),
        sms: 80,
        l2: 6 << 20,
        source: "nvaccelinfo (driver 535.171.04, CUDA 12.2), github.com/oliatsm/cnn-cifar10_0 \
                 Notes/7-CPU-GPU.md",
    },
];

fn gpu(e: &Entry) -> Gpu {
    Gpu {
        key: e.key.into(),
        name: e.name.into(),
        total_bytes: e.total,
        compute_capability: e.cc,
        sms: e.sms,
        l2_bytes: e.l2,
        smem_optin: smem_optin(e.cc),
        source: e.source.into(),
    }
}

/// `sharedMemPerBlockOptin` by architecture (XLA's device specs; the CUDA programming guide's
/// compute-capability table).
fn smem_optin(cc: (u32, u32)) -> u64 {
    match cc {
        (9, _) => 232_448,
        (8, 0) => 166_912,
        (8, _) => 101_376,
        _ => 98_304,
    }
}

/// Shared memory per multiprocessor by architecture (the same sources).
pub fn smem_per_sm(cc: (u32, u32)) -> u64 {
    match cc {
        (9, _) => 233_472,
        (8, 0) => 167_936,
        (8, _) => 102_400,
        _ => 98_304,
    }
}

/// Resident threads per multiprocessor by architecture.
pub fn threads_per_sm(cc: (u32, u32)) -> u32 {
    match cc {
        (8, 6) | (8, 9) => 1536,
        _ => 2048,
    }
}

/// The `--gpu` names, in catalogue order.
pub fn names() -> Vec<&'static str> {
    ENTRIES.iter().map(|e| e.key).collect()
}

/// A catalogued GPU by its `--gpu` name (case-insensitive).
pub fn by_name(key: &str) -> Option<Gpu> {
    let k = key.to_ascii_lowercase();
    ENTRIES.iter().find(|e| e.key == k).map(gpu)
}

/// The catalogued GPU a published row names in words ("NVIDIA Tesla V100-SXM2 16GB",
/// "A100-80GB"): the entry whose family (the key before its first `-`) is a word of the text,
/// and whose memory (the key's `NNgb`) appears in it where the family has several sizes.
pub fn from_words(text: &str) -> Option<Gpu> {
    let lower = text.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let family = |key: &str| {
        let f = key.strip_prefix("rtx-").unwrap_or(key);
        f.split('-').next().unwrap_or(f).to_string()
    };
    let candidates: Vec<&Entry> = ENTRIES
        .iter()
        .filter(|e| words.contains(&family(e.key).as_str()))
        .collect();
    let sized = candidates.iter().find(|e| {
        e.key
            .rsplit('-')
            .next()
            .is_some_and(|size| size.ends_with("gb") && words.contains(&size))
            || e.key.ends_with("-pcie") && words.contains(&"pcie")
    });
    sized.or(candidates.first()).map(|e| gpu(e))
}

/// The device `--gpu` and `--gpu-memory` describe: a catalogued GPU, its memory overridden by
/// `--gpu-memory` where both are given, or an H100-80GB-like device of that memory alone.
pub fn resolve(key: Option<&str>, memory: Option<u64>) -> Result<Gpu, String> {
    let mut g = match key {
        Some(k) => by_name(k).ok_or_else(|| {
            format!(
                "unknown GPU `{k}` (known: {}; or --gpu-memory SIZE)",
                names().join(", ")
            )
        })?,
        None => {
            let m = memory.ok_or("give --gpu NAME or --gpu-memory SIZE")?;
            let mut g = by_name("h100-80gb").expect("catalogued");
            g.key = "custom".into();
            g.name = format!("Custom GPU ({})", crate::units::human(m));
            g.source = "--gpu-memory; otherwise the h100-80gb entry".into();
            g
        }
    };
    if let Some(m) = memory {
        if m <= CONTEXT_BYTES {
            return Err(format!(
                "--gpu-memory {} leaves nothing after the CUDA context's {}",
                crate::units::human(m),
                crate::units::human(CONTEXT_BYTES)
            ));
        }
        g.total_bytes = m;
    }
    Ok(g)
}

impl Gpu {
    /// The bytes `cudaMalloc` may hold: the total less the context and modules.
    pub fn usable_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(CONTEXT_BYTES)
    }

    /// The device name rows carry: never mistaken for a measured GPU.
    pub fn row_name(&self) -> String {
        format!("{} (emulated)", self.name)
    }

    /// The environment the stub runtime reads.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let cc = self.compute_capability;
        vec![
            ("VRAMLAB_EMU_NAME", self.name.clone()),
            ("VRAMLAB_EMU_TOTAL", self.total_bytes.to_string()),
            ("VRAMLAB_EMU_CONTEXT", CONTEXT_BYTES.to_string()),
            ("VRAMLAB_EMU_CC_MAJOR", cc.0.to_string()),
            ("VRAMLAB_EMU_CC_MINOR", cc.1.to_string()),
            ("VRAMLAB_EMU_SMS", self.sms.to_string()),
            ("VRAMLAB_EMU_L2", self.l2_bytes.to_string()),
            ("VRAMLAB_EMU_SMEM_OPTIN", self.smem_optin.to_string()),
            ("VRAMLAB_EMU_SMEM_PER_SM", smem_per_sm(cc).to_string()),
            ("VRAMLAB_EMU_THREADS_PER_SM", threads_per_sm(cc).to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_resolves_and_fits_its_marketed_class() {
        for k in names() {
            let g = by_name(k).unwrap();
            assert_eq!(g.key, k);
            assert!(g.usable_bytes() > 0 && g.usable_bytes() < g.total_bytes);
            // The reported memory is below the marketed size in GB, and within 15% of it.
            let marketed: u64 = match k {
                "h200" => 141,
                "l4" | "rtx-4090" | "rtx-3090" => 24,
                "l40s" => 48,
                "a100-40gb" => 40,
                "v100-16gb" => 16,
                "v100-32gb" => 32,
                _ => 80,
            } * 1_000_000_000;
            let gib = marketed as f64 / 1e9 * (1u64 << 30) as f64;
            assert!((g.total_bytes as f64) <= gib * 1.0001, "{k}");
            assert!(g.total_bytes as f64 > marketed as f64 * 0.85, "{k}");
        }
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
}
