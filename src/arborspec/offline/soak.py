"""A randomized soak: many short generations on random tiny Llama pairs, every invariant checked.

    arborspec dev soak --steps 10000 --seed 0    # the bar: 10,000 speculative steps, 0 failures
    arborspec dev soak --replay 123456789        # re-run one failing case by its case seed

Each *case* draws, from its own seed: a tiny random Llama target (vocabulary, width, depth) and a
perturbed copy as its draft, a registered builder and budget, the target's temperature / top-k /
top-p (the draft side follows them; at temperature 0 a random draft temperature), and a random
prompt. It then checks:

* greedy cases: the tokens equal plain decoding's;
* every case: every committed token is a valid id, every step's draft probabilities and estimates
  are finite and in range, accepted lengths add up to the output;
* after every step: the target cache holds exactly the committed tokens but the last, the draft
  cache no more than the committed tokens; at the end, the target cache equals a fresh prefill of
  the same tokens (the compactions lost nothing).

A failure records the case seed and the step, and `--replay` re-runs exactly that case.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field

import torch

from ..builders import builder_names, make_builder
from ..common.progress import progress_bar
from ..drafters import ModelDrafter
from ..engine.adapter import ModelAdapter
from ..engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from ..engine.invariants import CacheCheck
from ..engine.sampling import SamplingConfig

# no trained classifier exists for random pairs
EXTRA = {name: {"classifier": "none"} for name in ("c2t", "c2t-chain")}


@dataclass
class SoakFailure:
    case_seed: int
    # speculative step of the case at which the check failed (-1: before or after the steps)
    step: int
    description: str
    message: str


@dataclass
class SoakReport:
    seed: int
    cases: int = 0
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    failures: list[SoakFailure] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def tiny_pair(rng: random.Random):
    """A random tiny Llama target and a perturbed copy of it as the draft."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(rng.randrange(2**31))
    heads = rng.choice([2, 4])
    cfg = LlamaConfig(
        vocab_size=rng.choice([16, 48, 96]),
        hidden_size=8 * heads * rng.choice([1, 2]),
        intermediate_size=64,
        num_hidden_layers=rng.choice([1, 2]),
        num_attention_heads=heads,
        num_key_value_heads=rng.choice([1, heads]),
        max_position_embeddings=512,
        initializer_range=rng.choice([0.2, 0.5]),
        tie_word_embeddings=rng.random() < 0.5,
        attn_implementation="sdpa",
    )
    target = LlamaForCausalLM(cfg).eval()
    draft = LlamaForCausalLM(cfg).eval()
    noise = rng.choice([0.0, 0.1, 0.5])
    with torch.no_grad():
        for (_, p), (_, q) in zip(draft.named_parameters(), target.named_parameters()):
            p.copy_(q + noise * q.std() * torch.randn_like(q))
    return target, draft


def draw_case(case_seed: int) -> dict:
    """Everything a case uses, from its seed (models excluded: `tiny_pair` draws them
    from the same rng)."""
    rng = random.Random(case_seed)
    greedy = rng.random() < 0.5
    case = {
        "builder": rng.choice(builder_names()),
        "budget": rng.choice([1, 2, 3, 5, 8, 16]),
        "temperature": 0.0 if greedy else rng.choice([0.3, 0.7, 1.0, 1.6]),
        "top_k": rng.choice([0, 0, 3, 10]),
        "top_p": rng.choice([1.0, 1.0, 0.9, 0.5]),
        "draft_temperature": rng.choice([None, 0.4, 2.0]) if greedy else None,
        "prompt_len": rng.randint(1, 40),
        "max_new_tokens": rng.randint(1, 48),
        "model_seed": rng.randrange(2**31),
    }
    return case


