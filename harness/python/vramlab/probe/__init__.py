"""vramlab's torch probe: a vramlab scenario measured with PyTorch (docs/src/guides/torch-probe.md).

Run it as `python -m vramlab.probe SCENARIO.toml ...` where vramlab is installed or on the path,
or by its directory, `python3 harness/python/vramlab/probe ...` (how vramlab runs it, under any
stack's interpreter); the options are in cli.py. The modules: grid (the scenario and vramlab's
points of it), meters, csvout (the CSV rows), features (the feature_* columns), llm (language
models with transformers), generate (diffusers pipelines), cli (the command line and the run),
common. Importing the package imports no torch. The published programs `vramlab validate
--emulate` runs are beside it, in vramlab/peers/.
"""
from .csvout import COLUMNS, SCHEMA_VERSION

__all__ = ["COLUMNS", "SCHEMA_VERSION"]
