"""Plain int8 decoding of this checkout against an earlier commit, in alternating processes.

    .venv/bin/python benchmarks/tools/plain_int8_ab.py --base 9b7dc22 --pairs 5 \
        --out benchmarks/results/plain-int8-ab.json

What one token of plain decoding on the int8 embedded target costs with each code, when nothing but
the code differs: a git worktree of `--base` beside this checkout, one Python process per run (each
loads the target anew, decodes one warm-up prompt, then the prompts), the two codes' processes
alternating (base first in odd pairs, this checkout first in even ones) so that the machine's drift
hits both alike. Both decode the same token ids (the stratified MT-Bench first turns, rendered once
by this checkout's chat template) with their own `autoregressive_generate`; the report gives each
run's milliseconds per generated token (prefill included, as `arborspec bench` counts them), the
medians, each pair's ratio (this checkout over the base) and whether both produced the same tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from arborspec.bench.prompts import conversation, load_prompts
from arborspec.common.chat import encode_messages, eos_ids
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.models import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]

# run in a fresh interpreter, `src` of one tree first on the path: decode the prompts, print JSON
CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.models import load_model
torch.set_num_threads(int(sys.argv[3]))
job = json.load(open(sys.argv[2]))
target = ModelAdapter(load_model("embedded", "cpu", "int8"))
cfg = DecodeConfig(max_new_tokens=job["max_new_tokens"], eos_token_ids=tuple(job["eos"]))
with torch.inference_mode():
    autoregressive_generate(target, job["prompts"][0], cfg)
    seconds, tokens, outputs = 0.0, 0, []
    for ids in job["prompts"]:
        t0 = time.perf_counter()
        out = autoregressive_generate(target, ids, cfg).output_ids
        seconds += time.perf_counter() - t0
        tokens += len(out)
        outputs.append(out)
print(json.dumps({"ms_per_token": 1e3 * seconds / tokens, "tokens": tokens, "outputs": outputs}))
"""


def prompt_job(num_prompts: int, max_new_tokens: int) -> dict:
    tokenizer = load_tokenizer("embedded")
    prompts = load_prompts("mt-bench", num_prompts)
    ids = [encode_messages(tokenizer, conversation(p, []), True) for p in prompts]
    return {"prompts": ids, "max_new_tokens": max_new_tokens, "eos": list(eos_ids(tokenizer))}


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def run(src: Path, job_file: Path, threads: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(job_file), str(threads)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the earlier commit")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/plain-int8-ab.json")
    args = ap.parse_args()
    base_rev, head_rev = git("rev-parse", "--short", args.base), git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "src"))
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(worktree), base_rev],
            cwd=ROOT,
            check=True,
        )
        try:
            job_file = Path(tmp) / "job.json"
            job_file.write_text(json.dumps(prompt_job(args.num_prompts, args.max_new_tokens)))
            trees = {"base": worktree / "src", "head": ROOT / "src"}
            runs = {"base": [], "head": []}
            for pair in range(args.pairs):
                order = ("base", "head") if pair % 2 == 0 else ("head", "base")
                for name in order:
                    runs[name].append(run(trees[name], job_file, args.threads))
                    print(
                        f"pair {pair + 1} {name}: {runs[name][-1]['ms_per_token']:.2f} ms/token",
                        file=sys.stderr,
                    )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False
            )
    ms = {name: [r["ms_per_token"] for r in rs] for name, rs in runs.items()}
    report = {
        "base": base_rev,
        "head": head_rev + ("+uncommitted" if dirty else ""),
        "command": " ".join(sys.argv),
        "ms_per_token": {name: [round(v, 3) for v in vs] for name, vs in ms.items()},
        "median_ms_per_token": {name: round(statistics.median(vs), 3) for name, vs in ms.items()},
        "pair_ratios_head_over_base": [round(h / b, 3) for h, b in zip(ms["head"], ms["base"])],
        "median_ratio": round(statistics.median(ms["head"]) / statistics.median(ms["base"]), 3),
        "identical_tokens": all(
            h["outputs"] == b["outputs"] for h, b in zip(runs["head"], runs["base"])
        ),
        "tokens_per_run": runs["head"][0]["tokens"],
    }
    report.update(measured=utc_timestamp(), machine=machine_info(), versions=versions())
    write_json_atomic(report, Path(args.out))
    print(
        json.dumps(
            {
                k: report[k]
                for k in (
                    "median_ms_per_token",
                    "pair_ratios_head_over_base",
                    "median_ratio",
                    "identical_tokens",
                )
            }
        )
    )


if __name__ == "__main__":
    main()
