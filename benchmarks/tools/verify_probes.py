"""What the pieces of a step around the target forward cost, one call at a time (docs/algorithms.md
§7 and §11, `engine/decode.py`'s "likely rows").

    .venv/bin/python benchmarks/tools/verify_probes.py --out benchmarks/results/verify-probes.json

The embedded pair in int8, 2 threads. Hidden rows are the target's own, from an MT-Bench answer's
prefill. Each figure is the median of `--rounds` calls; before each LM-head call a 160 MB buffer is
written, so the head's weights come from memory as they do between a step's forwards.

* `lm_head_rows`: k logits rows through `torch.mm` on the transposed copy, oneDNN's linear on the
  packed copy (`HeadRows.logits` for several rows) and `F.linear`, k = 1, 2, 4, 8;
* `screen_rows`: the greedy screen of k rows in one pass (`HeadRows.greedy_rows`);
* `draw`: one token drawn from a 49152-token distribution by `torch.multinomial` and by the inverse
  CDF (`engine/sampling.sample`);
* `head_forward`: the int8 draft head's forward of k rows over a 200-row cache, eager and replayed
  (drafters/head_traced.py), k = 1, 3, 8, with the replay checked equal to the eager forward.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from arborspec.bench.prompts import conversation, load_prompts
from arborspec.common.chat import encode_messages
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import stamp
from arborspec.drafters.head_traced import TracedHead, cache_holding
from arborspec.engine.sampling import sample
from arborspec.engine.tree import additive_mask
from arborspec.models import load_pair


def median_ms(fn, rounds: int, flush: torch.Tensor | None = None) -> float:
    fn()
    times = []
    for _ in range(rounds):
        if flush is not None:
            flush.add_(1.0)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(1e3 * statistics.median(times), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/verify-probes.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair("embedded", dtype="int8")
    target, head = pair.target, pair.drafter.head
    prompt = encode_messages(pair.tokenizer, conversation(load_prompts("mt-bench", 1)[0], []), True)
    flush = torch.zeros(40_000_000)
    out: dict = {"lm_head_rows": {}, "screen_rows": {}, "draw": {}, "head_forward": {}}
    with torch.inference_mode():
        hidden = target.hidden_forward(torch.tensor(prompt))[-8:].contiguous()
        rows = target.head
        rows.logits(hidden[:2])  # makes the packed copy
        for k in (1, 2, 4, 8):
            h = hidden[:k]
            out["lm_head_rows"][k] = {
                "mm_transposed": median_ms(lambda: torch.mm(h, rows.weight_t), args.rounds, flush),
                "onednn_packed": median_ms(
                    lambda: torch.ops.mkldnn._linear_pointwise(
                        h, rows.packed, None, "none", [], ""
                    ),
                    args.rounds,
                    flush,
                ),
                "f_linear": median_ms(lambda: F.linear(h, rows.weight), args.rounds, flush),
                "screen": median_ms(lambda: rows.greedy_rows(h), args.rounds, flush),
            }
            out["screen_rows"][k] = out["lm_head_rows"][k].pop("screen")
        probs = rows.logits(hidden[:1])[0].div(0.6).softmax(-1)
        gen = torch.Generator().manual_seed(0)
        out["draw"] = {
            "multinomial": median_ms(
                lambda: torch.multinomial(probs, 1, generator=gen), 10 * args.rounds
            ),
            "inverse_cdf": median_ms(lambda: sample(probs, gen), 10 * args.rounds),
        }
        config = head.body.config
        past = 200
        prefill = DynamicCache(config=config)
        ids = torch.randint(100, 40000, (1, past), generator=gen)
        head(
            ids,
            torch.randn(1, past, head.hidden_size, generator=gen),
            position_ids=torch.arange(past)[None],
            past_key_values=prefill,
        )
        keys, values = prefill.layers[0].keys, prefill.layers[0].values
        traced = TracedHead(head)
        for k in (1, 3, 8):
            ids = torch.randint(100, 40000, (1, k), generator=gen)
            feats = torch.randn(1, k, head.hidden_size, generator=gen)
            pos = torch.arange(past, past + k)[None]
            allowed = torch.ones(k, past + k, dtype=torch.bool).tril_(past)
            mask = additive_mask(allowed, feats.dtype)[None, None]

            def eager():
                return head(ids, feats, pos, mask, cache_holding(keys, values, config))

            def replayed():
                return traced(ids, feats, pos, mask, cache_holding(keys, values, config))

            out["head_forward"][k] = {
                "eager": median_ms(eager, 5 * args.rounds),
                "replayed": median_ms(replayed, 5 * args.rounds),
                "equal": bool(torch.equal(eager(), replayed())),
            }
    print(out)
    write_json_atomic(
        {
            "command": "benchmarks/tools/verify_probes.py",
            "rounds": args.rounds,
            **out,
            **stamp(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
