"""budget=auto (builders/auto_size.py), the cost curve (engine/cost.py) and the draft-side temperature at T = 0.

Exact values on small cases, the prefix property the verifiers rely on, and losslessness: the target's
distribution when sampling (greedy identity of every budget=auto builder is tests/test_greedy_identity.py's).
"""


import pytest
import torch
from arborspec.builders.auto_size import auto_subtree, best_size, ranking
from arborspec.builders.registry import make_builder, parse_budget
from arborspec.drafters import ModelDrafter, NgramDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.cost import CostCurve, measure_cost_curve
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.sampling import (
    GREEDY_DRAFT_TEMPERATURE,
    ORDERED_VALUE_TEMPERATURE,
    SamplingConfig,
    sampling_config,
)
from arborspec.errors import ArborError

from conftest import GREEDY_PROMPTS as PROMPTS
from conftest import (
    TableDrafter,
    assert_departs,
    assert_first_two_follow,
    assert_follows,
    on_device,
    random_table,
    table_ctx,
)

# a CPU-like curve (the first extra row is the expensive one) and a steep one (big trees never pay)
FLAT = CostCurve((1, 2, 4, 8, 16, 32, 64), (1.0, 1.6, 1.7, 1.8, 1.9, 2.5, 3.5), 0.05, 0.05)
STEEP = CostCurve((1, 2, 4, 8), (1.0, 1.5, 2.5, 4.5), 0.05, 0.0)


def test_cost_curve_interpolates_and_extrapolates():
    c = CostCurve((1, 2, 4), (1.0, 1.5, 2.5), 0.01, 0.1)
    assert c.t(1) == 1.0 and c.t(2) == 1.5 and c.t(3) == 2.0 and c.t(4) == 2.5
    assert c.t(6) == pytest.approx(3.5)  # slope 0.5 per row beyond the last point
    assert c.step_cost(2, 3) == pytest.approx(2.0 + 0.3)  # 2 nodes + root = 3 rows, 3 draft forwards
    assert CostCurve.from_dict(c.as_dict()) == c
    table = c.step_costs(3, 6)
    assert table[:7] == tuple(c.step_cost(n, 3) for n in range(7)) and c.step_costs(3, 6) is table  # tabulated once
    assert len(c.step_costs(0, 400)) == 401 and c.step_costs(0, 400)[400] == pytest.approx(c.step_cost(400, 0))


def test_best_size_exact():
    # rates: n=0: 1/1; n=1: 1.9/1.5; n=2: 2.5/2.0; n=3: 2.6/2.5
    assert best_size([0.9, 0.6, 0.1], STEEP, 0) == 1
    assert best_size([0.2], STEEP, 0) == 0  # 1.2 / 1.5 < 1: the root alone (plain decoding) is best
    # flat curve: 1 node: 1.9/1.6 = 1.1875; 3 nodes: 2.5/1.7 = 1.47; 7 nodes: 1 + 0.9 + 0.6 + 5 * 0.2 = 3.5 / 1.8
    assert best_size([0.9, 0.6, 0.2, 0.2, 0.2, 0.2, 0.2], FLAT.__class__(FLAT.tokens, FLAT.relative, 0.05, 0.0), 0) == 7


def _dyspec_tree(seed, budget, name="dyspec"):
    drafter = TableDrafter(random_table(12, seed, power=2.0), 12)
    return make_builder(name, budget=budget).build(table_ctx(drafter, seed), 0)


def assert_keeps_prefixes_of_draws(auto, ctx, limit=32):
    """Every node of `auto` keeps the first k of its keyed draws without replacement, in order (`ctx`: a fresh
    context with the step's seed): a tree the rejection verifier accepts with the distributions they came from."""
    from arborspec.builders.base import DrawSequence

    for node, kids in enumerate(auto.children):
        if kids:
            draws = DrawSequence.of(ctx, auto, node, limit)
            assert [auto.tokens[k] for k in kids] == draws.tokens[: len(kids)]


@pytest.mark.parametrize("name", ["dyspec", "dyspec-threshold"])
@pytest.mark.parametrize("seed", range(6))
def test_sampled_auto_trees_keep_prefixes_of_their_draws(seed, name):
    ctx = table_ctx(TableDrafter(random_table(12, seed, power=2.0), 12), seed)
    ctx.cost = FLAT
    auto = make_builder(name, budget=24, auto=True).build(ctx, 0)
    assert 1 <= auto.num_nodes <= 25
    assert_keeps_prefixes_of_draws(auto, table_ctx(TableDrafter(random_table(12, seed, power=2.0), 12), seed))


def _pessimist(rate: float):
    """An acceptance model that has seen every bucket's draws accepted at `rate` x their draft probability."""
    from arborspec.engine.acceptance import EDGES, AcceptanceModel

    model = AcceptanceModel(prior=4.0)
    for lo, hi in zip((0.0,) + EDGES, EDGES + (1.0,)):
        q = (lo + hi) / 2
        hits = round(400 * rate * q)
        model.update([q] * 400, [True] * hits + [False] * (400 - hits))
    return model


