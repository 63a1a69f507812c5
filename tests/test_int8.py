"""The int8 target (engine/int8.py, docs/algorithms.md §8): exact per-row int8 linears, a smoothing fold
that keeps the float model, bitwise batch invariance of whole forwards, sampled tokens that follow the
int8 model's law, the embedded target in int8 and a compiled int8 target. Greedy identity of every builder
with plain int8 decoding and HF `generate` is tests/test_greedy_identity.py's."""

import copy

import arborspec.engine.int8 as int8_module
import pytest
import torch
from arborspec.builders.registry import make_builder
from arborspec.common.hf_cache import cache_kwargs
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.batch_target import BatchTarget
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.int8 import (
    ACT_LEVELS,
    WEIGHT_LEVELS,
    Int8Group,
    Int8Linear,
    activation_maxima,
    int8_rows_product,
    pack_int8_weight,
    packed_int8_values,
    quantize_int8,
    rounded_like_kernel,
    smooth,
)
from arborspec.engine.invariant_attention import NAME, attend_float64, float64_attention
from arborspec.engine.packed_rows import split_width
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.tree import TokenTree
from arborspec.errors import ArborError
from arborspec.models import load_model, parse_dtype

from conftest import GREEDY_PROMPTS as PROMPTS
from conftest import MODEL_THREADS, assert_first_two_follow, assert_greedy_identical, perturbed_copy, tiny_llama


def calibration(vocab: int, n: int = 3, length: int = 40, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=gen) for _ in range(n)]


def int8_copy(model):
    return quantize_int8(copy.deepcopy(model), calibration(model.config.vocab_size))


@pytest.fixture(scope="module")
def int8_pair(tiny_pair):
    target, draft = tiny_pair
    return int8_copy(target), draft


def test_int8_linear_is_the_exact_integer_product_row_by_row():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 40, bias=True)
    x = torch.randn(7, 64)
    x[:, 5] *= 50  # an outlier channel
    q = Int8Linear(lin)
    together = q(x)
    alone = torch.cat([q(x[i: i + 1]) for i in range(7)])
    assert torch.equal(together, alone)  # a row's result does not depend on the other rows
    # reference: the same integer arithmetic written out
    w_scale = lin.weight.abs().amax(1) / WEIGHT_LEVELS
    w_int = torch.round(lin.weight / w_scale[:, None]).clamp(-WEIGHT_LEVELS, WEIGHT_LEVELS)
    x_scale = x.abs().amax(1, keepdim=True) / ACT_LEVELS
    x_int = torch.round(x / x_scale)
    reference = (x_int.double() @ w_int.double().T) * w_scale.double() * x_scale.double() + lin.bias.double()
    assert torch.allclose(together.double(), reference, rtol=1e-5, atol=1e-5)
    assert (together - lin(x)).abs().max() < 0.05 * lin(x).abs().max()  # and it is close to the float product


def test_the_int8_product_uses_the_documented_rounding_of_each_activation():
    """Activations just below a half-way point, where round(x + 128) and round(x) part: the product
    equals the exact integer product of `rounded_like_kernel`'s values, bit for bit, and not that
    of round(x) (so the greedy screen's error bound is computed from what the kernel used)."""
    torch.manual_seed(0)
    weight = torch.randn(48, 256) * 0.05
    packed = pack_int8_weight(weight)
    w_int = packed_int8_values(packed).double()
    w_scale = (weight.abs().amax(1) / WEIGHT_LEVELS).double().float()
    ulp = 2.0 ** -17  # float32 spacing in [64, 128)
    k = torch.randint(64, 126, (6, 256)).float()
    units = k + 0.5 - ulp  # round(units) = k; round(units + 128) can be k + 1
    units[:, 0] = 127.0  # each row's largest |x|: scale 1 / 4 exactly, so rows / scale = units
    rows = units / 4
    y, scaled, scale = int8_rows_product(rows, packed)
    assert torch.equal(scaled, units) and torch.equal(scale, torch.full((6, 1), 0.25))
    kernel = rounded_like_kernel(scaled)
    plain = torch.round(scaled)
    assert (kernel != plain).sum() > 50  # the two roundings do part on these rows

    def product(values):
        return (values.double() @ w_int.T).float().mul(w_scale).mul(scale)

    assert torch.equal(y, product(kernel))
    assert not torch.equal(y, product(plain))


needs_amx = pytest.mark.skipif(not int8_module.amx_int8(), reason="no AMX int8 on this CPU: oneDNN's int8 path is off")


