"""The greedy screen (engine/lm_head.py, docs/algorithms.md §7): its error bounds hold, its argmax is the
full row's, it screens (few float32 rows), and a bound made too tight is caught by the same checks."""

from __future__ import annotations

import pytest
import torch
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.lm_head import GreedyScreen, HeadRows, LazyLogits, greedy_token

from conftest import tiny_llama


def head_and_rows(vocab: int = 4096, hidden: int = 576, rows: int = 200, seed: int = 0):
    """A head shaped like SmolLM2's (per-token scales differ) and hidden rows with a few huge channels,
    as a final norm produces, each row pointing towards one token (a peaked distribution)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, hidden, generator=g) * (0.02 + 0.06 * torch.rand(vocab, 1, generator=g))
    hid = torch.randn(rows, hidden, generator=g)
    hid[:, :5] *= 25.0  # outlier channels
    winners = torch.randint(0, vocab, (rows,), generator=g)
    hid += 3.0 * weight[winners] / weight[winners].norm(dim=1, keepdim=True) * hidden ** 0.5
    return weight, hid


def screen_of(weight: torch.Tensor) -> GreedyScreen:
    return GreedyScreen(weight, weight.t().contiguous())


def test_bounds_hold_against_float64():
    weight, hid = head_and_rows()
    screen = screen_of(weight)
    for h in hid:
        approx, bound = screen.bounds(h[None])
        exact = (weight.double() @ h.double()).float()
        assert bool(((approx - exact).abs() <= bound).all())
        assert float(bound.max()) < 10.0  # a bound that says nothing would pass the line above too


def test_argmax_is_the_full_rows_and_few_rows_are_computed():
    weight, hid = head_and_rows()
    screen = screen_of(weight)
    full = (hid @ weight.t()).argmax(1)
    assert [screen.argmax(h[None]) for h in hid] == full.tolist()
    assert screen.candidates / len(hid) < 0.01 * weight.shape[0]


def near_ties(weight: torch.Tensor, hid: torch.Tensor, gap: float = 1e-3) -> torch.Tensor:
    """Each row moved along the difference of its two best tokens' weights until they are `gap` apart."""
    out = []
    for h in hid:
        logits = weight @ h
        top2 = logits.topk(2).indices
        d = weight[top2[0]] - weight[top2[1]]
        out.append(h - (float(logits[top2[0]] - logits[top2[1]]) - gap) * d / float(d @ d))
    return torch.stack(out)


def test_near_ties_are_resolved_by_the_float32_logits():
    """Rows whose two best tokens are 1e-3 apart: both are candidates, the larger exact logit wins."""
    weight, hid = head_and_rows(rows=40, seed=1)
    screen = screen_of(weight)
    for h in near_ties(weight, hid):
        before = screen.candidates
        assert screen.argmax(h[None]) == int((weight.double() @ h.double()).argmax())
        assert screen.candidates - before >= 2


def test_rows_screened_together_get_what_each_gets_alone():
    """Batched decoding screens many rows in one int8 product: every row's screen logits, bounds and token are
    exactly those of the row alone, near ties included."""
    weight, hid = head_and_rows(rows=24, seed=3)
    screen = screen_of(weight)
    rows = torch.cat([hid[:12], near_ties(weight, hid[12:])])
    approx, bound = screen.bounds(rows)
    for i, h in enumerate(rows):
        a, b = screen.bounds(h[None])
        assert torch.equal(approx[i], a[0]) and torch.equal(bound[i], b[0])
    assert screen.argmax_rows(rows) == [screen.argmax(h[None]) for h in rows]
    assert screen.argmax_rows(rows) == (rows.double() @ weight.double().t()).argmax(1).tolist()


def test_a_bound_too_tight_is_caught():
    """Negative control: the same check fails for a screen whose bounds are shrunk 100 times."""
    weight, hid = head_and_rows(rows=40, seed=2)
    screen = screen_of(weight)
    screen.norm_w, screen.norm_err = screen.norm_w / 100, screen.norm_err / 100
    rows = near_ties(weight, hid)
    assert [screen.argmax(h[None]) for h in rows] != (rows.double() @ weight.double().t()).argmax(1).tolist()


