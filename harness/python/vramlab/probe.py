"""`python -m vramlab.probe SCENARIO.toml --out FILE.csv [--device cuda:0|cpu|emu:GPU] ...`:
vramlab's torch probe (docs/src/guides/torch-probe.md), from the installed package.

The probe's source is the package `scripts/torch_probe` of the repository. A wheel carries a
copy (the subpackage `vramlab._torch_probe`, put there by scripts/build-wheel.sh); in a checkout
the repository's package itself is run.
"""

from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path


def source() -> Path:
    """The probe's package directory: the wheel's copy, else the checkout's."""
    here = Path(__file__).resolve().parent
    for p in (here / "_torch_probe", here.parent.parent.parent / "scripts" / "torch_probe"):
        if (p / "__init__.py").is_file():
            return p
    raise SystemExit("error: vramlab.probe: the torch probe is not in this installation")


def module_name() -> str:
    """The probe's package as an importable name: `vramlab._torch_probe` in a wheel; in a
    checkout `torch_probe`, importable once scripts/ is on sys.path (added here)."""
    src = source()
    if src.parent == Path(__file__).resolve().parent:
        return f"{__package__ or 'vramlab'}.{src.name}"
    if str(src.parent) not in sys.path:
        sys.path.insert(0, str(src.parent))
    return src.name


def load():
    """The probe's CSV module (its SCHEMA_VERSION, COLUMNS, Writer), without torch."""
    return importlib.import_module(f"{module_name()}.csvout")


if __name__ == "__main__":
    sys.argv[0] = str(source())
    runpy.run_module(module_name(), run_name="__main__")
