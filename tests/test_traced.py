"""Forwards replayed from traces (engine/traced.py): every hidden state and cache row the eager forward's
bit for bit, for plain steps across the cache's growth, trees of any size, batches with holes and padding;
one trace per kind of forward; what the replay leaves to the eager path."""

import copy

import pytest
import torch
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.batch_target import BatchTarget
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.engine.int8 import quantize_int8
from arborspec.engine.kv_cache import MIN_CAPACITY
from arborspec.engine.packed_rows import split_width
from arborspec.engine.tree import TokenTree

from conftest import tiny_llama


@pytest.fixture(scope="module")
def int8_target():
    model = tiny_llama(3, vocab=96, layers=2)
    gen = torch.Generator().manual_seed(0)
    return quantize_int8(copy.deepcopy(model), [torch.randint(3, 96, (40,), generator=gen) for _ in range(3)])


def tree_of(root: int, size: int, seed: int) -> TokenTree:
    gen = torch.Generator().manual_seed(seed)
    tree = TokenTree.from_root(root)
    for _ in range(size - 1):
        parent = int(torch.randint(0, tree.num_nodes, (1,), generator=gen))
        tree.add(parent, int(torch.randint(3, 96, (1,), generator=gen)))
    return tree


def cache_rows(adapter: ModelAdapter) -> list[torch.Tensor]:
    return [t for layer in adapter.cache.layers for t in (layer.keys, layer.values)]


def test_plain_steps_and_trees_replayed_equal_the_eager_forward_bitwise(int8_target):
    """Plain one-token steps past the cache's first buffer (it grows between replays), then trees of 2-9
    nodes: hidden states, logits rows and every cache row equal to the eager adapter's; two traces in all
    (one row without a mask, several rows with one)."""
    traced, eager = ModelAdapter(int8_target), ModelAdapter(int8_target, trace=False)
    assert traced.traced is not None and eager.traced is None
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 96, (MIN_CAPACITY - 8,), generator=gen)
    for adapter in (traced, eager):
        adapter.prefill(prompt)
    assert not traced.traced.traces  # a prefill from an empty cache runs eagerly
    for step in range(20):
        token = torch.randint(3, 96, (1,), generator=gen)
        rows = [adapter.hidden_forward(token) for adapter in (traced, eager)]
        assert torch.equal(rows[0], rows[1]), step
    assert traced.cache_len == eager.cache_len > MIN_CAPACITY
    assert all(torch.equal(a, b) for a, b in zip(cache_rows(traced), cache_rows(eager)))
    past = traced.cache_len
    for size in (2, 5, 9, 3):
        tree = tree_of(7, size, seed=size)
        out = []
        for adapter in (traced, eager):
            adapter.capture_hidden(True)
            logits = adapter.tree_forward(tree, lazy=True)
            out.append((adapter.last_hidden.clone(), logits[size - 1]))
            adapter.compact(past, [past + size - 1])
        assert torch.equal(out[0][0], out[1][0]), size
        assert torch.equal(out[0][1], out[1][1]), size
        assert all(torch.equal(a, b) for a, b in zip(cache_rows(traced), cache_rows(eager))), size
        past += 1
    assert len(traced.traced.traces) == 2


def test_batched_forwards_replayed_equal_the_eager_forward_bitwise(int8_target):
    """A batch with holes (prompts of different lengths) and uneven trees, then a request leaving and one
    joining: every request's hidden states equal the eager batch's; two batch traces serve them all."""
    prompts = {"a": [5, 17, 33, 8, 9, 40, 11], "b": [12, 70, 3], "c": [60, 61, 62, 1, 44]}
    batches = [BatchTarget(ModelAdapter(int8_target)), BatchTarget(ModelAdapter(int8_target, trace=False))]
    for batch in batches:
        for key, ids in prompts.items():
            batch.join(key, ids)
    for step in range(4):
        if step == 2:  # one leaves, one joins with a longer prompt
            for batch in batches:
                batch.leave("b")
                batch.join("d", list(range(20, 41)))
        keys = list(batches[0].rows.keys)
        sizes = {key: 1 + (i + step) % 3 * 2 for i, key in enumerate(keys)}
        trees = {key: tree_of(3 + i, sizes[key], seed=10 * step + i) for i, key in enumerate(keys)}
        results = [batch.verify_forward(trees) for batch in batches]
        for key in keys:
            assert torch.equal(results[0][1][key], results[1][1][key]), (step, key)
        kept = {key: [sizes[key] - 1] if sizes[key] > 1 else [] for key in keys}
        for batch, (_, _, width) in zip(batches, results):
            batch.keep(kept, width)
    traced = batches[0].adapter.traced.traces
    assert 1 <= len(traced) <= 2 and all(key.batched for key in traced)


def test_plain_decoding_replayed_gives_the_eager_tokens(int8_target):
    cfg = DecodeConfig(max_new_tokens=30)
    prompt = [5, 17, 33, 8, 9]
    replayed = autoregressive_generate(ModelAdapter(int8_target), prompt, cfg).output_ids
    assert replayed == autoregressive_generate(ModelAdapter(int8_target, trace=False), prompt, cfg).output_ids
    assert len(replayed) == 30


