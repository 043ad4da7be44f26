"""The probe writes the binary's CSV schema: its columns come from schema.json, which is
`vramlab schema --json` (harness/src/record.rs's one record type), not from a list of its own."""
import csv
import importlib
import json
import shutil
import sys
from pathlib import Path

from conftest import run_vramlab

PROBE = Path(__file__).resolve().parents[2] / "vramlab" / "probe"


def test_the_committed_schema_is_the_binarys(vramlab):
    live = json.loads(run_vramlab(vramlab, "schema", "--json"))
    assert json.loads((PROBE / "schema.json").read_text()) == live
    import vramlab.probe as probe
    assert probe.SCHEMA_VERSION == live["schema_version"]
    assert probe.COLUMNS == [c["name"] for c in live["columns"]]


def test_a_column_changed_in_the_schema_is_a_column_the_writer_writes(tmp_path, monkeypatch):
    # A copy of the probe package whose schema gains a column, renames one and bumps the
    # version: the writer's header and rows follow the file, with no edit to the Python.
    pkg = tmp_path / "probe_copy"
    shutil.copytree(PROBE, pkg, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    schema = json.loads((pkg / "schema.json").read_text())
    schema["schema_version"] += 1
    schema["columns"].insert(3, {"name": "added_here", "since": schema["schema_version"]})
    renamed = schema["columns"][-1]["name"] + "_renamed"
    schema["columns"][-1]["name"] = renamed
    (pkg / "schema.json").write_text(json.dumps(schema))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        csvout = importlib.import_module("probe_copy.csvout")
        out = tmp_path / "rows.csv"
        w = csvout.Writer(out)
        w.write({"schema_version": csvout.SCHEMA_VERSION, "added_here": 7, renamed: "x"})
        w.f.close()
        with out.open() as f:
            header, row = list(csv.reader(f))
        assert header == [c["name"] for c in schema["columns"]]
        assert row[0] == str(schema["schema_version"])
        assert row[3] == "7"
        assert row[-1] == "x"
    finally:
        for m in [m for m in sys.modules if m == "probe_copy" or m.startswith("probe_copy.")]:
            del sys.modules[m]
