//! `pip install vramlab` (docs/src/guides/install.md): the wheel that scripts/build-wheel.sh
//! builds installs into a fresh venv with pip alone (no index, no compiler), and its binary,
//! its Python package and its emulator stubs work from there. `#[ignore]`d: it builds the wheel
//! (a release build of vramlab; minutes from cold) and needs the torch environment
//! (`VRAMLAB_TORCH_PYTHON`, scripts/torch-env.sh); `scripts/test.sh` runs it.
//!
//! "Only torch from the cached torch environment": the test venv is created by that
//! environment's base interpreter (the same Python version), and one `.pth` file in its
//! site-packages names the torch environment's site-packages. `--system-site-packages` would
//! not do: a venv made from another venv's python inherits the base interpreter's
//! site-packages, not the torch venv's.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A python's answer to one expression.
fn ask(python: &Path, expr: &str) -> String {
    stdout(&run(
        Command::new(python).args(["-c", &format!("print({expr})")])
    ))
}

/// A venv made by `base`, with the wheel installed by pip from the file alone.
fn venv_with_wheel(base: &Path, dir: &Path, wheel: &Path) -> PathBuf {
    run(Command::new(base).args(["-m", "venv"]).arg(dir));
    let py = dir.join("bin/python");
    run(Command::new(&py)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
        ])
        .arg(wheel));
    py
}

/// `vramlab` from a venv's bin/, as a user runs it there: that bin/ first on PATH, from a
/// folder outside the checkout, with none of vramlab's overrides.
fn vramlab(venv: &Path, cwd: &Path) -> Command {
    let bin = venv.join("bin");
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let mut c = Command::new(bin.join("vramlab"));
    c.current_dir(cwd)
        .env("PATH", path)
        .env_remove("PYTHONPATH")
        .env_remove("VRAMLAB_PYTHON_DIR")
        .env_remove("VRAMLAB_EMU_STUBS")
        .env_remove("VIRTUAL_ENV");
    c
}

const TRAIN: &str = r#"import os, torch, vramlab
print("VRAMLAB_PACKAGE", vramlab.__file__)
print("LD_PRELOAD", os.environ.get("LD_PRELOAD", ""))
with vramlab.phase("load"):
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(8, 64, device="cuda")
for _ in range(2):
    with vramlab.phase("forward"):
        loss = model(x).square().mean()
    with vramlab.phase("backward"):
        loss.backward()
    with vramlab.phase("optimizer"):
        opt.step()
        opt.zero_grad()
"#;