@pytest.mark.parametrize("seed", range(4))
def test_dyspec_auto_growth_stops_on_calibrated_values(seed):
    """Growth is judged with calibrated values: a draft the verifier accepts less than it claims grows a
    smaller tree (fewer draft forwards and rows), still keeping a prefix of every node's draws."""
    curve = FLAT.__class__(FLAT.tokens, FLAT.relative, 0.05, 0.15)
    sizes = {}
    for label, acceptance in (("face", None), ("pessimist", _pessimist(0.3))):
        drafter = TableDrafter(random_table(12, seed, power=4.0), 12)
        ctx = table_ctx(drafter, seed)
        ctx.cost, ctx.acceptance = curve, acceptance
        auto = make_builder("dyspec", budget=32, auto=True).build(ctx, 0)
        sizes[label] = (auto.size, drafter.forwards, drafter.rows)
        assert_keeps_prefixes_of_draws(auto, table_ctx(TableDrafter(random_table(12, seed, power=4.0), 12), seed))
    assert all(p <= f for p, f in zip(sizes["pessimist"], sizes["face"])), sizes  # size, forwards, draft rows


def test_growth_rule_values_nodes_like_the_acceptance_model():
    from arborspec.builders.auto_size import GrowthRule

    tree = _dyspec_tree(5, 12)
    model = _pessimist(0.5)
    stop = GrowthRule(FLAT, model, 16)
    for node in range(1, tree.num_nodes):
        stop.add(tree.subtree(list(range(1, node + 1))), node)  # as grown: `node` is the newest
    assert stop.values == pytest.approx(model.node_values(tree))
    assert stop.expected == pytest.approx(model.expected_length(tree))


@pytest.mark.parametrize("seed", range(4))
def test_opt_tree_auto_drafts_a_layer_only_if_it_can_pay(seed):
    """On a free curve auto grows exactly the fixed tree; where draft forwards are dear it drafts fewer layers,
    and never more."""
    free = CostCurve((1, 64), (1.0, 1.0), 0.01, 0.0)
    dear = CostCurve(FLAT.tokens, FLAT.relative, 0.05, 0.6)
    grown = {}
    for label, curve, auto in (("fixed", None, False), ("free", free, True), ("dear", dear, True)):
        drafter = TableDrafter(random_table(12, seed, power=1.0, bump=3.0), 12)
        ctx = table_ctx(drafter, seed)
        ctx.cost = curve
        tree = make_builder("opt-tree", budget=12, delta=0.0, auto=auto).build(ctx, 0)
        grown[label] = (tree, drafter.forwards)
    assert grown["free"][0].tokens == grown["fixed"][0].tokens and grown["free"][1] == grown["fixed"][1]
    assert grown["dear"][1] < grown["fixed"][1], grown


def test_auto_needs_a_cost_curve_and_a_builder_that_offers_it():
    drafter = TableDrafter(random_table(12, 0), 12)
    with pytest.raises(ArborError, match="cost curve"):
        make_builder("dyspec", budget="auto").build(table_ctx(drafter), 0)
    with pytest.raises(ArborError, match="budget=auto"):
        make_builder("sequoia", budget="auto")
    with pytest.raises(ArborError, match="integer >= 1 or auto"):
        parse_budget("big")
    assert parse_budget("auto") == "auto" and parse_budget("12") == 12


def _opt_tree(seed, budget):
    drafter = TableDrafter(random_table(12, seed, power=2.0), 12)
    return make_builder("opt-tree", budget=budget, delta=0.0).build(table_ctx(drafter, seed), 0)


def test_auto_subtree_keeps_everything_on_a_free_curve_and_refuses_sampled_trees():
    tree = _opt_tree(1, 10)
    free = CostCurve((1, 64), (1.0, 1.0), 0.01, 0.0)
    assert auto_subtree(tree, free, 3) is tree
    assert auto_subtree(tree, STEEP, 0).size < tree.size
    with pytest.raises(ArborError, match="selected trees only"):
        auto_subtree(_dyspec_tree(1, 10), free, 3)


def test_auto_measures_the_cost_curve_once_and_relearns_the_overhead(tiny_pair, device):
    """The curve is timed on the device the target runs on (on a GPU, synchronised)."""
    target, draft = (on_device(model, device) for model in tiny_pair)
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder("dyspec", budget="auto"))
    cfg = DecodeConfig(max_new_tokens=8)
    first = dec.generate(PROMPTS[0], cfg)
    assert first.output_ids == autoregressive_generate(ModelAdapter(target), PROMPTS[0], cfg).output_ids
    assert first.config["step_overhead"] == 0.0  # sized before anything was learnt
    curve = dec.cost
    assert curve is not None and curve.relative[0] == 1.0 and curve.one_token_s > 0 and curve.draft_cost > 0
    assert curve.step_overhead == pytest.approx(curve.with_overhead_of(first.steps).step_overhead)
    second = dec.generate(PROMPTS[1], cfg)
    assert second.config["step_overhead"] == round(curve.step_overhead, 4)  # sized with what the first taught
    # the measured curve itself is kept; only the overhead is learnt again, from the latest generation
    assert ((dec.cost.tokens, dec.cost.relative, dec.cost.one_token_s)
            == (curve.tokens, curve.relative, curve.one_token_s))
    assert dec.cost.step_overhead == pytest.approx(curve.with_overhead_of(second.steps).step_overhead)


