"""llm: the keywords and inputs that differ between software stacks (no torch needed)."""
from types import SimpleNamespace

from vramlab.probe.llm import dtype_kwarg, older_than


def test_older_than_compares_major_and_minor_only():
    assert older_than("4.39.3", 4, 40)
    assert not older_than("4.40.0", 4, 40)
    assert not older_than("5.24.0.dev0", 4, 56)
    assert older_than("4.9.1", 4, 10)  # numeric, not lexical


def test_the_dtype_keyword_follows_transformers_rename():
    assert dtype_kwarg(SimpleNamespace(__version__="4.39.3")) == "torch_dtype"
    assert dtype_kwarg(SimpleNamespace(__version__="4.56.0")) == "dtype"
    assert dtype_kwarg(SimpleNamespace(__version__="5.24.0")) == "dtype"


def test_a_scenarios_stacks_write_one_csv_each_and_name_a_missing_one(tmp_path, monkeypatch):
    import pytest

    from vramlab.probe.cli import stack_out, stack_python
    from vramlab.probe.common import InputError

    out = tmp_path / "emu.csv"
    assert stack_out(out, "default") == out
    assert stack_out(out, "torch-2.2") == tmp_path / "emu-torch-2.2.csv"
    monkeypatch.setenv("VRAMLAB_TORCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(InputError, match="unknown"):
        stack_python("torch-1.0")
    with pytest.raises(InputError, match="scripts/torch-env.sh --stack torch-2.2"):
        stack_python("torch-2.2")
    py = tmp_path / "cache" / "stacks" / "torch-2.2" / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("")
    assert stack_python("torch-2.2") == str(py)
