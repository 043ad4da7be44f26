"""grid: the probe's points and ids are `vramlab sweep --dry-run`'s, for every committed scenario
and for small grids that reach the axes the committed ones leave out."""
import pytest
from conftest import ROOT, run_vramlab

from torch_probe import grid
from torch_probe.common import InputError

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


def ids(spec: dict) -> list[str]:
    return [p["id"] for p in grid.expand(spec)]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_ids_are_vramlabs(vramlab, path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec, _ = grid.load_spec(path)
    got = ids(spec)
    assert got, f"{path.name}: no points"
    assert got == run_vramlab(vramlab, "sweep", "--dry-run", path).splitlines()


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_grid_ids_are_vramlabs(vramlab, name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    (tmp_path / "config.json").write_text(TINY_CONFIG)
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\ndevice = "cpu"\n[model]\nsource = "synthetic:{tmp_path}/config.json"\n'
                    + GRIDS[name])
    spec, text = grid.load_spec(path)
    assert text == path.read_text()
    assert ids(spec) == run_vramlab(vramlab, "sweep", "--dry-run", path).splitlines()


def test_point_fields():
    spec = {"name": "s", "model": {"source": "synthetic:m/config.json"},
            "sweep": {"mode": ["infer"], "precision": ["f32"], "batch": [2], "context": [64],
                      "decode_steps": 8}}
    [p] = grid.expand(spec)
    assert p["id"] == "synthetic-m/infer/f32/b2/c64/preallocated"
    assert (p["prompt_len"], p["decode_steps"], p["decode_every"]) == (56, 8, 8)
    assert p["train"]["optimizer"] == "adamw"


@pytest.mark.parametrize("source, want", [
    ("hf:models/SmolLM2-135M", "SmolLM2-135M"),
    ("gguf:models/x/SmolLM2.Q4_1.gguf", "SmolLM2.Q4_1"),
    ("synthetic:configs/llama-3.1-8b.json", "synthetic-llama-3.1-8b"),
    ("synthetic:configs/tiny/config.json", "synthetic-tiny"),
    ("nonsense", "nonsense"),
])
def test_model_id(source, want):
    assert grid.model_id(source) == want


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


def test_load_spec_names_the_missing_field(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[model]\nsource = "hf:x"\n')
    with pytest.raises(InputError, match="missing field `sweep`"):
        grid.load_spec(p)
    p.write_text("name = ")
    with pytest.raises(InputError, match=str(p)):
        grid.load_spec(p)
