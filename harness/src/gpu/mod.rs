//! The GPU catalogue: one table of the GPUs vramlab knows, with every name people type for
//! them. `estimate --gpu` judges against these bytes, and `vramlab emulate --gpu` and
//! `estimate --emulate` present the same GPUs through the stub CUDA runtime, so both verdicts
//! use one capacity. `vramlab gpus` prints the table (docs/src/reference/gpu-catalogue.md is
//! generated from it, with the sources in full). Memory is `cudaDeviceProp::totalGlobalMem` as
//! deviceQuery prints it: it varies a little with the driver and ECC, so the catalogue takes the
//! published reading, and where two readings disagree, the smaller (the emulated device then
//! runs out first, never later).

/// Who makes a GPU: the stub runtime presents NVIDIA's (CUDA) only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Nvidia,
    Amd,
}

/// One catalogued GPU, as the stub runtime presents it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// The `--gpu` name.
    pub key: String,
    /// The product as people write it ("RTX 4090").
    pub label: String,
    /// The memory size it is sold with, GB: the class it is listed under.
    pub marketed_gb: u64,
    /// The name CUDA reports (`torch.cuda.get_device_name`).
    pub name: String,
    pub vendor: Vendor,
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
    /// Other names it answers to (beyond the key, the label and CUDA's name, each compared
    /// without case, spaces, dashes or a vendor word).
    aliases: &'static [&'static str],
    label: &'static str,
    marketed_gb: u64,
    name: &'static str,
    vendor: Vendor,
    total: u64,
    cc: (u32, u32),
    sms: u32,
    l2: u64,
    source: &'static str,
}

