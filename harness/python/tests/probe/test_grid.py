"""grid: the probe's points are `vramlab sweep --dry-run --json`'s, read into the probe's form, for
every committed scenario and for small grids that reach the axes the committed ones leave out; the
probe makes up no point of its own and relays vramlab's refusal."""
import json
import sys

import pytest
from conftest import ROOT, run_vramlab

from vramlab.probe import common, grid
from vramlab.probe.common import InputError

SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))

TINY_CONFIG = """{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1024,
"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
"num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
"rope_theta": 10000.0, "tie_word_embeddings": false}"""

# Sweep tables for the tiny config above (the model source is filled in).
GRIDS = {
    "tables-and-repeats": """
[[sweep]]
mode = ["infer"]
precision = ["f32", "bf16"]
batch = [1, 2]
context = [32, 64]
kv_cache = ["preallocated", "growing"]
repeats = 2
[[sweep]]
mode = ["train"]
precision = ["f32", "mixed-bf16"]
batch = [4]
context = [16]
optimizer = ["adamw", "sgd"]
checkpointing = ["none", "layer"]
grad_accum = [1, 2]
trainable = ["full", "lora-r8"]
""",
    "infer-and-train-in-one-table": """
[sweep]
mode = ["infer", "train"]
precision = ["f32"]
batch = [1]
context = [32, 64]
decode_steps = 8
decode_every = 4
kv_window = ["model", "full"]
attention = ["eager", "flash"]
kernels = ["reference", "fused"]
""",
}


def points(path):
    s = grid.load(path)
    return s.plan, s.points


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_points_are_vramlabs(vramlab, path, monkeypatch):
    monkeypatch.chdir(ROOT)
    plan, got = points(path)
    assert got, f"{path.name}: no points"
    assert [p["id"] for p in got] == run_vramlab(vramlab, "sweep", "--dry-run", path).splitlines()
    tables = grid.as_list(grid.load(path).spec["sweep"])
    for p in got:
        if plan == "llm":
            # The table's own attention, else the probe's --attention (None).
            want = p["ops"]["attention"] if "attention" in tables[p["table"]] else None
            assert p["attention"] == want, p["id"]
        elif plan == "generate":
            assert f"{p['width']}x{p['height']}" == p["shape"]["resolution"], p["id"]
            assert (p["mode"], p["gen_attention"], p["frames"]) == ("generate", p["attention"], p["shape"]["frames"])


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_grid_points_are_vramlabs(vramlab, name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    (tmp_path / "config.json").write_text(TINY_CONFIG)
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\ndevice = "cpu"\n[model]\nsource = "synthetic:{tmp_path}/config.json"\n'
                    + GRIDS[name])
    spec, text, plan, got = grid.load(path)
    assert text == path.read_text()
    assert spec["name"] == name
    assert plan == "llm"
    assert [p["id"] for p in got] == run_vramlab(vramlab, "sweep", "--dry-run", path).splitlines()
    # Only the one-table grid sets `attention`: its points carry it, the others leave it to
    # the probe's --attention.
    attention = {p["attention"] for p in got}
    assert attention == ({"eager", "flash"} if name == "infer-and-train-in-one-table" else {None})


def test_point_fields(vramlab, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[model]\nsource = "synthetic:m/config.json"\n[sweep]\nmode = ["infer"]\n'
                    'precision = ["f32"]\nbatch = [2]\ncontext = [64]\ndecode_steps = 8\n')
    plan, [p] = points(path)
    assert (plan, p["id"]) == ("llm", "synthetic-m/infer/f32/b2/c64/preallocated")
    assert (p["prompt_len"], p["decode_steps"], p["decode_every"]) == (56, 8, 8)
    assert p["train"]["optimizer"] == "adamw"


def fake_vramlab(tmp_path, monkeypatch, stdout: str, stderr: str = "", code: int = 0):
    """A `vramlab` that prints `stdout` and `stderr` and exits `code`, as VRAMLAB_BIN."""
    b = tmp_path / "vramlab"
    b.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\nprintf '%s\\n' '{stderr}' >&2\nexit {code}\n")
    b.chmod(0o755)
    monkeypatch.setenv("VRAMLAB_BIN", str(b))


def test_the_points_are_the_binarys_alone(tmp_path, monkeypatch):
    """Whatever vramlab prints is the grid: a point it names is run, none is made up here."""
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[model]\nsource = "hf:x"\n[sweep]\nmode = ["infer"]\n')
    point = {"id": "made/up/by/the/binary", "table": 0, "mode": "infer", "ops": {"attention": "sdpa"}}
    spec = {"name": "from-the-binary", "sweep": {"mode": ["infer"]}}
    fake_vramlab(tmp_path, monkeypatch, json.dumps({"scenario": spec, "plan": "llm", "points": [point]}))
    assert grid.load(path).spec["name"] == "from-the-binary"
    plan, [p] = points(path)
    assert (plan, p["id"], p["attention"]) == ("llm", "made/up/by/the/binary", None)


def test_a_scenario_vramlab_refuses_is_its_line(tmp_path, monkeypatch):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[model]\nsource = "hf:x"\n[sweep]\nmode = ["infer"]\n')
    fake_vramlab(tmp_path, monkeypatch, "", f"error: {path}: line 5: bad", 2)
    with pytest.raises(InputError, match=f"^{path}: line 5: bad$"):
        points(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("VRAMLAB_BIN", str(empty / "missing"))
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(common, "ROOT", empty)
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    with pytest.raises(InputError, match="needs the vramlab binary"):
        points(path)


def test_expand_env(monkeypatch):
    monkeypatch.delenv("VRAMLAB_MODELS", raising=False)
    assert grid.expand_env("${VRAMLAB_MODELS}/a") == ".cache/models/a"
    monkeypatch.setenv("X_DIR", "/x")
    assert grid.expand_env("${X_DIR}/b/${X_DIR}") == "/x/b//x"
    monkeypatch.delenv("X_DIR")
    with pytest.raises(InputError, match="`X_DIR` is not set"):
        grid.expand_env("${X_DIR}")
    with pytest.raises(InputError, match="unclosed"):
        grid.expand_env("${X_DIR")


@pytest.mark.parametrize("bad", ["nocolon", "s3:bucket/x"])
def test_parse_source_refuses(bad):
    with pytest.raises(InputError):
        grid.parse_source(bad)


def test_parse_resolution():
    assert grid.parse_resolution("512x384") == (512, 384)
    with pytest.raises(InputError, match="WIDTHxHEIGHT"):
        grid.parse_resolution("512")


def test_the_scenario_is_vramlabs_reading(vramlab, tmp_path):
    """The TOML is read by vramlab alone: its one line for a missing field or bad syntax, and
    the probe's spec is what vramlab parsed."""
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[model]\nsource = "hf:x"\n')
    with pytest.raises(InputError, match=f"^{p}: .*sweep"):
        grid.load(p)
    p.write_text("name = ")
    with pytest.raises(InputError, match=str(p)):
        grid.load(p)
    with pytest.raises(InputError, match="cannot read scenario"):
        grid.load(tmp_path / "missing.toml")
