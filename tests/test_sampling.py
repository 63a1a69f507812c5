"""Sampling transforms follow HF semantics; Gumbel top-k equals sequential sampling without replacement."""

import itertools

import pytest
import torch
from arborspec.engine.sampling import (
    SamplingConfig,
    gumbel_like,
    probs_from_logits,
    sample_without_replacement,
    warp_logits,
)
from arborspec.errors import ArborError
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from conftest import assert_follows


@pytest.mark.parametrize("temperature,top_k,top_p",
                         [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.8), (0.6, 8, 0.9), (1.0, 1, 1.0)])
def test_warp_matches_hf(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3
    ours = warp_logits(logits, SamplingConfig(temperature, top_k, top_p))
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    finite = torch.isfinite(ref)
    assert torch.allclose(ours[finite], ref[finite], atol=1e-5)


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    probs = probs_from_logits(logits, SamplingConfig(0.0))
    assert probs.tolist() == [[0, 1, 0], [1, 0, 0]]


def test_draft_side_of_greedy_is_a_real_distribution():
    cfg = SamplingConfig(0.0, top_k=3)
    assert cfg.draft_side().temperature == 0.8 and cfg.draft_side().top_k == 3  # ordered draws' value temperature
    assert SamplingConfig(0.6).draft_side() == SamplingConfig(0.6)


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)])
def test_bad_sampling_values(kwargs):
    with pytest.raises(ArborError):
        SamplingConfig(**kwargs)


def test_gumbel_topk_is_sampling_without_replacement():
    """The joint law of the first two draws of Gumbel top-k over 20000 draws equals sequential draws from
    residuals, p(a) p(b) / (1 - p(a)) (chi-square, conftest; laws 0.02 away in total variation are rejected)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    n = 20000
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(5, 5)
    for _ in range(n):
        a, b = sample_without_replacement(p, 2, gumbel_like(p, gen))
        counts[a, b] += 1
    exact = torch.zeros(5, 5)
    for a, b in itertools.permutations(range(4), 2):
        exact[a, b] = p[a] * p[b] / (1 - p[a])
    assert_follows(counts, exact, what="Gumbel top-2", detects=0.02)
    assert counts[4].sum() == 0 and counts[:, 4].sum() == 0  # zero-probability tokens are never drawn


def test_without_replacement_stops_at_support():
    p = torch.tensor([0.0, 0.7, 0.0, 0.3])
    drawn = sample_without_replacement(p, 4, gumbel_like(p, torch.Generator().manual_seed(0)))
    assert sorted(drawn) == [1, 3]


def test_support_sized_noise_draws_like_full_noise():
    """One Gumbel draw per support token (vocabulary order) = the full-vocabulary noise restricted to the support."""
    p = torch.tensor([0.0, 0.4, 0.0, 0.25, 0.2, 0.0, 0.15])
    support = torch.nonzero(p > 0).squeeze(-1)
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        full = gumbel_like(p, gen)
        assert sample_without_replacement(p, 3, full) == sample_without_replacement(p, 3, full[support])
    counts = torch.zeros(7)
    for _ in range(20000):
        counts[sample_without_replacement(p, 1, gumbel_like(support.float(), gen))[0]] += 1
    assert_follows(counts, p, what="support-sized noise", detects=0.02)  # chi-square over 20000 draws, conftest


def test_one_draw_follows_the_distribution_and_never_draws_probability_zero():
    """`sample` (inverse CDF): 20,000 draws from an unnormalised law with zero-probability tokens (first, last
    and inside) follow it (chi-square, conftest) and never give a zero-probability token; a law that moves
    0.05 of the mass is rejected; an all-zero or NaN row is refused."""
    from arborspec.engine.sampling import sample

    from conftest import assert_departs

    weights = torch.tensor([0.0, 3.0, 0.5, 0.0, 2.0, 1e-3, 4.0, 0.0])
    law = weights / weights.sum()
    gen = torch.Generator().manual_seed(7)
    counts = torch.bincount(torch.tensor([sample(weights, gen) for _ in range(20_000)]), minlength=8)
    assert counts[[0, 3, 7]].sum() == 0
    nonzero = law > 0
    assert_follows(counts[nonzero], law[nonzero], what="inverse-CDF draws", detects=0.05)
    moved = law.clone()
    moved[1] -= 0.05
    moved[6] += 0.05
    assert_departs(counts[nonzero], moved[nonzero], what="a law 0.05 away")
    for bad in (torch.zeros(4), torch.tensor([0.5, float("nan")])):
        with pytest.raises(RuntimeError, match="invalid distribution"):
            sample(bad, gen)
