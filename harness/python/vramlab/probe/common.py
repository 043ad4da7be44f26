"""What every part of the probe shares: bad input, the checkout, run metadata, the emulated GPU."""
import datetime as _dt
import hashlib
import json
import os
from pathlib import Path

# The checkout (harness/python/vramlab/probe/ is four levels down); in a wheel, a folder above
# site-packages (where no build is found).
ROOT = Path(__file__).resolve().parents[4]
# The package's directory (`python3 harness/python/vramlab/probe` runs it).
PKG_DIR = Path(__file__).resolve().parent

class InputError(Exception):
    """Bad input: exit code 2, like vramlab."""


def now_rfc3339() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def short_hash(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:16]


def git_rev() -> str:
    import subprocess
    try:  # a worktree's .git is a file: ask git first
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout.strip()[:12]
    except (OSError, subprocess.SubprocessError):
        pass
    head = ROOT / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            return (ROOT / ".git" / ref[5:]).read_text().strip()[:12]
        return ref[:12]
    except OSError:
        return ""


EMU_CONV_NOTE = ("emulated: convolutions on PyTorch's native CUDA path (cuDNN off); cuDNN's "
                 "algorithm and workspace are not modeled")


def materialize(torch, model, device):
    """A model built on `meta`, each tensor allocated once on the emulated `device`, tied ones
    kept tied (vramlab._emulate.materialize; `vramlab emulate` puts it on PYTHONPATH)."""
    from vramlab._emulate import materialize as allocate_once
    return allocate_once(model, device)


def emulated() -> bool:
    """Whether this process runs on vramlab's emulated GPU (`vramlab emulate` sets these)."""
    return bool(os.environ.get("VRAMLAB_EMU_TOTAL")) and bool(os.environ.get("VRAMLAB_EMU_DIR"))


def vramlab_bin() -> str:
    """The vramlab binary (the scenario's points, and `vramlab emulate` for emu:GPU): $VRAMLAB_BIN,
    PATH, the one beside this Python (the wheel's venv), or this checkout's newest build (release
    or debug)."""
    import shutil
    import sys
    for c in (os.environ.get("VRAMLAB_BIN"), shutil.which("vramlab"),
              str(Path(sys.executable).parent / "vramlab")):
        if c and Path(c).is_file():
            return str(c)
    builds = [b for b in (ROOT / "target" / "release" / "vramlab", ROOT / "target" / "debug" / "vramlab")
              if b.is_file()]
    if builds:
        return str(max(builds, key=lambda b: b.stat().st_mtime))
    raise InputError("the torch probe needs the vramlab binary, which expands the scenario's points "
                     "and runs emu:GPU (set VRAMLAB_BIN, put it on PATH, or `cargo build -p vramlab`)")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read config: {e}") from e


def self_args() -> list:
    """The arguments after `python` that run this probe again in another process: its
    directory, which any interpreter runs (another stack's has no vramlab installed)."""
    return [str(PKG_DIR)]
