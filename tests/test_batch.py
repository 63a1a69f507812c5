"""Batched decoding (engine/batch_decode.py, docs/algorithms.md §10): on the batch-invariant int8 target every
request's greedy output is the one it gets decoded alone, whatever it is batched with and whenever it joins, for
every registered builder, mixed with plain rows, with a draft model, the n-gram drafter and the batched draft head;
each request's cache rows hold exactly its committed tokens after every step, bit for bit those of a fresh prefill;
requests that end or are cancelled release their rows; sampled batched outputs follow the target's law; the
shared budget's trees obey their budget and cost; the cache layout's moves are exact."""

import copy

import pytest
import torch
from arborspec import SpeculativeGenerator
from arborspec.builders.registry import builder_names, make_builder
from arborspec.builders.shared_budget import SharedBudget
from arborspec.drafters import ModelDrafter, NgramDrafter
from arborspec.drafters.head import HeadDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.batch_cost import EXPLORE, BatchCost, DraftingHistory
from arborspec.engine.batch_decode import BatchDecoder, BatchRequest
from arborspec.engine.batch_rows import BatchRows
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.engine.int8 import quantize_int8
from arborspec.engine.sampling import SamplingConfig
from arborspec.errors import ArborError
from transformers import DynamicCache

from conftest import FALSE_ALARM, assert_follows, exact_first_two

EXTRA = {"c2t": {"classifier": "none", "beta": 0.05}, "c2t-chain": {"classifier": "none", "beta": 0.05}}
# different lengths; the second repeats itself (lookup copies from it); the third has nothing to prefill
PROMPTS = ([5, 17, 33, 8, 9, 40], [1, 60, 61, 62, 60, 61, 62, 60, 61], [88],
           [7, 3, 9, 11, 13, 15, 17, 19, 21, 23, 7, 3])
GREEDY = DecodeConfig(max_new_tokens=20, sampling=SamplingConfig(0.0), eos_token_ids=(2,))


def calibration(vocab: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (40,), generator=gen) for _ in range(3)]


@pytest.fixture(scope="module")
def int8_pair(tiny_pair):
    target, draft = tiny_pair
    return quantize_int8(copy.deepcopy(target), calibration(target.config.vocab_size)), draft


@pytest.fixture(scope="module")
def references(int8_pair):
    adapter = ModelAdapter(int8_pair[0])
    return [autoregressive_generate(adapter, list(p), GREEDY).output_ids for p in PROMPTS]


def builder(name: str, budget: int = 4):
    return make_builder(name, budget=budget, **EXTRA.get(name, {}))


def check_caches(dec: BatchDecoder) -> None:
    """Every request's target row holds its committed tokens but the last, bit for bit those of a fresh prefill,
    and holes only past its length."""
    rows = dec.target.rows
    for h in dec.active:
        assert rows.length(h.key) == len(h.committed) - 1
    if not dec.active:
        return
    fresh = ModelAdapter(dec.adapter.model)
    for h in dec.active[:2]:
        n = len(h.committed) - 1
        if n == 0:
            continue
        fresh.reset()
        fresh.feed(torch.tensor(h.committed[:-1]))
        b = rows.row(h.key)
        for mine, theirs in zip(rows.cache.layers, fresh.cache.layers):
            assert torch.equal(mine.keys[b, :, :n], theirs.keys[0])
            assert torch.equal(mine.values[b, :, :n], theirs.values[0])


def run_staggered(dec: BatchDecoder, make, lookup: int = 0, check: bool = False):
    """Two requests (one plain) join at once, two more after two steps; returns the handles in PROMPTS order."""
    handles = [dec.submit(BatchRequest(list(PROMPTS[0]), GREEDY, make(), lookup)),
               dec.submit(BatchRequest(list(PROMPTS[1]), GREEDY, None))]
    for _ in range(2):
        dec.step()
        if check:
            check_caches(dec)
    handles += [dec.submit(BatchRequest(list(PROMPTS[2]), GREEDY, make(), lookup)),
                dec.submit(BatchRequest(list(PROMPTS[3]), GREEDY, make(), 0))]
    while not dec.idle:
        dec.step()
        if check:
            check_caches(dec)
    return handles


