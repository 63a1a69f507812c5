"""A draft model's cut vocabulary (drafters/draft_vocab.py, drafters/model.py): logits exactly the full head's
inside the vocabulary and the request's own context tokens, -inf elsewhere; a new request starts from the cut
vocabulary again, and spawned drafters share nothing of each other's requests; greedy output = plain decoding
with float and int8 logits; sampled output keeps the target's law; the frequency ranking is exact on a small
reference text and cached."""

from __future__ import annotations

import json

import pytest
import torch
from arborspec.builders.registry import make_builder
from arborspec.drafters import ModelDrafter, draft_vocab
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.int8 import quantize_int8
from arborspec.engine.sampling import SamplingConfig

from conftest import assert_first_two_follow, char_tokenizer, perturbed_copy, tiny_llama

VOCAB = [t for t in range(96) if t % 3 != 1]  # two tokens in three of the tiny models' 96


def test_cut_logits_are_the_heads_inside_the_vocabulary_and_the_context(tiny_pair):
    target, draft = tiny_pair
    full, cut = ModelDrafter(draft), ModelDrafter(draft, vocab_ids=VOCAB)
    prompt = [1, 4, 7, 10, 30]  # 1, 4, 7 and 10 are outside VOCAB (30 is in it)
    reference = full.begin(prompt)
    logits = cut.begin(prompt)
    allowed = torch.zeros(96, dtype=torch.bool)
    allowed[VOCAB + prompt] = True  # the context's own tokens join the vocabulary for this request
    assert torch.isinf(logits[~allowed]).all() and (logits[~allowed] < 0).all()
    torch.testing.assert_close(logits[allowed], reference[allowed], rtol=1e-5, atol=1e-5)
    assert cut.draft_vocab_size == len(VOCAB)
    twin = cut.spawn()  # a new request: the cut vocabulary alone again
    assert torch.isinf(twin.begin([1, 30, 33])[4])
    assert not torch.isinf(cut.begin(prompt + [6, 13])[13])  # the first request keeps its own tokens
    cut.reset()
    assert torch.isinf(cut.begin([1, 30, 33])[4])


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("budget", [4, "auto"])
def test_greedy_output_with_a_cut_vocabulary_is_plain_decodings(tiny_pair, int8, budget):
    target, _ = tiny_pair
    draft = perturbed_copy(tiny_llama(0), 1, 0.3)
    if int8:
        gen = torch.Generator().manual_seed(1)
        draft = quantize_int8(draft, [torch.randint(3, 96, (40,), generator=gen) for _ in range(3)])
    cfg = DecodeConfig(max_new_tokens=32)
    steps = []
    for prompt in ([1, 17, 42, 8, 23], [1, 60, 61, 62, 60, 61], [1, 9, 27, 81, 9, 27]):
        expected = autoregressive_generate(ModelAdapter(target), prompt, cfg).output_ids
        drafter = ModelDrafter(draft, int8_logits=int8, vocab_ids=VOCAB)
        dec = SpeculativeDecoder(ModelAdapter(target), drafter, make_builder("dyspec", budget=budget), lookup=0)
        out = dec.generate(prompt, cfg)
        assert out.output_ids == expected
        steps += out.steps
    assert max(s.accepted_length for s in steps) > 1  # the draft's tokens were accepted


@pytest.mark.slow
def test_a_cut_vocabulary_keeps_the_target_law(small_vocab_pair):
    """Sampled DySpec trees from a draft that can propose 6 of 16 tokens (and the context's): the first two
    tokens follow the target's law."""
    target, draft = small_vocab_pair
    drafter = ModelDrafter(draft, vocab_ids=[0, 3, 5, 8, 11, 14])  # 1, 2 and 4 of the prompt join it
    dec = SpeculativeDecoder(ModelAdapter(target), drafter, make_builder("dyspec", budget=4), lookup=0)
    prompt = [1, 2, 4]
    assert_first_two_follow(dec, target, prompt, SamplingConfig(1.0), 900, "cut draft vocabulary", detects=0.1)


def test_the_frequency_ranking_is_exact_and_cached(tmp_path, monkeypatch):
    text = tmp_path / "ref.py"
    text.write_text("aab\nbb")  # a x2, b x3, newline x1
    monkeypatch.setattr(draft_vocab, "reference_files", lambda: [text])
    tok = char_tokenizer()
    ids = {c: tok.convert_tokens_to_ids(c) for c in "ab"}
    ranked = draft_vocab.ranked_tokens(tok, tmp_path / "cache")
    assert ranked[:2] == [ids["b"], ids["a"]]
    cached = list((tmp_path / "cache").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text()) == ranked
    text.write_text("zzzz")  # the cache is read, not the text again
    assert draft_vocab.ranked_tokens(tok, tmp_path / "cache") == ranked
    vocab = draft_vocab.frequent_tokens(tok, 1, tmp_path / "cache")
    assert ids["b"] in vocab and ids["a"] not in vocab
    assert set(tok.all_special_ids) <= set(vocab)
