"""Shared fixtures of the torch probe's unit tests (no torch needed).

The tests that compare with vramlab itself need its binary: $VRAMLAB_BIN (scripts/test.sh sets
it to the build of `cargo test --workspace`); without it they are skipped and say so.
"""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture
def vramlab(monkeypatch) -> str:
    """The vramlab binary, which the probe's grid.points runs too (through $VRAMLAB_BIN)."""
    b = os.environ.get("VRAMLAB_BIN")
    if not b:
        pytest.skip("VRAMLAB_BIN is not set: point it at a vramlab binary (`cargo build -p vramlab`, "
                    "then target/debug/vramlab) to compare with vramlab itself")
    if not Path(b).is_file():
        pytest.fail(f"VRAMLAB_BIN={b}: no such file")
    monkeypatch.setenv("VRAMLAB_BIN", b)
    return b


def run_vramlab(vramlab: str, *args) -> str:
    """vramlab's stdout, from the checkout's root (relative paths as the probe reads them)."""
    out = subprocess.run([vramlab, *map(str, args)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, f"vramlab {' '.join(map(str, args))}: {out.stderr}"
    return out.stdout