@pytest.mark.parametrize("name", builder_names())
def test_batched_int8_greedy_equals_each_request_alone(int8_pair, references, name):
    target, draft = int8_pair
    dec = BatchDecoder(ModelAdapter(target), ModelDrafter(draft))
    handles = run_staggered(dec, lambda: builder(name), lookup=4)
    assert [h.result.output_ids for h in handles] == references
    assert dec.target.rows.cache is None and len(dec.target) == 0  # everyone left, every row released


def test_caches_hold_exactly_the_committed_tokens_after_every_step(int8_pair, references):
    target, draft = int8_pair
    dec = BatchDecoder(ModelAdapter(target), ModelDrafter(draft))
    handles = run_staggered(dec, lambda: builder("dyspec", 6), lookup=4, check=True)
    assert [h.result.output_ids for h in handles] == references


def test_ngram_drafter_and_shared_budget_batched(int8_pair, references):
    target, _ = int8_pair
    adapter = ModelAdapter(target)
    dec = BatchDecoder(adapter, NgramDrafter(target.config.vocab_size))
    assert [h.result.output_ids for h in run_staggered(dec, lambda: builder("opt-tree"))] == references
    for shared in (SharedBudget(max_nodes=5, budget=7), SharedBudget(max_nodes=5)):
        dec = BatchDecoder(adapter, NgramDrafter(target.config.vocab_size), shared=shared)
        handles = run_staggered(dec, lambda: builder("dyspec", 5), lookup=3)
        assert [h.result.output_ids for h in handles] == references


def test_batched_draft_head_keeps_its_rows_in_step(trained_head, head_target):
    """The head drafts every request in one forward per depth; int8 target greedy = each request alone, and the
    head's rows hold the tokens committed before the step's new ones."""
    head = trained_head[0]
    target = quantize_int8(copy.deepcopy(head_target), calibration(head_target.config.vocab_size))
    adapter = ModelAdapter(target)
    refs = [autoregressive_generate(adapter, list(p), GREEDY).output_ids for p in PROMPTS]
    dec = BatchDecoder(adapter, HeadDrafter(head))
    handles = [dec.submit(BatchRequest(list(p), GREEDY, builder("dyspec", 6), 2)) for p in PROMPTS[:2]]
    seen_forwards = []
    dec.step()
    handles += [dec.submit(BatchRequest(list(p), GREEDY, builder("specinfer", 6))) for p in PROMPTS[2:]]
    while not dec.idle:
        dec.step()
        seen_forwards.append(dec.drafts.forwards)
        for h in dec.active:
            assert dec.drafts.batch.length(h.key) == len(h.committed) - h.steps[-1].accepted_length
    assert [h.result.output_ids for h in handles] == refs
    # one draft forward per depth for the whole batch (plus begin's), not one per request
    assert max(seen_forwards) <= 1 + 6
    assert dec.drafts.batch.cache is None


def test_leaving_and_cancelled_requests_release_their_rows(int8_pair, references):
    target, draft = int8_pair
    dec = BatchDecoder(ModelAdapter(target), ModelDrafter(draft))
    short = dec.submit(BatchRequest(list(PROMPTS[0]), DecodeConfig(max_new_tokens=3, sampling=SamplingConfig(0.0)),
                                    builder("dyspec")))
    long = dec.submit(BatchRequest(list(PROMPTS[3]), GREEDY, builder("chain")))
    other = dec.submit(BatchRequest(list(PROMPTS[1]), GREEDY, None))
    while not short.done:
        dec.step()
    assert short.result.stop_reason == "length" and len(short.result.output_ids) == 3
    assert len(dec.target) == 2 and short.key not in dec.target.rows
    assert dec.target.width == max(dec.target.rows.lens)  # the cache shrank to the longest row left
    dec.step()
    dec.cancel(long)
    assert long.result.stop_reason == "cancelled"
    assert long.result.output_ids == references[3][: len(long.result.output_ids)]
    assert len(dec.target) == 1 and dec.target.width == len(other.committed) - 1
    dec.run()
    assert other.result.output_ids == references[1]
    assert dec.target.rows.cache is None and dec.drafts.drafters == {}


class Broken:
    """Wraps a builder; raises from `build` on the request's `at`-th step."""

    def __init__(self, inner, at: int) -> None:
        self.inner, self.at, self.calls = inner, at, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def build(self, ctx, root):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("injected builder failure")
        return self.inner.build(ctx, root)


