"""Teacher-forcing quality of a draft model against its target on held-out prompts.

``arborspec draft-quality --target embedded --draft embedded-draft --out q.json`` measures:

* **draft cost**: median wall time of one draft forward (1 new token over a
  ``--cache-len``-token KV cache) divided by the same for the target, on this machine;
* **top-1 agreement**: on target-greedy continuations of held-out prompts, the fraction of
  positions where argmax(draft) == argmax(target) (teacher forcing: both see the same prefix);
* **expected chain acceptance**: per-position acceptance probability of standard
  speculative sampling, ``sum_x min(p_T(x), p_D(x))``, with both distributions at
  temperature T; at T=0 it equals the top-1 agreement. Reported for T=0 and ``--temperature``.

Held-out prompts (never used for training, see ``arborspec.offline.distill``): MT-Bench first
turns and HumanEval prompts, found inside their installed packages by
``common/datafiles.py``, both fed through the target's chat template.
"""

from __future__ import annotations

import statistics

import torch

from ..common.chat import encode_prompt
from ..common.datafiles import humaneval_file, mt_bench_file, read_jsonl
from ..common.hf_cache import cache_kwargs
from ..common.progress import progress_bar
from ..common.timing import clock
from ..models import load_model, load_tokenizer, resolve_model_path
from .distill import load_draft
from .generation import cut_at_eos, left_padded, pad_token_id


def mtbench_first_turns() -> list[str]:
    return [row["turns"][0] for row in read_jsonl(mt_bench_file())]


def humaneval_prompts() -> list[str]:
    return [
        f"Complete the following Python function.\n\n```python\n{r['prompt']}```"
        for r in read_jsonl(humaneval_file())
    ]


@torch.inference_mode()
def greedy_continuations(
    target, tok, prompts: list[list[int]], max_new_tokens: int, batch_size: int = 8
) -> list[list[int]]:
    pad = pad_token_id(tok)
    outs = []
    for b in range(0, len(prompts), batch_size):
        ids, mask = left_padded(prompts[b : b + batch_size], pad)
        seqs = target.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )[:, ids.shape[1] :]
        outs += [cut_at_eos(row, {tok.eos_token_id}) for row in seqs.tolist()]
    return outs


@torch.inference_mode()
def teacher_forced_stats(
    target, draft, prompt: list[int], cont: list[int], temperature: float
) -> dict:
    """Per-position agreement and expected acceptance on prompt+cont (positions predicting cont)."""
    ids = torch.tensor([prompt + cont])
    s, n = len(prompt), len(cont)
    lt = target(ids).logits[0, s - 1 : s - 1 + n].float()
    ld = draft(ids).logits[0, s - 1 : s - 1 + n].float()
    agree = (lt.argmax(-1) == ld.argmax(-1)).float()
    pt = torch.softmax(lt / temperature, -1)
    pd = torch.softmax(ld / temperature, -1)
    acc_t = torch.minimum(pt, pd).sum(-1)
    return {"agree": agree.tolist(), "acc_t": acc_t.tolist()}


@torch.inference_mode()
def forward_time(model, cache_len: int, reps: int, seed: int = 0) -> float:
    """Median seconds of one 1-token forward over a `cache_len`-token KV cache."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (1, cache_len), generator=g)
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(ids, **cache_kwargs(model, cache), use_cache=True)
    nxt = torch.tensor([[int(out.logits[0, -1].argmax())]])
    times = []
    for i in range(reps + 3):
        t = clock()
        model(nxt, **cache_kwargs(model, cache), use_cache=True)
        dt = clock(model.device) - t
        cache.crop(-1)
        if i >= 3:
            times.append(dt)
    return statistics.median(times)


def interleaved_times(target, time_draft, cache_len: int, reps: int) -> tuple[float, float]:
    """Median seconds of a target forward and of a draft forward (`time_draft(reps, seed)`), timed
    in three alternating rounds so both see the same load on the machine."""
    tt, td = [], []
    for r in range(3):
        tt.append(forward_time(target, cache_len, reps // 3 + 1, seed=r))
        td.append(time_draft(reps // 3 + 1, r))
    return statistics.median(tt), statistics.median(td)


def measure(
    target_name: str = "embedded",
    draft_name: str = "embedded-draft",
    *,
    n_mtbench: int = 80,
    n_humaneval: int = 40,
    max_new_tokens: int = 64,
    temperature: float = 0.6,
    cache_len: int = 128,
    reps: int = 40,
    threads: int | None = None,
    gen_batch_size: int = 8,
    progress: bool = True,
) -> dict:
    if threads:
        torch.set_num_threads(threads)
    tok = load_tokenizer(target_name)
    target = load_model(target_name)
    draft = load_draft(resolve_model_path(draft_name), tok, dtype=torch.float32)
    t0 = clock()
    t_target, t_draft = interleaved_times(
        target, lambda r, s: forward_time(draft, cache_len, r, s), cache_len, reps
    )
    result = {
        "target": target_name,
        "draft": draft_name,
        "threads": torch.get_num_threads(),
        "cost": {
            "target_forward_ms": round(1000 * t_target, 3),
            "draft_forward_ms": round(1000 * t_draft, 3),
            "draft_cost_ratio": round(t_draft / t_target, 4),
            "cache_len": cache_len,
        },
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "sets": {},
    }
    sets = {
        "mt_bench_turn1": mtbench_first_turns()[:n_mtbench],
        "humaneval": humaneval_prompts()[:n_humaneval],
    }
    all_agree, all_acc = [], []
    for name, prompts in sets.items():
        if not prompts:
            continue
        enc = [encode_prompt(tok, p) for p in prompts]
        conts = greedy_continuations(target, tok, enc, max_new_tokens, gen_batch_size)
        agree, acc = [], []
        with progress_bar(progress) as bar:
            task = bar.add_task(name, total=len(enc), info="")
            for p, c in zip(enc, conts):
                bar.advance(task)
                if not c:
                    continue
                st = teacher_forced_stats(target, draft, p, c, temperature)
                agree += st["agree"]
                acc += st["acc_t"]
                bar.update(task, info=f"agreement so far {sum(agree) / len(agree):.3f}")
        result["sets"][name] = {
            "prompts": len(enc),
            "positions": len(agree),
            "top1_agreement": round(sum(agree) / len(agree), 4),
            "chain_acceptance_t0": round(sum(agree) / len(agree), 4),
            f"chain_acceptance_t{temperature:g}": round(sum(acc) / len(acc), 4),
        }
        all_agree += agree
        all_acc += acc
    if all_agree:
        result["overall"] = {
            "positions": len(all_agree),
            "top1_agreement": round(sum(all_agree) / len(all_agree), 4),
            "chain_acceptance_t0": round(sum(all_agree) / len(all_agree), 4),
            f"chain_acceptance_t{temperature:g}": round(sum(all_acc) / len(all_acc), 4),
        }
    result["seconds"] = round(clock() - t0, 1)
    return result
