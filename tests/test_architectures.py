"""The architectures people run, on tiny random configurations: greedy speculative output == plain
decoding == HF `generate` for every registered builder, with a draft model and with the n-gram
drafter (docs/algorithms.md §4).

Sliding-window models (Gemma 2, Gemma 3, Mistral with `sliding_window`, Qwen2 with
`use_sliding_window`) keep full cache layers and get the window through per-layer-type masks
(engine/attention_masks.py). Their window is WINDOW tokens, the prompts are longer and the
generations NEW tokens long, several windows, so that a mask or compaction error cannot hide; that
the window changes these outputs at all is checked too (the same weights without a window decode
differently). Tree rows of the target and of the draft equal plain forwards there, a compacted
cache equals a fresh prefill, and the int8 target (in-place cache layers) decodes like its own plain
decoding. Other layer types are refused in one line; Gemma 2 (no sdpa path) loads through
`models.load_model` with eager attention.
"""

from __future__ import annotations

import functools

import pytest
import torch
from arborspec.builders.registry import builder_names, make_builder
from arborspec.drafters import HeadDrafter, ModelDrafter, NgramDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.int8 import quantize_int8
from arborspec.engine.kv_cache import InPlaceLayer
from arborspec.engine.tree import TokenTree
from arborspec.errors import ArborError
from arborspec.models import attention_kernel, load_model
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from conftest import assert_greedy_identical, make_head, perturbed_copy

WINDOW = 6
NEW = 32  # new tokens: more than four windows
PROMPTS = ([5, 17, 33, 8, 9, 40, 11, 12, 13, 50], [3, 44, 45, 46, 44, 45, 46, 44, 45, 46, 44, 45])
VOCAB = 160
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
    initializer_range=0.3,  # logits far from ties (the default 0.02 gives near-flat rows)
)
ARCHS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "mistral": ("mistral", {"sliding_window": None}),
    "gemma": ("gemma", {"head_dim": 16}),
    "phi3": ("phi3", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", {}),
    "stablelm": ("stablelm", {}),
    "gpt2": ("gpt2", {"n_inner": 128}),
    "gpt-neox": ("gpt_neox", {}),
    "starcoder2": ("starcoder2", {}),
    "gemma2": ("gemma2", {"head_dim": 16, "sliding_window": WINDOW}),
    "gemma3": (
        "gemma3_text",
        {
            "head_dim": 16,
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        },
    ),
    "mistral-sliding": ("mistral", {"sliding_window": WINDOW}),
    "qwen2-sliding": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
}
SLIDING = [name for name, (_, kw) in ARCHS.items() if kw.get("sliding_window")]
# Random pairs are rarely confident enough for C2T's default threshold (tests/test_greedy_identity)
EXTRA = {name: {"classifier": "none", "beta": 0.05} for name in ("c2t", "c2t-chain")}
PROMPT = {"model": PROMPTS[0], "ngram": PROMPTS[1]}  # the repeating one gives the n-grams a match


def build(name: str, seed: int = 0, **over):
    """The tiny random model of architecture `name` (float32, eval mode), seeded."""
    model_type, kw = ARCHS[name]
    config = AutoConfig.for_model(model_type, **{**COMMON, **kw, **over})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@functools.cache
def target(name: str):
    return build(name)


@functools.cache
def draft(name: str):
    """A copy of the target with a little noise on every weight: of the same family and vocabulary,
    agreeing with the target on about half of its tokens, so that trees get accepted paths whose
    rows compaction moves (a draft of another seed agrees with a random target on almost none)."""
    return perturbed_copy(target(name), 1, 0.05)