def test_step_overhead_is_the_median_gap_between_steps_and_the_curve():
    from arborspec.engine.stats import StepStats

    curve = CostCurve((1, 2, 4), (1.0, 1.5, 2.5), 0.1, 0.1)

    def step(size, forwards, seconds):
        return StepStats(accepted_length=1, tree_size=size, tree_depth=1, estimated_length=1.0, draft_time=0.0,
                         build_time=0.0, verify_time=seconds, other_time=0.0, draft_forwards=forwards)

    # predicted: t(2) + 1 x 0.1 = 1.6 and t(4) + 2 x 0.1 = 2.7 t(1); measured 0.19 s and 0.30 s, 0.16 s
    steps = [step(1, 1, 0.19), step(3, 2, 0.30), step(1, 1, 0.16), step(0, 0, 5.0)]
    learnt = curve.with_overhead_of(steps)
    assert learnt.step_overhead == pytest.approx(0.3)  # gaps 0.3, 0.3, 0.0: median 0.3; the plain step ignored
    assert learnt.step_cost(1, 1) == pytest.approx(1.9) and learnt.relative == curve.relative
    assert curve.with_overhead_of([step(1, 1, 0.1)]).step_overhead == 0.0  # never below 0
    assert CostCurve.from_dict(learnt.as_dict()) == learnt


def test_overheads_per_forward_and_per_token_are_fitted_jointly():
    """Step time / t(1) - t(n + 1) - f x timed draft cost = o + d f + a (A - READ_ROWS): recovered exactly from
    noise-free steps where deeper trees (more forwards) also commit more tokens, which a fit on forwards alone
    would charge to the forwards; a slope that comes out negative is dropped."""
    from arborspec.engine.cost import READ_ROWS
    from arborspec.engine.stats import StepStats

    curve = CostCurve((1, 2, 4, 8), (1.0, 1.5, 1.6, 1.8), 0.04, 0.1)
    o, d, a = 0.12, 0.05, 0.2

    def step(size, forwards, accepted, extra=0.0):
        seconds = 0.04 * (curve.t(size + 1) + forwards * 0.1 + o + d * forwards + a * (accepted - READ_ROWS) + extra)
        return StepStats(accepted_length=accepted, tree_size=size, tree_depth=forwards, estimated_length=1.0,
                         draft_time=0.0, build_time=0.0, verify_time=seconds, other_time=0.0, draft_forwards=forwards)

    shapes = [(3, 1, 1), (3, 1, 2), (5, 2, 2), (5, 2, 3), (7, 3, 3), (7, 3, 4), (7, 1, 1), (4, 2, 1), (6, 3, 2)]
    learnt = curve.with_overhead_of([step(*x) for x in shapes])
    assert (learnt.step_overhead, learnt.draft_overhead, learnt.token_cost) == pytest.approx((o, d, a))
    assert learnt.step_cost(3, 2) == pytest.approx(curve.t(4) + 2 * (0.1 + d) + o)
    # tokens that cost nothing while forwards do: the token slope comes out negative, is dropped, d refitted
    cheap = [step(n, f, k, extra=-a * (k - READ_ROWS) - 0.03 * (k - READ_ROWS)) for n, f, k in shapes]
    refit = curve.with_overhead_of(cheap)
    assert refit.token_cost == 0.0 and refit.draft_overhead >= 0.0
    assert CostCurve.from_dict(learnt.as_dict()) == learnt


def test_auto_sizes_grow_with_the_step_overhead():
    """A fixed cost per step makes every node cheaper relative to the step: the best size never shrinks."""
    gains = [0.6, 0.3, 0.04, 0.02, 0.015, 0.01, 0.01, 0.005]
    sizes = [best_size(gains, CostCurve(FLAT.tokens, FLAT.relative, 0.05, 0.05, 0, o), 2) for o in (0.0, 1.0, 3.0)]
    # step cost t(n + 1) + 2 x 0.05 + o. o = 1: 4 nodes (1.96 / 2.825) beat 2 (1.9 / 2.75) and 5 (1.975 / 2.85);
    # o = 3: 5 nodes (1.975 / 4.85) beat 4 (1.96 / 4.825) and 6 (1.985 / 4.875)
    assert sizes == [2, 4, 5]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dyspec", "dyspec-threshold"])
def test_auto_sampling_follows_target_distribution(small_vocab_pair, name):
    """The first two sampled tokens over 800 seeds follow the target's laws (chi-square, conftest; laws 0.1
    away in total variation are rejected)."""
    target, draft = small_vocab_pair
    cfg = SamplingConfig(0.8, top_p=0.95)
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, budget="auto"), cost=FLAT)
    assert_first_two_follow(dec, target, [3, 7, 1, 12], cfg, 800, name, detects=0.1)


def test_measure_cost_curve_on_a_tiny_model(tiny_pair):
    target, draft = tiny_pair
    curve = measure_cost_curve(ModelAdapter(target), ModelDrafter(draft), context_len=16, sizes=(1, 4, 8), repeats=2)
    assert curve.tokens == (1, 4, 8) and curve.relative[0] == 1.0
    assert all(r > 0 for r in curve.relative) and curve.draft_cost > 0 and curve.context == 16


