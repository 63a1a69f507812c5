"""The draft head's forwards replayed from traces (drafters/head_traced.py): the root's and every expanded
node's draft logits and the head's cache rows equal to the eager drafter's bit for bit, through steps of one
and several rows, commits and a reset; two traces in all; greedy output = plain decoding."""

import pytest
import torch
from arborspec.builders.registry import make_builder
from arborspec.drafters.head import HeadDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.tree import TokenTree

from conftest import make_head, tiny_llama


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0, layers=2)
    head = make_head(target, vocab_ids=torch.arange(80))
    head.quantize_logits().quantize_layers()
    return target, head


def rows_of(drafter: HeadDrafter) -> list[torch.Tensor]:
    layer = drafter.cache.layers[0]
    return [layer.keys, layer.values]


def test_replayed_head_equals_the_eager_head_bitwise(pair):
    """Forty steps of begin / expand (1-5 nodes a call, nodes under earlier nodes) / commit on random trees,
    with 1-4 committed tokens a step, then a reset and a new prompt: root and node logits, and the cache rows
    after every call, equal to the eager drafter's; the replay makes two traces (one row, several)."""
    target, head = pair
    traced, eager = HeadDrafter(head), HeadDrafter(head, trace=False)
    assert traced.traced is not None and eager.traced is None
    gen = torch.Generator().manual_seed(3)
    hidden = target.config.hidden_size
    for prompt_len in (9, 5):
        committed = torch.randint(3, 96, (prompt_len,), generator=gen).tolist()
        feats = torch.randn(prompt_len - 1, hidden, generator=gen)
        for drafter in (traced, eager):
            drafter.reset()
            drafter.observe(feats)
        for step in range(20):
            roots = [drafter.begin(committed) for drafter in (traced, eager)]
            assert torch.equal(roots[0], roots[1]), step
            assert all(torch.equal(a, b) for a, b in zip(rows_of(traced), rows_of(eager))), step
            tree = TokenTree.from_root(committed[-1])
            for depth in range(int(torch.randint(1, 4, (1,), generator=gen))):
                parents = [n for n in range(tree.num_nodes) if tree.depths[n] == depth]
                nodes = [
                    tree.add(
                        parents[int(torch.randint(0, len(parents), (1,), generator=gen))], int(tok)
                    )
                    for tok in torch.randint(
                        3, 96, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen
                    )
                ]
                out = [drafter.expand(tree, nodes) for drafter in (traced, eager)]
                assert torch.equal(out[0], out[1]), (step, depth)
                assert all(torch.equal(a, b) for a, b in zip(rows_of(traced), rows_of(eager)))
            for drafter in (traced, eager):
                drafter.commit(tree, [])
            new = torch.randint(
                3, 96, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen
            ).tolist()
            feats = torch.randn(len(new), hidden, generator=gen)
            for drafter in (traced, eager):
                drafter.observe(feats)
            committed += new
    assert sorted(traced.traced.traces) == [(False, False), (False, True)]
    assert traced.cache_len > 40


def test_replayed_head_keeps_greedy_output_and_shares_traces(pair):
    """Speculative decoding with the replayed head = plain decoding; a spawned drafter (batched decoding's
    per-request drafters) replays the same traces."""
    target, head = pair
    drafter = HeadDrafter(head)
    cfg = DecodeConfig(max_new_tokens=40)
    prompt = [5, 17, 33, 2, 64, 9]
    res = SpeculativeDecoder(
        ModelAdapter(target), drafter, make_builder("dyspec", budget=4)
    ).generate(prompt, cfg)
    assert res.output_ids == autoregressive_generate(ModelAdapter(target), prompt, cfg).output_ids
    assert drafter.traced.traces and drafter.spawn().traced is drafter.traced


def test_replayed_batched_head_equals_the_eager_one_bitwise(pair):
    """The batched head drafter over three requests (a join and a leave on the way): root and node logits and
    the batch's cache rows equal to the eager batched drafter's after every call; its traces are the
    single-request drafter's object, with batched kinds added."""
    target, head = pair
    single = HeadDrafter(head)
    traced, eager = single.batched(), HeadDrafter(head, trace=False).batched()
    assert traced.traced is single.traced and eager.traced is None
    gen = torch.Generator().manual_seed(5)
    hidden = target.config.hidden_size
    committed = {}

    def join(key, n):
        committed[key] = torch.randint(3, 96, (n,), generator=gen).tolist()
        feats = torch.randn(n - 1, hidden, generator=gen)
        for drafter in (traced, eager):
            drafter.join(key, committed[key], feats)

    def same_rows():
        a, b = traced.batch.cache.layers[0], eager.batch.cache.layers[0]
        return torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)

    join("a", 7)
    join("b", 4)
    for step in range(12):
        if step == 4:
            join("c", 9)
        if step == 8:
            for drafter in (traced, eager):
                drafter.leave("b")
            del committed["b"]
        roots = [drafter.begin(dict(committed)) for drafter in (traced, eager)]
        assert all(torch.equal(roots[0][k], roots[1][k]) for k in committed), step
        assert same_rows(), step
        trees = {}
        for depth in range(2):
            items = []
            for key in committed:
                tree = trees.setdefault(key, TokenTree.from_root(committed[key][-1]))
                parents = [n for n in range(tree.num_nodes) if tree.depths[n] == depth]
                count = int(torch.randint(1, 4, (1,), generator=gen))
                nodes = [
                    tree.add(parents[0], int(t))
                    for t in torch.randint(3, 96, (count,), generator=gen)
                ]
                items.append((key, tree, nodes))
            out = [drafter.expand(items) for drafter in (traced, eager)]
            assert all(torch.equal(x, y) for x, y in zip(*out)), (step, depth)
            assert same_rows(), (step, depth)
        features = {}
        for key in committed:
            new = torch.randint(
                3, 96, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen
            ).tolist()
            features[key] = torch.randn(len(new), hidden, generator=gen)
            committed[key] = committed[key] + new
        for drafter in (traced, eager):
            drafter.commit([(key, trees[key], []) for key in trees], features)
    assert {(True, False), (True, True)} <= set(traced.traced.traces)
