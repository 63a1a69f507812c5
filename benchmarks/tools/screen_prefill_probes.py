"""Two settings of the int8 target measured on real text (docs/algorithms.md §7 and §8).

    .venv/bin/python benchmarks/tools/screen_prefill_probes.py \
        --out benchmarks/results/screen-prefill-probes.json

The embedded target in int8; `--num-prompts` stratified MT-Bench first turns, each answered by plain
greedy decoding (`--answer-tokens` tokens).

* `screen`: the greedy LM-head screen (`engine/lm_head.GreedyScreen`) with `--channels` of each row
  kept in float32 (`OUTLIERS`): candidates per row (median, 90th percentile, largest) over the
  hidden rows of every answer position, and milliseconds per screen of 1, 4 and 8 rows (the
  settings take turns within each of `--rounds` rounds; median). Every setting's tokens are checked
  equal to the first's.
* `prefill`: the prefill of prompts of several lengths (the longest prompt's first n tokens), the
  float64 attention with the kernel's causal flag (what `engine/invariant_attention.py` runs) and
  with an explicit boolean causal mask (what it ran before), taking turns within each round; best
  milliseconds of each, and whether the hidden states and every layer's cache are bit for bit equal.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AttentionInterface

import arborspec.engine.invariant_attention as attention
from arborspec.bench.prompts import conversation, load_prompts
from arborspec.common.chat import encode_messages
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import stamp
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.engine.lm_head import GreedyScreen
from arborspec.models import load_pair


def masked_prefill(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """The float64 attention with an explicit causal mask for a prefill (before the flag)."""
    q_len, length = query.shape[2], key.shape[2]
    if attention_mask is None and q_len > 1 and q_len == length:
        causal = torch.ones(q_len, length, dtype=torch.bool, device=query.device).tril()
        return attention.attend_float64(query, key, value, causal, scaling), None
    return attention.float64_attention(
        module, query, key, value, attention_mask, scaling, dropout, **kw
    )


def screen_probe(adapter, hidden: torch.Tensor, channels: list[int], rounds: int) -> list[dict]:
    screen = adapter.head.screen
    default = GreedyScreen.OUTLIERS
    reference = None
    rows_out = []
    times: dict[tuple[int, int], list[float]] = {}
    try:
        for k in channels:
            GreedyScreen.OUTLIERS = k
            counts, tokens = [], []
            for row in hidden:
                before = screen.candidates
                tokens += screen.argmax_rows(row[None])
                counts.append(screen.candidates - before)
            reference = reference or tokens
            counts.sort()
            rows_out.append(
                {
                    "channels": k,
                    "candidates_median": statistics.median(counts),
                    "candidates_p90": counts[int(0.9 * len(counts))],
                    "candidates_max": counts[-1],
                    "tokens_equal_to_first": tokens == reference,
                }
            )
        for _ in range(rounds):
            for k in channels:
                GreedyScreen.OUTLIERS = k
                for n in (1, 4, 8):
                    t0 = time.perf_counter()
                    for j in range(20):
                        screen.argmax_rows(hidden[j * n : (j + 1) * n])
                    times.setdefault((k, n), []).append((time.perf_counter() - t0) / 20)
    finally:
        GreedyScreen.OUTLIERS = default
    for row in rows_out:
        row["ms_per_screen"] = {
            str(n): round(statistics.median(times[(row["channels"], n)]) * 1e3, 3)
            for n in (1, 4, 8)
        }
    return rows_out


def prefill_probe(adapter, prompt: list[int], lengths: list[int], rounds: int) -> list[dict]:
    out = []
    impls = {"causal_flag": attention.float64_attention, "explicit_mask": masked_prefill}
    try:
        for n in lengths:
            ids = torch.tensor(prompt[:n])
            times: dict[str, list[float]] = {name: [] for name in impls}
            states = {}
            for _ in range(rounds):
                for name, impl in impls.items():
                    AttentionInterface.register(attention.NAME, impl)
                    adapter.reset()
                    t0 = time.perf_counter()
                    hidden = adapter.hidden_forward(ids)
                    times[name].append(time.perf_counter() - t0)
                    states[name] = (
                        hidden,
                        [(l.keys.clone(), l.values.clone()) for l in adapter.cache.layers],
                    )
            (h1, c1), (h2, c2) = states.values()
            same = torch.equal(h1, h2) and all(
                torch.equal(a, b) for x, y in zip(c1, c2) for a, b in zip(x, y)
            )
            best = {name: min(t) * 1e3 for name, t in times.items()}
            out.append(
                {
                    "tokens": n,
                    "ms": {name: round(v, 1) for name, v in best.items()},
                    "flag_over_mask": round(best["causal_flag"] / best["explicit_mask"], 3),
                    "bit_identical": same,
                }
            )
            print(out[-1], flush=True)
    finally:
        AttentionInterface.register(attention.NAME, attention.float64_attention)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--answer-tokens", type=int, default=64)
    ap.add_argument("--channels", default="16,4,0")
    ap.add_argument("--lengths", default="64,128,232,401")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/screen-prefill-probes.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(dtype="int8", draft="embedded-head")
    adapter = pair.target
    prompts = [
        encode_messages(pair.tokenizer, conversation(p, [])) for p in load_prompts("mt-bench", 16)
    ]
    hidden = []
    with torch.inference_mode():
        for ids in prompts[: args.num_prompts]:
            answer = autoregressive_generate(
                adapter, list(ids), DecodeConfig(max_new_tokens=args.answer_tokens)
            )
            adapter.reset()
            # the rows whose argmax gives each answer token
            hidden.append(
                adapter.hidden_forward(torch.tensor(ids + answer.output_ids))[len(ids) - 1 :]
            )
        hidden = torch.cat(hidden)
        screen = screen_probe(
            adapter, hidden, [int(c) for c in args.channels.split(",")], args.rounds
        )
        for row in screen:
            print(row, flush=True)
        longest = max(prompts, key=len)
        lengths = [n for n in (int(v) for v in args.lengths.split(",")) if n <= len(longest)]
        prefill = prefill_probe(adapter, longest, lengths, args.rounds)
    write_json_atomic(
        {
            **stamp(),
            "threads": args.threads,
            "answer_rows": int(hidden.shape[0]),
            "screen": screen,
            "prefill": prefill,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