def test_cost_curve_keeps_each_sizes_fastest_round(tiny_pair, monkeypatch):
    """One interrupted t(1) (a garbage collection, another process) must not shrink every ratio: each size keeps
    its fastest timed round (round 0 warms up and is not kept)."""
    import arborspec.engine.cost as cost

    base, calls = [1.0, 1.3, 1.6], []

    def fake_seconds(fn, reps, warmup=0):
        fn()
        i, round_ = len(calls) % 3, len(calls) // 3
        calls.append(i)
        return base[i] * (3.0 if (round_, i) == (1, 0) else 1.0) * (50.0 if round_ == 0 else 1.0)

    monkeypatch.setattr(cost, "median_seconds", fake_seconds)
    target, _ = tiny_pair
    sizes, relative, one = cost.measure_target_times(ModelAdapter(target), list(range(5, 21)), sizes=(1, 4, 8),
                                                     repeats=2)
    assert sizes == [1, 4, 8] and len(calls) == 9
    assert relative == pytest.approx([1.0, 1.3, 1.6]) and one == pytest.approx(1.0)


# --------------------------------------------------------------------------- draft temperature at T = 0
def test_draft_temperature_is_the_draft_side_at_greedy_only():
    greedy_draft = SamplingConfig(0.0, draft_temperature=GREEDY_DRAFT_TEMPERATURE)
    assert SamplingConfig(0.0).draft_side() == greedy_draft.draft_side()
    assert SamplingConfig(0.0, draft_temperature=0.4).draft_side().temperature == 0.4
    assert SamplingConfig(0.7, draft_temperature=0.4).draft_side() == SamplingConfig(0.7, draft_temperature=0.4)
    assert sampling_config(False, 1.0, draft_temperature=0.3).draft_side().temperature == 0.3
    with pytest.raises(ArborError, match="draft temperature must be >= 0"):
        SamplingConfig(0.0, draft_temperature=-0.5)
    ordered = SamplingConfig(0.0, draft_temperature=0.0).draft_side()
    assert ordered.ordered_draws and ordered.temperature == ORDERED_VALUE_TEMPERATURE == 0.8  # top tokens in order
    assert not SamplingConfig(0.7, draft_temperature=0.0).draft_side().ordered_draws
    with pytest.raises(TypeError):  # only the draft side of a greedy target draws in order
        SamplingConfig(0.7, ordered_draws=True)


@pytest.mark.parametrize("name", ["dyspec", "dyspec-threshold", "sequoia", "chain"])
def test_ordered_draws_take_the_most_likely_tokens_and_stay_greedy_identical(tiny_pair, name):
    """Draft temperature 0: every node's children are its most likely draft tokens, in order of probability."""
    from arborspec.engine.contracts import DraftContext

    target, draft = tiny_pair
    builder = make_builder(name, budget=8)
    base = autoregressive_generate(ModelAdapter(target), PROMPTS[0], DecodeConfig(max_new_tokens=20)).output_ids
    cfg = DecodeConfig(max_new_tokens=20, sampling=SamplingConfig(0.0, draft_temperature=0.0))
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), builder)
    assert dec.generate(PROMPTS[0], cfg).output_ids == base
    drafter = ModelDrafter(draft)
    ctx = DraftContext(drafter, cfg.sampling.draft_side(), torch.Generator().manual_seed(0), drafter.begin(PROMPTS[0]))
    tree = builder.build(ctx, PROMPTS[0][-1])
    for node, kids in enumerate(tree.children):
        if kids:
            probs = ctx.probs(tree, [node])[0]
            top = torch.topk(probs, len(kids)).indices.tolist()
            assert [tree.tokens[k] for k in kids] == top, (name, node)


def test_ordered_draws_are_valued_at_temperature_0_8(tiny_pair):
    """At T = 0 the builders value ordered draws with the draft distribution at temperature 0.8: DySpec's node values
    are the products of softmax(logits / 0.8) along each path, exactly (at temperature 1 they would differ)."""
    from arborspec.engine.contracts import DraftContext

    _, draft = tiny_pair
    drafter = ModelDrafter(draft)
    cfg = SamplingConfig(0.0).draft_side()
    root_logits = drafter.begin(PROMPTS[0])
    ctx = DraftContext(drafter, cfg, torch.Generator().manual_seed(0), root_logits)
    tree = make_builder("dyspec", budget=8).build(ctx, PROMPTS[0][-1])
    sharp = torch.softmax(root_logits.double() / 0.8, -1)
    assert torch.allclose(ctx.probs(tree, [0])[0].double(), sharp, atol=1e-6)
    assert not torch.allclose(sharp, torch.softmax(root_logits.double(), -1), atol=1e-3)
    for node in range(1, tree.num_nodes):
        path = [0] + tree.path_to(node)  # root ... node
        value = 1.0
        for parent, child in zip(path, path[1:]):
            value *= float(ctx.probs(tree, [parent])[0, tree.tokens[child]])
        assert tree.values[node] == pytest.approx(value, rel=1e-4), node


@pytest.mark.parametrize("name", ["dyspec", "sequoia", "specinfer"])
def test_draft_temperature_keeps_greedy_identity_and_changes_the_tree(tiny_pair, name):
    target, draft = tiny_pair
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, budget=8))
    base = autoregressive_generate(ModelAdapter(target), PROMPTS[0], DecodeConfig(max_new_tokens=20)).output_ids
    depths = {}
    for temp in (0.2, 1.0, 3.0):
        cfg = DecodeConfig(max_new_tokens=20, sampling=SamplingConfig(0.0, draft_temperature=temp))
        res = dec.generate(PROMPTS[0], cfg)
        assert res.output_ids == base, (name, temp)
        depths[temp] = [s.estimated_length for s in res.steps]
    assert depths[0.2] != depths[3.0]  # the draft side really changed


