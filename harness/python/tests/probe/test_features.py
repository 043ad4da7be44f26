"""features: the probe's feature_* columns are vramlab's (harness/src/features.rs), checked on the
rows of a real `vramlab sweep` of a tiny model on CPU; shape_of reads both config spellings."""
import csv
import json
from types import SimpleNamespace

import pytest
from conftest import run_vramlab
from test_grid import TINY_CONFIG

from vramlab.probe import grid
from vramlab.probe.features import PRECISION_BYTES, features, shape_of

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
"""


def test_features_are_vramlabs(vramlab, tmp_path):
    (tmp_path / "config.json").write_text(TINY_CONFIG)
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(f'name = "tiny"\ndevice = "cpu"\n[model]\n'
                        f'source = "synthetic:{tmp_path}/config.json"\n' + SWEEP)
    out = tmp_path / "tiny.csv"
    run_vramlab(vramlab, "sweep", scenario, "--out", out)
    rows = list(csv.DictReader(out.open()))
    points = {p["id"]: p for p in grid.load(scenario).points}
    shape = shape_of(SimpleNamespace(**json.loads(TINY_CONFIG)))
    checked = set()
    for r in rows:
        assert r["status"] == "ok", r
        p = points[r["point_id"]]
        params = int(r["param_count"])
        f = features(shape, p, r["phase"], int(r["kv_tokens"] or 0), params, params)
        # The probe leaves out what a load row does not have; vramlab writes 0.
        got = {k: f.get(k, 0) for k in FEATURES}
        want = {k: int(r[k] or 0) for k in FEATURES}
        assert got == want, f"{r['point_id']} {r['phase']} step {r['step']}"
        checked.add((p["mode"], r["phase"]))
    assert {("infer", "load"), ("infer", "prefill"), ("infer", "decode"), ("train", "forward")} <= checked


def test_shape_of_reads_both_spellings():
    llama = SimpleNamespace(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=1024)
    assert shape_of(llama) == dict(hidden=128, layers=2, vocab=1024, kv_per_token=2 * 2 * 2 * 32)
    # GPT-2's names; no KV heads: as many as the attention heads.
    gpt2 = SimpleNamespace(n_embd=64, n_layer=3, n_head=4, vocab_size=500)
    assert shape_of(gpt2) == dict(hidden=64, layers=3, vocab=500, kv_per_token=2 * 3 * 4 * 16)
    # An explicit head_dim wins over hidden / heads.
    gemma = SimpleNamespace(hidden_size=128, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=1, head_dim=64, vocab_size=10)
    assert shape_of(gemma)["kv_per_token"] == 2 * 1 * 1 * 64


@pytest.mark.parametrize("precision, weights, compute", [("f32", 4, 4), ("bf16", 2, 2), ("mixed-bf16", 4, 2)])
def test_precision_bytes(precision, weights, compute):
    assert PRECISION_BYTES[precision] == (weights, compute)