const ENTRIES: &[Entry] = &[
    Entry {
        key: "mi300x",
        aliases: &[],
        label: "MI300X",
        marketed_gb: 192,
        name: "AMD Instinct MI300X",
        vendor: Vendor::Amd,
        total: 206_141_652_992,
        cc: (9, 4),
        sms: 304,
        l2: 4 << 20,
        source: "rocm-smi VRAM Total Memory and hipDeviceProp totalGlobalMem on bare metal (an SR-IOV VF \
                 reads 205,822,885,888); CUs and L2: caps-tum/mt4g MI300X VF report (ROCm 6.4). \
                 An AMD GPU: estimated, never emulated (the stub runtime is CUDA's)",
    },
    Entry {
        key: "b200",
        aliases: &[],
        label: "B200",
        marketed_gb: 180,
        name: "NVIDIA B200",
        vendor: Vendor::Nvidia,
        total: 191_514_411_008,
        cc: (10, 0),
        sms: 148,
        l2: 132_644_864,
        source: "XLA b200.txtpb (device_memory_size, core_count, l2_cache_size; driver 13.0, runtime 12.8); \
                 PyTorch reads 182642 MiB (the same bytes)",
    },
    Entry {
        key: "h200",
        aliases: &[],
        label: "H200",
        marketed_gb: 141,
        name: "NVIDIA H200",
        vendor: Vendor::Nvidia,
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
        key: "gh200",
        aliases: &["gh200-480gb", "gh200-120gb"],
        label: "GH200",
        marketed_gb: 96,
        name: "NVIDIA GH200 120GB",
        vendor: Vendor::Nvidia,
        total: 101_468_602_368,
        cc: (9, 0),
        sms: 132,
        l2: 60 << 20,
        source: "deviceQuery of a GH200 120GB (driver 12.9, runtime 12.9; the 480GB board reads \
                 102,005,473,280)",
    },
    Entry {
        key: "h100-80gb",
        aliases: &["h100", "h100-sxm", "h100-sxm5"],
        label: "H100-80GB",
        marketed_gb: 80,
        name: "NVIDIA H100 80GB HBM3",
        vendor: Vendor::Nvidia,
        total: 85_045_477_376,
        cc: (9, 0),
        sms: 132,
        l2: 50 << 20,
        source: "deviceQuery H100SXMx8_deviceQuery.py (driver 12.7, runtime 12.4), \
                 github.com/thamada/nvidia-smi; XLA h100_sxm.txtpb",
    },
    Entry {
        key: "h100-pcie",
        aliases: &[],
        label: "H100 PCIe",
        marketed_gb: 80,
        name: "NVIDIA H100 PCIe",
        vendor: Vendor::Nvidia,
        total: 84_942_979_072,
        cc: (9, 0),
        sms: 114,
        l2: 50 << 20,
        source: "XLA h100_pcie.txtpb (device_memory_size; nvaccelinfo reads 85,045,477,376)",
    },
    Entry {
        key: "h100-nvl",
        aliases: &[],
        label: "H100 NVL",
        marketed_gb: 94,
        name: "NVIDIA H100 NVL",
        vendor: Vendor::Nvidia,
        total: 99_861_594_112,
        cc: (9, 0),
        sms: 132,
        l2: 60 << 20,
        source: "deviceQuery H100NVLx2_deviceQuery.py (driver 12.4, runtime 12.4, ECC on), \
                 github.com/thamada/nvidia-smi; caps-tum/mt4g reads 99,960,750,080 (driver 12.8)",
    },
    Entry {
        key: "a100-80gb",
        aliases: &["a100-sxm4-80gb"],
        label: "A100-80GB",
        marketed_gb: 80,
        name: "NVIDIA A100-SXM4-80GB",
        vendor: Vendor::Nvidia,
        total: 85_100_068_864,
        cc: (8, 0),
        sms: 108,
        l2: 40 << 20,
        source: "deviceQuery A100SXMx4_deviceQuery.py (driver 12.5, runtime 12.4), \
                 github.com/thamada/nvidia-smi; XLA a100_sxm_80.txtpb",
    },
    Entry {
        key: "a100-40gb",
        aliases: &["a100-sxm4-40gb"],
        label: "A100-40GB",
        marketed_gb: 40,
        name: "NVIDIA A100-SXM4-40GB",
        vendor: Vendor::Nvidia,
        total: 42_298_834_944,
        cc: (8, 0),
        sms: 108,
        l2: 40 << 20,
        source: "deviceQuery in github.com/bottlerocket-os/bottlerocket/pull/3873 \
                 (driver 12.2, runtime 11.4); XLA a100_sxm_40.txtpb",
    },
    Entry {
        key: "l40s",
        aliases: &[],
        label: "L40S",
        marketed_gb: 48,
        name: "NVIDIA L40S",
        vendor: Vendor::Nvidia,
        total: 47_803_596_800,
        cc: (8, 9),
        sms: 142,
        l2: 96 << 20,
        source: "deviceQuery L40S_deviceQuery.py (driver 12.4, runtime 12.4), \
                 github.com/thamada/nvidia-smi",
    },
    Entry {
        key: "rtx-6000-ada",
        aliases: &["rtx6000-ada", "rtx-6000-ada-generation"],
        label: "RTX 6000 Ada",
        marketed_gb: 48,
        name: "NVIDIA RTX 6000 Ada Generation",
        vendor: Vendor::Nvidia,
        total: 51_002_867_712,
        cc: (8, 9),
        sms: 142,
        l2: 96 << 20,
        source: "deviceQuery RTX6000Ada_x8_deviceQuery.py (driver 12.4, runtime 12.4, ECC off), \
                 github.com/thamada/nvidia-smi",
    },
    Entry {
        key: "a6000",
        aliases: &["rtx-a6000"],
        label: "RTX A6000",
        marketed_gb: 48,
        name: "NVIDIA RTX A6000",
        vendor: Vendor::Nvidia,
        total: 51_041_271_808,
        cc: (8, 6),
        sms: 84,
        l2: 6 << 20,
        source: "XLA a6000.txtpb (device_memory_size, core_count, l2_cache_size); a deviceQuery (driver \
                 12.7, runtime 12.1) reads 51,160,023,040",
    },
    Entry {
        key: "rtx-5090",
        aliases: &[],
        label: "RTX 5090",
        marketed_gb: 32,
        name: "NVIDIA GeForce RTX 5090",
        vendor: Vendor::Nvidia,
        total: 33_660_534_784,
        cc: (12, 0),
        sms: 170,
        l2: 96 << 20,
        source: "deviceQuery (driver 13.0, runtime 12.8, display attached; without one it reads \
                 33,668,857,856), a Matmul SM120 README; the open-gpu-kernel-modules issue 1 \
                 deviceQuery (driver 12.8) reads 33,677,180,928",
    },
    Entry {
        key: "l4",
        aliases: &[],
        label: "L4",
        marketed_gb: 24,
        name: "NVIDIA L4",
        vendor: Vendor::Nvidia,
        total: 23_570_219_008,
        cc: (8, 9),
        sms: 58,
        l2: 48 << 20,
        source: "deviceQuery L4_deviceQuery.py (driver 12.4, runtime 11.8), \
                 github.com/thamada/nvidia-smi",
    },
    Entry {
        key: "a10",
        aliases: &[],
        label: "A10",
        marketed_gb: 24,
        name: "NVIDIA A10",
        vendor: Vendor::Nvidia,
        total: 23_609_475_072,
        cc: (8, 6),
        sms: 72,
        l2: 6 << 20,
        source: "deviceQuery (driver 12.2, runtime 11.8) in a mixbench log and github.com/aalanwyr/face2cuda \
                 step2cuda/README.md; a driver 12.8 deviceQuery reads 23,696,375,808",
    },
    Entry {
        key: "rtx-4090",
        aliases: &[],
        label: "RTX 4090",
        marketed_gb: 24,
        name: "NVIDIA GeForce RTX 4090",
        vendor: Vendor::Nvidia,
        total: 25_386_352_640,
        cc: (8, 9),
        sms: 128,
        l2: 72 << 20,
        source: "deviceQuery RTX4090_deviceQuery.py (driver 12.4, runtime 12.4, no display), \
                 github.com/thamada/nvidia-smi",
    },
    Entry {
        key: "rtx-3090",
        aliases: &[],
        label: "RTX 3090",
        marketed_gb: 24,
        name: "NVIDIA GeForce RTX 3090",
        vendor: Vendor::Nvidia,
        total: 25_327_697_920,
        cc: (8, 6),
        sms: 82,
        l2: 6 << 20,
        source: "deviceQuery RTX3090_deviceQuery.py (driver 12.6, runtime 12.4), \
                 github.com/thamada/nvidia-smi",
    },
    Entry {
        key: "v100-16gb",
        aliases: &["v100"],
        label: "V100-16GB",
        marketed_gb: 16,
        name: "Tesla V100-PCIE-16GB",
        vendor: Vendor::Nvidia,
        total: 16_928_342_016,
        cc: (7, 0),
        sms: 80,
        l2: 6 << 20,
        source: "mt4g report, github.com/caps-tum/mt4g sample_results/Tesla V100-PCIE-16GB; \
                 XLA v100.txtpb",
    },
    Entry {
        key: "v100-32gb",
        aliases: &[],
        label: "V100-32GB",
        marketed_gb: 32,
        name: "Tesla V100-PCIE-32GB",
        vendor: Vendor::Nvidia,
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
        label: e.label.into(),
        marketed_gb: e.marketed_gb,
        name: e.name.into(),
        vendor: e.vendor,
        total_bytes: e.total,
        compute_capability: e.cc,
        sms: e.sms,
        l2_bytes: e.l2,
        smem_optin: smem_optin(e.cc),
        source: e.source.into(),
    }
}