def test_a_failing_request_ends_alone_and_the_batch_goes_on(int8_pair, references):
    """A request whose builder, stopping check or callback raises ends with stop reason "error" and its rows
    released; every other request's output is the one it gets alone."""
    target, draft = int8_pair
    dec = BatchDecoder(ModelAdapter(target), ModelDrafter(draft))

    def stop_raises(ids):
        raise ValueError("injected stop-check failure")

    def callback_raises(tokens):
        raise KeyError("injected callback failure")

    good = [dec.submit(BatchRequest(list(PROMPTS[i]), GREEDY, builder("dyspec"), 2)) for i in (0, 3)]
    plain = dec.submit(BatchRequest(list(PROMPTS[1]), GREEDY, None))
    bad = [dec.submit(BatchRequest(list(PROMPTS[2]), GREEDY, Broken(builder("dyspec"), at=3))),
           dec.submit(BatchRequest(list(PROMPTS[2]), DecodeConfig(max_new_tokens=20, stopping=stop_raises))),
           dec.submit(BatchRequest(list(PROMPTS[0]), GREEDY, builder("chain"), on_tokens=callback_raises))]
    dec.run()
    assert [h.result.output_ids for h in good + [plain]] == [references[0], references[3], references[1]]
    assert [h.result.stop_reason for h in bad] == ["error"] * 3
    assert [type(h.error) for h in bad] == [RuntimeError, ValueError, KeyError]
    assert bad[0].result.output_ids == references[2][: len(bad[0].result.output_ids)]
    assert len(bad[0].result.output_ids) >= 2  # two steps committed before its builder raised
    assert dec.target.rows.cache is None and dec.drafts.drafters == {}


def test_generate_batch_of_one_is_generate(tiny_pair):
    target, draft = tiny_pair
    gen = SpeculativeGenerator.from_models(target, None, draft=draft, method="dyspec", budget=4)
    for kwargs in ({}, {"do_sample": True, "temperature": 0.9, "seed": 3}):
        alone = gen.generate(list(PROMPTS[0]), max_new_tokens=16, **kwargs)
        [batched] = gen.generate_batch([list(PROMPTS[0])], max_new_tokens=16, **kwargs)
        assert batched.output_ids == alone.output_ids
    [plain] = gen.generate_autoregressive_batch([list(PROMPTS[1])], max_new_tokens=16)
    assert plain.output_ids == gen.generate_autoregressive(list(PROMPTS[1]), max_new_tokens=16).output_ids


def test_bad_batch_requests_fail_in_one_line(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ArborError, match="needs a drafter"):
        BatchDecoder(ModelAdapter(target)).submit(BatchRequest([1, 2], GREEDY, builder("dyspec")))
    with pytest.raises(ArborError, match="max_rows"):
        BatchDecoder(ModelAdapter(target), ModelDrafter(draft), max_rows=3).submit(
            BatchRequest([1, 2], GREEDY, builder("dyspec", 8)))
    with pytest.raises(ArborError, match="max_new_tokens"):
        BatchDecoder(ModelAdapter(target)).submit(BatchRequest([1] * 500, DecodeConfig(max_new_tokens=100)))


def flat_cost(target: float, per_row: float, draft: float) -> BatchCost:
    widths = (1, 2, 4, 8, 16)
    return BatchCost((1, 2, 4, 8, 16), widths, tuple(tuple(target + per_row * b * w for w in widths)
                                                     for b in (1, 2, 4, 8, 16)), (draft,) * 5)


