"""The measuring tools' commands on tiny models: `arborspec draft-quality` (a draft model, a draft
head, a set of 0 prompts skipped), `arborspec dev prompt-overlap`, `arborspec dev profile`
(forward and steps), and where the developers' commands live."""

from __future__ import annotations

import json

import pytest
from arborspec.cli import app
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.lm_head import GreedyScreen
from arborspec.offline.head_data import HeadDataConfig, generate_head_data, load_head_data
from arborspec.offline.prompt_overlap import benchmark_overlap, benchmark_references
from typer.testing import CliRunner

from conftest import char_tokenizer, make_head, perturbed_copy, tiny_llama

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
    make_head(target).save(root / "head", str(root / "target"), target)
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


def test_draft_quality_of_a_head_skips_a_set_of_0_prompts(chat_dirs, tmp_path):
    root, _, _ = chat_dirs
    result = CliRunner().invoke(app, ["draft-quality", "--target", str(root / "target"),
                                      "--draft", str(root / "head"), "--n-mtbench", "0",
                                      "--n-humaneval", "2", "--max-new-tokens", "4", "--reps", "3",
                                      "--cache-len", "8", "--work-dir", str(tmp_path / "heldout"),
                                      "--out", str(tmp_path / "q.json")])
    assert result.exit_code == 0, result.output
    res = json.loads((tmp_path / "q.json").read_text())
    assert list(res["sets"]) == ["humaneval"] and res["cost"]["head_cost_ratio"] > 0
    assert not (tmp_path / "heldout" / "mt_bench_turn1").exists()
    bad = CliRunner().invoke(app, ["draft-quality", "--target", str(root / "target"),
                                   "--draft", str(root / "head"), "--n-humaneval", "-1"])
    assert bad.exit_code == 2 and "must be >= 0 (0 skips that set)" in bad.output


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
    result = CliRunner().invoke(app, ["dev", "prompt-overlap", "--data-dir", str(data),
                                      "--target", str(root / "target"), "--ngram", "3"])
    assert result.exit_code == 0, result.output
    res = _json(result.output)
    from arborspec.offline.self_instruct import user_message

    messages = [user_message(tok, s.tokens[:s.prompt_len].tolist()) for s in load_head_data(data)]
    assert res == json.loads(json.dumps(benchmark_overlap(messages, benchmark_references(), 3)
                                        | {"asked": res["asked"]}))
    assert res["messages"] == len(messages) > 0
    assert res["asked"] == 4 * len(list(data.glob("shard_*.safetensors")))
    bad = CliRunner().invoke(app, ["dev", "prompt-overlap", "--data-dir", str(data), "--ngram", "0"])
    assert bad.exit_code == 2 and "--ngram must be >= 1" in bad.output


def test_the_developers_commands_are_under_dev():
    for name in ("soak", "prompt-overlap", "sequoia-shape", "profile"):
        assert CliRunner().invoke(app, [name, "--help"]).exit_code == 2, name  # no such command
        assert CliRunner().invoke(app, ["dev", name, "--help"]).exit_code == 0, name
    bad = CliRunner().invoke(app, ["dev", "soak", "--steps", "0"])
    assert bad.exit_code == 2 and "--steps must be >= 1" in bad.output


def test_dev_profile_of_a_forward_by_precision_and_rows(chat_dirs, tmp_path):
    root, _, _ = chat_dirs
    out = tmp_path / "forward.json"
    result = CliRunner().invoke(app, ["dev", "profile", "forward", "--target", str(root / "target"),
                                      "--dtype", "float32,int8", "--sizes", "1,3", "--context", "12",
                                      "--repeats", "3", "--rounds", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    res = json.loads(out.read_text())
    rows = res["results"]
    assert [(r["path"], r["rows"]) for r in rows] == [("float32", 1), ("int8", 1), ("float32", 3),
                                                     ("int8", 3)]
    for r in rows:
        assert r["wall_ms"] > 0 and r["ops_total_ms"] > 0 and r["ops_ms"]
        assert r["python_and_dispatch_ms"] == round(r["wall_ms"] - r["ops_total_ms"], 3)
        assert {"self_attn", "mlp", "outside_layers_ms"} <= set(r["modules_ms"])
    assert all("linears" in r["ops_ms"] for r in rows if r["path"] == "float32")
    assert res["context"] == 12 and res["machine"] and res["versions"]


def test_dev_profile_of_steps_splits_every_method_and_restores_the_engine(chat_dirs, tmp_path):
    root, _, _ = chat_dirs
    originals = (ModelAdapter.tree_forward, ModelAdapter.feed, GreedyScreen.argmax_rows)
    out = tmp_path / "steps.json"
    result = CliRunner().invoke(app, ["dev", "profile", "steps", "--target", str(root / "target"),
                                      "--draft", str(root / "draft"), "--dtype", "float32",
                                      "-m", "dyspec:budget=2", "-m", "chain:budget=2:lookup=2",
                                      "--num-prompts", "2", "--max-new-tokens", "6",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (ModelAdapter.tree_forward, ModelAdapter.feed, GreedyScreen.argmax_rows) == originals
    res = json.loads(out.read_text())
    rows = {r["method"]: r for r in res["rows"]}
    assert list(rows) == ["plain", "dyspec:budget=2", "chain:budget=2:lookup=2"]
    assert rows["plain"]["speedup"] == 1.0 and "target_forward" not in rows["plain"]["phase_ms_per_step"]
    for label in ("dyspec:budget=2", "chain:budget=2:lookup=2"):
        phases, calls = rows[label]["phase_ms_per_step"], rows[label]["calls_per_step"]
        assert calls["target_forward"] == 1.0 and calls["draft_begin"] == 1.0 and "rest" in phases
        assert rows[label]["tokens_per_step"] >= 1.0
    assert (res["num_prompts"], res["max_new_tokens"], res["dtype"]) == (2, 6, "float32")
    for args, message in ((["sideways"], "use forward or steps"),
                          (["steps", "--dtype", "float32,int8"], "one precision"),
                          (["forward", "--sizes", "0"], "must be >= 1")):
        bad = CliRunner().invoke(app, ["dev", "profile", *args, "--target", str(root / "target")])
        assert bad.exit_code == 2 and message in bad.output, bad.output
