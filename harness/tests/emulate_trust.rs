//! An emulated run never reports what it did not see (docs/src/guides/emulator.md, "What the
//! report can and cannot see"): whatever order torch is imported in, whatever processes the
//! program starts, however it ends, the report is the real figures, a named partial report, or
//! no verdict. The torch tests are `#[ignore]`d (they need `VRAMLAB_TORCH_PYTHON`;
//! `scripts/test.sh` runs them); the record layout test runs everywhere. Every expected figure is
//! derived here from what the program allocates, never copied from a run.
use assert_cmd::Command;
use serde_json::Value;
use std::path::{Path, PathBuf};

const GIB: u64 = 1 << 30;

mod common;
use common::{emulate_data as data, torch_python};

/// The torch environment's `bin/` (torchrun).
fn torch_bin(name: &str) -> String {
    Path::new(&torch_python())
        .with_file_name(name)
        .to_string_lossy()
        .into_owned()
}

struct Run {
    code: i32,
    json: Value,
    stderr: String,
}

impl Run {
    /// The `EXPECT {...}` line the program printed (on stderr under `--json`).
    fn expect(&self) -> Value {
        let line = self
            .stderr
            .lines()
            .find_map(|l| l.strip_prefix("EXPECT "))
            .unwrap_or_else(|| panic!("no EXPECT line:\n{}", self.stderr));
        serde_json::from_str(line).unwrap()
    }
    fn processes(&self) -> &Vec<Value> {
        self.json["processes"].as_array().expect("processes")
    }
}

/// `vramlab emulate --json ARGS -- COMMAND...` with `env`: standard output must be one JSON
/// document, whatever the program printed.
fn emulate_env(args: &[&str], command: &[String], env: &[(&str, &Path)]) -> Run {
    let mut cmd = Command::cargo_bin("vramlab").unwrap();
    cmd.arg("emulate")
        .arg("--json")
        .args(args)
        .arg("--")
        .args(command);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("stdout is not one JSON document ({e}):\n{stdout}\nstderr:\n{stderr}")
    });
    Run {
        code: out.status.code().unwrap_or(-1),
        json,
        stderr,
    }
}