def test_float32_models_and_several_token_chunks_run_eagerly(int8_target):
    """A float32 model keeps the modules' forward (its cache is transformers' own). On the int8 target a
    forward the trace cannot take (a several-token chunk with no mask) runs eagerly and makes no trace."""
    assert ModelAdapter(tiny_llama(0)).traced is None
    adapter = ModelAdapter(int8_target)
    adapter.prefill(torch.tensor([5, 17, 33]))
    adapter.feed(torch.tensor([8, 9, 40]))  # a plain chunk of three rows after the cache
    assert not adapter.traced.traces
    adapter.feed(torch.tensor([11]))
    assert len(adapter.traced.traces) == 1


def test_a_packed_batch_replays_as_the_eager_forward(int8_target, monkeypatch):
    """Uneven trees are packed into one row (engine/packed_rows.py): a replaying adapter runs a trace of its
    own that takes the packing as an input, and multiplies only the real rows, as the eager forward does; the
    same trace then serves another pattern of tree sizes. Every request gets the hidden states of its tree
    alone."""
    import arborspec.engine.int8 as int8_module

    product = int8_module.int8_rows_product
    rows_multiplied = []

    def counted(rows, *args):
        rows_multiplied.append(int(rows.shape[0]))
        return product(rows, *args)

    monkeypatch.setattr(int8_module, "int8_rows_product", counted)
    prompts = {"a": [5, 17, 33, 8, 9, 40, 11], "b": [12, 70, 3]}
    batches = {}
    for trace in (True, False):
        batches[trace] = BatchTarget(ModelAdapter(int8_target, trace=trace))
        for key, ids in prompts.items():
            batches[trace].join(key, ids)
    patterns = [{"a": tree_of(3, 5, seed=1), "b": tree_of(4, 1, seed=2)},
                {"a": tree_of(3, 2, seed=3), "b": tree_of(4, 6, seed=4)}]
    for trees in patterns:
        real = sum(tree.num_nodes for tree in trees.values())
        states = {}
        for trace, batch in batches.items():
            rows_multiplied.clear()
            _, states[trace], width = batch.verify_forward(trees)
            batch.keep({key: [] for key in trees}, width)
            # the real rows only, eagerly or while the trace records; a replay of it calls no Python
            recorded = not trace or trees is patterns[0]
            assert set(rows_multiplied) == ({real} if recorded else set())
        assert [key.packs for key in batches[True].adapter.traced.traces] == [True]
        assert batches[False].adapter.traced is None
        for key in trees:  # alone: the same steps (each kept its root) on the request's own cache
            alone = BatchTarget(ModelAdapter(int8_target, trace=False))
            alone.join(key, prompts[key])
            for earlier in patterns[: patterns.index(trees) + 1]:
                _, own, width = alone.verify_forward({key: earlier[key]})
                alone.keep({key: []}, width)
            assert torch.equal(states[True][key], own[key]) and torch.equal(states[False][key], own[key]), key


def test_a_packed_batch_whose_attention_splits_replays_as_each_tree_alone(int8_target):
    """One long tree beside short ones: the packed forward attends the long tree's rows past the next longest in
    a call of their own (engine/packed_rows.py, `split_width`). One trace serves patterns whose long request and
    split width differ; every request gets the hidden states of its tree alone, replayed, eagerly, and with the
    attention unsplit."""
    prompts = {"a": [5, 17, 33, 8, 9, 40, 11], "b": [12, 70, 3], "c": [60, 61, 62, 1, 44], "d": [9, 9, 30]}
    patterns = [{"a": tree_of(3, 9, seed=1), "b": tree_of(4, 1, seed=2), "c": tree_of(5, 2, seed=3),
                 "d": tree_of(6, 1, seed=4)},
                {"a": tree_of(3, 1, seed=5), "b": tree_of(4, 3, seed=6), "c": tree_of(5, 2, seed=7),
                 "d": tree_of(6, 8, seed=8)}]
    variants = {"replayed": (True, True), "eager": (False, True), "unsplit": (True, False)}
    batches = {}
    for name, (trace, splits) in variants.items():
        batches[name] = BatchTarget(ModelAdapter(int8_target, trace=trace))
        batches[name].splits = splits
        for key, ids in prompts.items():
            batches[name].join(key, ids)
    for trees in patterns:
        assert split_width([tree.num_nodes for tree in trees.values()]) is not None
        states = {}
        for name, batch in batches.items():
            _, states[name], width = batch.verify_forward(trees)
            batch.keep({key: [] for key in trees}, width)
        assert [(key.packs, key.split) for key in batches["replayed"].adapter.traced.traces] == [(True, True)]
        for key in trees:
            alone = BatchTarget(ModelAdapter(int8_target, trace=False))
            alone.join(key, prompts[key])
            for earlier in patterns[: patterns.index(trees) + 1]:
                _, own, width = alone.verify_forward({key: earlier[key]})
                alone.keep({key: []}, width)
            for name in variants:
                assert torch.equal(states[name][key], own[key]), (name, key)