def hf_generate(model, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=NEW,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def identity_cases() -> list:
    """Every architecture with either drafter; the full-attention ones marked slow."""
    return [
        pytest.param(name, drafter, marks=[] if name in SLIDING else [pytest.mark.slow])
        for name in ARCHS
        for drafter in ("model", "ngram")
    ]


@pytest.mark.parametrize("name,drafter", identity_cases())
def test_greedy_output_is_hf_generate_for_every_builder(name, drafter):
    model, prompt = target(name), PROMPT[drafter]
    assert len(set(hf_generate(model, prompt))) >= NEW // 4  # not degenerate: a mask error shows
    results = []
    for builder in builder_names():
        drafts = ModelDrafter(draft(name)) if drafter == "model" else NgramDrafter(VOCAB)
        results += assert_greedy_identical(
            model,
            drafts,
            make_builder(builder, budget=6, **EXTRA.get(builder, {})),
            [prompt],
            NEW,
            eos=(),
            helped=False,
        )
    steps = [s for r in results for s in r.steps]
    assert any(s.tree_size > 0 for s in steps)
    if drafter == "model":  # accepted paths: compaction moved rows
        assert max(s.accepted_length for s in steps) > 2


@pytest.mark.parametrize("name", SLIDING)
def test_a_draft_head_on_a_sliding_window_target(name):
    """A draft head (its one layer with full attention, whatever the target's last layer is) on a
    sliding-window target: greedy output = `generate`'s, and the head's cache is compacted like
    the target's."""
    model = target(name)
    head = make_head(model)
    assert getattr(head.body.config, "layer_types", None) in (None, ["full_attention"])
    for builder in ("dyspec", "opt-tree"):
        assert_greedy_identical(
            model,
            HeadDrafter(head),
            make_builder(builder, budget=6),
            [PROMPT["model"]],
            NEW,
            eos=(),
            helped=False,
        )


@pytest.mark.parametrize("name", SLIDING)
def test_the_window_changes_the_output(name):
    """The same weights with a window longer than the text decode differently: the window is
    exercised by these prompts and lengths, so an error in its mask would change the output."""
    wide = build(name, sliding_window=1024)
    for prompt in PROMPTS:
        assert hf_generate(wide, prompt) != hf_generate(target(name), prompt), prompt


def assert_caches_equal(ours: DynamicCache, fresh: DynamicCache) -> None:
    assert ours.get_seq_length() == fresh.get_seq_length()
    for mine, ref in zip(ours.layers, fresh.layers, strict=True):
        assert torch.allclose(mine.keys, ref.keys, atol=1e-4)
        assert torch.allclose(mine.values, ref.values, atol=1e-4)


def plain_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


def wide_tree(root: int) -> TokenTree:
    """Three children of the root and a chain of depth 4 under the first: nodes whose cache rows
    are not their positions (the draft's cache holds them after its earlier depths)."""
    tree = TokenTree.from_root(root)
    node = tree.add(0, 11)
    tree.add(0, 12)
    tree.add(0, 13)
    for token in (14, 15, 16):
        node = tree.add(node, token)
        tree.add(tree.parents[node], token + 10)
    return tree


@pytest.mark.parametrize("name", SLIDING)
def test_tree_rows_and_compaction_equal_plain_forwards(name):
    """Target: every tree node's logits = a plain forward of prefix + path; the compacted cache =
    a fresh prefill, and the next forward after it = a plain one. Draft: the depth-by-depth rows
    = plain forwards, and its cache after commit = a fresh prefill."""
    model = target(name)
    prefix = PROMPTS[0]
    tree = wide_tree(prefix[-1])
    lm = ModelAdapter(model)
    lm.prefill(torch.tensor(prefix[:-1]))
    past = lm.cache_len
    logits = lm.tree_forward(tree)
    for node in range(tree.num_nodes):
        want = plain_logits(model, prefix + tree.path_tokens(node))
        assert torch.allclose(logits[node], want, atol=1e-4), node
    deepest = max(range(tree.num_nodes), key=lambda n: tree.depths[n])
    path = tree.path_to(deepest)
    lm.compact(past + 1, [past + n for n in path])
    committed = prefix + tree.path_tokens(deepest)
    fresh = ModelAdapter(model)
    fresh.prefill(torch.tensor(committed))
    assert_caches_equal(lm.cache, fresh.cache)
    assert lm.positions.tolist() == list(range(len(committed)))
    after = lm.prefill(torch.tensor([7]))
    assert torch.allclose(after, plain_logits(model, committed + [7]), atol=1e-4)

    drafter = ModelDrafter(model)  # the target as its own draft: rows comparable to plain ones
    root = drafter.begin(prefix)
    assert torch.allclose(root, plain_logits(model, prefix), atol=1e-4)
    for depth in range(1, tree.depth + 1):
        nodes = [n for n in range(1, tree.num_nodes) if tree.depths[n] == depth]
        rows = drafter.expand(tree, nodes)
        for row, node in enumerate(nodes):
            want = plain_logits(model, prefix + tree.path_tokens(node))
            assert torch.allclose(rows[row], want, atol=1e-4), node
    assert drafter.lm.positions.tolist() != list(range(drafter.cache_len))  # rows != positions
    drafter.commit(tree, path)
    fresh = ModelAdapter(model)
    fresh.prefill(torch.tensor(committed))
    assert_caches_equal(drafter.lm.cache, fresh.cache)


@pytest.mark.parametrize("name", SLIDING)
def test_caches_after_a_generation_equal_a_fresh_prefill(name):
    model = target(name)
    dec = SpeculativeDecoder(
        ModelAdapter(model), ModelDrafter(draft(name)), make_builder("specinfer", budget=8)
    )
    prompt = PROMPTS[0]
    out = dec.generate(prompt, DecodeConfig(max_new_tokens=NEW)).output_ids
    committed = prompt + out
    for lm in (dec.target, dec.drafter.lm):
        n = lm.cache_len
        assert n >= len(committed) - 1
        fresh = ModelAdapter(lm.model)
        fresh.prefill(torch.tensor(committed[:n]))
        assert_caches_equal(lm.cache, fresh.cache)
        assert lm.positions.tolist() == list(range(n))


@pytest.mark.parametrize("name", SLIDING)
def test_features_along_a_sequence_see_the_window(name):
    """`features_along` (no cache, the model's own masks) = the adapter's hidden rows."""
    model = target(name)
    ids = PROMPTS[0] + hf_generate(model, PROMPTS[0])
    lm = ModelAdapter(model)
    assert torch.allclose(lm.features_along(ids), lm.hidden_forward(torch.tensor(ids)), atol=1e-5)


def test_int8_target_with_a_sliding_window():
    """The int8 target (float64 attention, in-place cache layers) of a sliding-window model: greedy
    speculative output = its plain decoding, features along a sequence = its hidden rows (its
    attention is unknown to transformers' mask builders: the adapter's masks carry the window)."""
    model = build("mistral-sliding")
    gen = torch.Generator().manual_seed(0)
    quantize_int8(model, [torch.randint(3, VOCAB, (40,), generator=gen) for _ in range(3)])
    lm = ModelAdapter(model)
    assert all(type(layer) is InPlaceLayer for layer in lm.cache.layers)
    prompt = PROMPTS[0]
    cfg = DecodeConfig(max_new_tokens=NEW)
    plain = autoregressive_generate(ModelAdapter(model), prompt, cfg).output_ids
    for builder in ("dyspec", "sequoia"):
        dec = SpeculativeDecoder(lm, ModelDrafter(draft("mistral-sliding")), make_builder(builder))
        assert dec.generate(prompt, cfg).output_ids == plain, builder
    ids = prompt + plain
    fresh = ModelAdapter(model)
    assert torch.equal(fresh.features_along(ids), fresh.hidden_forward(torch.tensor(ids)))


UNSUPPORTED = {
    "chunked_attention": (
        "llama4_text",
        dict(
            intermediate_size_mlp=128,
            num_local_experts=2,
            attention_chunk_size=4,
            interleave_moe_layer_step=1,
        ),
    ),
    "linear_attention (recurrent state)": ("mamba", dict(state_size=4)),
}


@pytest.mark.parametrize("what", list(UNSUPPORTED))
def test_other_layer_types_are_refused_in_one_line(what):
    model_type, kw = UNSUPPORTED[what]
    config = AutoConfig.for_model(model_type, **{**COMMON, **kw})
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ArborError) as err:
        ModelAdapter(model)
    assert what in str(err.value) and "\n" not in str(err.value)


