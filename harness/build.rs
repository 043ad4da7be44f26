// Build facts for the CSV and manifest: git revision, rustc and candle versions.
use std::process::Command;

fn run(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let git = run("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    // Dirty means the code differs from the commit: measured results (results/) are data that
    // a sweep writes into the tree, not a change to what measures.
    let dirty = run(
        "git",
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            "..",
            ":(exclude)../results",
        ],
    )
    .map(|s| !s.is_empty())
    .unwrap_or(false);
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc = run(&rustc, &["--version"]).unwrap_or_else(|| "unknown".into());
    let lock = std::fs::read_to_string("../Cargo.lock").unwrap_or_default();
    let version_of = |name: &str| {
        let mut lines = lock.lines();
        while let Some(l) = lines.next() {
            if l == format!("name = \"{name}\"") {
                if let Some(v) = lines.next().and_then(|v| v.strip_prefix("version = ")) {
                    return v.trim_matches('"').to_string();
                }
            }
        }
        "unknown".to_string()
    };
    println!(
        "cargo:rustc-env=VRAMLAB_GIT_REV={git}{}",
        if dirty { "-dirty" } else { "" }
    );
    println!("cargo:rustc-env=VRAMLAB_RUSTC={rustc}");
    println!(
        "cargo:rustc-env=VRAMLAB_CANDLE={}",
        version_of("candle-core")
    );
    println!("cargo:rustc-env=VRAMLAB_CUDARC={}", version_of("cudarc"));
    println!("cargo:rerun-if-changed=../Cargo.lock");
    // Where git keeps them: `../.git/` in a clone, `.git/worktrees/NAME/` for a worktree (whose
    // `.git` is a file; a path that does not exist would rerun this script on every build).
    for what in ["HEAD", "index"] {
        let path = run("git", &["rev-parse", "--git-path", what])
            .unwrap_or_else(|| format!("../.git/{what}"));
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
