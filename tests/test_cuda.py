"""The engine on a CUDA GPU, where the CPU suite has no counterpart. (The CPU suite's device-independent
checks, greedy identity of every builder and drafter in every floating precision, tree logits,
compaction, `custom_generate`, the measured cost curve, take conftest's `device` and run on a GPU there.)

* tree logits (eager and on demand) = plain forwards along each node's path in float16 and bfloat16,
  within a tolerance for the dtype that still tells sibling paths apart; compaction = a fresh prefill,
  also after whole generations (greedy and sampled, with lookup);
* `model.generate(custom_generate=arborspec.generate)` = `model.generate` in float16 and bfloat16;
* the batch decoder and `arborspec serve`'s service on a float32 target (the CPU suite runs them on int8);
* the real embedded pair (SmolLM2-135M-Instruct and its shipped draft head) with the device's
  defaults, float32 and float16: greedy output = plain decoding = HF `generate` on MT-Bench-like
  prompts.

Greedy identity in float16 and bfloat16 allows one thing a float32 run does not: two outputs may
part at a rounding tie, a token whose two candidates' logits lie within the dtype's tolerance (a
tree forward and a one-row forward round differently; an exact float16 tie is decided either way).
Such a tie is reported as a warning with its logits, and each test bounds how many of its
generations may end at one (conftest `same_tokens`); any other difference fails with both tokens'
logits.

Every test runs on `ARBORSPEC_TEST_DEVICE` (default "cuda") and is skipped when that device is
missing; `ARBORSPEC_TEST_DEVICE=cpu` runs the same checks on a CPU.
"""

from __future__ import annotations

import functools
import os

import arborspec
import pytest
import torch
from arborspec.builders.registry import make_builder
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.tree import TokenTree

from conftest import EOS, GREEDY_PROMPTS, perturbed_copy, row_logits, same_tokens, tiny_llama, tolerance

DEVICE = os.environ.get("ARBORSPEC_TEST_DEVICE", "cuda")


def _missing(device: str) -> str | None:
    """Why `device` cannot run the tests here (None: it can)."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        return f"ARBORSPEC_TEST_DEVICE={device!r} is not a torch device"
    if kind == "cuda" and not torch.cuda.is_available():
        return "no CUDA GPU visible (set ARBORSPEC_TEST_DEVICE=cpu to run these checks on the CPU)"
    if kind not in ("cpu", "cuda"):
        return f"ARBORSPEC_TEST_DEVICE={device!r}: only cpu and cuda are supported"
    return None


pytestmark = [pytest.mark.cuda, pytest.mark.skipif(_missing(DEVICE) is not None,
                                                   reason=_missing(DEVICE) or "")]

HALF = ("float16", "bfloat16")
NEW = 24


def dev() -> torch.device:
    return torch.device(DEVICE)


@functools.cache
def tiny_target(dtype: str):
    """`tiny_pair`'s target (conftest) on the device in `dtype`."""
    return tiny_llama(0).to(dev(), getattr(torch, dtype))


@functools.cache
def tiny_draft(dtype: str):
    """A perturbed copy of the target that often agrees with it, on the device in `dtype`."""
    return perturbed_copy(tiny_llama(0), 1, 0.3).to(dev(), getattr(torch, dtype))


_PLAIN: dict = {}


def plain(model, prompt, new: int = NEW, eos=EOS) -> list[int]:
    """Plain greedy decoding through the adapter on the device (once per model, prompt, length)."""
    key = (id(model), tuple(prompt), new, tuple(eos))
    if key not in _PLAIN:
        cfg = DecodeConfig(max_new_tokens=new, eos_token_ids=tuple(eos))
        _PLAIN[key] = autoregressive_generate(ModelAdapter(model), list(prompt), cfg).output_ids
    return list(_PLAIN[key])


def hf_greedy(model, prompt, new: int, eos=EOS, pad: int = 0) -> list[int]:
    ids = torch.tensor([list(prompt)], device=dev())
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                             eos_token_id=list(eos), pad_token_id=pad)
    assert out.device.type == dev().type
    return out[0, len(prompt):].tolist()


# --------------------------------------------------------------------------- half precision: tree logits, compaction
def small_tree(root: int) -> tuple[TokenTree, list[int]]:
    """root -> {11 -> {13 -> 41, 14}, 12 -> 40, 15}: siblings at every depth. Returns the tree and the
    nodes at depth 1 and 2."""
    tree = TokenTree.from_root(root)
    a, b, e = tree.add(0, 11), tree.add(0, 12), tree.add(0, 15)
    c, d = tree.add(a, 13), tree.add(a, 14)
    f = tree.add(b, 40)
    tree.add(c, 41)
    return tree, [a, b, e, c, d, f]