/// `sharedMemPerBlockOptin` by architecture: the multiprocessor's shared memory less the 1 KiB
/// the runtime reserves per block from compute capability 8.0 on (the CUDA programming guide's
/// compute-capability table; XLA's device specs read the same).
fn smem_optin(cc: (u32, u32)) -> u64 {
    match cc {
        (7, _) => smem_per_sm(cc),
        _ => smem_per_sm(cc) - 1024,
    }
}

/// Shared memory per multiprocessor by architecture (the same sources).
pub fn smem_per_sm(cc: (u32, u32)) -> u64 {
    match cc {
        (9, _) | (10, _) => 233_472,
        (8, 0) => 167_936,
        (8, _) | (12, _) => 102_400,
        _ => 98_304,
    }
}

/// Resident threads per multiprocessor by architecture.
pub fn threads_per_sm(cc: (u32, u32)) -> u32 {
    match cc {
        (8, 6) | (8, 9) | (12, _) => 1536,
        _ => 2048,
    }
}

/// The `--gpu` names, in catalogue order.
pub fn names() -> Vec<&'static str> {
    ENTRIES.iter().map(|e| e.key).collect()
}

/// The aliases of the GPU `key` (beyond its key, label and CUDA name).
pub fn aliases(key: &str) -> Vec<&'static str> {
    ENTRIES
        .iter()
        .find(|e| e.key == key)
        .map(|e| e.aliases.to_vec())
        .unwrap_or_default()
}

