"""features: the probe's feature_* columns are vramlab's own (`vramlab features`, from the
definition every sweep row uses), checked on the rows of a real `vramlab sweep` of a tiny model
on CPU; the probe passes its rows and its LoRA targets, and relays a refusal."""
import csv
import json

import pytest
from conftest import run_vramlab
from test_grid import TINY_CONFIG, fake_vramlab

from vramlab.probe import grid
from vramlab.probe.common import InputError

FEATURES = ("feature_weight_bytes", "feature_kv_bytes", "feature_act_bytes", "feature_logits_bytes",
            "feature_optimizer_bytes")

SWEEP = """
[[sweep]]
mode = ["infer"]
precision = ["f32", "bf16"]
batch = [1, 2]
context = [32, 48]
kv_cache = ["preallocated", "growing"]
decode_steps = 8
decode_every = 4
[[sweep]]
mode = ["train"]
precision = ["f32", "mixed-bf16"]
batch = [2]
context = [16]
optimizer = ["adamw", "sgd"]
trainable = ["full", "lora-r4"]
"""


def test_features_are_the_sweeps(vramlab, tmp_path):
    """Every row of a sweep: what the probe is told for (phase, kv_tokens) is what vramlab wrote."""
    (tmp_path / "config.json").write_text(TINY_CONFIG)
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(f'name = "tiny"\ndevice = "cpu"\n[model]\n'
                        f'source = "synthetic:{tmp_path}/config.json"\n' + SWEEP)
    out = tmp_path / "tiny.csv"
    run_vramlab(vramlab, "sweep", scenario, "--out", out)
    by_point: dict = {}
    for r in csv.DictReader(out.open()):
        assert r["status"] == "ok", r
        by_point.setdefault(r["point_id"], []).append(r)
    checked = set()
    for pid, rows in by_point.items():
        got = grid.features(scenario, pid, [(r["phase"], int(r["kv_tokens"] or 0)) for r in rows])
        assert len(got) == len(rows)
        for r, f in zip(rows, got):
            assert f == {k: int(r[k] or 0) for k in FEATURES}, f"{pid} {r['phase']} step {r['step']}"
            checked.add((pid.split("/")[1], r["phase"]))
    assert {("infer", "load"), ("infer", "prefill"), ("infer", "decode"), ("train", "forward"),
            ("train", "optimizer")} <= checked
    # The adapters count: a LoRA point's weights exceed the full point's, its optimizer is less.
    lora = next(p for p in by_point if "lora-r4" in p and "adamw" in p)
    full = lora.replace("lora-r4", "full")
    [fl], [ff] = (grid.features(scenario, p, [("optimizer", 0)]) for p in (lora, full))
    assert fl["feature_weight_bytes"] > ff["feature_weight_bytes"]
    assert 0 < fl["feature_optimizer_bytes"] < ff["feature_optimizer_bytes"]
    # More LoRA targets, more adapters.
    [fa] = grid.features(scenario, lora, [("optimizer", 0)], "all-linear")
    assert fa["feature_optimizer_bytes"] > fl["feature_optimizer_bytes"]


def test_the_probe_asks_for_its_rows(tmp_path, monkeypatch):
    """The rows go as --row PHASE@KV in order; only the feature_* columns come back."""
    args_file = tmp_path / "args"
    b = tmp_path / "vramlab"
    row = {"phase": "decode", "kv_tokens": 9, **{k: i for i, k in enumerate(FEATURES)}}
    b.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {args_file}\n"
                 f"echo '{json.dumps([row, row])}'\n")
    b.chmod(0o755)
    monkeypatch.setenv("VRAMLAB_BIN", str(b))
    got = grid.features(tmp_path / "s.toml", "p/1", [("prefill", 7), ("decode", 9)], "q,v")
    assert got == [{k: i for i, k in enumerate(FEATURES)}] * 2
    assert args_file.read_text().split() == ["features", str(tmp_path / "s.toml"), "--point", "p/1",
                                             "--json", "--row", "prefill@7", "--row", "decode@9",
                                             "--lora-targets", "q,v"]


def test_a_refusal_is_vramlabs_line(tmp_path, monkeypatch):
    fake_vramlab(tmp_path, monkeypatch, "", "error: s.toml: point `x` is not a point of this scenario", 2)
    with pytest.raises(InputError, match="^s.toml: point `x` is not a point of this scenario$"):
        grid.features(tmp_path / "s.toml", "x", [("load", 0)])
