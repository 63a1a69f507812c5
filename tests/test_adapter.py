"""Tree attention on an unmodified HF model, and KV compaction, on each `device` (conftest)."""

import pytest
import torch
from arborspec.builders.registry import make_builder
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder
from arborspec.engine.tree import TokenTree
from transformers import DynamicCache

from conftest import on_device, tolerance
from conftest import row_logits as plain_logits


def atol(got: torch.Tensor, ref: torch.Tensor) -> float:
    """1e-4 on a CPU; a GPU's kernels sum in other orders, within float32's tolerance of `ref`'s scale."""
    return 1e-4 if got.device.type == "cpu" else tolerance("float32", ref)


def close(row: torch.Tensor, ref: torch.Tensor) -> bool:
    """A tree forward's row (on any device) equals the plain forward's float32 row `ref` (on the CPU)."""
    return torch.allclose(row.float().cpu(), ref, atol=atol(row, ref))


def test_tree_forward_matches_plain_forward(tiny_pair, device):
    target = on_device(tiny_pair[0], device)
    prefix = [3, 14, 15, 9, 26, 5]
    tree = TokenTree.from_root(prefix[-1])
    a = tree.add(0, 11)
    b = tree.add(0, 12)
    c = tree.add(a, 13)
    tree.add(b, 40)
    tree.add(c, 41)
    lm = ModelAdapter(target)
    lm.prefill(torch.tensor(prefix[:-1]))
    logits = lm.tree_forward(tree)
    for node in range(tree.num_nodes):
        ref = plain_logits(target, prefix + tree.path_tokens(node))
        assert close(logits[node], ref), node


def test_lazy_tree_logits_compute_only_the_rows_read(tiny_pair, device):
    from arborspec.engine.lm_head import LazyLogits

    target = on_device(tiny_pair[0], device)
    prefix = [3, 14, 15, 9, 26, 5]
    tree = TokenTree.from_root(prefix[-1])
    a = tree.add(0, 11)
    tree.add(0, 12)
    tree.add(a, 13)
    lm = ModelAdapter(target)
    assert lm.head.supported
    lm.prefill(torch.tensor(prefix[:-1]))
    lazy = lm.tree_forward(tree, lazy=True)
    assert isinstance(lazy, LazyLogits) and len(lazy) == 4 and len(lazy.rows) == 0
    for node in (0, a, -1):
        ref = plain_logits(target, prefix + tree.path_tokens(node % tree.num_nodes))
        assert close(lazy[node], ref), node
    assert len(lazy.rows) == 3 and lazy[a] is lazy[a] and lazy[a].shape == (target.config.vocab_size,)


def test_heads_with_logit_transforms_use_the_models_own_logits(tiny_pair):
    from arborspec.engine.lm_head import HeadRows

    target, _ = tiny_pair
    assert HeadRows(target).supported
    target.config.final_logit_softcapping = 30.0
    try:
        lm = ModelAdapter(target)
        assert not lm.head.supported
        lm.prefill(torch.tensor([3, 4]))
        tree = TokenTree.from_root(5)
        tree.add(0, 6)
        assert torch.is_tensor(lm.tree_forward(tree, lazy=True))  # eager: the model computes its logits
    finally:
        target.config.final_logit_softcapping = None


COMPACTED_PATH = [1, 2, 3, 4, 5, 6, 8]  # what `forward_and_compact` leaves in the cache


def forward_and_compact(model) -> ModelAdapter:
    """Prefill 1 2 3 4, verify the tree 5 -> {6 -> 8 -> 9, 7}, keep the root and nodes 6, 8 (`COMPACTED_PATH`)."""
    lm = ModelAdapter(model)
    lm.prefill(torch.tensor([1, 2, 3, 4]))
    tree = TokenTree.from_root(5)
    a = tree.add(0, 6)
    tree.add(0, 7)
    c = tree.add(a, 8)
    tree.add(c, 9)
    lm.tree_forward(tree)
    lm.compact(4 + 1, [4 + a, 4 + c])  # keep the root, then nodes a and c
    return lm


