"""``vramlab.estimate()``: the estimate from Python, built on ``vramlab estimate --json``.

    import vramlab
    e = vramlab.estimate(model="llama-3.1-8b", gpu="rtx-4090", context=8192)
    e.total_bytes, e.verdict, e.fits         # 17930558129, "fits", True
    for row in e.breakdown:
        print(row.name, row.bytes)
    e = vramlab.estimate(model="qwen2.5-0.5b", runtime="vllm", gpu="h100-80gb",
                         enforce_eager=True, max_model_len=4096)
    e.serving["kv_tokens"]

Every keyword is the flag of the same name (``max_model_len=4096`` is ``--max-model-len 4096``;
``True`` gives a switch, ``False`` and ``None`` leave it out), so the command line's ``--help``
documents them all. The binary is ``$VRAMLAB_BIN``, else the ``vramlab`` on ``PATH`` (the wheel
installs it beside its Python). Bad input (exit 2) raises :class:`ValueError` with the binary's
one line; a failure (exit 1, e.g. the emulated run failed) raises :class:`RuntimeError`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union


@dataclass(frozen=True)
class Row:
    """One row of the breakdown: its name and its bytes."""

    name: str
    bytes: int


@dataclass(frozen=True)
class Estimate:
    """What ``vramlab estimate --json`` printed, with the figures typed.

    ``json`` keeps the whole document (every field of the command's JSON, documented in
    docs/src/guides/estimate.md). An LLM estimate fills the breakdown, the totals and, with
    ``gpu=``, the verdict; a ``runtime="vllm"`` estimate fills ``serving``; ``emulate=`` fills
    ``emulated`` (PyTorch's, or vLLM's, own figures on the emulated GPU: never a GPU measurement).
    """

    json: Dict[str, Any]
    breakdown: List[Row] = field(default_factory=list)
    total_bytes: Optional[int] = None
    allocated_bytes: Optional[int] = None
    reserved_bytes: Optional[int] = None
    verdict: Optional[str] = None
    fits: Optional[bool] = None
    serving: Optional[Dict[str, Any]] = None
    emulated: Optional[Dict[str, Any]] = None


Flag = Union[str, int, float, bool, None]


def binary() -> str:
    """The vramlab binary: ``$VRAMLAB_BIN``, else ``vramlab`` beside this Python, else on PATH."""
    explicit = os.environ.get("VRAMLAB_BIN")
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(sys.executable), "vramlab")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("vramlab")
    if found is None:
        raise FileNotFoundError("no vramlab binary: pip install vramlab, or set $VRAMLAB_BIN")
    return found


def command(model: str, flags: Dict[str, Flag]) -> List[str]:
    """The argument list of ``vramlab estimate`` for ``model`` and ``flags``."""
    argv = [binary(), "estimate", "--model", model]
    for key, value in flags.items():
        if value is None or value is False:
            continue
        argv.append("--" + key.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    argv.append("--json")
    return argv


def estimate(model: str, **flags: Flag) -> Estimate:
    """Estimates ``model`` (a preset, a path, a Hub id or a pipeline) under ``flags``."""
    run = subprocess.run(command(model, flags), capture_output=True, text=True, check=False)
    if run.returncode == 2:
        raise ValueError(run.stderr.strip())
    if run.returncode != 0:
        raise RuntimeError(run.stderr.strip() or f"vramlab estimate exited {run.returncode}")
    doc = json.loads(run.stdout)
    serving = doc.get("serving")
    gpu = doc.get("gpu") if isinstance(doc.get("gpu"), dict) and serving is None else None
    return Estimate(
        json=doc,
        breakdown=[Row(r["name"], int(r["bytes"])) for r in doc.get("breakdown", [])],
        total_bytes=doc.get("total_bytes"),
        allocated_bytes=doc.get("allocated_bytes"),
        reserved_bytes=doc.get("reserved_bytes"),
        verdict=gpu.get("verdict") if gpu else None,
        fits=serving["fits"] if serving is not None else (gpu.get("fits") if gpu else None),
        serving=serving,
        emulated=doc.get("emulated"),
    )