def test_auto_subtree_never_grows_estimated_length_per_cost_below_the_fixed_tree():
    tree = _opt_tree(3, 30)
    auto = auto_subtree(tree, FLAT, 2)
    rate = lambda t: t.estimated_accept_length() / FLAT.step_cost(t.size, 2)  # noqa: E731
    assert rate(auto) >= rate(tree) - 1e-12
    assert torch.isfinite(torch.tensor(rate(auto)))


# --------------------------------------------------------------------------- the online acceptance model
def test_acceptance_model_starts_at_face_value_and_learns_exact_rates():
    from arborspec.engine.acceptance import AcceptanceModel

    model = AcceptanceModel(prior=4.0, rank_prior=8.0)
    assert model.rate(0.3) == pytest.approx(0.3) and model.rate(0.3, 2) == pytest.approx(0.3)
    model.update([0.3] * 6 + [0.95] * 2, [True, False, False, False, False, False, True, True],
                 [0, 0, 1, 1, 2, 3, 0, 0])
    pooled = (1 + 4 * 0.3) / (6 + 4)  # bucket (0.2, 0.35] over all ranks: 0.22
    assert model.rate(0.3, 0) == pytest.approx((1 + 8 * pooled) / (2 + 8))  # 1st children: 1 of 2 accepted
    assert model.rate(0.3, 1) == pytest.approx((0 + 8 * pooled) / (2 + 8))  # 2nd: 0 of 2
    assert model.rate(0.3, 5) == model.rate(0.3, 2) == pytest.approx(8 * pooled / 10)  # 3rd and later: ranks 2, 3
    assert model.rate(0.25, 0) == pytest.approx((1 + 8 * (1 + 4 * 0.25) / 10) / 10)  # same bucket, own prior
    assert model.rate(0.95) == pytest.approx((2 + 8 * (2 + 4 * 0.95) / 6) / 10)
    assert model.rate(0.05, 1) == pytest.approx(0.05)  # a bucket never seen: face value
    tree = _dyspec_tree(2, 6)
    values = model.node_values(tree)
    for i in range(1, tree.num_nodes):
        rank = tree.children[tree.parents[i]].index(i)
        assert values[i] == pytest.approx(values[tree.parents[i]] * model.rate(tree.draft_probs[i], rank))
    assert model.expected_length(tree) == pytest.approx(sum(values))


