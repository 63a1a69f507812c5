"""The measuring tools' commands on tiny models: `arborspec draft-quality`, `arborspec
prompt-overlap`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from arborspec.cli import app
from arborspec.offline.head_data import HeadDataConfig, generate_head_data, load_head_data
from arborspec.offline.prompt_overlap import benchmark_overlap, benchmark_references

from conftest import char_tokenizer, perturbed_copy, tiny_llama

TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}:{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant:{% endif %}")


@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory):
    """A tiny target and a perturbed draft model, saved with a character tokenizer that has a chat
    template."""
    root = tmp_path_factory.mktemp("tools")
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    target = tiny_llama(4)
    for name, model in (("target", target), ("draft", perturbed_copy(target, 1, 0.3))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root, target, tok


def _json(output: str) -> dict:
    return json.loads(output[output.index("{"):])


def test_draft_quality_of_a_draft_model(chat_dirs, tmp_path):
    root, _, _ = chat_dirs
    out = tmp_path / "q.json"
    result = CliRunner().invoke(app, ["draft-quality", "--target", str(root / "target"),
                                      "--draft", str(root / "draft"), "--n-mtbench", "2",
                                      "--n-humaneval", "0", "--max-new-tokens", "4", "--reps", "3",
                                      "--cache-len", "8", "--out", str(out)])
    assert result.exit_code == 0, result.output
    res = json.loads(out.read_text())
    assert res["draft"] == str(root / "draft") and res["max_new_tokens"] == 4
    assert res["cost"]["cache_len"] == 8 and res["cost"]["draft_cost_ratio"] > 0
    stats = res["sets"]["mt_bench_turn1"]
    assert stats["prompts"] == 2 and 0 < stats["positions"] <= 8
    assert 0.0 <= stats["top1_agreement"] <= 1.0
    assert stats["chain_acceptance_t0"] == stats["top1_agreement"]
    assert res["overall"]["positions"] == stats["positions"]


def test_draft_quality_refuses_the_ngram_drafter_in_one_line(chat_dirs):
    root, _, _ = chat_dirs
    result = CliRunner().invoke(app, ["draft-quality", "--target", str(root / "target"),
                                      "--draft", "ngram"])
    assert result.exit_code == 2 and "n-gram drafter has no model" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_prompt_overlap_of_self_instructed_shards(chat_dirs, tmp_path):
    root, target, tok = chat_dirs
    data = tmp_path / "data"
    target.generation_config.eos_token_id = tok.convert_tokens_to_ids("e")
    cfg = HeadDataConfig(prompt_source="self-instruct", num_prompts=8, batch_size=4,
                         max_new_tokens=5, max_query_tokens=10)
    generate_head_data(cfg, target, tok, data, progress=False)
    result = CliRunner().invoke(app, ["prompt-overlap", "--data-dir", str(data),
                                      "--target", str(root / "target"), "--ngram", "3"])
    assert result.exit_code == 0, result.output
    res = _json(result.output)
    from arborspec.offline.self_instruct import user_message

    messages = [user_message(tok, s.tokens[:s.prompt_len].tolist()) for s in load_head_data(data)]
    assert res == json.loads(json.dumps(benchmark_overlap(messages, benchmark_references(), 3)
                                        | {"asked": res["asked"]}))
    assert res["messages"] == len(messages) > 0
    assert res["asked"] == 4 * len(list(data.glob("shard_*.safetensors")))
    bad = CliRunner().invoke(app, ["prompt-overlap", "--data-dir", str(data), "--ngram", "0"])
    assert bad.exit_code == 2 and "--ngram must be >= 1" in bad.output