@pytest.mark.parametrize("dtype", HALF)
def test_tree_logits_equal_plain_forwards(dtype):
    model = tiny_target(dtype)
    prefix = [3, 14, 15, 9, 26, 5, 35, 8]
    tree, siblings = small_tree(prefix[-1])
    refs = [row_logits(model, prefix + tree.path_tokens(n)) for n in range(tree.num_nodes)]
    for lazy in (False, True):
        lm = ModelAdapter(model)
        lm.prefill(torch.tensor(prefix[:-1]))
        logits = lm.tree_forward(tree, lazy=lazy)
        for node in range(tree.num_nodes):
            row = logits[node].float().cpu()
            err = float((row - refs[node]).abs().max())
            assert err <= tolerance(dtype, refs[node]), (dtype, lazy, node, err)
    # the tolerance tells paths apart: a node's row against its siblings' and cousins' plain rows
    for i, u in enumerate(siblings):
        for v in siblings[i + 1:]:
            if tree.depths[u] == tree.depths[v]:
                gap = float((refs[u] - refs[v]).abs().max())
                assert gap > 10 * tolerance(dtype, refs[u]), (dtype, u, v, gap)


def cache_rows(cache, rows: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys[:, :, :rows].float().cpu(), layer.values[:, :, :rows].float().cpu())
            for layer in cache.layers]


def assert_caches_close(c1, c2, dtype: str, rows: int | None = None) -> None:
    """Equal lengths (or c1 holds at least `rows`) and keys/values within the dtype's tolerance."""
    if rows is None:
        assert c1.get_seq_length() == c2.get_seq_length()
    rows = rows or c2.get_seq_length()
    assert c1.get_seq_length() >= rows and c2.get_seq_length() == rows
    for (k1, v1), (k2, v2) in zip(cache_rows(c1, rows), cache_rows(c2)):
        assert float((k1 - k2).abs().max()) <= tolerance(dtype, k2)
        assert float((v1 - v2).abs().max()) <= tolerance(dtype, v2)


@pytest.mark.parametrize("dtype", HALF)
def test_compaction_equals_a_fresh_prefill(dtype):
    """Prefill 1 2 3 4, verify the tree 5 -> {6 -> 8 -> 9, 7}, keep the root and nodes 6, 8: the cache
    equals a fresh prefill of 1 2 3 4 5 6 8 and not one of 1 2 3 4 5 7 8 (the dropped sibling)."""
    model = tiny_target(dtype)
    lm = ModelAdapter(model)
    lm.prefill(torch.tensor([1, 2, 3, 4]))
    tree = TokenTree.from_root(5)
    a = tree.add(0, 6)
    tree.add(0, 7)
    c = tree.add(a, 8)
    tree.add(c, 9)
    lm.tree_forward(tree)
    lm.compact(4 + 1, [4 + a, 4 + c])
    assert {layer.keys.device.type for layer in lm.cache.layers} == {dev().type}

    def fresh(ids):
        out = ModelAdapter(model)
        out.prefill(torch.tensor(ids))
        return out.cache

    assert_caches_close(lm.cache, fresh([1, 2, 3, 4, 5, 6, 8]), dtype)
    with pytest.raises(AssertionError):
        assert_caches_close(lm.cache, fresh([1, 2, 3, 4, 5, 7, 8]), dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_caches_equal_a_fresh_prefill_after_generations(dtype):
    """After whole speculative generations (greedy and sampled, with lookup), target and draft caches =
    a fresh prefill of the committed tokens; some steps kept several nodes (compaction moved rows), and
    the sampled trees had grafted nodes."""
    from arborspec.engine.sampling import SamplingConfig

    model, draft = tiny_target(dtype), tiny_draft(dtype)
    kept, sampled_grafts = [], 0
    for name, params in [("sequoia", dict(shape=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])),
                         ("dyspec", dict(budget=16))]:
        for prompt, temperature in [(GREEDY_PROMPTS[0], 1.0), (GREEDY_PROMPTS[1], 0.0), (GREEDY_PROMPTS[1], 1.0)]:
            dec = SpeculativeDecoder(ModelAdapter(model), ModelDrafter(draft), make_builder(name, **params),
                                     lookup=6)
            res = dec.generate(list(prompt), DecodeConfig(max_new_tokens=30, seed=3,
                                                          sampling=SamplingConfig(temperature)))
            assert len(res.steps) > 3
            kept += [s.accepted_length - 1 for s in res.steps]
            if temperature > 0:  # the rejection verifiers judge grafted nodes as point masses
                sampled_grafts += sum(s.lookup_nodes for s in res.steps)
            committed = list(prompt) + res.output_ids
            fresh_t = ModelAdapter(model)
            fresh_t.prefill(torch.tensor(committed[:-1]))
            assert_caches_close(dec.target.cache, fresh_t.cache, dtype, rows=len(committed) - 1)
            n = dec.drafter.lm.cache_len
            assert n >= len(prompt)
            fresh_d = ModelAdapter(draft)
            fresh_d.prefill(torch.tensor(committed[:n]))
            assert_caches_close(dec.drafter.lm.cache, fresh_d.cache, dtype)
    assert max(kept) >= 2, kept
    assert sampled_grafts > 0  # sampled trees got lookup nodes too