fn emulate(args: &[&str], script: &str, script_args: &[&str]) -> Run {
    let mut command = vec![torch_python(), data(script)];
    command.extend(script_args.iter().map(|s| s.to_string()));
    emulate_env(args, &command, &[])
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// The process of the report whose PyTorch peak is `bytes`.
fn process_with(r: &Run, bytes: u64) -> &Value {
    r.processes()
        .iter()
        .find(|p| p["max_memory_allocated"] == bytes)
        .unwrap_or_else(|| panic!("no process allocated {bytes}: {}", r.json))
}

/// The record layout the stubs write (harness/emulator/emu_record.h), compiled from the header
/// itself and read back through vramlab's reader: every field at its offset.
#[test]
fn the_stubs_records_read_back_field_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("write.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <string.h>
#include "emu_record.h"
int main(int argc, char **argv) {
  struct emu_proc p;
  memset(&p, 0, sizeof p);
  p.magic = EMU_RECORD_MAGIC; p.pid = 4242; p.ppid = 7; p.devices = 3; p.contexts = 4;
  p.d2h_reads = 11; p.last_d2h_ns = 12; p.errors = 13; p.exited = 1;
  p.dev[2].used = 21; p.dev[2].peak = 22; p.dev[2].mallocs = 23; p.dev[2].failed = 24;
  strcpy(p.last_error, "cudaFree(0x1): not an allocation of this process");
  strcpy(p.cmdline, "python train.py");
  struct emu_device d = {EMU_RECORD_MAGIC, 31, 32, 33};
  FILE *f = fopen(argv[1], "wb"); fwrite(&p, sizeof p, 1, f); fclose(f);
  f = fopen(argv[2], "wb"); fwrite(&d, sizeof d, 1, f); fclose(f);
  return argc == 3 ? 0 : 1;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("write");
    let header_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("emulator");
    let cc = std::process::Command::new("cc")
        .arg("-I")
        .arg(&header_dir)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("a C compiler (cc)");
    assert!(cc.success());
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let ok = std::process::Command::new(&exe)
        .arg(run.join("proc-4242.bin"))
        .arg(run.join("device-2.bin"))
        .status()
        .unwrap();
    assert!(ok.success());
    let c = vramlab::emulate::records::Collected::read(&run).unwrap();
    assert_eq!(c.processes.len(), 1);
    let p = &c.processes[0];
    let d = p.driver.as_ref().unwrap();
    assert_eq!((p.pid, p.ppid, d.contexts), (4242, 7, 4));
    assert_eq!(
        (d.d2h_reads, d.last_d2h_ns, d.errors, d.exited),
        (11, 12, 13, true)
    );
    assert_eq!(d.devices.len(), 3);
    let dev = d.devices[2];
    assert_eq!(
        (dev.used, dev.peak, dev.mallocs, dev.failed),
        (21, 22, 23, 24)
    );
    assert_eq!(
        d.last_error,
        "cudaFree(0x1): not an allocation of this process"
    );
    assert_eq!(p.command, "python train.py");
    assert_eq!(p.device(), Some(2));
    assert_eq!(c.devices.len(), 1);
    assert_eq!(
        (
            c.devices[0].index,
            c.devices[0].contexts_at_end,
            c.devices[0].peak_nvml_used
        ),
        (2, 32, 33)
    );
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_hook_holds_whatever_order_torch_is_imported_in() {
    for how in [
        "find_spec",
        "import_module",
        "from_import",
        "transformers_first",
    ] {
        let r = emulate(
            &["--gpu", "h100-80gb"],
            "trust/import_order.py",
            &[how, &GIB.to_string()],
        );
        assert_eq!(r.code, 0, "{how}: {}", r.stderr);
        assert_eq!(r.json["fits"], true, "{how}: {}", r.json);
        assert_eq!(r.json["status"], "complete", "{how}");
        assert_eq!(u(&r.json["run"]["max_memory_allocated"]), GIB, "{how}");
        let e = r.expect();
        assert_eq!(u(&e["allocated"]), GIB, "{how}: the program's own view");
        assert_eq!(e["cudnn"], false, "{how}: cuDNN is off under emulation");
        assert_eq!(r.processes()[0]["cudnn"], false, "{how}");
    }
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn a_spawned_child_is_measured_and_named_as_the_peak() {
    let r = emulate(&["--gpu", "h100-80gb"], "trust/children.py", &["spawn"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.json["fits"], true, "{}", r.json);
    let parent = process_with(&r, GIB);
    let child = process_with(&r, 2 * GIB);
    assert_eq!(child["ppid"], parent["pid"], "{}", r.json);
    assert_eq!(r.json["peak_process"], child["pid"]);
    assert_eq!(u(&r.json["run"]["max_memory_allocated"]), 2 * GIB);
    // One device, two contexts: both processes' bytes at once, each with its context.
    let ctx = u(&r.json["gpu"]["context_bytes"]);
    let dev = &r.json["devices"][0];
    assert_eq!(u(&dev["peak_nvml_used"]), 3 * GIB + 2 * ctx, "{dev}");
    assert_eq!(dev["fits"], true);
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn forked_dataloader_workers_leave_the_report_whole() {
    let r = emulate(&["--gpu", "l4"], "trust/children.py", &["dataloader"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.json["fits"], true, "{}", r.json);
    assert_eq!(r.processes().len(), 1, "the workers never touch the GPU");
    assert!(u(&r.json["run"]["max_memory_allocated"]) >= GIB);
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn torchrun_ranks_report_on_two_emulated_devices() {
    let command = vec![
        torch_bin("torchrun"),
        "--nproc-per-node".into(),
        "2".into(),
        data("trust/ranks.py"),
    ];
    let r = emulate_env(&["--gpu", "a100-80gb", "--devices", "2"], &command, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.json["fits"], true, "{}", r.json);
    let ctx = u(&r.json["gpu"]["context_bytes"]);
    let devices = r.json["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{}", r.json);
    for (rank, d) in devices.iter().enumerate() {
        let bytes = (rank as u64 + 1) * GIB;
        assert_eq!(u(&d["index"]), rank as u64);
        assert_eq!(u(&d["peak_nvml_used"]), bytes + ctx, "{d}");
        assert_eq!(process_with(&r, bytes)["device"], rank as u64);
    }
    // One device for two ranks: the second rank's set_device fails, named by the stubs.
    let r = emulate_env(&["--gpu", "a100-80gb"], &command, &[]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.json["fits"], Value::Null);
    let reason = r.json["reason"].as_str().unwrap();
    assert!(
        reason.contains("cudaSetDevice(device 1)") && reason.contains("--devices"),
        "{reason}"
    );
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn nothing_on_the_device_is_no_verdict() {
    let r = emulate(&["--gpu", "l4"], "trust/ends.py", &["nocuda"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert_eq!(r.json["fits"], Value::Null);
    assert_eq!(r.json["status"], "no-cuda-memory");
    assert!(
        r.stderr.contains("no GPU here"),
        "the program's own output, on stderr"
    );
    // The table says so, with no "fits" line.
    let out = Command::cargo_bin("vramlab")
        .unwrap()
        .args(["emulate", "--gpu", "l4", "--"])
        .arg(torch_python())
        .arg(data("trust/ends.py"))
        .arg("nocuda")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3));
    assert!(stdout.contains("no CUDA memory was observed"), "{stdout}");
    assert!(!stdout.contains("fits on"), "{stdout}");
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn a_killed_program_is_partial_with_what_it_held() {
    let r = emulate(&["--gpu", "l4"], "trust/ends.py", &["killed"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.json["fits"], Value::Null);
    assert_eq!(r.json["status"], "partial");
    assert_eq!(r.json["ending"]["signal"], "SIGKILL");
    assert!(r.stderr.contains("killed by SIGKILL"), "{}", r.stderr);
    let p = &r.processes()[0];
    assert_eq!(p["status"], "partial");
    assert_eq!(
        u(&p["peak_driver"]),
        GIB,
        "what the stubs counted until the kill"
    );
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn a_hang_ends_at_the_timeout_naming_the_loop() {
    let r = emulate(
        &["--gpu", "l4", "--timeout", "12s"],
        "trust/ends.py",
        &["hang"],
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.json["status"], "partial");
    assert_eq!(r.json["ending"]["kind"], "timeout");
    let reason = r.json["reason"].as_str().unwrap();
    assert!(reason.contains("--timeout 12s"), "{reason}");
    assert!(reason.contains("reads as zeros"), "{reason}");
    assert!(
        reason.contains("ends.py\", line"),
        "the call site: {reason}"
    );
    // The Python process left through its exit handlers: PyTorch's own peaks are there.
    assert!(
        u(&r.json["run"]["max_memory_allocated"]) >= GIB,
        "{}",
        r.json
    );
}

#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn a_failing_program_exits_1_with_its_error_not_2() {
    let r = emulate(&["--gpu", "l4"], "trust/ends.py", &["error"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.json["fits"], Value::Null);
    assert!(
        r.json["reason"]
            .as_str()
            .unwrap()
            .contains("ValueError: the program's own failure"),
        "{}",
        r.json
    );
}

/// `estimate --emulate` on an 8.9 card trains a model whose embedding backward sorts (CUB): the
/// stubs answer the kernel version the driver would load, so it runs to a verdict.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn the_qwen3_training_query_on_an_l4_ends_in_a_verdict() {
    let out = Command::cargo_bin("vramlab")
        .unwrap()
        .args(["estimate", "--runtime", "torch", "--json", "--python"])
        .arg(torch_python())
        .args(["--model", "qwen3-0.6b", "--mode", "train", "--batch", "4"])
        .args(["--context", "1024", "--emulate", "l4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let e: Value = serde_json::from_slice(&out.stdout).unwrap();
    let status = e["emulated"]["status"].as_str().unwrap();
    assert!(["ok", "oom"].contains(&status), "{e}");
}

/// A soak: 50 emulated programs, in two lanes of 25 back to back that run side by side (so
/// two runs are always in flight on the same machine), every ending mixed: ok, out of memory,
/// killed, two timeouts, spawned children, nothing on the device. Each report is the run's own
/// (every program allocates a size of its own), and the temporary folder is left empty.
#[test]
#[ignore = "needs the torch environment (scripts/test.sh)"]
fn fifty_programs_back_to_back_lose_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let tmpdir: PathBuf = tmp.path().to_path_buf();
    std::thread::scope(|s| {
        for lane in 0..2u64 {
            let tmpdir = &tmpdir;
            s.spawn(move || (lane..50).step_by(2).for_each(|i| soak_run(i, tmpdir)));
        }
    });
    let left: Vec<_> = std::fs::read_dir(&tmpdir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind in TMPDIR: {left:?}");
}

/// Run `i` of the soak: its kind is `i % 10`; a timeout only at runs 6 and 36 (each waits out
/// its 12 s), the other runs of that kind fit.
fn soak_run(i: u64, tmpdir: &Path) {
    let env = [("TMPDIR", tmpdir)];
    let py = torch_python();
    // Whole 2 MiB units: the caching allocator hands out exactly the size asked for (a
    // large block is not split when less than 1 MiB would remain).
    let mib = (i + 1) << 21;
    let kind = match i % 10 {
        6 if i != 6 && i != 36 => 0,
        k => k,
    };
    let (command, args, code): (Vec<String>, Vec<&str>, i32) = match kind {
        0 | 1 => (
            vec![
                py.clone(),
                data("trust/import_order.py"),
                "find_spec".into(),
                mib.to_string(),
            ],
            vec!["--gpu", "l4"],
            0,
        ),
        2 | 3 => (
            vec![py.clone(), data("alloc.py"), (5 * GIB + mib).to_string()],
            vec!["--gpu", "l4", "--gpu-memory", "4GiB"],
            1,
        ),
        4 | 5 => (
            vec![py.clone(), data("trust/ends.py"), "killed".into()],
            vec!["--gpu", "l4"],
            1,
        ),
        6 => (
            vec![py.clone(), data("trust/ends.py"), "hang".into()],
            vec!["--gpu", "l4", "--timeout", "12s"],
            1,
        ),
        7 => (
            vec![py.clone(), data("trust/children.py"), "spawn".into()],
            vec!["--gpu", "h100-80gb"],
            0,
        ),
        _ => (
            vec![py.clone(), data("trust/ends.py"), "nocuda".into()],
            vec!["--gpu", "l4"],
            3,
        ),
    };
    let r = emulate_env(&args, &command, &env);
    assert_eq!(r.code, code, "run {i}: {}", r.stderr);
    match kind {
        0 | 1 => assert_eq!(u(&r.json["run"]["max_memory_allocated"]), mib, "run {i}"),
        2 | 3 => assert_eq!(r.json["fits"], false, "run {i}"),
        4 | 5 => assert_eq!(r.json["ending"]["signal"], "SIGKILL", "run {i}"),
        6 => assert_eq!(r.json["ending"]["kind"], "timeout", "run {i}"),
        7 => assert_eq!(r.processes().len(), 2, "run {i}: {}", r.json),
        _ => assert_eq!(r.json["status"], "no-cuda-memory", "run {i}"),
    }
}
