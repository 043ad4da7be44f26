//! The preload meter's acceptance: a C program with allocations of known sizes runs
//! under `LD_PRELOAD=libvramlab_preload.so` and checks exact deltas, the peak reset, threads
//! and fork (tests/probe.c). A process of its own, so nothing else pollutes the counts.
use std::path::PathBuf;
use std::process::Command;

fn preload_so() -> PathBuf {
    // `cargo test` builds the cdylib beside this test binary: target/<profile>/deps.
    let exe = std::env::current_exe().unwrap();
    let so = exe.with_file_name("libvramlab_preload.so");
    assert!(so.exists(), "{} not built", so.display());
    // ld.so splits LD_PRELOAD on spaces and colons: a checkout under such a path needs a copy.
    let copy = std::env::temp_dir().join(format!("vramlab-preload-{}.so", std::process::id()));
    std::fs::copy(&so, &copy).unwrap();
    copy
}

fn build_probe(tag: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/probe.c");
    let out = std::env::temp_dir().join(format!(
        "vramlab-preload-probe-{}-{tag}",
        std::process::id()
    ));
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O0", "-fno-builtin", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed on {}", src.display());
    out
}

fn run(args: &[&str]) -> String {
    let probe = build_probe(args[0]);
    let out = Command::new(&probe)
        .args(args)
        .env("LD_PRELOAD", preload_so())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&probe);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "probe failed ({}):\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn exact_deltas_peak_reset_threads_and_fork() {
    let text = run(&["3000017", "24"]);
    for name in [
        "malloc_big",
        "realloc_grow",
        "calloc",
        "posix_memalign",
        "aligned_alloc",
        "reallocarray",
        "strdup",
        "peak_holds_transient",
        "peak_after_reset",
        "threads_live_back",
        "fork_child",
    ] {
        assert!(
            text.contains(&format!("ok {name}\n")),
            "{name} missing:\n{text}"
        );
    }
    // Other sizes: an mmapped block (above glibc's threshold) and a tiny one.
    run(&["67108864", "1"]);
}

#[test]
fn without_preload_the_probe_says_so() {
    let probe = build_probe("bare");
    let out = Command::new(&probe)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&probe);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("vramlab_* not found"));
}
