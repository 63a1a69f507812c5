"""The in-place KV cache of float64-attention targets (engine/kv_cache.py): it holds exactly the values a
`DynamicLayer` holds (converted to its storage dtype, float64 or float32), through growth past its capacity,
crops and compactions; a batch of two or more keeps float32 buffers, a batch of one and a single sequence
float64; and the int8 target's
forwards, tree forwards and generations over it equal those over transformers' own cache."""


import pytest
import torch
from arborspec.engine import kv_cache
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.engine.int8 import quantize_int8
from arborspec.engine.kv_cache import InPlaceLayer, new_cache, uses_float64_attention
from arborspec.engine.tree import TokenTree
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from conftest import tiny_llama


def _rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 8, generator=gen), torch.randn(1, 2, n, 8, generator=gen)


@pytest.mark.parametrize("storage", [torch.float64, torch.float32])
def test_an_in_place_layer_holds_the_dynamic_layers_values_through_growth_crop_and_compaction(
    monkeypatch, storage
):
    monkeypatch.setattr(kv_cache, "MIN_CAPACITY", 4)  # grow several times in a short sequence
    mine, ref = InPlaceLayer(storage), DynamicLayer()
    for step, n in enumerate([3, 1, 5, 2, 9, 1]):
        k, v = _rows(n, step)
        got_k, got_v = mine.update(k, v)
        want_k, want_v = ref.update(k, v)
        assert got_k.dtype == got_v.dtype == storage
        assert torch.equal(got_k, want_k.to(storage)) and torch.equal(got_v, want_v.to(storage))
        assert mine.get_seq_length() == ref.get_seq_length()
        if step % 2:  # a compaction as ModelAdapter.compact does it: rows copied into place, the rest cropped
            start = mine.get_seq_length() - n
            slots = torch.tensor([start + n - 1])
            for layer in (mine, ref):
                layer.keys[:, :, start:start + 1] = layer.keys.index_select(2, slots)
                layer.values[:, :, start:start + 1] = layer.values.index_select(2, slots)
                layer.crop(-(n - 1))
        assert torch.equal(mine.keys, ref.keys.to(storage))
        assert torch.equal(mine.values, ref.values.to(storage))
    mine.reset()
    assert mine.get_seq_length() == 0


@pytest.fixture(scope="module")
def int8_target():
    model = tiny_llama(seed=3)
    gen = torch.Generator().manual_seed(0)
    samples = [torch.randint(3, model.config.vocab_size, (40,), generator=gen) for _ in range(3)]
    return quantize_int8(model, samples)


def _with_dynamic_cache(model) -> ModelAdapter:
    adapter = ModelAdapter(model)
    adapter.new_cache = lambda m: DynamicCache(config=m.config)  # transformers' own float32 layers
    adapter.reset()
    return adapter


def test_only_float64_attention_targets_get_the_in_place_cache(int8_target):
    assert uses_float64_attention(int8_target)
    assert all(type(layer) is InPlaceLayer for layer in new_cache(int8_target).layers)
    plain = tiny_llama(seed=3)
    assert not uses_float64_attention(plain)
    assert all(type(layer) is DynamicLayer for layer in new_cache(plain).layers)


def test_int8_forwards_over_the_in_place_cache_equal_those_over_transformers_cache(int8_target, monkeypatch):
    monkeypatch.setattr(kv_cache, "MIN_CAPACITY", 8)
    ours, theirs = ModelAdapter(int8_target), _with_dynamic_cache(int8_target)
    prompt = torch.arange(5, 25)
    for adapter in (ours, theirs):
        adapter.prefill(prompt)
    tree = TokenTree.from_root(7)
    a = tree.add(0, 11)
    tree.add(0, 12)
    tree.add(a, 13)
    h_ours = ours.tree_forward(tree, lazy=True).hidden
    h_theirs = theirs.tree_forward(tree, lazy=True).hidden
    assert torch.equal(h_ours, h_theirs)
    for adapter in (ours, theirs):
        adapter.compact(prompt.numel(), [prompt.numel(), prompt.numel() + 1, prompt.numel() + 3])
    assert ours.cache_len == theirs.cache_len == prompt.numel() + 3
    for mine, ref in zip(ours.cache.layers, theirs.cache.layers):
        assert torch.equal(mine.keys, ref.keys.double()) and torch.equal(mine.values, ref.values.double())
    cfg = DecodeConfig(max_new_tokens=40)
    out_ours = autoregressive_generate(ours, prompt.tolist(), cfg).output_ids
    out_theirs = autoregressive_generate(theirs, prompt.tolist(), cfg).output_ids
    assert out_ours == out_theirs and len(out_ours) == 40


def test_a_batch_of_two_keeps_float32_buffers_one_sequence_float64(int8_target):
    """The storage split of engine/kv_cache.py: the adapter's own cache in float64; a batch of one
    sequence too; the batch's of two, joined from two prefills of that cache, in float32 holding the
    same values, and still after a forward grows it; back in float64, the same values, when one
    sequence is left."""
    from arborspec.engine.batch_target import BatchTarget

    single = ModelAdapter(int8_target)
    single.prefill(torch.arange(5, 25))
    assert all(layer.storage == torch.float64 and layer.keys.dtype == torch.float64
               for layer in single.cache.layers)
    batch = BatchTarget(ModelAdapter(int8_target))
    batch.join("a", list(range(5, 25)))
    alone = batch.rows.cache.layers
    assert all(t.dtype == torch.float64 for layer in alone for t in (layer.keys, *layer.buffers))
    batch.join("b", list(range(30, 42)))
    layers = batch.rows.cache.layers
    assert all(layer.storage == torch.float32 for layer in layers)
    assert all(t.dtype == torch.float32 for layer in layers for t in (layer.keys, *layer.buffers))
    for mine, ref in zip(layers, single.cache.layers):
        assert torch.equal(mine.keys[0, :, :19], ref.keys[0, :, :19].float())
    batch.verify_forward({"a": TokenTree.from_root(25), "b": TokenTree.from_root(42)})
    assert all(t.dtype == torch.float32 for layer in layers for t in (layer.keys, *layer.buffers))
    kept = [layer.keys[0, :, :19].clone() for layer in layers]
    batch.keep({"a": [], "b": []}, 19)
    batch.leave("b")
    layers = batch.rows.cache.layers
    assert all(t.dtype == torch.float64 for layer in layers for t in (layer.keys, *layer.buffers))
    for mine, before in zip(layers, kept):
        assert torch.equal(mine.keys[0, :, :19], before.double())
