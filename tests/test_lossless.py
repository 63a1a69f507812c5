"""Every registered builder keeps the target's distribution when sampling, stops exactly at max_new_tokens and
at EOS, and repeats a sampled run exactly with the same seed.

Parametrised over the registry, so a new builder is covered as soon as it is registered. Greedy identity
(speculative output == plain decoding == HF `generate`) is tests/test_greedy_identity.py's.
"""

import pytest
from arborspec.builders.registry import builder_names, make_builder
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.sampling import SamplingConfig

from conftest import GREEDY_PROMPTS, assert_first_two_follow

BUILDERS = builder_names()
# Pair-specific artefacts do not exist for the random test models: C2T uses its joint-probability rule here.
EXTRA = {name: {"classifier": "none"} for name in ("c2t", "c2t-chain")}
PROMPT = GREEDY_PROMPTS[0]


@pytest.mark.parametrize("name", BUILDERS)
def test_max_new_tokens_is_exact_and_eos_stops(tiny_pair, name):
    target, draft = tiny_pair
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft),
                             make_builder(name, budget=8, **EXTRA.get(name, {})))
    for n in (1, 2, 7):
        assert len(dec.generate(PROMPT, DecodeConfig(max_new_tokens=n)).output_ids) == n
    # make the 3rd greedy token an EOS: generation must stop right after it
    base = autoregressive_generate(ModelAdapter(target), PROMPT, DecodeConfig(max_new_tokens=10)).output_ids
    eos = base[2]
    cut = base[: base.index(eos) + 1]
    res = dec.generate(PROMPT, DecodeConfig(max_new_tokens=10, eos_token_ids=(eos,)))
    assert res.output_ids == cut and res.stop_reason == "eos"


# --------------------------------------------------------------------------- sampling
N_RUNS = 800


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILDERS)
def test_sampling_follows_target_distribution(small_vocab_pair, name):
    """The first two sampled tokens over 800 seeds follow the target's exact laws (chi-square at the false-alarm
    rate of conftest), and the same samples reject laws 0.1 away in total variation."""
    target, draft = small_vocab_pair
    cfg = SamplingConfig(0.8, top_p=0.95)
    prompt = [3, 7, 1, 12]
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft),
                             make_builder(name, budget=6, **EXTRA.get(name, {})))
    assert_first_two_follow(dec, target, prompt, cfg, N_RUNS, name, detects=0.1)


def test_sampled_runs_repeat_exactly_with_the_same_seed(tiny_pair):
    target, draft = tiny_pair
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder("specinfer", budget=8))
    cfg = DecodeConfig(max_new_tokens=16, sampling=SamplingConfig(0.9), seed=11)
    assert dec.generate(PROMPT, cfg).output_ids == dec.generate(PROMPT, cfg).output_ids
