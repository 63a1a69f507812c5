"""Held-out quality and cost of a draft head: `arborspec draft-quality --draft DIR --out q.json`.

* **Agreement per depth** (teacher forcing, `train_head.evaluate`): on the
  target's greedy answers to MT-Bench first turns and HumanEval prompts (never
  used for training), the fraction of answer positions where the head's top-1
  token equals the target's greedy token, at depth 1 (the head reads exact
  target features: equals chain acceptance at temperature 0) and at depths 2-3
  (it reads its own predictions, as deeper tree nodes do).
* **Chain acceptance at temperature T** (depth 1): mean of sum_x min(p_T(x), p_D(x)).
* `--draft-logits int8`: the same with the head's fc, decoder layer and draft logits in int8 (the
  CPU default of `generate` and `bench`; drafters/head.py); `int8_logits` alone: only the logits.
* **Cost**: median time of one head forward (1 new row over a `cache_len` cache,
  draft-vocabulary logits included) / one 1-token target forward, interleaved.

The answers and their features are generated once into `--work-dir` (resumable).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..common.timing import median_seconds
from ..drafters.head import DraftHead, load_head
from .draft_quality import humaneval_prompts, interleaved_times, mtbench_first_turns
from .head_data import HeadDataConfig, HeadSequence, generate_head_data, load_head_data
from .train_head import HeadTrainConfig, evaluate, make_batch


@torch.inference_mode()
def head_forward_time(head: DraftHead, cache_len: int, reps: int, seed: int = 0) -> float:
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    h = head.hidden_size
    cache = DynamicCache(config=head.body.config)
    head(
        torch.randint(3, min(1000, head.vocab_size), (1, cache_len), generator=g),
        torch.randn(1, cache_len, h, generator=g),
        past_key_values=cache,
    )
    tok, feat = torch.tensor([[5]]), torch.randn(1, 1, h, generator=g)
    pos = torch.tensor([[cache_len]])

    # one new row, draft-vocabulary logits included, then back to the same cache
    def one_row() -> None:
        head.full_logits(head(tok, feat, position_ids=pos, past_key_values=cache)[0])
        cache.crop(-1)

    return median_seconds(one_row, reps, warmup=3)


@torch.inference_mode()
def chain_acceptance(head: DraftHead, seqs: list[HeadSequence], temperature: float) -> float:
    """Depth-1 expected acceptance of speculative sampling at `temperature` over
    the answer positions."""
    total, count = 0.0, 0
    lm = head._target[1]
    for s in seqs:
        b = make_batch([s], 10_000)
        pred = head(b.tokens, b.prev)[0]
        rows = b.valid[0]
        if not rows.any():
            continue
        pt = torch.softmax(lm(b.target[0][rows]).float() / temperature, -1)
        pd = torch.softmax(head.full_logits(pred[rows]) / temperature, -1)
        total += float(torch.minimum(pt, pd).sum())
        count += int(rows.sum())
    return total / max(count, 1)


def measure(
    head_dir: str,
    target_name: str = "embedded",
    *,
    work_dir: str = "runs/head/heldout",
    n_mtbench: int = 80,
    n_humaneval: int = 40,
    max_new_tokens: int = 128,
    temperature: float = 0.6,
    cache_len: int = 128,
    reps: int = 30,
    depths: int = 3,
    int8_logits: bool = False,
    int8_layers: bool = False,
) -> dict:
    from ..models import load_model, load_tokenizer

    tok = load_tokenizer(target_name)
    target = load_model(target_name).requires_grad_(False)
    head = load_head(head_dir, target, int8_logits=int8_logits, int8_layers=int8_layers)
    t_target, t_head = interleaved_times(
        target, lambda r, s: head_forward_time(head, cache_len, r, seed=s), cache_len, reps
    )
    result = {
        "head": head_dir,
        "target": target_name,
        "threads": torch.get_num_threads(),
        "cost": {
            "target_forward_ms": round(1000 * t_target, 3),
            "head_forward_ms": round(1000 * t_head, 3),
            "head_cost_ratio": round(t_head / t_target, 4),
            "cache_len": cache_len,
            "draft_vocab": int(head.vocab_ids.numel()),
            "int8_logits": head.int8_logits,
            "int8_layers": head.int8_layers,
        },
        "max_new_tokens": max_new_tokens,
        "sets": {},
    }
    cfg = HeadTrainConfig(ttt_steps=depths, batch_tokens=4096)
    sets = {
        "mt_bench_turn1": mtbench_first_turns()[:n_mtbench],
        "humaneval": humaneval_prompts()[:n_humaneval],
    }
    for name, prompts in sets.items():
        if not prompts:  # a set of 0 prompts is skipped
            continue
        data_dir = Path(work_dir) / name
        gen_cfg = HeadDataConfig(
            target=target_name,
            num_prompts=len(prompts),
            max_new_tokens=max_new_tokens,
            batch_size=16,
            sample_fraction=0.0,
        )
        generate_head_data(
            gen_cfg, target, tok, data_dir, progress=False, prompts=prompts, source=name
        )
        seqs = load_head_data(data_dir)
        stats = evaluate(head, seqs, cfg)
        stats.pop("loss", None)
        stats[f"chain_acceptance_t{temperature:g}"] = round(
            chain_acceptance(head, seqs, temperature), 4
        )
        stats["positions"] = sum(max(0, len(s.tokens) - s.prompt_len) for s in seqs)
        result["sets"][name] = stats
        print(f"{name}: {stats}", file=sys.stderr)
    return result
