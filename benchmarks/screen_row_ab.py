"""The greedy screen of one LM-head row (engine/lm_head.py), before and after 2192a55, in one process.

    .venv/bin/python benchmarks/screen_row_ab.py --out benchmarks/screen-row-ab-s18.json

The screen as it was at `--before` (read with `git show`) and as it is now run on the same hidden rows of the
int8 target (the last `--rows` of one forward over `--context` tokens), alternating per round, both from one
loaded target; every row's token is checked equal. Reports the median time per row of each round.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import torch

from arborspec.common.jsonfiles import report_json
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.common.timing import median_seconds
from arborspec.models import load_pair


def screen_class_at(commit: str):
    """`GreedyScreen` as engine/lm_head.py defined it at `commit` (its package imports made absolute)."""
    root = Path(__file__).resolve().parents[1]
    src = subprocess.run(["git", "show", f"{commit}:src/arborspec/engine/lm_head.py"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    src = src.replace("from ..", "from arborspec.").replace("from .int8", "from arborspec.engine.int8")
    namespace: dict = {}
    exec(compile(src, f"lm_head@{commit}", "exec"), namespace)
    return namespace["GreedyScreen"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="fd6fbd8")
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load_pair("embedded", "ngram", dtype="int8").target
    now = target.head.screen
    before = screen_class_at(a.before)(now.weight, now.weight_t)
    ids = torch.arange(1000, 1000 + a.context)
    hidden = target.hidden_forward(ids)[-a.rows:].float().contiguous()
    rows = [hidden[i: i + 1] for i in range(a.rows)]
    same = [before.argmax(r) for r in rows] == [now.argmax(r) for r in rows]
    per_row = {"before": [], "now": []}
    for _ in range(a.rounds):
        for name, screen in (("before", before), ("now", now)):
            seconds = median_seconds(lambda: [screen.argmax(r) for r in rows], 10, warmup=1)
            per_row[name].append(round(seconds / a.rows * 1e3, 3))
    result = {"before_commit": a.before, "rows": a.rows, "context": a.context, "same_tokens": same,
              "ms_per_row": per_row, "machine": machine_info(), "versions": versions(), "timestamp": utc_timestamp()}
    report_json(result, a.out)


if __name__ == "__main__":
    main()
