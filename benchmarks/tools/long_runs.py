"""Long greedy generations on the embedded target: identity, exact KV caches after every step, memory.

    .venv/bin/python benchmarks/tools/long_runs.py --new-tokens 4096 --out benchmarks/results/long-4096.json

What `tests/test_long_runs.py` checks on tiny models, on the real pair (the embedded SmolLM2 target and its
default draft, the shipped head) and longer:

* the context: the target's limit (`max_position_embeddings`), and that a `max_new_tokens` past it fails
  before any forward with the one-line context error, for plain and speculative decoding;
* plain decoding, then one builder per children mode (`--methods`, default `opt-tree` = children selected,
  `dyspec` = sampled without replacement, `specinfer` = sampled with replacement), all greedy (T = 0), on a
  raw continuation: no chat template, and EOS ignored (a `DecodeConfig` without `eos_token_ids` only stops
  at `max_new_tokens`), so every run writes exactly `--new-tokens` tokens;
* after every speculative step, the target cache = committed tokens - 1 on every layer and the draft cache
  <= committed tokens (`engine/invariants.CacheCheck`); at the end, the tokens = plain decoding's;
* memory at 10 %, 50 % and 100 % of each run: the process's peak RSS so far (`ru_maxrss`, since the process
  started, so it includes the earlier runs) and its current RSS (`/proc/self/statm`); tokens/s, steps and
  the mean accepted length (tokens per target forward, bonus included).

The JSON is rewritten (atomically) after each run, so an interrupted run keeps the finished ones. Exit
status 1 when a check failed (the JSON says which), 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import torch
from arborspec.builders import make_builder
from arborspec.common.chat import encode_prompt
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.engine.decode import (
    DecodeConfig,
    SpeculativeDecoder,
    autoregressive_generate,
    check_context,
)
from arborspec.engine.invariants import CacheCheck
from arborspec.errors import ArborError
from arborspec.models import load_pair

PROMPT = ("The old lighthouse stood at the end of the northern cape, and for more than a hundred years its keepers "
          "had written down everything that happened there. This is the story of the last of them.")
MARKS = (0.1, 0.5, 1.0)


def memory() -> dict:
    """Peak RSS of this process so far and its current RSS, in MiB (Linux: ru_maxrss is in KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        with open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        rss = None
    return {"peak_rss_mib": round(peak, 1), "rss_mib": None if rss is None else round(rss, 1)}


class MemoryMarks:
    """`on_tokens`: memory (and a progress line) when the output first reaches 10 %, 50 % and 100 % of `total`."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.marks = label, total, 0, []
        self.pending, self.t0 = list(MARKS), time.perf_counter()

    def __call__(self, new: list[int]) -> None:
        self.done += len(new)
        while self.pending and self.done >= self.pending[0] * self.total:
            mark = {"at": self.pending.pop(0), "tokens": self.done, **memory()}
            self.marks.append(mark)
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            print(f"  {self.label}: {self.done}/{self.total} tokens, {rate:.1f} tok/s, peak RSS "
                  f"{mark['peak_rss_mib']} MiB, RSS {mark['rss_mib']} MiB", file=sys.stderr, flush=True)


def both(*callbacks):
    """One `on_tokens` callback that calls each of `callbacks` in turn."""

    def call(new: list[int]) -> None:
        for callback in callbacks:
            callback(new)
    return call


def context_limit(pair, decoder: SpeculativeDecoder, prompt: list[int]) -> dict:
    """The target's context and what a request one token past it does: a one-line ArborError before any forward."""
    limit = pair.target.max_positions
    over = DecodeConfig(max_new_tokens=limit - len(prompt) + 1)
    forwards = []
    found: dict = {"max_position_embeddings": limit, "prompt_tokens": len(prompt), "requested": over.max_new_tokens}
    for kind, run in (("plain", lambda: autoregressive_generate(pair.target, prompt, over, on_tokens=forwards.append)),
                      ("speculative", lambda: decoder.generate(prompt, over, on_tokens=forwards.append))):
        t0 = time.perf_counter()
        try:
            run()
            message = None
        except ArborError as exc:
            message = str(exc)
        found[kind] = {"error": message, "seconds": round(time.perf_counter() - t0, 4)}
    expected = f"exceeds the target's context of {limit} positions"
    found["ok"] = (not forwards and pair.target.cache_len == 0
                   and all(found[k]["error"] and expected in found[k]["error"] and "\n" not in found[k]["error"]
                           for k in ("plain", "speculative")))
    return found


def run_one(label: str, generate, plain_ids: list[int] | None, new_tokens: int,
            check: CacheCheck | None) -> tuple[dict, list[int] | None]:
    """One generation (`generate(on_tokens)`) with its checks; returns its record and its tokens."""
    marks = MemoryMarks(label, new_tokens)
    try:
        result = generate(marks if check is None else both(check, marks))
    except AssertionError as exc:  # a broken cache invariant, raised by the check right after that step
        return {"method": label, "ok": False, "error": str(exc), "cache_checked_steps": check.steps,
                "memory": marks.marks}, None
    out = result.output_ids
    same = None if plain_ids is None else out == plain_ids
    first_difference = None
    if same is False:
        first_difference = next((i for i, (a, b) in enumerate(zip(out, plain_ids)) if a != b),
                                min(len(out), len(plain_ids)))
    record = {
        "method": label, "new_tokens": len(out), "steps": len(result.steps),
        "mean_accepted_length": round(result.mean_accepted_length, 4), "wall_time_s": round(result.wall_time, 3),
        "tokens_per_second": round(result.tokens_per_second, 3), "stop_reason": result.stop_reason,
        "identical_to_plain": same, "first_difference": first_difference,
        "cache_checked_steps": None if check is None else check.steps, "memory": marks.marks, "error": None,
        "ok": len(out) == new_tokens and same is not False and (check is None or check.steps == len(result.steps)),
    }
    return record, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=4096)
    ap.add_argument("--out", default=None, help="JSON report (default: benchmarks/results/long-NEW_TOKENS.json)")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", default=None, help="default: the target's default draft (the shipped head)")
    ap.add_argument("--methods", default="opt-tree,dyspec,specinfer", help="comma list of builders")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default=PROMPT, help="raw text to continue (no chat template)")
    args = ap.parse_args()
    out = Path(args.out or f"benchmarks/results/long-{args.new_tokens}.json")
    try:
        return run(args, out)
    except ArborError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; finished runs kept in {out}", file=sys.stderr)
        return 130