# --------------------------------------------------------------------------- half precision: custom_generate
CG_PROMPT = [5, 17, 33, 42, 9, 40, 17, 33]


def hf_ids(model, prompt=CG_PROMPT, new: int = 32, **kw) -> torch.Tensor:
    ids = torch.tensor([prompt], device=dev())
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0,
                              max_new_tokens=new, **kw)


@pytest.mark.parametrize("dtype", HALF)
def test_custom_generate_in_half_precision(dtype):
    """Two prompts x two methods, 16 new tokens: in half precision a generation may end at a rounding tie
    (`same_tokens`), and both methods may meet the same one, so the bound is that not every generation ends at
    a tie. (Over longer answers a bfloat16 cache filled by tree forwards drifts from one filled row by row by
    more than one forward's tolerance: on an H200, 0.34 in a logit of 4 after 26 tokens.)"""
    model = tiny_target(dtype)
    ties = 0
    for prompt in (CG_PROMPT, list(GREEDY_PROMPTS[1])):
        want = hf_ids(model, prompt, 16)
        for method in ("dyspec", "chain"):
            out = hf_ids(model, prompt, 16, custom_generate=arborspec.generate, method=method,
                         draft=tiny_draft(dtype))
            assert out.device == want.device
            ties += same_tokens(model, prompt, out[0, len(prompt):].tolist(), want[0, len(prompt):].tolist(),
                                f"{dtype} {method} {prompt}")
    assert ties < 4, "every generation ends at a rounding tie"


# --------------------------------------------------------------------------- float32: batches and the server
def test_batched_greedy_equals_each_request_alone():
    """The batch decoder on the device, float32: speculative and plain requests in one batch, each request's
    greedy output = plain decoding of its prompt alone."""
    from arborspec.engine.batch_decode import BatchDecoder, BatchRequest

    model = tiny_target("float32")
    dec = BatchDecoder(ModelAdapter(model), ModelDrafter(tiny_draft("float32")))
    cfg = DecodeConfig(max_new_tokens=NEW, eos_token_ids=tuple(EOS))
    handles = [dec.submit(BatchRequest(list(p), cfg, make_builder("dyspec", budget=8) if i % 2 == 0 else None,
                                       lookup=4 if i == 0 else 0))
               for i, p in enumerate(GREEDY_PROMPTS)]
    dec.run()
    for prompt, handle in zip(GREEDY_PROMPTS, handles):
        same_tokens(model, prompt, handle.result.output_ids, plain(model, prompt), f"batched {prompt}")
    assert dec.target.rows.cache is None  # every request left and gave its rows back


def test_the_server_answers_from_the_device():
    """`arborspec serve`'s service on the device (float32 tiny pair): at temperature 0 the streamed and the
    non-streamed answers are plain decoding's text."""
    import openai
    from arborspec import SpeculativeGenerator
    from arborspec.serve import ServeConfig, Service

    from conftest import char_tokenizer
    from test_serve import start

    model = tiny_target("float32")
    gen = SpeculativeGenerator.from_models(model, char_tokenizer(), draft=tiny_draft("float32"), method="dyspec",
                                           budget=8, lookup=4)
    server = start(Service(ServeConfig(model_name="tiny", default_max_tokens=NEW), gen))
    try:
        client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
        for text in ("Hello, GPU.", "abcabcabc abc"):
            ids = gen.tokenizer(text)["input_ids"]
            want = gen.tokenizer.decode(plain(model, ids, NEW, (gen.tokenizer.eos_token_id,)), skip_special_tokens=True)
            ask = dict(model="tiny", messages=[{"role": "user", "content": text}], temperature=0, max_tokens=NEW)
            reply = client.chat.completions.create(**ask)
            assert reply.choices[0].message.content == want and reply.model_extra["arborspec"]["speculative"]
            streamed = "".join(c.choices[0].delta.content or "" for c in
                               client.chat.completions.create(stream=True, **ask) if c.choices)
            assert streamed == want
    finally:
        server.stop()


