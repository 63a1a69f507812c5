"""`model.generate(..., custom_generate=arborspec.generate)` and models the caller loaded.

Greedy output = `model.generate`'s for every builder, with and without processors that change the
target's law (repetition penalty, banned n-grams, a minimum length); sampled output follows
`generate`'s processed law (Monte-Carlo on a 16-token vocabulary); streamers receive exactly the
decoded output once; stop strings cut where `generate` cuts; `from_models` = loading by name; the
caller's model is left as it was; what cannot be honoured is refused in one line.
"""

from __future__ import annotations

import threading

import arborspec
import pytest
import torch
from arborspec import ArborError, SpeculativeGenerator
from arborspec.builders import builder_names
from arborspec.models import HEAD_BESIDE_MODEL, default_draft_for
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteriaList,
    StopStringCriteria,
    TextIteratorStreamer,
    TextStreamer,
    TopPLogitsWarper,
)

from conftest import (
    FALSE_ALARM,
    assert_departs,
    assert_follows,
    char_tokenizer,
    on_device,
    perturbed_copy,
    tiny_llama,
)

PROMPT = torch.tensor([[5, 17, 33, 2 + 40, 9, 40, 17, 33]])
# builder parameters a builder needs on tiny models (C2T without a trained classifier)
PARAMS = {name: {"classifier": "none", "beta": 0.05} for name in ("c2t", "c2t-chain")}
PROCESSORS = {
    "plain": {},
    "repetition": {"repetition_penalty": 1.4},
    "no-repeat": {"no_repeat_ngram_size": 2},
    "all": {"repetition_penalty": 1.2, "no_repeat_ngram_size": 3, "min_new_tokens": 20},
}


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0)
    return target, perturbed_copy(target, 1, 0.3)


def hf(model, ids=PROMPT, **kw):
    with torch.no_grad():
        return model.generate(ids, do_sample=False, pad_token_id=0, **kw)


def spec(model, ids=PROMPT, method="dyspec", **kw):
    return hf(
        model,
        ids,
        custom_generate=arborspec.generate,
        method=method,
        builder_params=PARAMS.get(method),
        **kw,
    )


# --------------------------------------------------------------------------- greedy identity
@pytest.mark.parametrize("processors", PROCESSORS)
@pytest.mark.parametrize("method", builder_names())
def test_greedy_equals_generate_for_every_builder(pair, method, processors, device):
    target, draft = (on_device(model, device) for model in pair)
    kw = dict(max_new_tokens=32, **PROCESSORS[processors])
    ids = PROMPT.to(device)
    want = hf(target, ids, **kw)
    assert want.device == ids.device
    for d in (draft, "ngram"):
        out = spec(target, ids, method=method, draft=d, budget=6, **kw)
        assert torch.equal(out, want), (method, processors, d if isinstance(d, str) else "model")


def test_processors_change_the_greedy_output(pair):
    """The identity above is not vacuous: each processor set changes what `generate` gives, and
    the speculative route follows the change."""
    target, _ = pair
    plain = hf(target, max_new_tokens=32)
    for name, kw in PROCESSORS.items():
        if name != "plain":
            assert not torch.equal(hf(target, max_new_tokens=32, **kw), plain), name


def test_greedy_with_lookup_and_processors(pair):
    target, draft = pair
    kw = dict(max_new_tokens=40, repetition_penalty=1.3, no_repeat_ngram_size=3)
    assert torch.equal(spec(target, draft="ngram", lookup=5, budget=4, **kw), hf(target, **kw))


# --------------------------------------------------------------------------- sampled law
N_RUNS = 900
SAMPLED_PROMPT = [3, 7, 1, 12, 3, 7]


def processed_law(target, processors, prompt):
    """Exact joint law of the first two tokens under `processors` (what `generate` samples)."""
    vocab = target.config.vocab_size
    with torch.no_grad():

        def probs(ids):
            row = target(torch.tensor([ids])).logits[0, -1:].float()
            return processors(torch.tensor([ids]), row).softmax(-1)[0]

        p1 = probs(prompt)
        return torch.stack([p1[t] * probs(prompt + [t]) for t in range(vocab)])  # [V, V]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dyspec", "specinfer", "opt-tree"])
