"""A scenario and its points, vramlab's own: `vramlab sweep SCENARIO --dry-run --json` parses the
TOML and expands the grid (harness/src/scenario/), and this module only reads what it prints into
the probe's form, so the ids, the axes' order, their defaults and the TOML's reading have one
source (and the probe needs no tomllib: Python 3.9 runs it); `features` asks it for the rows'
`feature_*` columns, which have no Python copy either. Imports no torch."""
import json
import os
import re
import subprocess
from pathlib import Path
from typing import NamedTuple, Optional

from .common import InputError, vramlab_bin


def expand_env(s: str) -> str:
    """`${VAR}` from the environment; VRAMLAB_MODELS defaults to .cache/models (source.rs)."""
    out, rest = [], s
    while "${" in rest:
        i = rest.index("${")
        out.append(rest[:i])
        end = rest.find("}", i)
        if end < 0:
            raise InputError(f"unclosed `${{` in `{s}`")
        var = rest[i + 2:end]
        val = os.environ.get(var)
        if val is None:
            if var == "VRAMLAB_MODELS":
                val = ".cache/models"
            else:
                raise InputError(f"environment variable `{var}` is not set")
        out.append(val)
        rest = rest[end + 1:]
    out.append(rest)
    return "".join(out)


def parse_source(s: str) -> tuple[str, str]:
    if ":" not in s:
        raise InputError(f"model source `{s}` must be `hf:DIR`, `gguf:FILE` or `synthetic:CONFIG.json`")
    kind, path = s.split(":", 1)
    if kind not in ("hf", "gguf", "synthetic"):
        raise InputError(f"unknown model source kind `{kind}` in `{s}`")
    return kind, expand_env(path)


def as_list(v):
    return v if isinstance(v, list) else [v]


def parse_resolution(r: str) -> tuple[int, int]:
    m = re.fullmatch(r"([0-9]+)x([0-9]+)", str(r))
    if not m:
        raise InputError(f"resolution `{r}` must be WIDTHxHEIGHT in pixels, e.g. 512x512")
    return int(m.group(1)), int(m.group(2))


class Scenario(NamedTuple):
    """A scenario as vramlab read it."""
    spec: dict
    """The TOML, as vramlab parsed it."""
    text: str
    """The file's text (its hash and text go in the manifest)."""
    plan: str
    """The points' kind: `llm`, `generate` or `finetune`."""
    points: list
    """The points in grid order, each in the probe's form (`_FORMS`)."""


def load(path: Path) -> Scenario:
    """The scenario at `path`, through `vramlab sweep PATH --dry-run --json`. A file vramlab
    refuses is its one line."""
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"{path}: cannot read scenario: {e}") from e
    doc = json.loads(_vramlab("sweep", str(path), "--dry-run", "--json", what="the scenario's points"))
    spec, plan = doc["scenario"], doc["plan"]
    tables = as_list(spec["sweep"])
    return Scenario(spec, text, plan, [_FORMS[plan](p, tables[p["table"]]) for p in doc["points"]])


def features(path: Path, point: str, rows: list, lora_targets: Optional[str] = None) -> list:
    """The `feature_*` columns of point `point`'s rows, each `(phase, kv_tokens)`, through
    `vramlab features` (harness/src/features.rs): dicts of the columns, in `rows`' order."""
    args = ["features", str(path), "--point", point, "--json"]
    args += [a for ph, kv in rows for a in ("--row", f"{ph}@{kv}")]
    if lora_targets:
        args += ["--lora-targets", lora_targets]
    return [{k: v for k, v in r.items() if k.startswith("feature_")}
            for r in json.loads(_vramlab(*args, what="the rows' features"))]


def _vramlab(*args: str, what: str) -> str:
    """vramlab's stdout for `args`; a refusal is its one line."""
    cmd = [vramlab_bin(), *args]
    # The CPU meter's preload is the probe's, not the binary's.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    except OSError as e:
        raise InputError(f"{cmd[0]}: cannot run vramlab for {what}: {e}") from e
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        line = lines[-1] if lines else f"`vramlab {' '.join(args[:1])}` exited {out.returncode}"
        raise InputError(line[len("error: "):] if line.startswith("error: ") else line)
    return out.stdout


def _llm(p: dict, table: dict) -> dict:
    """A language-model point: vramlab's fields, and `attention` only where its table sets one
    (else the probe's --attention)."""
    return dict(p, attention=p["ops"]["attention"] if "attention" in table else None)


def _generate(p: dict, _table: dict) -> dict:
    """A generation point: its shape's fields at the top, the resolution in pixels."""
    w, h = parse_resolution(p["shape"]["resolution"])
    return dict(p, **p["shape"], mode="generate", gen_attention=p["attention"], width=w, height=h)


def _finetune(p: dict, _table: dict) -> dict:
    """A denoiser's LoRA point (listed, never run by the probe)."""
    return dict(p, mode="finetune")


_FORMS = {"llm": _llm, "generate": _generate, "finetune": _finetune}