def run_case(case_seed: int) -> tuple[int, int]:
    """Run one case; raise AssertionError (with the step in `.step`) on a broken invariant.
    Returns (steps, tokens)."""
    case = draw_case(case_seed)
    target, draft = tiny_pair(random.Random(case["model_seed"]))
    vocab = target.config.vocab_size
    prompt = random.Random(case_seed + 1).choices(range(vocab), k=case["prompt_len"])
    sampling = SamplingConfig(
        case["temperature"], case["top_k"], case["top_p"], case["draft_temperature"]
    )
    cfg = DecodeConfig(max_new_tokens=case["max_new_tokens"], sampling=sampling, seed=case_seed)
    params = {**EXTRA.get(case["builder"], {})}
    dec = SpeculativeDecoder(
        ModelAdapter(target),
        ModelDrafter(draft),
        make_builder(case["builder"], budget=case["budget"], **params),
    )
    check = CacheCheck(dec, len(prompt))
    try:
        result = dec.generate(prompt, cfg, on_tokens=check)
    except AssertionError as exc:
        exc.step = check.steps
        raise
    out = result.output_ids
    _require(
        len(out) == cfg.max_new_tokens, f"{len(out)} tokens for max_new_tokens {cfg.max_new_tokens}"
    )
    _require(all(0 <= t < vocab for t in out), "a token id outside the vocabulary")
    _require(
        sum(s.accepted_length for s in result.steps) == len(out), "accepted lengths do not add up"
    )
    for s in result.steps:
        _require(
            all(math.isfinite(p) and 0 <= p <= 1 + 1e-6 for p in s.examined_draft_probs),
            "a draft probability out of [0, 1]",
        )
        _require(
            math.isfinite(s.estimated_length) and math.isfinite(s.calibrated_length),
            "a non-finite estimate",
        )
    if sampling.greedy:
        base = autoregressive_generate(ModelAdapter(target), prompt, cfg).output_ids
        _require(out == base, "greedy tokens differ from plain decoding")
    fresh = ModelAdapter(target)
    fresh.prefill(torch.tensor(prompt + out[:-1]))
    for mine, ref in zip(dec.target.cache.layers, fresh.cache.layers):
        _require(
            mine.keys.shape == ref.keys.shape
            and torch.allclose(mine.keys, ref.keys, atol=1e-4)
            and torch.allclose(mine.values, ref.values, atol=1e-4),
            "target cache differs from a fresh prefill",
        )
    return len(result.steps), len(out)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def describe(case_seed: int) -> str:
    c = draw_case(case_seed)
    return (
        f"{c['builder']} budget={c['budget']} T={c['temperature']} top_k={c['top_k']} "
        f"top_p={c['top_p']} draft_T={c['draft_temperature']} prompt={c['prompt_len']} "
        f"new={c['max_new_tokens']}"
    )


def soak(steps: int, seed: int = 0, progress: bool = True, replay: int | None = None) -> SoakReport:
    """Run cases until `steps` speculative steps were checked (or just the case `replay`)."""
    report, rng, t0 = SoakReport(seed=seed), random.Random(seed), time.time()
    seeds = iter([replay]) if replay is not None else iter(lambda: rng.randrange(2**31), None)
    try:
        with progress_bar(progress) as bar:
            task = bar.add_task("soak", total=1 if replay is not None else steps, info="")
            for case_seed in seeds:
                if replay is None and report.steps >= steps:
                    break
                try:
                    n_steps, n_tokens = run_case(case_seed)
                # every failure is recorded with what reproduces it
                except Exception as exc:  # noqa: BLE001
                    report.failures.append(
                        SoakFailure(
                            case_seed,
                            getattr(exc, "step", -1),
                            describe(case_seed),
                            f"{type(exc).__name__}: {exc}",
                        )
                    )
                    n_steps, n_tokens = 1, 0
                report.cases += 1
                report.steps += n_steps
                report.tokens += n_tokens
                bar.update(
                    task,
                    advance=1 if replay is not None else n_steps,
                    info=f"{report.cases} cases, {len(report.failures)} failures",
                )
                if replay is not None:
                    break
    finally:
        report.seconds = round(time.time() - t0, 1)
    return report