def test_sampling_follows_the_processed_law(method):
    """With a minimum length, a repetition penalty and top-p, the first two sampled tokens follow
    `generate`'s processed joint law (one check per builder kind: without replacement, with
    replacement, selected); the law without the penalty is rejected by the same samples (the test
    can tell)."""
    target = tiny_llama(5, vocab=16, hidden=32, init=0.4)
    draft = perturbed_copy(target, 6, 0.3)
    no_eos = MinNewTokensLengthLogitsProcessor(len(SAMPLED_PROMPT), 2, eos_token_id=2)
    law = processed_law(
        target,
        LogitsProcessorList(
            [no_eos, RepetitionPenaltyLogitsProcessor(1.6), TopPLogitsWarper(0.85)]
        ),
        SAMPLED_PROMPT,
    )
    counts = torch.zeros(16, 16)
    ids = torch.tensor([SAMPLED_PROMPT])
    for seed in range(N_RUNS):
        out = target.generate(
            ids,
            do_sample=True,
            top_k=0,
            top_p=0.85,
            repetition_penalty=1.6,
            max_new_tokens=2,
            min_new_tokens=2,
            pad_token_id=0,
            custom_generate=arborspec.generate,
            draft=draft,
            method=method,
            budget=6,
            seed=seed,
        )
        t1, t2 = out[0, -2:].tolist()
        counts[t1, t2] += 1
    assert_follows(counts, law, FALSE_ALARM, method, detects=0.08)
    unpenalised = processed_law(
        target, LogitsProcessorList([no_eos, TopPLogitsWarper(0.85)]), SAMPLED_PROMPT
    )
    assert_departs(counts, unpenalised, FALSE_ALARM, f"{method} without the penalty")


# --------------------------------------------------------------------------- streamers, stops
@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def test_text_iterator_streamer_yields_the_output_once(pair, tok):
    target, draft = pair
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    result = {}

    def run():
        result["out"] = spec(target, draft=draft, budget=6, max_new_tokens=40, streamer=streamer)

    thread = threading.Thread(target=run)
    thread.start()
    text = "".join(streamer)
    thread.join(timeout=60)
    new = result["out"][0, PROMPT.shape[1] :]
    assert text == tok.decode(new, skip_special_tokens=True)
    assert len(text) > 10


def test_text_streamer_prints_the_output(pair, tok, capsys):
    target, _ = pair
    out = spec(target, draft="ngram", max_new_tokens=30, streamer=TextStreamer(tok, skip_prompt=True))
    printed = capsys.readouterr().out
    assert printed == tok.decode(out[0, PROMPT.shape[1] :], skip_special_tokens=True) + "\n"


def test_stop_strings_cut_where_generate_cuts(pair, tok):
    target, draft = pair
    full = hf(target, max_new_tokens=40)[0, PROMPT.shape[1] :]
    text = tok.decode(full)
    stop = text[14:16]  # a string the greedy output reaches mid-way
    want = hf(target, max_new_tokens=40, stop_strings=[stop], tokenizer=tok)
    assert want.shape[1] < PROMPT.shape[1] + 40
    criteria = StoppingCriteriaList([StopStringCriteria(tok, [stop])])
    for d in (draft, "ngram"):
        out = spec(target, draft=d, budget=8, max_new_tokens=40, stopping_criteria=criteria)
        assert torch.equal(out, want)


def test_eos_list_and_return_dict(pair):
    target, draft = pair
    full = hf(target, max_new_tokens=30)[0, PROMPT.shape[1] :].tolist()
    eos = [full[9], 95]
    want = hf(target, max_new_tokens=30, eos_token_id=eos)
    out = spec(target, draft=draft, max_new_tokens=30, eos_token_id=eos, return_dict_in_generate=True)
    assert isinstance(out, arborspec.ArborspecGenerateOutput)
    cut = full.index(eos[0]) + 1
    assert torch.equal(out.sequences, want) and want.shape[1] == PROMPT.shape[1] + cut
    stats = out.arborspec
    assert stats.output_ids == want[0, PROMPT.shape[1] :].tolist() and stats.stop_reason == "eos"
    assert sum(s.accepted_length for s in stats.steps) == cut


