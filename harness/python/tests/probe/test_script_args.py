"""The shell scripts' bad input (scripts/lib/args.sh): every scripts/**/*.sh refuses an unknown flag
or an unexpected argument with one line on stderr naming itself and the argument, exit 2, and
prints its usage for -h/--help, exit 0.

Each script runs in a sandbox where it could not do its real work unnoticed: an empty HOME and
working folder, every vramlab cache inside them, no VRAMLAB_* setting and a PATH without cargo;
the sandbox must still be empty afterwards (the arguments are refused before anything is done).
"""
import os
import re
import subprocess

import pytest
from conftest import ROOT

from vramlab.probe.cli import parser

SCRIPTS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "scripts").rglob("*.sh")
                 if p.parent.name != "lib")


@pytest.fixture
def sandbox(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMLAB_") and k != "OUT"}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), PATH="/usr/bin:/bin")
    for var in ("TORCH", "WHEEL", "CUDA", "EMU", "LINT"):
        env[f"VRAMLAB_{var}_CACHE"] = str(home / "cache" / var.lower())
    yield cwd, env
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p not in (home, cwd))
    assert not left, f"the script wrote {left}"


def run(script: str, sandbox, *args) -> subprocess.CompletedProcess:
    cwd, env = sandbox
    return subprocess.run(["bash", str(ROOT / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=30)


def one_line_refusal(script: str, out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, f"{script}: exit {out.returncode}, stderr {out.stderr!r}"
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, f"{script}: {out.stderr!r}"
    assert lines[0].startswith(f"{script}: "), lines[0]
    return lines[0]


def test_every_script_is_checked():
    assert "scripts/test.sh" in SCRIPTS and "scripts/gpu/run.sh" in SCRIPTS and len(SCRIPTS) >= 16


@pytest.mark.parametrize("args", [["--bogus-flag"], ["--bogus-flag=1"], ["x", "--bogus-flag"]],
                         ids=["flag", "flag=value", "after-an-argument"])
@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unknown_flag_is_refused_in_one_line(script, args, sandbox):
    line = one_line_refusal(script, run(script, sandbox, *args))
    assert "--bogus-flag" in line


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_argument_too_many_is_refused_in_one_line(script, sandbox):
    line = one_line_refusal(script, run(script, sandbox, "a1", "a2", "a3", "a4"))
    assert re.search(r"unexpected argument 'a[1-4]'", line), line


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage(script, flag, sandbox):
    out = run(script, sandbox, flag)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert script in out.stdout, f"{script} {flag} does not name the script: {out.stdout!r}"


@pytest.mark.parametrize("args, says", [
    (["--stack"], "--stack needs a value"),
    (["--stack", "torch-0.1"], "unknown stack 'torch-0.1'"),
])
def test_torch_env_refuses_a_bad_stack(args, says, sandbox):
    assert says in one_line_refusal("scripts/torch-env.sh", run("scripts/torch-env.sh", sandbox, *args))


def test_emulator_build_headers_needs_its_output_folder(sandbox):
    line = one_line_refusal("scripts/emulator-build.sh", run("scripts/emulator-build.sh", sandbox, "--headers", "inc"))
    assert "OUT" in line


def test_torch_cpu_knows_the_probes_flags():
    """scripts/torch-cpu.sh checks its arguments against its own list of the probe's flags."""
    text = (ROOT / "scripts/torch-cpu.sh").read_text()
    listed = re.search(r"^PROBE_FLAGS=\(([^)]*)\)", text, re.M).group(1).split()
    probe = [a.option_strings[-1] + ("" if a.nargs == 0 else "=")
             for a in parser()._actions if a.option_strings and "--help" not in a.option_strings]
    assert sorted(listed) == sorted(probe)


def test_build_wheel_refuses_an_output_folder_it_cannot_make(sandbox, tmp_path):
    blocker = tmp_path / "cwd" / "a-file"
    blocker.write_text("")
    for args in (["--out", f"{blocker}/wheels"], [f"{blocker}/wheels"], ["--out", str(blocker)]):
        line = one_line_refusal("scripts/build-wheel.sh", run("scripts/build-wheel.sh", sandbox, *args))
        assert "cannot write the wheel into" in line and str(blocker) in line
    blocker.unlink()


@pytest.mark.parametrize("args", [["--out", "{dir}"], ["--out={dir}"], ["{dir}"]])
def test_build_wheel_out_is_the_wheels_folder(args, sandbox, tmp_path):
    """--out DIR (or DIR) is made before the build starts. The build itself stops at once here:
    its cache folder (VRAMLAB_WHEEL_CACHE), where everything it builds goes, is under a file."""
    cwd, env = sandbox
    wheels = tmp_path / "wheels"
    blocker = tmp_path / "cache-blocker"
    blocker.write_text("")
    env = {**env, "VRAMLAB_WHEEL_CACHE": str(blocker / "cache")}
    out = run("scripts/build-wheel.sh", (cwd, env), *(a.format(dir=wheels) for a in args))
    assert out.returncode == 1 and out.stdout == "" and "cache-blocker" in out.stderr, out.stderr
    assert wheels.is_dir()
    wheels.rmdir()
    blocker.unlink()
