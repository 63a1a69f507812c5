"""Self-instructed head data: the target writes its own user messages through its chat template."""

from __future__ import annotations

import pytest
import torch
from arborspec.errors import ArborError
from arborspec.offline.head_data import HeadDataConfig, generate_head_data, load_head_data
from arborspec.offline.self_instruct import user_turn_prefix, write_queries

from conftest import char_tokenizer, tiny_llama

TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}:{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant:{% endif %}")


@pytest.fixture
def chat_tokenizer():
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def test_user_turn_prefix_is_the_template_up_to_the_message(chat_tokenizer):
    ids = user_turn_prefix(chat_tokenizer)
    assert chat_tokenizer.decode(ids) == "<s>user:"
    whole = chat_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert whole.startswith(chat_tokenizer.decode(ids))


def test_a_tokenizer_without_a_chat_template_is_refused_in_one_line():
    with pytest.raises(ArborError, match="--self-instruct 0"):
        user_turn_prefix(char_tokenizer())


def test_queries_are_the_closed_user_messages_the_model_samples(chat_tokenizer):
    model = tiny_llama(3)
    end = chat_tokenizer.convert_tokens_to_ids("e")  # a frequent character as end of turn: some rows close, some not
    queries = write_queries(model, chat_tokenizer, 24, seed=5, end_ids={end}, max_tokens=12)
    # the same draws by hand: every kept query is the text before the first end token of a sampled row
    prefix = user_turn_prefix(chat_tokenizer)
    torch.manual_seed(5)
    ids = torch.tensor([prefix] * 24)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                         top_k=0, top_p=1.0, max_new_tokens=12, pad_token_id=0)[:, len(prefix):].tolist()
    want = []
    for row in out:
        if end in row:
            text = chat_tokenizer.decode(row[:row.index(end)], skip_special_tokens=True).strip()
            if text:
                want.append(text)
    assert queries == want
    assert 0 < len(queries) < 24  # the closed ones kept, the unclosed ones dropped


def test_openings_start_each_message_with_the_seeds_choice_and_the_model_writes_the_rest(chat_tokenizer):
    import random

    from arborspec.offline.self_instruct import OPENINGS

    model = tiny_llama(3)
    end = chat_tokenizer.convert_tokens_to_ids("i")  # closes about half of this model's rows within 24 tokens
    queries = write_queries(model, chat_tokenizer, 24, seed=5, end_ids={end}, max_tokens=24, openings=True)
    assert queries == write_queries(model, chat_tokenizer, 24, seed=5, end_ids={end}, max_tokens=24, openings=True)
    rng = random.Random(5)
    starts = iter([rng.choice(OPENINGS) for _ in range(24)])
    for q in queries:  # the kept messages, in order, each begun by its row's opening and continued by the model
        assert any(q.startswith(s) and len(q) > len(s) for s in starts)
    assert len({q.split()[0] for q in queries}) > 3  # several openings in one batch


def test_self_instructed_shards_hold_template_prompts_and_answers(chat_tokenizer, tmp_path):
    model = tiny_llama(4)
    cfg = HeadDataConfig(prompt_source="self-instruct", num_prompts=8, batch_size=4, max_new_tokens=5,
                         max_query_tokens=10)
    model.generation_config.eos_token_id = chat_tokenizer.convert_tokens_to_ids("e")
    info = generate_head_data(cfg, model, chat_tokenizer, tmp_path, progress=False)
    seqs = load_head_data(tmp_path)
    assert seqs and info["tokens"] == sum(len(s.tokens) for s in seqs)
    prefix = chat_tokenizer.decode(user_turn_prefix(chat_tokenizer))
    for s in seqs:
        prompt = chat_tokenizer.decode(s.tokens[:s.prompt_len])
        assert prompt.startswith(prefix) and prompt.endswith("<s>assistant:")
        assert len(s.tokens) > s.prompt_len  # an answer follows
    # the pool's settings are unchanged by the new fields; a rerun with other settings is refused
    assert "prompt_source" not in HeadDataConfig().settings()
    with pytest.raises(ArborError, match="other settings"):
        generate_head_data(HeadDataConfig(num_prompts=8, batch_size=4), model, chat_tokenizer, tmp_path, progress=False)


def test_train_head_stages_use_both_data_parts(chat_tokenizer, tmp_path):
    """`--self-instruct N`: its shards go to <work>/data-self-instruct, the pool's to <work>/data, training reads
    both."""
    import json

    from arborspec.offline.train_head import HeadTrainConfig, _stages

    model = tiny_llama(6)
    model.generation_config.eos_token_id = chat_tokenizer.convert_tokens_to_ids("e")
    data = HeadDataConfig(num_prompts=8, batch_size=4, max_new_tokens=4, max_query_tokens=10)
    cfg = HeadTrainConfig(out=str(tmp_path / "out"), work_dir=str(tmp_path / "w"), data=data, self_instruct=8,
                          draft_vocab=32, epochs=1, batch_tokens=128, ckpt_every=10_000, val_fraction=0.2)
    _stages(cfg, model, chat_tokenizer, progress=False)
    pool = load_head_data(tmp_path / "w" / "data")
    chat = load_head_data(tmp_path / "w" / "data-self-instruct")
    info = json.loads((tmp_path / "out" / "training.json").read_text())
    assert info["data"]["sequences"] == len(pool) + len(chat)
    assert info["data"]["self_instructed_sequences"] == len(chat) > 0


def test_user_message_inverts_the_chat_encoding(chat_tokenizer):
    from arborspec.common.chat import encode_prompt
    from arborspec.offline.self_instruct import user_message

    assert user_message(chat_tokenizer, encode_prompt(chat_tokenizer, "How do magnets work?")) == "How do magnets work?"
    with pytest.raises(ArborError, match="chat template"):
        user_message(chat_tokenizer, chat_tokenizer("plain text")["input_ids"])


def test_benchmark_overlap_counts_exact_and_shared_ngrams():
    from arborspec.offline.prompt_overlap import benchmark_overlap

    refs = {"set": ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting culture."]}
    messages = ["compose an engaging travel blog post about a recent trip to Hawaii, highlighting culture",  # exact
                "Please compose an engaging travel blog post about a recent trip to Spain.",  # 8 shared words
                "Compose an engaging travel blog post about Spain.",  # 7 shared words only
                "How do magnets work?"]
    res = benchmark_overlap(messages, refs, n=8)
    assert res["set"] == {"texts": 1, "exact": 1, "sharing_ngram": 2, "examples": messages[:2]}
    assert res["messages"] == 4 and res["distinct"] == 4


def test_an_unknown_prompt_source_is_refused(chat_tokenizer, tmp_path):
    with pytest.raises(ArborError, match="unknown prompt source"):
        generate_head_data(HeadDataConfig(prompt_source="self_instruct"), tiny_llama(4), chat_tokenizer, tmp_path,
                           progress=False)