def test_compaction_keeps_the_path(tiny_pair, device):
    target = on_device(tiny_pair[0], device)
    lm = forward_and_compact(target)
    fresh = ModelAdapter(target)
    fresh.prefill(torch.tensor(COMPACTED_PATH))
    assert {layer.keys.device.type for layer in lm.cache.layers} == {torch.device(device).type}
    assert_caches_equal(lm.cache, fresh.cache)


def assert_caches_equal(c1: DynamicCache, c2: DynamicCache, rows: int | None = None) -> None:
    """Equal caches (or equal first `rows` rows, when c1 may hold more)."""
    if rows is None:
        assert c1.get_seq_length() == c2.get_seq_length()
    rows = rows or c2.get_seq_length()
    assert c1.get_seq_length() >= rows and c2.get_seq_length() == rows
    for l1, l2 in zip(c1.layers, c2.layers):
        assert torch.allclose(l1.keys[:, :, :rows], l2.keys, atol=atol(l1.keys, l2.keys))
        assert torch.allclose(l1.values[:, :, :rows], l2.values, atol=atol(l1.values, l2.values))


def test_caches_equal_fresh_run_after_many_steps(tiny_pair, device):
    """After a whole speculative generation, target and draft caches equal a fresh prefill of the committed tokens."""
    target, draft = (on_device(model, device) for model in tiny_pair)
    prompt = [5, 17, 33, 8, 9, 40]
    for name, params in [("sequoia", dict(shape=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])),
                         ("specinfer", dict(topk=2, max_depth=3))]:
        dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, **params))
        res = dec.generate(prompt, DecodeConfig(max_new_tokens=30, seed=3))
        assert len(res.steps) > 3
        committed = prompt + res.output_ids
        # target cache holds everything but the last committed token (the next root)
        fresh_t = ModelAdapter(target)
        fresh_t.prefill(torch.tensor(committed[:-1]))
        # if the last step was cut at max_new_tokens the cache also holds the cut-off accepted tokens
        assert_caches_equal(dec.target.cache, fresh_t.cache, rows=len(committed) - 1)
        n = dec.drafter.lm.cache_len
        fresh_d = ModelAdapter(draft)
        fresh_d.prefill(torch.tensor(committed[:n]))
        assert_caches_equal(dec.drafter.lm.cache, fresh_d.cache)
        assert n >= len(prompt)


@pytest.mark.slow  # torch.compile
def test_compiled_decoder_keeps_plain_and_tree_decoding_exact(tiny_pair):
    """`--compile` (ModelAdapter.compile): the same tokens as the eager model, for plain decoding and a tree
    method (compiled once with dynamic shapes; one-row and many-row forwards both go through it)."""
    import copy

    from arborspec.builders.registry import make_builder
    from arborspec.drafters import ModelDrafter
    from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate

    target, draft = tiny_pair
    model = copy.deepcopy(target)  # the session fixture stays eager
    cfg = DecodeConfig(max_new_tokens=12)
    prompt = [5, 9, 13, 2, 7, 11]
    eager = autoregressive_generate(ModelAdapter(target), prompt, cfg).output_ids
    adapter = ModelAdapter(model)
    adapter.compile()
    adapter.compile()  # idempotent
    assert adapter.compiled and not ModelAdapter(target).compiled
    assert autoregressive_generate(adapter, prompt, cfg).output_ids == eager
    dec = SpeculativeDecoder(adapter, ModelDrafter(draft), make_builder("dyspec", budget=6))
    assert dec.generate(prompt, cfg).output_ids == eager


def test_generator_compiles_a_pair_it_was_given(tiny_pair, monkeypatch):
    """`SpeculativeGenerator(compile=True)` compiles the target of a pair loaded elsewhere, once."""
    from arborspec.api import SpeculativeGenerator
    from arborspec.models import ModelPair

    calls = []
    adapter = ModelAdapter(tiny_pair[0])
    monkeypatch.setattr(adapter, "compile", lambda: calls.append(1))
    pair = ModelPair("t", "d", adapter, ModelDrafter(tiny_pair[1]), None)
    SpeculativeGenerator(method="dyspec", budget=4, pair=pair, compile=True)
    SpeculativeGenerator(method="dyspec", budget=4, pair=pair)
    assert calls == [1]