@needs_amx
def test_onednn_products_are_fbgemms_bit_for_bit(monkeypatch):
    """From `ONEDNN_MIN_ROWS` rows on a product runs through oneDNN: on activations just below half-way
    points (where the 8-bit rounding can part) and on random rows of 1 to 70, over three weight shapes, its
    output equals fbgemm's bit for bit. Negative control: oneDNN fed round(x) + 128 instead of the kernel's
    round(x + 128) gives other values on the same rows, so the rows do exercise the rounding."""
    monkeypatch.setattr(int8_module, "ONEDNN_MIN_ROWS", 1)
    torch.manual_seed(0)
    ulp = 2.0 ** -17
    for out_features, in_features in ((48, 256), (1536, 576), (576, 1536)):
        weight = torch.randn(out_features, in_features) * 0.05
        packed = pack_int8_weight(weight)
        onednn = int8_module.OneDnnWeight(packed)
        units = torch.randint(64, 126, (40, in_features)).float() + 0.5 - ulp
        units[:, 0] = 127.0
        batches = [units / 4] + [torch.randn(n, in_features) * 3 for n in (1, 2, 31, 32, 33, 70)]
        for rows in batches:
            fbgemm = int8_rows_product(rows, packed)[0]
            assert torch.equal(int8_rows_product(rows, packed, onednn)[0], fbgemm), rows.shape
        values = (units.round() + 128).to(torch.uint8)
        other = torch.ops.onednn.qlinear_pointwise(
            values, 1.0, 128, onednn.weight, onednn.scales, onednn.zeros, None, 1.0, 0, torch.float32, "none", [], "")
        assert not torch.equal(other * 0.25, int8_rows_product(units / 4, packed)[0])