# --------------------------------------------------------------------------- the embedded pair
# MT-Bench-like first turns: writing, coding, reasoning
EMBEDDED_PROMPTS = [
    "Draft a professional email seeking your supervisor's feedback on the quarterly financial report "
    "you prepared. Keep it short and to the point.",
    "Write a Python function that finds the common elements of two lists without using any extra "
    "data structures, and explain how it works.",
]
# 64 new tokens on a GPU; 24 on a CPU, where float16 matrix products are slow
EMBEDDED_NEW = 64 if DEVICE.startswith("cuda") else 24
_EMBEDDED_PLAIN: dict = {}


def embedded_plain(dtype: str, gen, text: str):
    """Plain decoding of `text` by the embedded target (once per precision and prompt)."""
    if (dtype, text) not in _EMBEDDED_PLAIN:
        _EMBEDDED_PLAIN[dtype, text] = gen.generate_autoregressive(text, max_new_tokens=EMBEDDED_NEW)
    return _EMBEDDED_PLAIN[dtype, text]


def _embedded_missing() -> str | None:
    """Why the embedded model cannot be loaded here (None: it can: converted, or its GGUF to convert)."""
    from arborspec.catalog import BUILTIN_DIRS, EMBEDDED_TARGET, cache_root, embedded_gguf_path
    from arborspec.common.gguf import is_converted
    from arborspec.errors import ArborError

    folder = cache_root() / BUILTIN_DIRS[EMBEDDED_TARGET]
    if is_converted(folder):
        return None
    try:
        embedded_gguf_path()
    except ArborError as exc:
        return (f"the embedded model is not available: no converted directory {folder} "
                f"($ARBORSPEC_CACHE) and no GGUF to convert ({exc})")
    return None


@pytest.fixture(scope="module", params=["float32", "float16"])
def embedded(request):
    """The embedded pair with the device's defaults (method, tree size, lookup, its shipped draft head)
    in the precision asked for."""
    why = _embedded_missing()
    if why:
        pytest.skip(why)
    from arborspec import SpeculativeGenerator

    gen = SpeculativeGenerator(device=DEVICE, dtype=request.param)
    yield request.param, gen
    del gen
    if dev().type == "cuda":
        torch.cuda.empty_cache()


@pytest.mark.slow  # the embedded model
def test_embedded_pair_runs_the_device_defaults(embedded):
    from arborspec.defaults import choose

    dtype, gen = embedded
    want = choose(DEVICE, True)
    assert (gen.settings.method, gen.settings.budget, gen.settings.lookup) == (want.method, want.budget,
                                                                               want.lookup)
    assert gen.pair.draft_name == "embedded-head" and gen.pair.precision == dtype
    assert gen.pair.target.device.type == dev().type
    assert {p.device.type for p in gen.pair.drafter.head.parameters()} == {dev().type}


@pytest.mark.slow  # the embedded model
def test_embedded_greedy_equals_plain_decoding(embedded):
    dtype, gen = embedded
    accepted, ties = [], 0
    for text in EMBEDDED_PROMPTS:
        spec = gen.generate(text, max_new_tokens=EMBEDDED_NEW)
        base = embedded_plain(dtype, gen, text)
        assert len(base.output_ids) > 16, (dtype, text, base.text)
        tied = same_tokens(gen.pair.target.model, list(spec.prompt_ids), spec.output_ids, base.output_ids,
                           f"{dtype} {text[:40]!r}")
        assert tied or spec.text == base.text
        ties += tied
        assert sum(s.accepted_length for s in spec.steps) == len(spec.output_ids)
        accepted.append(spec.mean_accepted_length)
    assert ties < len(EMBEDDED_PROMPTS), f"every prompt ends at a {dtype} rounding tie"
    assert max(accepted) > 1.5, (dtype, accepted)  # the shipped head's drafts are accepted


@pytest.mark.slow  # the embedded model
def test_embedded_plain_decoding_is_hf_generate(embedded):
    from arborspec.api import encode_prompt, eos_ids

    dtype, gen = embedded
    model, tok = gen.pair.target.model, gen.tokenizer
    eos = eos_ids(tok, model)
    ties = 0
    for text in EMBEDDED_PROMPTS:
        ids = encode_prompt(tok, text)
        got = embedded_plain(dtype, gen, text).output_ids
        want = hf_greedy(model, ids, EMBEDDED_NEW, eos=eos, pad=tok.eos_token_id)
        ties += same_tokens(model, ids, got, want, f"{dtype} {text[:40]!r}")
    assert ties < len(EMBEDDED_PROMPTS), f"every prompt ends at a {dtype} rounding tie"
