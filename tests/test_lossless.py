"""Every registered builder is lossless: greedy token identity, and the target's distribution when sampling.

Parametrised over the registry, so a new builder is covered as soon as it is registered.
"""

import pytest
import torch

from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.drafters import ModelDrafter, NgramDrafter
from arborspec.builders.registry import builder_names, make_builder
from arborspec.engine.sampling import SamplingConfig, probs_from_logits


BUILDERS = builder_names()
# Pair-specific artefacts do not exist for the random test models: C2T uses its joint-probability rule here.
EXTRA = {"c2t": {"classifier": "none"}}
PROMPTS = [[5, 17, 33, 8, 9, 40], [1, 60, 61, 62, 60, 61, 62, 60, 61], [88, 3]]


def hf_greedy(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
@pytest.mark.parametrize("name", BUILDERS)
def test_greedy_matches_plain_decoding_and_hf_generate(tiny_pair, name, drafter_kind):
    target, draft = tiny_pair
    cfg = DecodeConfig(max_new_tokens=24, eos_token_ids=(2,))
    for budget in (1, 8):
        drafter = ModelDrafter(draft) if drafter_kind == "model" else NgramDrafter(target.config.vocab_size)
        dec = SpeculativeDecoder(ModelAdapter(target), drafter, make_builder(name, budget=budget, **EXTRA.get(name, {})))
        for prompt in PROMPTS:
            spec = dec.generate(prompt, cfg)
            base = autoregressive_generate(ModelAdapter(target), prompt, cfg)
            assert spec.output_ids == base.output_ids, (name, budget, prompt)
            assert spec.output_ids == hf_greedy(target, prompt, 24)
            assert sum(s.accepted_length for s in spec.steps) == len(spec.output_ids)


@pytest.mark.parametrize("name", BUILDERS)
def test_max_new_tokens_is_exact_and_eos_stops(tiny_pair, name):
    target, draft = tiny_pair
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, budget=8, **EXTRA.get(name, {})))
    for n in (1, 2, 7):
        assert len(dec.generate(PROMPTS[0], DecodeConfig(max_new_tokens=n)).output_ids) == n
    # make the 3rd greedy token an EOS: generation must stop right after it
    base = autoregressive_generate(ModelAdapter(target), PROMPTS[0], DecodeConfig(max_new_tokens=10)).output_ids
    eos = base[2]
    cut = base[: base.index(eos) + 1]
    res = dec.generate(PROMPTS[0], DecodeConfig(max_new_tokens=10, eos_token_ids=(eos,)))
    assert res.output_ids == cut and res.stop_reason == "eos"


# --------------------------------------------------------------------------- sampling
N_RUNS = 600
TV_BOUND = 0.1


def exact_first_two(target, prompt, cfg):
    """Exact law of the first generated token and the marginal law of the second."""
    with torch.no_grad():
        p1 = probs_from_logits(target(torch.tensor([prompt])).logits[0, -1], cfg)
        rows = torch.stack([target(torch.tensor([prompt + [t]])).logits[0, -1] for t in range(target.config.vocab_size)])
    p2 = p1 @ probs_from_logits(rows, cfg)
    return p1, p2


@pytest.mark.parametrize("name", BUILDERS)
def test_sampling_follows_target_distribution(small_vocab_pair, name):
    target, draft = small_vocab_pair
    cfg = SamplingConfig(0.8, top_p=0.95)
    prompt = [3, 7, 1, 12]
    p1, p2 = exact_first_two(target, prompt, cfg)
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, budget=6, **EXTRA.get(name, {})))
    tv1, tv2 = first_two_tv(dec, prompt, cfg, p1, p2, N_RUNS)
    print(f"{name}: tv1={tv1:.3f} tv2={tv2:.3f}")
    assert tv1 < TV_BOUND and tv2 < TV_BOUND, (tv1, tv2)


def first_two_tv(dec, prompt, cfg, p1, p2, runs):
    """Total-variation distances of the first and second sampled tokens over `runs` seeds from their exact laws."""
    c1, c2 = torch.zeros(len(p1)), torch.zeros(len(p2))
    for seed in range(runs):
        out = dec.generate(prompt, DecodeConfig(max_new_tokens=2, sampling=cfg, seed=seed)).output_ids
        c1[out[0]] += 1
        c2[out[1]] += 1
    return 0.5 * float((c1 / runs - p1).abs().sum()), 0.5 * float((c2 / runs - p2).abs().sum())


def test_sampled_runs_repeat_exactly_with_the_same_seed(tiny_pair):
    target, draft = tiny_pair
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder("specinfer", budget=8))
    cfg = DecodeConfig(max_new_tokens=16, sampling=SamplingConfig(0.9), seed=11)
    assert dec.generate(PROMPTS[0], cfg).output_ids == dec.generate(PROMPTS[0], cfg).output_ids