def test_the_decoder_learns_acceptance_and_records_the_calibrated_estimate(tiny_pair):
    target, _ = tiny_pair
    # the n-gram drafter is far too sure of itself: the calibrated estimate must end closer to the truth
    dec = SpeculativeDecoder(ModelAdapter(target), NgramDrafter(target.config.vocab_size),
                             make_builder("dyspec", budget="auto"), cost=FLAT)
    res = dec.generate(PROMPTS[1], DecodeConfig(max_new_tokens=60))
    late = res.steps[len(res.steps) // 2:]
    actual = sum(s.accepted_length for s in late) / len(late)
    raw = sum(s.estimated_length for s in late) / len(late)
    calibrated = sum(s.calibrated_length for s in late) / len(late)
    assert abs(calibrated - actual) < abs(raw - actual), (raw, calibrated, actual)
    assert sum(dec.acceptance.examined) == sum(len(s.examined_accepted) for s in res.steps)
    assert sum(map(sum, dec.acceptance.examined_by_rank)) == sum(dec.acceptance.examined)
    assert sum(row[1] + row[2] for row in dec.acceptance.examined_by_rank) > 0  # later siblings were seen


def test_growth_rule_prices_the_best_prefix_with_the_forwards_paid_now():
    """Sunk draft forwards lower every size's rate alike: the best prefix so far is re-priced with them, so a
    forward paid after a good prefix does not make growth look hopeless against that prefix's old rate."""
    from arborspec.builders.auto_size import GrowthRule

    tree = _dyspec_tree(5, 12)
    stop = GrowthRule(FLAT, None, 16)
    for node in range(1, 5):
        stop.add(tree.subtree(list(range(1, node + 1))), node)
    for forwards in (0, 1, 3):
        best = max(e / FLAT.step_cost(k, forwards) for k, e in enumerate(stop.prefix))
        assert stop.best(forwards) == pytest.approx(best)
    assert stop.best(3) < stop.best(0)


def test_carried_acceptance_model_keeps_its_rates_on_fewer_observations():
    from arborspec.engine.acceptance import AcceptanceModel

    model = AcceptanceModel(prior=0.0, rank_prior=0.0)
    model.update([0.3] * 300 + [0.8] * 100, [True] * 90 + [False] * 210 + [True] * 75 + [False] * 25,
                 [0, 1] * 150 + [0] * 100)
    small = model.carried(40)
    assert sum(small.examined) == pytest.approx(40) and sum(model.examined) == 400
    for q, rank in ((0.3, 0), (0.3, 1), (0.8, 0)):
        assert small.rate(q, rank) == pytest.approx(model.rate(q, rank))
    assert model.carried(1000).examined == model.examined  # fewer than the cap: kept whole


def test_decoder_carries_what_it_learnt_to_its_next_generation(tiny_pair):
    target, _ = tiny_pair
    cfg = DecodeConfig(max_new_tokens=40)
    ngram = NgramDrafter(target.config.vocab_size)

    def first_tree(result):  # the first step that verified draft nodes
        return next(s for s in result.steps if s.tree_size > 0)

    dec = SpeculativeDecoder(ModelAdapter(target), ngram, make_builder("dyspec", budget=8))
    first = dec.generate(PROMPTS[1], cfg)
    ended = dec.acceptance
    second = dec.generate(PROMPTS[1], cfg)
    assert second.output_ids == first.output_ids  # greedy: the same tokens whatever the trees
    assert sum(dec.acceptance.examined) == pytest.approx(
        min(sum(ended.examined), 128.0) + sum(len(s.examined_accepted) for s in second.steps))
    # the first generation starts at face value; the second from what the first one learnt
    assert first_tree(first).calibrated_length == pytest.approx(first_tree(first).estimated_length)
    assert first_tree(second).calibrated_length != pytest.approx(first_tree(second).estimated_length)
    fresh = SpeculativeDecoder(ModelAdapter(target), ngram, make_builder("dyspec", budget=8), carry=False)
    fresh.generate(PROMPTS[1], cfg)
    again = fresh.generate(PROMPTS[1], cfg)
    assert first_tree(again).calibrated_length == pytest.approx(first_tree(again).estimated_length)
    assert sum(fresh.acceptance.examined) == sum(len(s.examined_accepted) for s in again.steps)
    # another temperature starts afresh too
    hot = dec.generate(PROMPTS[1], DecodeConfig(max_new_tokens=40, sampling=SamplingConfig(temperature=0.6), seed=1))
    assert first_tree(hot).calibrated_length == pytest.approx(first_tree(hot).estimated_length)


@pytest.mark.parametrize("seed", range(4))
def test_selected_trees_rank_by_calibrated_values_in_parent_closed_prefixes(seed):
    from arborspec.engine.acceptance import AcceptanceModel

    drafter = TableDrafter(random_table(8, seed, power=2.0), 8)
    tree = make_builder("opt-tree", budget=12).build(table_ctx(drafter, seed), 0)
    model = AcceptanceModel()
    model.update([0.05, 0.3, 0.6, 0.9] * 10, [True, False, True, False] * 10, [0, 1, 0, 2] * 10)
    values = model.node_values(tree)
    order = ranking(tree, values)
    assert [values[i] for i in order] == sorted(values[1:], reverse=True)
    for n in range(len(order) + 1):
        kept = set(order[:n]) | {0}
        assert all(tree.parents[i] in kept for i in order[:n])


def _fixed(*xs):
    x = torch.tensor(xs, dtype=torch.float32)
    return lambda path: x / x.sum()


SIZE_RULE_DRAFT, SIZE_RULE_TARGET = _fixed(0.7, 0.2, 0.05, 0.05), _fixed(0.45, 0.45, 0.05, 0.05)
SIZE_RULE_RUNS = 6000


def _first_tokens_under_rejection(build, runs=SIZE_RULE_RUNS):
    """Counts of the first token committed by one rejection-verified step over `runs` seeds, the tree grown by
    `build(ctx)` from SIZE_RULE_DRAFT and verified against SIZE_RULE_TARGET."""
    from arborspec.engine.verifiers import VERIFIERS

    counts, gen = torch.zeros(4), torch.Generator().manual_seed(0)
    for seed in range(runs):
        tree = build(table_ctx(TableDrafter(SIZE_RULE_DRAFT, 4), seed))
        logits = torch.stack([SIZE_RULE_TARGET(tuple(tree.path_tokens(n))).log() for n in range(tree.num_nodes)])
        res = VERIFIERS["rejection"](tree, logits, SamplingConfig(1.0), gen)
        counts[tree.tokens[res.accepted[0]] if res.accepted else res.bonus] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dyspec", "dyspec-threshold"])
@pytest.mark.parametrize("costs", [(1.0, 1.5, 1.6, 1.7), (1.0, 1.05, 1.1, 1.2)])
@pytest.mark.parametrize("budget", [1, 3])
def test_auto_sampled_trees_are_lossless_where_the_size_rule_bites(name, costs, budget):
    """A rejection-verified tree stays lossless only if whether a draw is kept is settled before the draw is seen:
    a cut that kept a node because its own draft probability made the tree pay would keep the likely draws more
    often than the draft draws them (draft 0.7 / 0.2, target 0.45 / 0.45: a draw kept only when it is the first
    token makes the output that token about 61 % of the time, the negative control below). Steep and flat curves,
    one step, 6000 seeds: the first token follows the target (chi-square, conftest; laws 0.035 away in total
    variation are rejected)."""
    curve = CostCurve((1, 2, 3, 4), costs, 0.05, 0.0)
    builder = make_builder(name, budget=budget, auto=True)

    def build(ctx):
        ctx.cost = curve
        return builder.build(ctx, 0)

    assert_follows(_first_tokens_under_rejection(build), SIZE_RULE_TARGET(()), what=name, detects=0.035)


@pytest.mark.slow
def test_a_cut_by_the_kept_draws_own_values_fails_the_size_rule_check():
    """Negative control for the test above: one drawn child kept only when it is the likeliest draft token (a cut
    judged by the draw's own value) biases the output towards that token, and the same check rejects it."""
    builder = make_builder("dyspec", budget=1)

    def build(ctx):
        tree = builder.build(ctx, 0)
        return tree if tree.tokens[1] == 0 else tree.subtree([])

    assert_departs(_first_tokens_under_rejection(build), SIZE_RULE_TARGET(()), what="the cut by the draw's value")


def test_draw_moments_give_the_exact_expected_rate_of_the_next_draw():
    """E[rate(D(y), rank)] over y drawn from D without the tokens already drawn, against the sum over the vocabulary,
    with and without an acceptance model (without one, rate(q) = q: sum of D^2 over the rest / its mass)."""
    from arborspec.builders.auto_size import DrawMoments, GrowthRule

    dist = torch.tensor([0.4, 0.25, 0.15, 0.08, 0.06, 0.03, 0.02, 0.01, 0.0])
    moments = DrawMoments(dist)
    for model in (None, _pessimist(0.4)):
        rule = GrowthRule(FLAT, model, 16)
        for drawn in ([], [1], [1, 0], [1, 0, 4]):
            rest = [y for y in range(len(dist)) if y not in drawn]
            mass = sum(float(dist[y]) for y in rest)
            brute = sum(float(dist[y]) / mass * rule.rate(float(dist[y]), len(drawn)) for y in rest if dist[y] > 0)
            got = moments.expected_rate(rule.rate, [float(dist[y]) for y in drawn], len(drawn))
            assert got == pytest.approx(brute, rel=1e-6), (model, drawn)
    assert moments.expected_rate(lambda q, r: q, [0.4], 1) == pytest.approx(
        sum(float(q) ** 2 for q in dist[1:]) / 0.6)


def test_ordered_draws_are_valued_exactly_random_draws_by_their_expectation():
    """At temperature 0 the k-th draw is the k-th most likely token, known before it is made: its value is the
    parent's times rate(its own q, k). A random draw is valued by the expectation over what it may be, which for
    the second draw of this distribution is far below the second token's own value (what kept T = 0 trees small)."""
    from arborspec.builders.auto_size import DrawMoments, GrowthRule

    dist = torch.tensor([0.4, 0.25, 0.15, 0.08, 0.06, 0.03, 0.02, 0.01, 0.0])
    probs = [0.4, 0.25, 0.15, 0.08]  # the ordered draws
    moments = DrawMoments(dist)
    for model in (None, _pessimist(0.4)):
        ordered, random = GrowthRule(FLAT, model, 16, ordered=True), GrowthRule(FLAT, model, 16)
        ordered.values = random.values = [1.0, 0.5]  # node 1 is worth 0.5
        assert ordered.moments(dist) is None  # ordered draws need no moments
        for k in range(len(probs)):
            assert ordered.draw_value(1, None, probs, k) == pytest.approx(0.5 * ordered.rate(probs[k], k))
            assert random.draw_value(1, moments, probs, k) == pytest.approx(random.expected_draw(1, moments, probs[:k]))
    ordered, random = GrowthRule(FLAT, None, 16, ordered=True), GrowthRule(FLAT, None, 16)  # face value: rate(q) = q
    ordered.values = random.values = [1.0, 0.5]
    assert ordered.draw_value(1, None, probs, 1) == pytest.approx(0.125)
    assert random.draw_value(1, random.moments(dist), probs, 1) == pytest.approx(
        0.5 * sum(float(q) ** 2 for q in dist[1:]) / 0.6)  # 0.5 x 0.1595 / 0.6 = 0.0665


@pytest.mark.parametrize("seed", range(3))
def test_dyspec_auto_judges_ordered_draws_by_their_own_value_and_random_ones_by_expectation(monkeypatch, seed):
    """Every draw DySpec auto considers is judged by `GrowthRule.draw_value`: at temperature 0 (ordered draws) with
    the value the kept node then has; above 0 with an expectation that differs from what the draw turns out to be."""
    from arborspec.builders.auto_size import GrowthRule
    from arborspec.engine.contracts import DraftContext
    from arborspec.engine.sampling import SamplingConfig

    seen = {}
    judge = GrowthRule.draw_value

    def spy(self, parent, moments, probs, k):
        seen[(parent, k)] = (judge(self, parent, moments, probs, k), self.ordered)
        return seen[(parent, k)][0]

    monkeypatch.setattr(GrowthRule, "draw_value", spy)
    results = {}
    for label, cfg in (("ordered", SamplingConfig(0.0).draft_side()), ("random", SamplingConfig(1.0))):
        drafter = TableDrafter(random_table(12, seed, power=2.0), 12)
        ctx = DraftContext(drafter, cfg, torch.Generator().manual_seed(seed), drafter.begin([0]))
        ctx.cost = FLAT
        seen.clear()
        tree = make_builder("dyspec", budget=16, auto=True).build(ctx, 0)
        assert tree.size >= 1
        judged = [seen[(p, tree.children[p].index(n))] for n, p in enumerate(tree.parents) if n > 0]
        assert all(ordered == (label == "ordered") for _, ordered in judged)
        results[label] = [(v, tree.values[n]) for (v, _), n in zip(judged, range(1, tree.num_nodes))]
    assert all(v == pytest.approx(own) for v, own in results["ordered"])
    assert any(v != pytest.approx(own) for v, own in results["random"])


def test_growth_rule_prices_a_node_at_the_cheapest_average_cost_of_growing():
    """price(n) = exchange x min over m > n of (cost(m) - cost(n)) / (m - n); keep() compares an expected value with
    it; a forward is worth paying when the children's expected gain lifts the score after paying it."""
    from arborspec.builders.auto_size import GrowthRule

    curve = CostCurve((1, 2, 3, 4, 5), (1.0, 1.5, 1.6, 1.7, 2.4), 0.1, 0.0)
    rule = GrowthRule(curve, None, 4)  # the root alone: rate 1 / t(1), the exchange is 1 token per t(1)
    # from 0 nodes: (1.5 - 1) / 1, (1.6 - 1) / 2 = 0.3, (1.7 - 1) / 3 = 0.2333, (2.4 - 1) / 4 = 0.35
    assert rule.price(0, 0) == pytest.approx(0.7 / 3)
    assert rule.price(1, 0) == pytest.approx(0.1)  # 1.6 - 1.5, (1.7 - 1.5) / 2, (2.4 - 1.5) / 3
    assert rule.price(4, 0) == float("inf")  # the cap
    assert rule.keep(0, 0.24, 0) and not rule.keep(0, 0.23, 0)
    # rate 1 / 1.0 as it is; with g more, one forward (draft cost 0) and a row: (1 + g) / 1.5 > 1 if g > 0.5
    assert not rule.worth_forward(0, 0.49, 1, 0) and rule.worth_forward(0, 0.51, 1, 0)


def test_a_run_of_slowed_down_steps_does_not_decide_the_slopes_and_no_tree_halves_them():
    """A quarter of the steps slowed down several-fold (another process on the machine) must not be charged to
    the committed tokens: the fit minimises absolute deviations and recovers the undisturbed costs; least
    squares on the same steps charges the tokens far more. A generation that built no tree halves the slopes."""
    from arborspec.engine.cost import READ_ROWS, least_absolute_deviations
    from arborspec.engine.stats import StepStats

    curve = CostCurve((1, 2, 4, 8), (1.0, 1.5, 1.6, 1.8), 0.04, 0.1)
    o, d, a = 0.1, 0.05, 0.06
    shapes = [(3, 1, 1), (3, 1, 2), (5, 2, 2), (5, 2, 3), (7, 3, 3), (7, 3, 4), (7, 1, 1), (4, 2, 1), (6, 3, 2)] * 4

    def step(size, forwards, accepted, slow=1.0):
        seconds = 0.04 * slow * (curve.t(size + 1) + forwards * 0.1 + o + d * forwards + a * (accepted - READ_ROWS))
        return StepStats(accepted_length=accepted, tree_size=size, tree_depth=forwards, estimated_length=1.0,
                         draft_time=0.0, build_time=0.0, verify_time=seconds, other_time=0.0, draft_forwards=forwards)

    # the last quarter slowed down 2-6x, the slower the more tokens it committed (as a disturbed tail can be)
    steps = [step(*x) for x in shapes[:27]] + [step(n, f, k, slow=2.0 + k) for n, f, k in shapes[27:]]
    learnt = curve.with_overhead_of(steps)
    assert (learnt.draft_overhead, learnt.token_cost) == pytest.approx((d, a), abs=1e-6)
    rows = torch.tensor([[1.0, s.draft_forwards, s.accepted_length - READ_ROWS] for s in steps], dtype=torch.float64)
    gaps = torch.tensor([[(s.verify_time / 0.04) - curve.t(s.tree_size + 1) - s.draft_forwards * 0.1] for s in steps],
                        dtype=torch.float64)
    assert torch.linalg.lstsq(rows, gaps).solution[2, 0] > 5 * a  # what least squares would have learnt
    assert least_absolute_deviations(rows, gaps)[2] == pytest.approx(a, abs=1e-6)
    plain = StepStats(accepted_length=1, tree_size=0, tree_depth=0, estimated_length=1.0, draft_time=0.0,
                      build_time=0.0, verify_time=0.04, other_time=0.0, draft_forwards=1)
    halved = learnt.with_overhead_of([plain] * 10)
    assert (halved.draft_overhead, halved.token_cost) == pytest.approx((d / 2, a / 2))
    assert learnt.with_overhead_of([]) == learnt


def test_a_decoder_keeps_one_cost_curve_for_greedy_steps_and_one_for_sampled_steps(tiny_pair):
    """Temperature 0's verifier reads screened argmaxes, sampling's reads full LM-head rows: the curves are timed
    that way, cached per kind, and what a decoder learns at one temperature does not size the other's trees."""
    from arborspec.engine.cost import cost_curve_for

    target, draft = tiny_pair
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder("dyspec", budget="auto"))
    greedy_cfg = DecodeConfig(max_new_tokens=8)
    sampled_cfg = DecodeConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=0.8))
    dec.generate(PROMPTS[0], greedy_cfg)
    assert set(dec.curves) == {True}
    greedy_curve = dec.curves[True]
    assert greedy_curve.tokens == cost_curve_for(dec.target, dec.drafter, True).tokens
    dec.generate(PROMPTS[0], sampled_cfg)
    assert set(dec.curves) == {True, False} and dec.curves[True] is greedy_curve  # untouched by the sampled run
    assert cost_curve_for(dec.target, dec.drafter, False) is not cost_curve_for(dec.target, dec.drafter, True)
    out = dec.generate(PROMPTS[1], greedy_cfg)
    assert out.output_ids == autoregressive_generate(ModelAdapter(target), PROMPTS[1], greedy_cfg).output_ids
