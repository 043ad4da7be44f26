"""Rows in harness/src/record.rs's CSV schema."""
import csv
import json
from pathlib import Path

from .common import EMU_CONV_NOTE, emulated

# The CSV schema is the binary's (`vramlab schema --json`, from harness/src/record.rs's one
# record type), written beside this module; a Rust test fails when this copy is stale
# (`VRAMLAB_BLESS=1 cargo test -p vramlab --test docs_generated` rewrites it).
SCHEMA_FILE = Path(__file__).with_name("schema.json")
_SCHEMA = json.loads(SCHEMA_FILE.read_text())
SCHEMA_VERSION: int = _SCHEMA["schema_version"]
COLUMNS: list = [c["name"] for c in _SCHEMA["columns"]]


class Writer:
    def __init__(self, path: Path, append: bool = False):
        """A new CSV with its header; `append`: rows after those of an existing one (a worker
        of `vramlab sweep`, whose parent wrote the header)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        header = not append or not path.exists() or path.stat().st_size == 0
        self.f = open(path, "a" if append else "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS, lineterminator="\n")
        if header:
            self.w.writeheader()
        self.f.flush()

    def write(self, row: dict):
        if row.get("mode") == "generate" and emulated() and row.get("status") == "ok":
            # Every emulated generation row says how its convolutions ran.
            row = dict(row, message="; ".join(filter(None, (row.get("message"), EMU_CONV_NOTE))))
        out = {}
        for c in COLUMNS:
            v = row.get(c)
            if v is None:
                out[c] = ""
            elif isinstance(v, float):
                out[c] = f"{v:.3f}"
            else:
                out[c] = v
        self.w.writerow(out)
        self.f.flush()