def run(args, out: Path) -> int:
    torch.set_num_threads(args.threads)
    cfg = DecodeConfig(max_new_tokens=args.new_tokens)  # greedy; no eos_token_ids: EOS does not stop the run
    builders = {name: make_builder(name, budget=args.budget) for name in args.methods.split(",") if name}
    pair = load_pair(args.target, args.draft)
    prompt = encode_prompt(pair.tokenizer, args.prompt, chat=False)
    decoders = {name: SpeculativeDecoder(pair.target, pair.drafter, b) for name, b in builders.items()}
    for dec in decoders.values():  # a request that does not fit fails here, before the long runs
        check_context(len(prompt), cfg, pair.target.max_positions, dec.builder.depth_limit + 1)
        check_context(len(prompt), cfg, pair.drafter.max_positions, dec.builder.depth_limit + 1, who="draft")
    report = {"tool": "benchmarks/tools/long_runs.py", "target": pair.target_name, "draft": pair.draft_name,
              "new_tokens": args.new_tokens, "budget": args.budget, "temperature": 0.0, "chat_template": False,
              "eos_ignored": True, "prompt": args.prompt, "prompt_tokens": len(prompt), "threads": args.threads,
              "machine": machine_info(pair.target.device), "versions": versions(), "created": utc_timestamp(),
              "context": context_limit(pair, next(iter(decoders.values())), prompt), "runs": []}
    write_json_atomic(report, out)
    print(f"context {report['context']['max_position_embeddings']}: past it fails up front: "
          f"{report['context']['ok']}", file=sys.stderr)
    record, plain = run_one("autoregressive",
                            lambda cb: autoregressive_generate(pair.target, prompt, cfg, on_tokens=cb),
                            None, args.new_tokens, None)
    report["runs"].append({**record, "children_mode": None})
    write_json_atomic(report, out)
    for name, dec in decoders.items():
        check = CacheCheck(dec, len(prompt))
        record, _ = run_one(name, lambda cb, dec=dec: dec.generate(prompt, cfg, on_tokens=cb), plain,
                            args.new_tokens, check)
        base = report["runs"][0]["tokens_per_second"]
        speedup = round(record["tokens_per_second"] / base, 4) if record.get("tokens_per_second") else None
        record.update(children_mode=dec.builder.children_mode, budget=args.budget, speedup_vs_plain=speedup)
        report["runs"].append(record)
        write_json_atomic(report, out)
    report["ok"] = report["context"]["ok"] and all(r["ok"] for r in report["runs"])
    write_json_atomic(report, out)
    for r in report["runs"]:
        print(f"{r['method']}: ok={r['ok']} {r.get('tokens_per_second')} tok/s, {r.get('steps')} steps, accepted "
              f"{r.get('mean_accepted_length')}, identical={r.get('identical_to_plain')}, peak RSS "
              f"{r['memory'][-1]['peak_rss_mib'] if r['memory'] else None} MiB"
              f"{', ' + r['error'] if r.get('error') else ''}",
              file=sys.stderr)
    print(f"written to {out}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
