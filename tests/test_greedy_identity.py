"""Greedy identity, the engine's promise at temperature 0: speculative output == plain decoding == HF
`generate` of the same model, for every registered builder (from the registry: a new builder is covered
as soon as it is registered) crossed with every drafter, target precision, context lookup and budget mode.

Axes (BASE: the first value of each):
* drafter: a perturbed copy of the target (`model`), the same copy in int8 with int8 draft logits
  (`model-int8`, what a draft model runs as on a CPU), the n-gram drafter, the draft head trained on the
  target (`head`), the head with int8 draft logits (`head-int8-logits`), the head with its layer and
  logits in int8 (`head-int8`, what CPU pairs run);
* precision of the target: float32, float16, bfloat16 (a real check that a tree's verdict does not
  depend on the other nodes in the forward: the tree forward and the one-token forward are different
  kernel shapes), int8 (the batch-invariant int8 target; drafts stay float32);
* lookup: 0 or LOOKUP tokens copied from earlier in the context grafted onto every tree;
* budget: fixed (budgets 1 and 8) or auto (builders that offer it; a flat and a steep cost curve);
* device: the CPU, and a CUDA GPU where one is visible (conftest `device`; int8 runs on a CPU only, and on
  a GPU a half-precision generation may part at a rounding tie: `same_tokens`).

Every builder runs every pair of axis values (the cases at most two axes away from BASE) and the CPU
default (CPU_DEFAULT, both budget modes). `make test-fast` keeps the cases at most one axis away from
BASE, which still put every builder through every value of every axis, and the CPU default's fixed
budget.
"""

from __future__ import annotations

import functools

import pytest
import torch
from arborspec.builders.registry import builder_class, builder_names, make_builder, parameter_names
from arborspec.drafters import ModelDrafter, NgramDrafter
from arborspec.drafters.head import HeadDrafter, load_head
from arborspec.engine.cost import CostCurve
from arborspec.engine.int8 import quantize_int8

from conftest import assert_greedy_identical, perturbed_copy, tiny_llama

BUILDERS = builder_names()
AUTO_BUILDERS = [name for name in BUILDERS if "auto" in parameter_names(builder_class(name))]
DRAFTERS = ("model", "model-int8", "ngram", "head", "head-int8-logits", "head-int8")
PRECISIONS = ("float32", "float16", "bfloat16", "int8")
LOOKUP = 5
LOOKUPS = (0, LOOKUP)
BUDGETS = ("fixed", "auto")
BASE = (DRAFTERS[0], PRECISIONS[0], LOOKUPS[0], BUDGETS[0])
# Random pairs are rarely confident enough for C2T's default threshold: its joint-probability rule, a low one.
# c2t-chain's lower one: on the float16 target the 24th token of GREEDY_PROMPTS[1] is a near tie (its top two logits
# one float16 step apart), which a forward of another row count can round the other way (docs/algorithms.md §10);
# the chains beta=0.05 grows happen to end on such a forward there, those of beta=0.02 do not.
EXTRA = {"c2t": {"classifier": "none", "beta": 0.05}, "c2t-chain": {"classifier": "none", "beta": 0.02}}
# a CPU-like curve (the first extra row is the expensive one) and a steep one (big trees never pay)
FLAT = CostCurve((1, 2, 4, 8, 16, 32, 64), (1.0, 1.6, 1.7, 1.8, 1.9, 2.5, 3.5), 0.05, 0.05)
STEEP = CostCurve((1, 2, 4, 8), (1.0, 1.5, 2.5, 4.5), 0.05, 0.0)
# What a CPU generation runs by default (defaults.py): the int8 target, its int8 draft head or int8 draft
# model, lookup.
CPU_DEFAULTS = (("head-int8", "int8", LOOKUP), ("model-int8", "int8", LOOKUP))


def cases() -> list:
    """The cases of the module doc, marked slow unless at most one axis away from BASE or the CPU default
    with a fixed budget."""
    out = []
    for name in BUILDERS:
        for drafter in DRAFTERS:
            for precision in PRECISIONS:
                for lookup in LOOKUPS:
                    for budget in BUDGETS:
                        if budget == "auto" and name not in AUTO_BUILDERS:
                            continue
                        axes = (drafter, precision, lookup, budget)
                        away = sum(a != b for a, b in zip(axes, BASE))
                        default = axes[:3] in CPU_DEFAULTS
                        if away > 2 and not default:
                            continue
                        fast = away <= 1 or (default and budget == "fixed")
                        out.append(pytest.param(name, *axes, marks=[] if fast else [pytest.mark.slow],
                                                id=f"{name}-{drafter}-{precision}-lookup{lookup}-{budget}"))
    return out