@needs_amx
def test_a_replay_picks_the_kernel_by_rows_and_equals_fbgemm(monkeypatch):
    """With oneDNN from 6 rows: replayed tree forwards of 9 rows run oneDNN's kernel (profiled), those of 1
    and 3 rows fbgemm's, each kind of forward from its own trace; a packed batch of uneven trees runs fbgemm
    over 5 rows and oneDNN over 6, from a trace of each kind.
    Every hidden state equals that of an eager adapter that only ever runs fbgemm, bit for bit."""
    model = tiny_llama(3, vocab=96, layers=2)
    gen = torch.Generator().manual_seed(0)
    target = quantize_int8(copy.deepcopy(model), [torch.randint(3, 96, (40,), generator=gen) for _ in range(3)])
    fbgemm_only, onednn_from = 10**9, 6

    def run(adapter, forward):
        """`forward()`'s result and whether it called oneDNN; the traced adapter with oneDNN from 6 rows,
        the eager one never."""
        monkeypatch.setattr(int8_module, "ONEDNN_MIN_ROWS", onednn_from if adapter.traced else fbgemm_only)
        with torch.profiler.profile() as prof:
            out = forward()
        return out, any(e.key == "onednn::qlinear_pointwise" for e in prof.key_averages())

    prompt = torch.randint(3, 96, (12,), generator=gen)
    adapters = [ModelAdapter(target), ModelAdapter(target, trace=False)]
    for adapter in adapters:
        run(adapter, lambda adapter=adapter: adapter.prefill(prompt))
    for step, size in enumerate((1, 9, 3, 9, 1)):
        tree = TokenTree.from_root(7 + step)
        for j in range(size - 1):
            tree.add(j // 2, 20 + j)
        out = []
        for adapter in adapters:
            adapter.capture_hidden(True)
            _, onednn = run(adapter, lambda adapter=adapter, tree=tree: adapter.tree_forward(tree, lazy=True))
            assert onednn == (adapter is adapters[0] and size >= onednn_from), (step, adapter.traced)
            out.append(adapter.last_hidden.clone())
            adapter.compact(adapter.cache_len - size, [adapter.cache_len - size])
        assert torch.equal(out[0], out[1]), step
    assert sorted(key.many for key in adapters[0].traced.traces) == [False, False, True]

    prompts = {"a": [5, 17, 33, 8, 9, 40, 11], "b": [12, 70, 3]}
    batches = [BatchTarget(ModelAdapter(target)), BatchTarget(ModelAdapter(target, trace=False))]
    for batch in batches:
        for key, ids in prompts.items():
            run(batch.adapter, lambda batch=batch, key=key, ids=ids: batch.join(key, ids))
    for sizes, real in (((4, 1), 5), ((5, 1), 6)):  # packed: 5 and 6 rows
        trees = {key: TokenTree.from_root(9) for key in prompts}
        for j in range(sizes[0] - 1):
            trees["a"].add(0, 30 + j)
        states = []
        for batch in batches:
            (_, state, width), onednn = run(batch.adapter, lambda batch=batch, trees=trees: batch.verify_forward(trees))
            assert onednn == (batch is batches[0] and real >= onednn_from), (sizes, batch.adapter.traced)
            states.append(state)
            batch.keep({key: [] for key in prompts}, width)
        for key in prompts:
            assert torch.equal(states[0][key], states[1][key]), (sizes, key)
    assert [(key.packs, key.many) for key in batches[0].adapter.traced.traces] == [(True, False), (True, True)]


@needs_amx
def test_a_deep_copy_packs_its_own_onednn_weights_and_computes_the_same(int8_pair, monkeypatch):
    """oneDNN's packed tensors cannot be copied: a deep copy of an int8 model packs its own (one per linear
    and per group, the group's shared with its first member) and gives the same hidden states through them."""
    monkeypatch.setattr(int8_module, "ONEDNN_MIN_ROWS", 2)
    target = int8_pair[0]
    clone = copy.deepcopy(target)
    ids = torch.tensor([[5, 17, 33, 8, 9, 40, 11, 12]])
    with torch.no_grad():
        assert torch.equal(clone.model(ids).last_hidden_state, target.model(ids).last_hidden_state)
    for original, copied in zip(target.modules(), clone.modules()):
        if isinstance(original, int8_module.OneDnnWeight):
            assert copied.weight is not original.weight and copied.packed is not original.packed
        group = getattr(copied, "group", None)
        if group is not None:
            assert copied.onednn is (group.onednn if copied.index == 0 else None)
            assert copied._packed is group.packed and group.members[copied.index] is copied


def test_a_group_of_linears_gives_each_member_its_own_int8_product_and_holds_nothing_after():
    torch.manual_seed(1)
    linears = [torch.nn.Linear(48, n, bias=b) for n, b in ((48, True), (24, False), (24, True))]
    group = Int8Group(linears)
    x = torch.randn(5, 48)
    for member, lin in zip(group.members, linears):
        assert torch.equal(member(x), Int8Linear(lin)(x))
    assert group.last_input is None and group.last_output is None  # every member served: references dropped
    y = torch.randn(5, 48)
    first = group.members[0](y)
    assert torch.equal(group.members[0](y), first)  # a second call from the same member recomputes, same result
    assert torch.equal(group.members[2](x), Int8Linear(linears[2])(x))  # a new input is never served stale rows


def test_smoothing_fold_keeps_the_float_model():
    model = tiny_llama(3, layers=2)
    ids = torch.tensor([[4, 9, 33, 2, 71, 8, 15]])
    with torch.no_grad():
        before = model(ids).logits
        folded = copy.deepcopy(model)
        samples = calibration(96)
        samples[0][3:6] = 90  # repeated tokens make a few channels large
        smooth(folded, activation_maxima(folded, samples), alpha=0.5)
        after = folded(ids).logits
    changed = (folded.model.layers[0].input_layernorm.weight - model.model.layers[0].input_layernorm.weight).abs().max()
    assert changed > 1e-3  # the scales really moved into the weights
    assert torch.allclose(before, after, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("packs,splits", [(True, True), (True, False), (False, False)])
def test_batched_tree_forward_of_uneven_trees_equals_each_tree_alone(int8_pair, packs, splits):
    """Uneven trees in one batched eager forward, packed into one row (engine/packed_rows.py; the long tree's
    rows attended in a call of their own or with the others) or padded to the widest (the replayed packed
    forward is tests/test_traced.py's): every real row's hidden state is the one its tree gets alone, and the
    cache holds the same keys and values either way."""
    target = int8_pair[0]
    prompts = {"a": [5, 17, 33, 8, 9, 40, 11], "b": [12, 70, 3], "c": [60, 61, 62, 1, 44]}
    trees = {}
    for key, extra in (("a", [40, 41, 42, 43, 44]), ("b", []), ("c", [50])):
        tree = TokenTree.from_root(prompts[key][-1])
        parent = 0
        for i, token in enumerate(extra):
            parent = tree.add(0 if i % 2 else parent, token)
        trees[key] = tree
    batch = BatchTarget(ModelAdapter(target, trace=False))
    batch.packs, batch.splits = packs, splits
    for key, ids in prompts.items():
        batch.join(key, ids)
    assert split_width([t.num_nodes for t in trees.values()]) == 2  # a batch that splits, splits this one
    _, states, _ = batch.verify_forward(trees)
    for key, tree in trees.items():
        alone = BatchTarget(ModelAdapter(target, trace=False))
        alone.join(key, prompts[key])
        _, own, _ = alone.verify_forward({key: tree})
        assert torch.equal(states[key], own[key]), key


@pytest.mark.parametrize("q_len", [1, 2, 5])
def test_float64_attention_gives_each_query_row_its_value_alone(q_len):
    """Grouped-query heads folded into rows (several query rows) or not: each query row's output equals
    the row attended alone, bit for bit, with holes in the mask and a strided cache as the int8 target has."""
    torch.manual_seed(q_len)
    batch, heads, groups, dim, length = 3, 6, 2, 16, 40
    query = torch.randn(batch, heads, q_len, dim)
    buffers = [torch.randn(batch, groups, 64, dim, dtype=torch.float64) for _ in range(2)]
    key, value = (b[:, :, :length] for b in buffers)  # views of larger buffers, as InPlaceLayer keeps them
    allowed = torch.rand(batch, 1, q_len, length) < 0.7
    allowed[..., -q_len:] = torch.eye(q_len, dtype=torch.bool)
    mask = torch.zeros(batch, 1, q_len, length, dtype=torch.float64).masked_fill_(
        ~allowed, torch.finfo(torch.float32).min)
    grouped = attend_float64(query, key, value, mask, 0.25)
    per_head = attend_float64(query, key, value, mask, 0.25, group_queries=False)
    assert grouped.shape == (batch, q_len, heads, dim)
    assert torch.equal(grouped, per_head)
    for i in range(q_len):
        alone = attend_float64(query[:, :, i: i + 1], key, value, mask[:, :, i: i + 1], 0.25)
        assert torch.equal(grouped[:, i], alone[:, 0]), i
    # a mask that differs per head is passed through per head
    head_mask = mask.expand(batch, heads, q_len, length).clone()
    head_mask[:, 0] = 0.0
    assert torch.equal(attend_float64(query, key, value, head_mask, 0.25),
                       attend_float64(query, key, value, head_mask, 0.25, group_queries=False))


def test_a_prefill_through_the_causal_flag_gives_each_row_its_value_alone():
    """A prefill from an empty cache (no mask, as many queries as keys) runs the kernel's causal flag: every
    row equals the same rows under an explicit causal mask and the row attended alone over its prefix, bit
    for bit, across the kernel's blocks (600 rows)."""
    torch.manual_seed(0)
    batch, heads, groups, dim, n = 2, 6, 2, 16, 600
    query = torch.randn(batch, heads, n, dim)
    key, value = (torch.randn(batch, groups, n, dim, dtype=torch.float64) for _ in range(2))
    flagged = float64_attention(None, query, key, value, None, 0.25)[0]
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    assert torch.equal(flagged, attend_float64(query, key, value, causal, 0.25))
    for i in (0, 1, 63, 64, 255, 256, 511, 512, n - 1):
        alone = attend_float64(query[:, :, i: i + 1], key[:, :, : i + 1], value[:, :, : i + 1], None, 0.25)
        assert torch.equal(flagged[:, i], alone[:, 0]), i


@pytest.mark.parametrize("onednn_from", [None, 2])
def test_int8_forward_is_bitwise_batch_invariant(int8_pair, monkeypatch, onednn_from):
    """Whole forwards = the same tokens in chunks, bit for bit; with `onednn_from` 2 (where the CPU has
    AMX), chunks of one token and of several run different kernels."""
    if onednn_from is not None:
        monkeypatch.setattr(int8_module, "ONEDNN_MIN_ROWS", onednn_from)
    target = int8_pair[0]
    assert target.config._attn_implementation == NAME
    ids = torch.tensor([[5, 17, 33, 8, 9, 40, 11, 12, 70, 3, 3, 60, 61, 62, 1, 44]])
    with torch.no_grad():
        whole = target.model(ids).last_hidden_state[0]
        from transformers import DynamicCache
        for cuts in ([4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [3, 10], [9]):
            cache, parts, start = DynamicCache(), [], 0
            for end in cuts + [16]:
                out = target.model(ids[:, start:end], **cache_kwargs(target.model, cache), use_cache=True)
                parts.append(out.last_hidden_state[0])
                start = end
            assert torch.equal(torch.cat(parts), whole), cuts


def test_int8_tree_forward_equals_plain_forwards_bitwise(int8_pair):
    """Every node's hidden state (and so its logits row) in a tree forward = a plain forward of its path."""
    target = int8_pair[0]
    adapter = ModelAdapter(target)
    adapter.capture_hidden(True)
    context = [5, 17, 33, 8, 9]
    adapter.prefill(torch.tensor(context[:-1]))
    tree = TokenTree.from_root(context[-1])
    a, b = tree.add(0, 40), tree.add(0, 41)
    c = tree.add(a, 42)
    tree.add(c, 43)
    tree.add(b, 44)
    logits = adapter.tree_forward(tree, lazy=True)
    hidden = adapter.last_hidden
    for node in range(tree.num_nodes):
        with torch.no_grad():
            plain = target.model(torch.tensor([context + tree.path_tokens(node)])).last_hidden_state[0, -1]
        assert torch.equal(hidden[node], plain), node
        assert torch.equal(logits[node], adapter.head.logits(plain[None])[0]), node


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dyspec", "specinfer", "sequoia"])
def test_sampling_with_an_int8_target_follows_its_distribution(small_vocab_pair, name):
    """The first two sampled tokens over 800 seeds follow the int8 target's own laws (chi-square, conftest;
    laws 0.1 away in total variation are rejected)."""
    target, draft = small_vocab_pair
    target = int8_copy(target)
    cfg = SamplingConfig(0.8, top_p=0.95)
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, budget=6))
    assert_first_two_follow(dec, target, [3, 7, 1, 12], cfg, 800, name, detects=0.1)


def test_int8_is_refused_off_cpu_and_bad_names_list_it(tmp_path):
    with pytest.raises(ArborError, match="int8"):
        parse_dtype("int9")
    with pytest.raises(ArborError, match="CPU only"):
        load_model(str(tmp_path), "cuda", "int8")
    with pytest.raises(ArborError, match="CPU only"):
        load_model(str(tmp_path), "cpu", "int8", device_map="auto")
    assert parse_dtype("int8") == torch.float32  # its activations, caches and drafts stay float32


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dyspec", "opt-tree"])
def test_embedded_int8_greedy_identity(embedded_int8_pair, method):
    """The embedded target in int8 with its draft head (int8 layer and logits, the CPU pair's default):
    DySpec and OPT-Tree = plain int8 decoding = HF generate of the int8 model, and trees are accepted."""
    from arborspec.common.chat import encode_prompt, eos_ids

    pair = embedded_int8_pair
    target = pair.target.model
    assert isinstance(target.model.layers[0].mlp.down_proj, Int8Linear)
    prompts = [encode_prompt(pair.tokenizer, p) for p in ("Explain in a few sentences why the sky is blue.",
                                                          "Write a Python function that reverses a string.")]
    assert_greedy_identical(target, pair.drafter, make_builder(method, budget=16), prompts, 40,
                            eos=eos_ids(pair.tokenizer, target), pad=pair.tokenizer.eos_token_id)


@pytest.fixture(scope="module")
def embedded_int8_pair():
    from arborspec.models import load_pair

    threads = torch.get_num_threads()
    torch.set_num_threads(MODEL_THREADS)  # a real model (conftest)
    yield load_pair("embedded", dtype="int8")
    torch.set_num_threads(threads)


@pytest.mark.slow  # torch.compile
def test_compiled_int8_target_keeps_greedy_identity():
    """`--compile` on the int8 target: the compiled decoder gives the eager int8 model's tokens, plain and tree.
    One decoder layer: dynamo compiles each layer's frames apart, so every layer adds compilation."""
    one_layer = tiny_llama(0, layers=1)
    target, draft = int8_copy(one_layer), perturbed_copy(one_layer, 1, 0.3)
    model = copy.deepcopy(target)
    cfg = DecodeConfig(max_new_tokens=12)
    eager = autoregressive_generate(ModelAdapter(target), PROMPTS[0], cfg).output_ids
    adapter = ModelAdapter(model)
    adapter.compile()
    assert autoregressive_generate(adapter, PROMPTS[0], cfg).output_ids == eager
    dec = SpeculativeDecoder(adapter, ModelDrafter(draft), make_builder("dyspec", budget=6))
    assert dec.generate(PROMPTS[0], cfg).output_ids == eager