def test_left_padding_is_dropped(pair):
    target, draft = pair
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), PROMPT], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(PROMPT)], dim=1)
    out = spec(target, padded, draft=draft, attention_mask=mask, max_new_tokens=20)
    assert torch.equal(out[:, :3], padded[:, :3])
    assert torch.equal(out[:, 3:], hf(target, max_new_tokens=20))


# --------------------------------------------------------------------------- refusals
class Custom(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(num_beams=2), "beam search"),
        (dict(num_return_sequences=2, do_sample=True), "several sequences"),
        (dict(output_scores=True, return_dict_in_generate=True), "scores"),
        (dict(logits_processor=LogitsProcessorList([Custom()])), "Custom"),
    ],
)
def test_what_cannot_be_honoured_is_refused_in_one_line(pair, kw, words):
    target, _ = pair
    with pytest.raises(ArborError) as err:
        target.generate(
            PROMPT,
            max_new_tokens=4,
            pad_token_id=0,
            custom_generate=arborspec.generate,
            draft="ngram",
            **kw,
        )
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("processors", ["plain", "repetition", "no-repeat"])
def test_a_left_padded_batch_is_decoded_together_row_by_row_as_alone(pair, processors):
    """A batch of three prompts of different lengths (left padding): each row's new tokens = `generate` of that
    prompt alone, padded after its end with the pad token; `arborspec` holds the rows' results."""
    target, draft = pair
    rows = [PROMPT[0].tolist(), [60, 61, 62, 60, 61], [88, 7, 9]]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    kw = dict(max_new_tokens=12, eos_token_id=[2, 77], **PROCESSORS[processors])
    out = spec(target, ids, draft=draft, attention_mask=mask, return_dict_in_generate=True, **kw)
    alone = [hf(target, torch.tensor([r]), **kw)[0, len(r):].tolist() for r in rows]
    assert torch.equal(out.sequences[:, :width], ids)
    longest = max(map(len, alone))
    assert out.sequences[:, width:].tolist() == [a + [0] * (longest - len(a)) for a in alone]
    assert [r.output_ids for r in out.arborspec] == alone


def test_length_processors_on_a_padded_batch_are_refused_in_one_line(pair):
    target, _ = pair
    ids = torch.tensor([[0, 0, 5, 17], [60, 61, 62, 63]])
    mask = (ids != 0).long()
    with pytest.raises(ArborError, match="padded length"):
        spec(target, ids, draft="ngram", attention_mask=mask, max_new_tokens=6, min_new_tokens=3)


# --------------------------------------------------------------------------- the caller's model
def fingerprint(model):
    """Everything arborspec could have changed on a model: weights, module types, attention
    implementation, hooks, compiled forwards."""
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [type(m).__name__ for m in model.modules()],
        model.config._attn_implementation,
        sum(
            len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
            for m in model.modules()
        ),
        [type(m.forward).__name__ for m in model.modules()],
        model.generation_config.to_dict(),
    )


def test_the_callers_model_is_left_as_it_was(pair, trained_head, head_target):
    target, draft = pair
    before, plain = fingerprint(target), hf(target, max_new_tokens=24, repetition_penalty=1.2)
    spec(target, draft=draft, max_new_tokens=24, repetition_penalty=1.2)
    spec(target, draft="ngram", lookup=4, max_new_tokens=24)
    after = fingerprint(target)
    weights, rest = before[0], before[1:]
    assert weights.keys() == after[0].keys()
    assert all(torch.equal(weights[k], after[0][k]) for k in weights)
    assert rest == after[1:]
    assert torch.equal(hf(target, max_new_tokens=24, repetition_penalty=1.2), plain)
    # a draft head reads the target's features through a hook while it runs: none is left after
    before = fingerprint(head_target)
    spec(head_target, draft=trained_head[0], max_new_tokens=16)
    assert fingerprint(head_target)[3] == before[3] == 0