/// A name reduced to what identifies the GPU: lower case, letters and digits only, without a
/// vendor or brand word ("NVIDIA GeForce RTX 4090", "rtx-4090" and "RTX4090" are "rtx4090").
fn compact(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !matches!(*w, "" | "nvidia" | "geforce" | "tesla"))
        .collect()
}

/// The compute capability of the catalogued NVIDIA GPU `name` names (`None` for an unknown
/// name, a bare size or an AMD card): what sizes torch's cuBLAS workspace in an estimate.
pub fn compute_capability(name: &str) -> Option<(u32, u32)> {
    by_name(name)
        .filter(|g| g.vendor == Vendor::Nvidia)
        .map(|g| g.compute_capability)
}

/// A catalogued GPU by any of its names: the key, an alias, the product label or the name CUDA
/// reports, compared without case, spaces, dashes or a vendor word; a memory size may drop its
/// `gb` ("h100-80", "a100-40").
pub fn by_name(name: &str) -> Option<Gpu> {
    let want = compact(name);
    if want.is_empty() {
        return None;
    }
    ENTRIES
        .iter()
        .find(|e| {
            std::iter::once(e.key)
                .chain(e.aliases.iter().copied())
                .chain([e.label, e.name])
                .map(compact)
                .any(|n| n == want || n == format!("{want}gb"))
        })
        .map(gpu)
}

/// The bytes a `--gpu` argument stands for: a catalogued GPU (its name and `totalGlobalMem`), or
/// a size in GB ("48gb", "48": 48 × 10^9 B). None for anything else.
pub fn name_or_size(arg: &str) -> Option<(String, u64)> {
    if let Some(g) = by_name(arg) {
        return Some((g.key, g.total_bytes));
    }
    let n = arg.to_ascii_lowercase();
    n.trim_end_matches("gb")
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|&g| g > 0)
        // A size past 2^64 B is no GPU.
        .and_then(|g| Some((format!("{g} GB"), g.checked_mul(1_000_000_000)?)))
}

/// Every catalogued GPU, in catalogue order.
pub fn all() -> Vec<Gpu> {
    ENTRIES.iter().map(gpu).collect()
}

/// The GPUs sold with one memory size: the catalogue's classes, smallest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    pub gb: u64,
    /// Its GPUs' labels ("L4, RTX 4090, RTX 3090").
    pub examples: String,
    /// The smallest `totalGlobalMem` of the class: a class fits when its smallest member does.
    pub bytes: u64,
}

/// The classes of the catalogue, smallest first.
pub fn classes() -> &'static [Class] {
    static C: std::sync::OnceLock<Vec<Class>> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        let mut sizes: Vec<u64> = ENTRIES.iter().map(|e| e.marketed_gb).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
            .into_iter()
            .map(|gb| {
                let members: Vec<&Entry> = ENTRIES.iter().filter(|e| e.marketed_gb == gb).collect();
                Class {
                    gb,
                    examples: members
                        .iter()
                        .map(|e| e.label)
                        .collect::<Vec<_>>()
                        .join(", "),
                    bytes: members
                        .iter()
                        .map(|e| e.total)
                        .min()
                        .expect("a class has members"),
                }
            })
            .collect()
    })
}

/// Usable bytes of a GPU of `gpu_bytes` after the headroom fraction: what both the analytic and
/// the emulated verdicts judge the NVML-equivalent "used" against.
pub fn budget(gpu_bytes: u64, headroom: f64) -> u64 {
    (gpu_bytes as f64 * (1.0 - headroom)) as u64
}

/// The smallest class whose budget holds `total`.
pub fn smallest_class(total: u64, headroom: f64) -> Option<&'static Class> {
    classes()
        .iter()
        .find(|c| total <= budget(c.bytes, headroom))
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
    if g.vendor != Vendor::Nvidia {
        return Err(format!(
            "{} is an AMD GPU: the emulator's stub runtime is CUDA's, so it presents NVIDIA GPUs \
             only (`vramlab estimate --gpu {}` answers analytically)",
            g.key, g.key
        ));
    }
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
mod tests;
