"""Long generations: after hundreds of steps and compactions the output is still exactly plain decoding's,
both KV caches hold exactly the committed tokens after every step, and the context limit ends cleanly.

The suite's share (tiny models, 1,500 tokens, one builder per children mode); `benchmarks/long_runs.py`
makes the same checks on the embedded target at 4,096 tokens, with memory figures.
"""

import pytest
from arborspec.builders.registry import make_builder
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.invariants import CacheCheck
from arborspec.errors import ArborError

from conftest import perturbed_copy, tiny_llama

LENGTH = 1500
PROMPT = [5, 17, 33, 8, 9, 40]


@pytest.fixture(scope="module")
def long_pair():
    target = tiny_llama(0, max_pos=2048)
    return target, perturbed_copy(target, 1, 0.3)


@pytest.mark.slow  # 1,500-token generations
@pytest.mark.parametrize("name", ["dyspec", "specinfer", "opt-tree"])  # without / with replacement / selected
def test_long_greedy_generation_stays_identical_with_exact_caches(long_pair, name):
    target, draft = long_pair
    cfg = DecodeConfig(max_new_tokens=LENGTH)  # no EOS: raw continuation to the end
    base = autoregressive_generate(ModelAdapter(target), PROMPT, cfg).output_ids
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, budget=8))
    check = CacheCheck(dec, len(PROMPT))
    out = dec.generate(PROMPT, cfg, on_tokens=check)
    assert out.output_ids == base and len(base) == LENGTH
    assert check.steps == len(out.steps) > LENGTH // 8  # hundreds of compactions happened


@pytest.mark.slow  # a generation to the end of a 2048-position context
def test_max_new_tokens_past_the_context_is_a_clean_error(long_pair):
    target, draft = long_pair
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder("dyspec", budget=8))
    with pytest.raises(ArborError, match="exceeds the target's context of 2048 positions"):
        dec.generate(PROMPT, DecodeConfig(max_new_tokens=2048 - len(PROMPT)))
    # the largest request that fits runs to its end
    fits = 2048 - len(PROMPT) - dec.builder.depth_limit - 1
    assert len(dec.generate(PROMPT, DecodeConfig(max_new_tokens=fits)).output_ids) == fits


def test_freed_memory_is_given_back_every_so_many_committed_tokens(monkeypatch):
    """engine/allocator.py: a trim each time `every` more tokens are committed, whatever the step sizes."""
    from arborspec.engine import allocator

    calls = []
    monkeypatch.setattr(allocator, "_TRIM", lambda pad: calls.append(pad))
    trim = allocator.PeriodicTrim("cpu", every=10)
    for n in [3, 3, 3, 3, 1, 7, 2, 1, 25]:  # running totals 3 6 9 12 13 20 22 23 48
        trim.advance(n)
    assert trim.calls == len(calls) == 3 and calls == [0] * 3  # crossed 10, 20, then 30 and 40 at once: one call
    assert not allocator.PeriodicTrim("cuda:0").active
