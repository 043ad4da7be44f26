"""vramlab's torch probe: a vramlab scenario measured with PyTorch (docs/src/guides/torch-probe.md).

Run it as `python3 scripts/torch_probe SCENARIO.toml ...` from a checkout, or as
`python -m vramlab.probe` from the wheel (which carries this package as `vramlab._torch_probe`);
the options are in cli.py. The modules: grid (scenario expansion and point ids), meters, csvout
(the CSV rows), features (the feature_* columns), llm (language models with transformers),
generate (diffusers pipelines), cli (the command line and the run), common. Importing the package
imports no torch.
"""
from .csvout import COLUMNS, SCHEMA_VERSION

__all__ = ["COLUMNS", "SCHEMA_VERSION"]