# --------------------------------------------------------------------------- loaded objects
def test_from_models_equals_loading_by_name(pair, tok, tmp_path):
    target, _ = pair
    target.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    by_name = SpeculativeGenerator(
        target=str(tmp_path), draft="ngram", dtype="float32", method="dyspec", budget=6
    )
    loaded = SpeculativeGenerator.from_models(target, tok, draft="ngram", method="dyspec", budget=6)
    first, second = loaded.describe().split(" | "), by_name.describe().split(" | ")
    assert first[0] == second[0] and first[2:] == second[2:]
    for prompt in ("abcabcab", "hello hello"):
        a = by_name.generate(prompt, max_new_tokens=30, chat=False)
        b = loaded.generate(prompt, max_new_tokens=30, chat=False)
        assert a.output_ids == b.output_ids and a.text == b.text


def test_from_models_takes_a_loaded_draft_and_checks_it(pair, tok):
    target, draft = pair
    gen = SpeculativeGenerator.from_models(target, tok, draft=draft, draft_tokenizer=tok, budget=6)
    ref = gen.generate_autoregressive([5, 17, 33, 9], max_new_tokens=24)
    out = gen.generate([5, 17, 33, 9], max_new_tokens=24)
    assert out.output_ids == ref.output_ids and out.mean_accepted_length > 1
    other = tiny_llama(3, vocab=64)
    with pytest.raises(ArborError, match="vocabulary of 64 tokens"):
        SpeculativeGenerator.from_models(target, tok, draft=other)
    with pytest.raises(ArborError, match="expected a loaded Hugging Face causal LM"):
        SpeculativeGenerator.from_models("not a model", tok)
    with pytest.raises(ArborError, match="needs the target's tokenizer"):
        SpeculativeGenerator.from_models(target, None, draft="ngram").generate("text")


def test_default_draft_is_a_head_beside_the_model(pair, tmp_path):
    target, _ = pair
    target.save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert default_draft_for(loaded) == "ngram"
    (tmp_path / HEAD_BESIDE_MODEL).mkdir()
    (tmp_path / HEAD_BESIDE_MODEL / "head.json").write_text("{}")
    assert default_draft_for(loaded) == str(tmp_path / HEAD_BESIDE_MODEL)


# --------------------------------------------------------------------------- the embedded target
@pytest.fixture(scope="module")
def embedded():
    from arborspec.catalog import embedded_target_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_target_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


@pytest.mark.slow
def test_embedded_target_through_generate(embedded):
    """The embedded model loaded by the user: its default draft is the shipped head, and greedy
    output = `generate`'s for every builder, with and without a repetition penalty and banned
    n-grams."""
    model, tok = embedded
    assert default_draft_for(model) == "embedded-head"
    messages = [{"role": "user", "content": "List three uses of copper, briefly."}]
    inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True)
    for kw in ({}, {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}):
        want = model.generate(**inputs, max_new_tokens=24, do_sample=False, **kw)
        for method in builder_names():
            out = model.generate(**inputs, max_new_tokens=24, do_sample=False, **kw,
                                 custom_generate=arborspec.generate, method=method,
                                 builder_params=PARAMS.get(method))
            assert torch.equal(out, want), (method, kw)


@pytest.mark.slow
def test_embedded_from_models_equals_loading_by_name(embedded):
    model, tok = embedded
    by_name = SpeculativeGenerator(dtype="float32")
    loaded = SpeculativeGenerator.from_models(model, tok)
    assert loaded.settings == by_name.settings
    assert loaded.pair.draft_name == by_name.pair.draft_name == "embedded-head"
    prompt = "Name two planets."
    a, b = by_name.generate(prompt, max_new_tokens=32), loaded.generate(prompt, max_new_tokens=32)
    assert a.output_ids == b.output_ids and a.text == b.text
