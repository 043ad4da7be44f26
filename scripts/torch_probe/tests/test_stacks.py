"""llm: the keywords and inputs that differ between software stacks (no torch needed)."""
from types import SimpleNamespace

from torch_probe.llm import dtype_kwarg, older_than


def test_older_than_compares_major_and_minor_only():
    assert older_than("4.39.3", 4, 40)
    assert not older_than("4.40.0", 4, 40)
    assert not older_than("5.24.0.dev0", 4, 56)
    assert older_than("4.9.1", 4, 10)  # numeric, not lexical


def test_the_dtype_keyword_follows_transformers_rename():
    assert dtype_kwarg(SimpleNamespace(__version__="4.39.3")) == "torch_dtype"
    assert dtype_kwarg(SimpleNamespace(__version__="4.56.0")) == "dtype"
    assert dtype_kwarg(SimpleNamespace(__version__="5.24.0")) == "dtype"