def test_shared_budget_follows_its_budget_and_the_cost(int8_pair, references):
    target, draft = int8_pair
    adapter = ModelAdapter(target)
    fixed = BatchDecoder(adapter, ModelDrafter(draft), shared=SharedBudget(max_nodes=6, budget=5))
    handles = [fixed.submit(BatchRequest(list(p), GREEDY, builder("dyspec", 6))) for p in PROMPTS]
    sizes = []
    while not fixed.idle:
        active = list(fixed.active)
        fixed.step()
        sizes.append(sum(h.steps[-1].tree_size for h in active))
    assert max(sizes) == 5 and all(h.result.output_ids == r for h, r in zip(handles, references))
    for cost, expect in ((flat_cost(1.0, 0.0, 0.0), "full"), (flat_cost(0.01, 1.0, 10.0), "none")):
        dec = BatchDecoder(adapter, ModelDrafter(draft), shared=SharedBudget(max_nodes=4))
        dec.batch_cost, dec.history = cost, DraftingHistory(cost)
        kinds = []  # whether each step drafted, as the history saw it
        timed = dec.history.timed
        dec.history.timed = lambda tokens, seconds, drafted, kinds=kinds, timed=timed: (
            kinds.append(drafted), timed(tokens, seconds, drafted))
        handles = [dec.submit(BatchRequest(list(p), GREEDY, builder("dyspec", 4))) for p in PROMPTS]
        dec.run()
        assert [h.result.output_ids for h in handles] == references
        sizes = [s.tree_size for h in handles for s in h.result.steps]
        if expect == "full":  # free rows and forwards: every tree grown is as large as allowed
            assert {size for size in sizes if size} == {4}
        else:  # rows and forwards dearer than any token: no tree, and drafting only when it looks again
            assert not any(sizes)  # (two steps after EXPLORE plain ones, two at the start)
            assert sum(kinds) <= 2 * (len(kinds) // (EXPLORE + 2) + 1) and not all(kinds), kinds


def test_drafting_history_does_not_time_the_heads_catch_up():
    history = DraftingHistory(flat_cost(1.0, 0.0, 0.0))
    assert history.worth()
    history.timed(1, 1.0, True)  # a first drafting step: not timed
    assert history.rate[True] is None and history.worth()
    history.timed(8, 1.0, True)
    assert history.rate[True] == 8 and not history.worth()  # plain steps not timed yet
    history.timed(5, 1.0, False)
    assert history.worth()  # drafting has been the faster: 8 > 5
    history.rate[True] = 4.0  # now it is not: plain steps until EXPLORE of them
    for _ in range(2, EXPLORE + 1):
        assert not history.worth()
        history.timed(5, 1.0, False)
    assert history.run == (False, EXPLORE) and history.worth()  # drafting timed again
    history.timed(1, 10.0, True)  # the catch-up after EXPLORE plain steps: slow, and not timed
    assert history.rate[True] == 4.0 and history.worth()  # a second drafting step, timed
    history.timed(9, 1.0, True)
    assert history.rate[True] == pytest.approx(0.8 * 4.0 + 0.2 * 9) and not history.worth()


def test_a_shared_budget_for_one_builder_leaves_other_requests_their_own_trees(int8_pair, references):
    target, draft = int8_pair
    default, own = builder("dyspec", 1), builder("dyspec", 2)
    free = flat_cost(1.0, 0.0, 0.0)  # rows and forwards free: the shared trees grow to max_nodes
    dec = BatchDecoder(ModelAdapter(target), ModelDrafter(draft), shared=SharedBudget(max_nodes=5, only=default))
    dec.batch_cost, dec.history = free, DraftingHistory(free)
    handles = [dec.submit(BatchRequest(list(p), GREEDY, default if i % 2 else own)) for i, p in enumerate(PROMPTS)]
    dec.run()
    assert [h.result.output_ids for h in handles] == references
    for i, h in enumerate(handles):
        sizes = {s.tree_size for s in h.result.steps if s.tree_size}
        assert sizes == ({5} if i % 2 else {2}), (i, sizes)
    with pytest.raises(ArborError, match="DySpec"):
        SharedBudget(only=builder("specinfer", 2))


@pytest.mark.slow
@pytest.mark.parametrize("name,shared,lookup", [("dyspec", None, 0), ("specinfer", None, 0), ("c2t", None, 0),
                                                ("dyspec", SharedBudget(max_nodes=5, budget=6), 0),
                                                ("dyspec", SharedBudget(max_nodes=5), 0),
                                                ("dyspec", None, 3), ("dyspec", SharedBudget(max_nodes=5), 3)])
def test_batched_sampling_follows_the_target_law(small_vocab_pair, name, shared, lookup):
    """800 seeds of one prompt (900 of one that repeats itself, with lookup: the rejection verifier judges the
    grafted chain as point masses), decoded 16 at a time among requests of other prompts: the first two tokens
    follow the target's exact laws."""
    target, draft = small_vocab_pair
    cfg = SamplingConfig(0.8, top_p=0.95)
    prompt, runs = ([13, 7, 12, 13, 7], 900) if lookup else ([3, 7, 1, 12], 800)
    dec = BatchDecoder(ModelAdapter(target), ModelDrafter(draft), max_requests=16, shared=shared)
    if shared is not None and shared.budget is None:
        cost = flat_cost(1.0, 0.02, 0.05)
        dec.batch_cost, dec.history = cost, DraftingHistory(cost)
    ours = []
    for seed in range(runs):
        ours.append(dec.submit(BatchRequest(prompt, DecodeConfig(max_new_tokens=2, sampling=cfg, seed=seed),
                                            builder(name, 5), lookup)))
        if seed % 3 == 0:  # company of another prompt, some decoded plainly
            dec.submit(BatchRequest([5, 9, 2, 14, 6], DecodeConfig(max_new_tokens=3, sampling=cfg, seed=seed),
                                    builder(name, 5) if seed % 2 else None))
        if seed % 8 == 7:
            dec.step()
    dec.run()
    vocab = target.config.vocab_size
    c1, c2 = torch.zeros(vocab), torch.zeros(vocab)
    for h in ours:
        c1[h.result.output_ids[0]] += 1
        c2[h.result.output_ids[1]] += 1
    assert (sum(s.lookup_nodes for h in ours for s in h.result.steps) > 0) == bool(lookup)
    p1, p2 = exact_first_two(target, prompt, cfg)
    assert_follows(c1, p1, FALSE_ALARM / 2, f"{name} first token", 0.1)
    assert_follows(c2, p2, FALSE_ALARM / 2, f"{name} second token", 0.1)


def layer_cache(tensors: list[torch.Tensor]) -> DynamicCache:
    """A one-layer cache holding `[1, 1, L, 1]` keys (values = -keys)."""
    cache = DynamicCache()
    keys = torch.tensor(tensors, dtype=torch.float32).view(1, 1, -1, 1)
    cache.update(keys, -keys, 0)
    return cache


def test_batch_rows_join_settle_and_leave_exactly():
    rows = BatchRows("cpu")
    rows.add("a", layer_cache([1, 2, 3]), 3)
    rows.add("b", layer_cache([7]), 1)
    assert rows.width == 3 and rows.lens == [3, 1]
    layer = rows.cache.layers[0]
    assert layer.keys[:, 0, :, 0].tolist() == [[1, 2, 3], [7, 0, 0]]
    # a step appends 4 columns to every row; a keeps its columns 3 and 5, b its 3, 4 and 6
    new = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]], dtype=torch.float32).view(2, 1, 4, 1)
    layer.update(new, -new)
    rows.settle({"a": [3, 5], "b": [3, 4, 6]})
    assert rows.lens == [5, 4] and rows.width == 5
    assert layer.keys[0, 0, :5, 0].tolist() == [1, 2, 3, 10, 12]
    assert layer.keys[1, 0, :4, 0].tolist() == [7, 20, 21, 23]
    assert torch.equal(layer.values, -layer.keys)
    rows.remove("a")
    assert rows.keys == ["b"] and rows.width == 4
    assert rows.cache.layers[0].keys[0, 0, :, 0].tolist() == [7, 20, 21, 23]
    rows.remove("b")
    assert rows.cache is None


