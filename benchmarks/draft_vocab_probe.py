"""Does a wider draft vocabulary help a trained head? (fourteenth session, step 2 of reproduce-s14.sh)

    .venv/bin/python benchmarks/draft_vocab_probe.py --head runs/head9-shipped \
        --data runs/head8/data-self-instruct runs/head9/data-self-instruct --out benchmarks/draft-vocab-probe-s14.json

The head drafts only among its `vocab_ids` (FR-Spec, docs/algorithms.md §6). This probe first counts how many of the
held-out answer tokens (MT-Bench first turns, HumanEval; `runs/head/heldout`, as `arborspec.offline.head_quality`
writes them) lie inside that vocabulary, then widens it *without training*: the head's own ids first, then the most
frequent answer tokens of `--data` that it lacks, then the lowest remaining ids, up to each size of `--sizes` (and the
whole vocabulary), and measures each widened head's held-out top-1 with `head_quality.measure` (int8 layer and
logits, as CPU pairs run them). Quality only; the cost column is the head forward against a target forward.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from arborspec.common.jsonfiles import report_json
from arborspec.offline.head_data import load_head_data
from arborspec.offline.head_quality import measure


def answer_tokens(data_dir: Path) -> list[int]:
    return [t for s in load_head_data(data_dir) for t in s.tokens[s.prompt_len:].tolist()]


def widened(ids: torch.Tensor, ranked: list[int], size: int, vocab: int) -> torch.Tensor:
    have = set(ids.tolist())
    extra = [t for t in ranked if t not in have][: size - len(ids)]
    have.update(extra)
    rest = [t for t in range(vocab) if t not in have][: size - len(ids) - len(extra)]
    return torch.cat([ids, torch.tensor(extra + rest, dtype=ids.dtype)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head", required=True, help="a head directory (head.json + head.safetensors)")
    ap.add_argument("--data", nargs="+", required=True, help="head data directories to rank the extra tokens by")
    ap.add_argument("--heldout", default="runs/head/heldout")
    ap.add_argument("--sizes", default="12288,16384")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/draft-vocab-probe-s14.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    state = load_file(str(Path(a.head) / "head.safetensors"))
    meta = json.loads((Path(a.head) / "head.json").read_text())
    ids, vocab = state["vocab_ids"], meta["vocab_size"]
    inside = set(ids.tolist())
    coverage = {}
    for name in ("mt_bench_turn1", "humaneval"):
        toks = answer_tokens(Path(a.heldout) / name)
        coverage[name] = {"answer_tokens": len(toks), "in_draft_vocab": round(sum(t in inside for t in toks) / len(toks), 4)}
    counts = Counter(t for d in a.data for t in answer_tokens(Path(d)))
    ranked = [t for t, _ in counts.most_common()]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in [len(ids)] + [int(s) for s in a.sizes.split(",")] + [vocab]:
            out = Path(tmp) / f"v{size}"
            out.mkdir()
            save_file({**state, "vocab_ids": widened(ids, ranked, size, vocab).contiguous()}, str(out / "head.safetensors"),
                      metadata={"format": meta["format"]})
            (out / "head.json").write_text(json.dumps({**meta, "draft_vocab_size": size}))
            q = measure(str(out), work_dir=a.heldout, n_mtbench=20, n_humaneval=10, int8_logits=True, int8_layers=True)
            results[str(size)] = {"head_cost_ratio": q["cost"]["head_cost_ratio"],
                                  **{name: {k: v for k, v in s.items() if k.startswith("top1")} for name, s in q["sets"].items()}}
            print(size, results[str(size)], flush=True)
    report_json({"head": a.head, "data": a.data, "distinct_answer_tokens": len(counts), "heldout_coverage": coverage,
                 "widened": results}, a.out)


if __name__ == "__main__":
    main()
