//! Compiles `cuda/*.cu` to PTX with nvcc when feature `cuda` is on; does nothing otherwise.
//!
//! Why nvcc at build time, not NVRTC at run time: candle's own `cuda` feature already needs
//! nvcc at build time (candle-kernels), so the toolchain is there whenever this runs
//! (scripts/cuda-toolchain.sh, ARCHITECTURE.md §13), and CI then proves every `.cu` compiles by
//! merely building `--features cuda` (scripts/cuda-build-check.sh), with no device and no
//! libnvrtc. The PTX is embedded with `include_str!` and loaded by candle's
//! `CudaDevice::get_or_load_custom_func`, exactly as candle loads its own kernels.
//!
//! nvcc: $NVCC, else `nvcc` on PATH, else $CUDA_HOME/bin/nvcc. Target: sm_$CUDA_COMPUTE_CAP
//! (default 90). `--fmad=false`: the f32 arithmetic is the CPU path's, operation for
//! operation (no fused multiply-add), so CUDA and CPU agree to rounding.
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: [&str; 4] = ["attention", "norm", "rowwise", "adamw"];

fn fail(msg: String) -> ! {
    eprintln!("vramlab-kernels build: {msg}");
    std::process::exit(1)
}

fn nvcc() -> PathBuf {
    if let Some(p) = std::env::var_os("NVCC") {
        return p.into();
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("nvcc"))
        .find(|p| p.is_file());
    let in_home = std::env::var_os("CUDA_HOME")
        .map(|h| Path::new(&h).join("bin/nvcc"))
        .filter(|p| p.is_file());
    on_path.or(in_home).unwrap_or_else(|| {
        fail("feature `cuda` needs nvcc: none on PATH, in $NVCC or $CUDA_HOME/bin (source the env.sh that scripts/cuda-toolchain.sh writes)".into())
    })
}

fn main() {
    // nvcc first, so that a missing one fails with nothing but its one line.
    let nvcc = std::env::var_os("CARGO_FEATURE_CUDA").map(|_| nvcc());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cuda");
    for v in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_COMPUTE_CAP",
        "CARGO_FEATURE_CUDA",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let Some(nvcc) = nvcc else {
        return;
    };
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for name in SOURCES {
        let src = Path::new("cuda").join(format!("{name}.cu"));
        let ptx = out.join(format!("{name}.ptx"));
        let res = Command::new(&nvcc)
            .args(["--ptx", "-std=c++17", "-O3", "--fmad=false"])
            .arg(format!("-arch=sm_{cap}"))
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| fail(format!("cannot run {}: {e}", nvcc.display())));
        if !res.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&res.stderr));
            fail(format!("nvcc failed on {} ({})", src.display(), res.status));
        }
    }
}
