"""Loaded by Python at start-up under `vramlab emulate` (this folder is put first on PYTHONPATH).
It only installs vramlab's emulator hooks; torch is not imported until the program imports it."""

import os

if os.environ.get("VRAMLAB_EMU_DIR"):
    from vramlab import _emulate

    _emulate.install()
