"""The thirteenth session's two step-cost changes, A/B in one process: the greedy verifier's batched screen and the
draft head's direct layer call (docs/algorithms.md §6 and §7), each against the path it replaced.

    .venv/bin/python benchmarks/step_paths_ab.py --out benchmarks/step-paths-ab-s13.json

Arms, all with the shipped head (int8 layer and logits), the same builder and the int8 target:

* `before`: the head runs its body's own forward (`LlamaModel.forward`: mask building, output bookkeeping), and
  the verifier screens one row per read (`verifiers.PREFETCH_ROWS = 1`);
* `direct head`: the head calls its layer directly, one row per screen;
* `both`: the direct call and the root's likeliest path screened together (`PREFETCH_ROWS = 3`, the default).

Per prompt, plain decoding and the three arms run one after the other on the same loaded target (interleaved, so
machine drift hits all of them alike); every output is checked token-identical to plain decoding. Speedup = plain
seconds per token / arm seconds per token over all prompts (every new token of every generation counted).
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import torch

from arborspec.bench.prompts import load_prompts
from arborspec.builders import make_builder
from arborspec.common.chat import encode_prompt, eos_ids
from arborspec.common.hf_cache import cache_kwargs
from arborspec.common.jsonfiles import report_json
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.drafters.head import HeadDrafter, load_head
from arborspec.engine import verifiers
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.sampling import sampling_config
from arborspec.models import load_pair, parse_dtype, resolve_head_dir


def body_forward(self, tokens, feats, position_ids=None, attention_mask=None, past_key_values=None):
    """The head's forward before this session: through its body's own forward."""
    out = self.body(inputs_embeds=self.inputs(tokens, feats), attention_mask=attention_mask, position_ids=position_ids,
                    **cache_kwargs(self.body, past_key_values), use_cache=past_key_values is not None)
    return out.last_hidden_state


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--method", default="dyspec")
    ap.add_argument("--budget", default="8")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/step-paths-ab.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    budget = int(args.budget) if args.budget.isdigit() else args.budget
    pair = load_pair("embedded", "ngram", dtype=args.dtype)  # the target; the heads are loaded below
    target = pair.target
    head_dir, dtype = resolve_head_dir("embedded-head"), parse_dtype(args.dtype)
    heads = {arm: load_head(head_dir, target.model, dtype, int8_logits=True, int8_layers=True)
             for arm in ("before", "direct head", "both")}
    heads["before"].forward = types.MethodType(body_forward, heads["before"])
    prefetch = {"before": 1, "direct head": 1, "both": verifiers.PREFETCH_ROWS}
    decoders = {arm: SpeculativeDecoder(target, HeadDrafter(head), make_builder(args.method, budget=budget))
                for arm, head in heads.items()}
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, seed=0, eos_token_ids=eos_ids(pair.tokenizer, target.model),
                       sampling=sampling_config(False, 1.0, 0, 1.0))
    prompts = [encode_prompt(pair.tokenizer, p.turns[0], True) for p in load_prompts("mt-bench", args.num_prompts)]

    def run(arm: str, ids: list[int]):
        verifiers.PREFETCH_ROWS = prefetch[arm]
        return decoders[arm].generate(ids, cfg)

    for arm in decoders:  # warm-up, untimed
        run(arm, prompts[0])
    seconds = {name: 0.0 for name in ["plain", *decoders]}
    tokens = dict.fromkeys(seconds, 0)
    accepted: dict[str, list[float]] = {arm: [] for arm in decoders}
    for ids in prompts:
        t0 = time.perf_counter()
        plain = autoregressive_generate(target, ids, cfg)
        seconds["plain"] += time.perf_counter() - t0
        tokens["plain"] += len(plain.output_ids)
        for arm in decoders:
            t0 = time.perf_counter()
            out = run(arm, ids)
            seconds[arm] += time.perf_counter() - t0
            tokens[arm] += len(out.output_ids)
            accepted[arm].append(out.mean_accepted_length)
            if out.output_ids != plain.output_ids:
                raise SystemExit(f"{arm}: output differs from plain decoding (prompt {ids[:8]}...)")
    per_token = {name: seconds[name] / tokens[name] for name in seconds}
    result = {"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(args),
              "tokens_per_s": {name: round(1 / t, 2) for name, t in per_token.items()},
              "speedup_vs_plain": {arm: round(per_token["plain"] / per_token[arm], 3) for arm in decoders},
              "mean_accepted_length": {arm: round(statistics.mean(v), 3) for arm, v in accepted.items()},
              "greedy_identical": True}
    report_json(result, args.out)


if __name__ == "__main__":
    main()
