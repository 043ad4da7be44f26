"""`python -m vramlab.probe SCENARIO.toml --out FILE.csv [--device cuda:0|cpu|emu:GPU] ...`:
vramlab's torch probe (docs/src/guides/torch-probe.md), from the installed package.

The probe's source is `scripts/torch_probe.py` of the repository. A wheel carries a copy
(`vramlab/_torch_probe.py`, put there by scripts/build-wheel.sh); in a checkout the script
itself is run.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def source() -> Path:
    """The probe script: the wheel's copy, else the checkout's."""
    here = Path(__file__).resolve().parent
    for p in (here / "_torch_probe.py", here.parent.parent.parent / "scripts" / "torch_probe.py"):
        if p.is_file():
            return p
    raise SystemExit("error: vramlab.probe: the torch probe is not in this installation")


def load():
    """The probe as a module namespace (its COLUMNS, Writer, ...), without running main."""
    return runpy.run_path(str(source()), run_name="vramlab_torch_probe")


if __name__ == "__main__":
    sys.argv[0] = str(source())
    runpy.run_path(str(source()), run_name="__main__")