def test_a_cache_layer_compaction_cannot_handle_is_refused():
    """transformers' sliding-window cache layer drops rows: a cache of them is caught after the
    first forward (the adapter's own caches keep full layers)."""
    lm = ModelAdapter(target("mistral-sliding"))
    lm.new_cache = lambda model: DynamicCache(config=model.config)
    lm.reset()
    with pytest.raises(ArborError, match="DynamicSlidingWindowLayer") as err:
        lm.prefill(torch.tensor(PROMPTS[0]))
    assert "\n" not in str(err.value)


def test_gemma2_loads_through_load_model_and_decodes(tmp_path):
    """Gemma 2 has no sdpa path (soft-capped attention logits): `load_model` picks eager, the LM
    head is left to the model (final logit soft-capping), greedy output = HF `generate`; int8 (its
    own attention, without soft-capping) is refused in one line."""
    build("gemma2").save_pretrained(tmp_path)
    assert attention_kernel(str(tmp_path)) == "eager"
    model = load_model(str(tmp_path))
    assert model.config._attn_implementation == "eager"
    assert model.config.attn_logit_softcapping and model.config.final_logit_softcapping
    lm = ModelAdapter(model)
    assert not lm.head.supported
    assert_greedy_identical(
        model, draft("gemma2"), make_builder("opt-tree", budget=6), [PROMPTS[0]], NEW, eos=()
    )
    with pytest.raises(ArborError, match="soft-capping") as err:
        load_model(str(tmp_path), dtype="int8")
    assert "\n" not in str(err.value)
