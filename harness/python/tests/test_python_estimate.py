"""``vramlab.estimate()`` (harness/python/vramlab/_estimate.py) against the binary it wraps: the
same JSON, its figures typed, bad input as ValueError. Needs $VRAMLAB_BIN (scripts/test.sh sets
it); without it the tests are skipped and say so."""
import json
import os
import subprocess
from pathlib import Path

import pytest

import vramlab

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def bin_path() -> str:
    b = os.environ.get("VRAMLAB_BIN")
    if not b:
        pytest.skip("VRAMLAB_BIN is not set: point it at a vramlab binary (target/debug/vramlab)")
    return b


def direct(bin_path: str, *args: str) -> dict:
    out = subprocess.run([bin_path, "estimate", *args, "--json"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_estimate_is_the_binary_s_json_typed(bin_path: str) -> None:
    e = vramlab.estimate(model="llama-3.1-8b", gpu="rtx-4090", context=8192, batch=1)
    want = direct(bin_path, "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--context", "8192", "--batch", "1")
    assert e.json == want
    assert [(r.name, r.bytes) for r in e.breakdown] == [(r["name"], r["bytes"]) for r in want["breakdown"]]
    assert e.total_bytes == want["total_bytes"] and e.allocated_bytes == want["allocated_bytes"]
    assert e.verdict == want["gpu"]["verdict"] and e.fits == want["gpu"]["fits"]
    assert e.serving is None and e.emulated is None


def test_switches_and_the_serving_answer(bin_path: str) -> None:
    e = vramlab.estimate(
        model="qwen2.5-0.5b", runtime="vllm", gpu="h100-80gb", enforce_eager=True, max_model_len=4096
    )
    want = direct(
        bin_path, "--model", "qwen2.5-0.5b", "--runtime", "vllm", "--gpu", "h100-80gb", "--enforce-eager",
        "--max-model-len", "4096",
    )
    assert e.serving == want["serving"] and e.fits is True and e.verdict is None


def test_bad_input_is_a_value_error_with_the_binary_s_line(bin_path: str) -> None:
    with pytest.raises(ValueError, match="unknown --gpu `toaster`"):
        vramlab.estimate(model="llama-3.1-8b", gpu="toaster")
    assert vramlab._estimate.command("m", {"a_b": 1, "c": True, "d": False, "e": None})[2:] == [
        "--model", "m", "--a-b", "1", "--c", "--json"
    ]