#[test]
#[ignore = "builds the wheel and needs the torch environment (scripts/test.sh)"]
fn the_wheel_installs_into_a_fresh_venv_and_emulates() {
    let torch_python = PathBuf::from(
        std::env::var("VRAMLAB_TORCH_PYTHON")
            .expect("VRAMLAB_TORCH_PYTHON: the torch environment's python (scripts/torch-env.sh)"),
    );
    let tmp = tempfile::tempdir().unwrap();
    // The dev profile: the same binary as the shipped wheel's but for optimization, built from
    // the test build's compiled dependencies (a release build would add minutes to the suite).
    let built = run(Command::new(root().join("scripts/build-wheel.sh"))
        .env("VRAMLAB_WHEEL_PROFILE", "dev")
        .arg(tmp.path().join("wheels")));
    let wheel = PathBuf::from(stdout(&built));
    assert!(
        wheel.is_file(),
        "build-wheel.sh printed {}",
        wheel.display()
    );

    // The venv: the torch environment's base interpreter, and a .pth naming its site-packages.
    let base = PathBuf::from(ask(&torch_python, "__import__('sys')._base_executable"));
    let torch_site = ask(
        &torch_python,
        "__import__('sysconfig').get_paths()['purelib']",
    );
    let venv = tmp.path().join("venv");
    let py = venv_with_wheel(&base, &venv, &wheel);
    let site = PathBuf::from(ask(&py, "__import__('sysconfig').get_paths()['purelib']"));
    std::fs::write(
        site.join("vramlab-test-torch.pth"),
        format!("{torch_site}\n"),
    )
    .unwrap();

    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    // 1. the binary on the venv's PATH.
    let version = run(vramlab(&venv, &work).arg("--version"));
    assert_eq!(
        stdout(&version),
        format!("vramlab {}", env!("CARGO_PKG_VERSION"))
    );
    // 2. the Python package, from the venv (not from the checkout).
    let imported = run(Command::new(&py)
        .current_dir(&work)
        .env_remove("PYTHONPATH")
        .args(["-c", "import vramlab; print(vramlab.__file__)"]));
    assert!(
        Path::new(&stdout(&imported)).starts_with(&site),
        "{}",
        stdout(&imported)
    );
    // The Python API, on the venv's own binary: the same total as the binary prints.
    let total = stdout(&run(Command::new(&py)
        .current_dir(&work)
        .env_remove("PYTHONPATH")
        .env_remove("VRAMLAB_BIN")
        .args([
            "-c",
            "import vramlab; print(vramlab.estimate(model='qwen2.5-0.5b', gpu='l4').total_bytes)",
        ])));
    let direct = run(vramlab(&venv, &work).args([
        "estimate",
        "--model",
        "qwen2.5-0.5b",
        "--gpu",
        "l4",
        "--json",
    ]));
    let j: serde_json::Value = serde_json::from_slice(&direct.stdout).unwrap();
    assert_eq!(total, j["total_bytes"].to_string());
    // The torch probe from the package: its point ids are vramlab's.
    let scenario = root().join("scenarios/smoke.toml");
    let ids = run(Command::new(&py)
        .current_dir(&work)
        .env_remove("PYTHONPATH")
        .args(["-m", "vramlab.probe"])
        .arg(&scenario)
        .arg("--dry-run"));
    let want = run(vramlab(&venv, &work)
        .args(["sweep", "--dry-run"])
        .arg(&scenario));
    let ids = stdout(&ids);
    assert!(!ids.is_empty());
    for id in ids.lines() {
        assert!(stdout(&want).contains(id), "{id} not in vramlab's dry run");
    }
    // It ran the wheel's package, vramlab/probe, whose tests stay in the checkout.
    let probe = PathBuf::from(stdout(&run(Command::new(&py)
        .current_dir(&work)
        .env_remove("PYTHONPATH")
        .args([
            "-c",
            "import os, vramlab.probe as p; print(os.path.dirname(p.__file__))",
        ]))));
    assert_eq!(
        probe.canonicalize().unwrap(),
        site.join("vramlab/probe").canonicalize().unwrap()
    );
    assert!(probe.join("grid.py").is_file(), "{}", probe.display());
    assert!(!probe.join("tests").exists(), "{}", probe.display());
    // 3. a tiny training loop on an emulated H100, rows written as CSV.
    std::fs::write(work.join("train.py"), TRAIN).unwrap();
    let csv = work.join("X.csv");
    let out = run(vramlab(&venv, &work).args([
        "emulate",
        "--gpu",
        "h100-80gb",
        "--out",
        "X.csv",
        "--model-id",
        "tiny",
        "--precision",
        "f32",
        "--",
        "python",
        "train.py",
    ]));
    let text = stdout(&out);
    // The package and the stubs the wheel installed, for this torch's CUDA major.
    let cuda = ask(&py, "__import__('torch').version.cuda.split('.')[0]");
    assert!(
        text.contains(&format!(
            "VRAMLAB_PACKAGE {}",
            site.join("vramlab").display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{}",
            site.join(format!("vramlab/_stubs/cu{cuda}/libvramlab_emu.so"))
                .display()
        )),
        "{text}"
    );
    assert!(
        text.contains("fits on NVIDIA H100 80GB HBM3 (emulated): yes"),
        "{text}"
    );
    let rows = vramlab::export::csv::read(&csv).unwrap();
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r.meter, vramlab::vocab::MeterKind::TorchEmulated);
        assert!(r.device_name.ends_with("(emulated)"), "{}", r.device_name);
        assert_eq!(r.model_id, "tiny");
    }
    let phases: Vec<String> = rows
        .iter()
        .filter_map(|r| r.phase.map(|p| p.to_string()))
        .collect();
    for want in ["load", "forward", "backward", "optimizer"] {
        assert!(
            phases.iter().any(|p| p == want),
            "no {want} row: {phases:?}"
        );
    }

    // 4. `estimate --emulate` runs the torch probe the wheel ships (vramlab/probe, found
    // through the venv's package, not the checkout), and `validate --emulate` a peer program of
    // it (the SDXL notebook's, which imports the probe's own modules) under another stack's
    // interpreter (torch-2.2's, which has no vramlab installed).
    let est = run(vramlab(&venv, &work).args([
        "estimate",
        "--model",
        "smollm2-135m",
        "--mode",
        "infer",
        "--context",
        "256",
        "--json",
        "--emulate",
        "h100-80gb",
    ]));
    let j: serde_json::Value = serde_json::from_str(&stdout(&est)).unwrap();
    let e = &j["emulated"];
    assert_eq!(e["status"], "ok", "{e}");
    let weights = j["breakdown"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == "weights"))
        .and_then(|r| r["bytes"].as_u64())
        .unwrap_or_else(|| panic!("no weights row: {j}"));
    assert!(e["max_memory_allocated"].as_u64().unwrap() > weights, "{e}");
    let peers: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(root().join("results/peers/published.json")).unwrap(),
    )
    .unwrap();
    let sdxl_row = peers
        .iter()
        .find(|p| p["id"] == "hf-blog-sdxl-fp16-sdpa-b4")
        .expect("the SDXL notebook's SDPA row");
    std::fs::write(
        work.join("one.json"),
        serde_json::to_string(&[sdxl_row]).unwrap(),
    )
    .unwrap();
    let torch22 = std::env::var("VRAMLAB_TORCH22_PYTHON")
        .expect("VRAMLAB_TORCH22_PYTHON: scripts/torch-env.sh --stack torch-2.2");
    let v = run(vramlab(&venv, &work)
        .args(["validate", "one.json", "--json", "--emulate", "--python"])
        .arg(&torch22));
    let j: serde_json::Value = serde_json::from_str(&stdout(&v)).unwrap();
    let e = &j["rows"][0]["emulated"];
    assert_eq!(e["kind"], "ran", "{e}");
    assert!(
        e["program"]
            .as_str()
            .unwrap()
            .contains("vramlab/peers/peer_sdxl.py"),
        "{e}"
    );

    // Without torch: one line naming the missing module, exit 2.
    let bare = tmp.path().join("bare");
    venv_with_wheel(Path::new("python3"), &bare, &wheel);
    std::fs::write(work.join("x.py"), "print('hi')\n").unwrap();
    let refused = |c: &mut Command, want: &str| {
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "want `{want}` in {err}");
    };
    let emulate = ["emulate", "--gpu", "h100-80gb", "--", "python", "x.py"];
    refused(
        vramlab(&bare, &work).args(emulate),
        "no module named 'torch'",
    );
    // A torch built for a CUDA major the wheel has no stubs for (a stand-in torch package).
    let fake = tmp.path().join("fake/torch");
    std::fs::create_dir_all(&fake).unwrap();
    std::fs::write(fake.join("__init__.py"), "").unwrap();
    std::fs::write(
        fake.join("version.py"),
        "__version__ = '2.0.0+cu118'\ncuda = '11.8'\n",
    )
    .unwrap();
    refused(
        vramlab(&bare, &work)
            .args(emulate)
            .env("PYTHONPATH", fake.parent().unwrap()),
        "no emulator stubs for CUDA 11",
    );
}