@functools.cache
def target_in(precision: str, device: str):
    """The tiny target (`tiny_pair`'s weights) in `precision` on `device`."""
    target = tiny_llama(0)
    if precision == "int8":
        gen = torch.Generator().manual_seed(0)
        return quantize_int8(target, [torch.randint(3, 96, (40,), generator=gen) for _ in range(3)])
    return target.to(device, getattr(torch, precision))


@functools.cache
def draft_model_for(precision: str, device: str):
    """A perturbed copy of the target that often agrees with it: in the target's floating precision,
    float32 beside the int8 target; on `device`."""
    draft = perturbed_copy(tiny_llama(0), 1, 0.3)
    return draft.to(device, torch.float32 if precision == "int8" else getattr(torch, precision))


@functools.cache
def int8_draft_model():
    """The perturbed copy in int8 (engine/int8.py), calibrated on its own random tokens."""
    gen = torch.Generator().manual_seed(1)
    draft = perturbed_copy(tiny_llama(0), 1, 0.3)
    return quantize_int8(draft, [torch.randint(3, 96, (40,), generator=gen) for _ in range(3)])


@pytest.fixture(scope="module")
def drafter_for(trained_head, tmp_path_factory):
    """`make(kind, precision, target)`: a fresh drafter of `kind` for the target in `precision` (on its
    device)."""
    heads = {}

    def make(kind: str, precision: str, target):
        device = str(next(target.parameters()).device)
        if kind == "model":
            return ModelDrafter(draft_model_for(precision, device))
        if kind == "model-int8":
            drafter = ModelDrafter(int8_draft_model(), int8_logits=True)
            assert drafter.int8_logits
            return drafter
        if kind == "ngram":
            return NgramDrafter(target.config.vocab_size)
        if (kind, precision, device) not in heads:
            # exported for this copy of the target: a head refuses a target whose embedding differs
            path = tmp_path_factory.mktemp(f"head-{precision}")
            trained_head[0].save(path, "tiny", target)
            dtype = None if precision in ("float32", "int8") else target.dtype
            head = load_head(path, target, dtype=dtype, int8_logits=kind.startswith("head-int8"),
                             int8_layers=kind == "head-int8")
            assert (head.int8_logits, head.int8_layers) == (kind != "head", kind == "head-int8")
            heads[kind, precision, device] = head
        return HeadDrafter(heads[kind, precision, device])

    return make


@pytest.mark.parametrize("name,drafter,precision,lookup,budget", cases())
def test_greedy_output_is_plain_decoding_and_hf_generate(drafter_for, name, drafter, precision, lookup, budget,
                                                        device):
    if device != "cpu" and "int8" in (precision, *drafter.split("-")):
        pytest.skip("int8 runs on a CPU only")
    target = target_in(precision, device)
    extra = EXTRA.get(name, {})
    if budget == "fixed":
        runs = [(make_builder(name, budget=b, **extra), None) for b in (1, 8)]
    else:
        runs = [(make_builder(name, budget="auto", **extra), curve) for curve in (FLAT, STEEP)]
    results = []
    for builder, curve in runs:
        drafts = drafter_for(drafter, precision, target)
        results += assert_greedy_identical(target, drafts, builder, cost=curve, lookup=lookup, helped=False)
        if budget == "auto":
            assert all(s.tree_size <= builder.budget + lookup for r in results for s in r.steps)
    steps = [s for r in results for s in r.steps]
    assert any(s.tree_size > 0 for s in steps)  # trees were verified, not only plain steps
    if drafter.startswith("model") and budget == "fixed":  # a draft that often agrees: its tokens were accepted
        assert max(s.accepted_length for s in steps) > 1
    if lookup:
        assert sum(s.lookup_nodes for s in steps) > 0  # a prompt repeats itself: lookup proposed something
        assert all(p > 0 for s in steps for p in s.examined_draft_probs)  # grafted nodes are not calibrated
    else:
        assert all(s.lookup_nodes == 0 for s in steps)
