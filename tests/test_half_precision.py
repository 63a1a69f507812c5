"""Greedy identity in float16 and bfloat16 (offered by `--dtype` for GPUs; checked here on CPU).

Verification is lossless with respect to the target *as it is run*: a tree of
draft tokens verified by a half-precision target must give exactly the tokens
plain decoding gives in the same precision. The tree forward and the one-token
forward are different kernel shapes, so this is a real check that the tree's
verdict does not depend on the other nodes in the forward.
"""

import pytest
import torch

from arborspec.builders.registry import builder_names, make_builder
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from conftest import perturbed_copy, tiny_llama

# Joint-probability rule with a low threshold: this random pair is rarely confident enough for the default 0.5.
EXTRA = {"c2t": {"classifier": "none", "beta": 0.05}}
PROMPTS = [[5, 17, 33, 8, 9, 40], [1, 60, 61, 62, 60, 61, 62, 60, 61], [88, 3]]


@pytest.fixture(scope="module", params=["float16", "bfloat16"])
def half_pair(request):
    dtype = getattr(torch, request.param)
    target = tiny_llama(0).to(dtype)
    draft = perturbed_copy(tiny_llama(0), 1, 0.3).to(dtype)
    return target, draft


@pytest.mark.parametrize("name", builder_names())
def test_half_precision_greedy_equals_plain_decoding_in_the_same_precision(half_pair, name):
    target, draft = half_pair
    cfg = DecodeConfig(max_new_tokens=24, eos_token_ids=(2,))
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, budget=8, **EXTRA.get(name, {})))
    helped = False
    for prompt in PROMPTS:
        spec = dec.generate(prompt, cfg)
        base = autoregressive_generate(ModelAdapter(target), prompt, cfg)
        assert spec.output_ids == base.output_ids, (name, prompt)
        hf = target.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=2, pad_token_id=0)
        assert base.output_ids == hf[0, len(prompt):].tolist()
        helped |= max(s.accepted_length for s in spec.steps) > 1
    assert helped