def test_each_kind_of_step_sizes_its_trees_by_its_own_cost_curve(int8_pair, monkeypatch):
    """`budget=auto` in a batch: greedy steps read the greedy curve, sampled steps the sampled one, each
    measured once; a curve given to the decoder serves both."""
    import arborspec.engine.batch_decode as batch_decode
    from arborspec.engine.cost import CostCurve

    curves = {kind: CostCurve((1, 2, 4, 8), (1.0, 1.2, 1.4, 1.8), 0.01, 0.3) for kind in (True, False)}
    measured = []

    def measure(adapter, drafter, greedy=False):
        measured.append(greedy)
        return curves[greedy]

    monkeypatch.setattr(batch_decode, "cost_curve_for", measure)
    target, draft = int8_pair
    sampled = DecodeConfig(max_new_tokens=4, sampling=SamplingConfig(0.8), seed=1, eos_token_ids=(2,))
    greedy = DecodeConfig(max_new_tokens=4, sampling=SamplingConfig(0.0), eos_token_ids=(2,))
    dec = BatchDecoder(ModelAdapter(target), ModelDrafter(draft))
    for config in (greedy, sampled, greedy, sampled):
        handle = dec.submit(BatchRequest(list(PROMPTS[0]), config, make_builder("dyspec", budget="auto")))
        while not handle.done:
            dec.step()
        assert handle.result.stop_reason == "length"
    assert measured == [True, False]  # the sampled steps did not reuse the greedy curve, nor re-measured
    given = curves[True]
    dec = BatchDecoder(ModelAdapter(target), ModelDrafter(draft), cost=given)
    assert dec._cost([]) is given
    assert measured == [True, False]
