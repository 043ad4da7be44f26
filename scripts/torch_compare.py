#!/usr/bin/env python3
"""Candle vs torch, per phase, for training and inference points (docs/src/guides/torch-probe.md).

    scripts/torch_compare.py CANDLE.csv TORCH.csv [TORCH.csv ...]

Prints a Markdown table with one row per (training point, runtime): the candle row first, then
each torch CSV (one per AdamW implementation). Figures, from step 1 and step 2 of the point:
- forward / backward / optimizer peak: step 2's peak_allocated minus what the process held
  before step 1 other than the weights (forward(1).baseline - feature_weight_bytes): the
  runtime's own heap and loader leftovers are left out, the weights are in;
- gradients: backward(1).end - forward(1).baseline;
- optimizer state: optimizer(1).end - forward(1).baseline;
- step-2 transient: optimizer(2).peak - optimizer(2).baseline;
and after each torch figure its ratio to candle's. Inference points (a second table), above the
prefill's baseline (so neither runtime's heap nor load leftovers count): the prefill's peak, its
end (the KV cache of the prompt), the last decode window's peak above its own baseline, and what
the whole run left live at its end (`total`: the full KV cache). Standard library
only.
"""
import csv
import sys


def figures(rows):
    g = {(r["phase"], r["step"]): r for r in rows}

    def v(phase, step, col):
        return int(g[(phase, step)][col])

    start = v("forward", "1", "baseline_allocated")
    floor = start - v("forward", "1", "feature_weight_bytes")
    return [
        v("forward", "2", "peak_allocated") - floor,
        v("backward", "2", "peak_allocated") - floor,
        v("optimizer", "2", "peak_allocated") - floor,
        v("backward", "1", "end_allocated") - start,
        v("optimizer", "1", "end_allocated") - start,
        v("optimizer", "2", "peak_allocated") - v("optimizer", "2", "baseline_allocated"),
    ]


def infer_figures(rows):
    g = {r["phase"]: r for r in rows}  # later decode rows replace earlier ones: the last stays

    def v(phase, col):
        return int(g[phase][col])

    base = v("prefill", "baseline_allocated")
    return [
        v("prefill", "peak_allocated") - base,
        v("prefill", "end_allocated") - base,
        v("decode", "peak_allocated") - v("decode", "baseline_allocated"),
        v("total", "end_allocated") - base,
    ]


def points(path, mode="train"):
    by = {}
    for r in csv.DictReader(open(path)):
        if r["mode"] == mode and r["status"] == "ok":
            by.setdefault(r["point_id"], []).append(r)
    return by


def table(cols, candle, torch, fig, label):
    print("| point | runtime | " + " | ".join(f"{c} (MB)" for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for pid, rows in candle.items():
        base = fig(rows)
        short = pid.split("/", 1)[1]
        print(f"| {short} | candle | " + " | ".join(mb(x) for x in base) + " |")
        for by in torch:
            if pid in by:
                f = fig(by[pid])
                cells = [f"{mb(x)} ({x / b:.2f}×)" if b else mb(x) for x, b in zip(f, base)]
                print(f"| {short} | torch {label(by[pid][0])} | " + " | ".join(cells) + " |")


def mb(x):
    return f"{x / 1e6:,.1f}"


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    train = points(argv[0])
    if train:
        cols = ["forward peak", "backward peak", "optimizer peak", "gradients",
                "optimizer state", "step-2 transient"]
        # The row's optimizer column names torch's implementation (`adamw-foreach`).
        table(cols, train, [points(p) for p in argv[1:]], figures, lambda r: r["optimizer"])
    infer = points(argv[0], "infer")
    if infer:
        cols = ["prefill peak", "prefill end (KV)", "last decode window peak", "total end"]
        table(cols, infer, [points(p, "infer") for p in argv[1:]], infer_figures,
              lambda r: r["attention"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