def test_non_finite_rows_fall_back_to_the_full_row():
    weight, _ = head_and_rows(vocab=256, rows=1)
    screen = screen_of(weight)
    row = torch.full((1, weight.shape[1]), float("nan"))
    assert screen.argmax(row) is None


@pytest.mark.parametrize("seed", [0, 1])
def test_plain_and_tree_rows_use_the_screen_and_agree_with_full_logits(seed):
    """On a tiny model: the adapter's screened greedy token of every row = argmax of the model's own logits."""
    model = tiny_llama(seed, init=0.5)
    lm = ModelAdapter(model)
    assert lm.head.screen is not None
    ids = torch.randint(4, 96, (40,), generator=torch.Generator().manual_seed(seed))
    rows = lm.feed(ids)
    assert isinstance(rows, LazyLogits)
    lm.reset()
    hidden = lm.hidden_forward(ids)
    reference = model(input_ids=ids.view(1, -1)).logits[0].argmax(-1)
    lazy = LazyLogits(hidden, lm.head)
    assert [greedy_token(lazy, i) for i in range(len(ids))] == reference.tolist()
    assert not lazy.rows  # no full row was computed for the greedy tokens
    assert greedy_token(rows, 0) == int(reference[-1])


def test_no_screen_for_half_precision_heads_or_heads_with_a_bias():
    assert HeadRows(tiny_llama(0).to(torch.bfloat16)).screen is None
    model = tiny_llama(0)
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    model.set_output_embeddings(biased)
    assert HeadRows(model).screen is None


def test_rows_computed_ahead_of_the_walk_are_the_rows_read_alone():
    """`LazyLogits.prefetch`: screened tokens of the rows computed ahead = each row's own `argmax`; logits rows
    computed in one product (oneDNN's packed head) = each row's own up to float32 summation order; a row computed
    ahead is not computed again; speculative decoding with every row, or none, computed ahead gives plain decoding's
    tokens."""
    import arborspec.engine.decode as decode
    from arborspec.builders.registry import make_builder
    from arborspec.drafters import NgramDrafter

    model = tiny_llama(2, init=0.5)
    lm = ModelAdapter(model)
    ids = torch.randint(4, 96, (30,), generator=torch.Generator().manual_seed(2))
    hidden = lm.hidden_forward(ids)
    ahead, alone = LazyLogits(hidden, lm.head), LazyLogits(hidden, lm.head)
    ahead.prefetch([0, 7, 7, 29, -1], greedy=True)
    assert sorted(ahead.best) == [0, 7, 29] and not ahead.rows
    assert [ahead.argmax(i) for i in range(30)] == [alone.argmax(i) for i in range(30)]
    ahead.prefetch([3, 11, 12], greedy=False)
    assert isinstance(lm.head.packed, torch.Tensor)  # several rows: oneDNN's packed head (lm_head doc)
    for i in (3, 11, 12):
        row = ahead.rows[i]
        assert torch.allclose(row, alone[i], rtol=1e-5, atol=1e-5)
        assert ahead[i] is row  # kept, not computed again
    cfg = decode.DecodeConfig(max_new_tokens=30)
    prompt = ids[:8].tolist()
    plain = decode.autoregressive_generate(ModelAdapter(model), prompt, cfg).output_ids
    saved = decode.LIKELY_ROW_VALUE
    try:
        for least in (0.0, 2.0):  # every node's row ahead; none but the root's
            decode.LIKELY_ROW_VALUE = {"screened": least, "sampled": least}
            dec = decode.SpeculativeDecoder(ModelAdapter(model), NgramDrafter(96), make_builder("dyspec", budget=6))
            assert dec.generate(prompt, cfg).output_ids == plain, least
    finally:
        decode.LIKELY_ROW_VALUE = saved
