"""Per-category benchmark reports and prompts with any number of user turns."""

from __future__ import annotations

from pathlib import Path

import pytest
from arborspec.bench.metrics import POOLED, UNCATEGORISED, categories, summarize, summarize_by_category
from arborspec.bench.prompts import Prompt, load_prompts
from arborspec.bench.report import CATEGORY_PLOT, PLOTS, category_table, read_results, write_report
from arborspec.bench.run import BASELINE, BenchConfig, RunKey, conversation_ids, parse_turns, run_bench, turns_to_run
from arborspec.errors import ArborError

from conftest import char_tokenizer, perturbed_copy, tiny_llama
from test_bench import _run, _steps, _synthetic_records, _write_results


# ---------------------------------------------------------------------------------------------- synthetic runs
def _cat(record: dict, category: str) -> dict:
    return {**record, "category": category}


def _flat(accepted: list[int]) -> dict:
    n = len(accepted)
    return _steps(accepted, [4] * n, [2] * n, [2.0] * n, [0.01] * n, [0.04] * n)


def _category_records() -> list[dict]:
    """Prompt 0 is `writing`, prompts 1 and 2 `math`.

    T=0: baseline 10 tok / 1 s, 100 tok / 10 s, 20 tok / 4 s; dyspec 10 tok / 0.25 s (4 steps), 100 tok / 5 s
    (25 steps), 20 tok / 1 s (4 steps); chain runs prompt 1 only: 100 tok / 20 s (50 steps).
    T=0.6: prompt 0 only, baseline 10 tok / 2 s, dyspec 10 tok / 1 s (5 steps).
    """
    d, c = "dyspec:budget=4", "chain:budget=2"
    return [
        _cat(_run(BASELINE, 0, 10, 1.0, _flat([1] * 10)), "writing"),
        _cat(_run(d, 0, 10, 0.25, _flat([3, 3, 2, 2]), same=True, budget=4), "writing"),
        _cat(_run(BASELINE, 1, 100, 10.0, _flat([1] * 100)), "math"),
        _cat(_run(d, 1, 100, 5.0, _flat([4] * 25), same=True, budget=4), "math"),
        _cat(_run(c, 1, 100, 20.0, _flat([2] * 50), same=True, budget=2), "math"),
        _cat(_run(BASELINE, 2, 20, 4.0, _flat([1] * 20)), "math"),
        _cat(_run(d, 2, 20, 1.0, _flat([5] * 4), same=True, budget=4), "math"),
        _cat(_run(BASELINE, 0, 10, 2.0, _flat([1] * 10), temperature=0.6), "writing"),
        _cat(_run(d, 0, 10, 1.0, _flat([2] * 5), temperature=0.6, budget=4), "writing"),
    ]


def _by(groups, category: str, method: str, temperature: float = 0.0):
    group = next(g for g in groups if g.category == category)
    return next(s for s in group.summaries if s.method == method and s.temperature == temperature)


# ---------------------------------------------------------------------------------------------- metrics
def test_category_speedups_are_ratios_of_totals_per_category():
    groups = summarize_by_category(_category_records())
    assert [g.category for g in groups] == ["writing", "math", POOLED]
    assert [g.prompts for g in groups] == [{0.0: 1, 0.6: 1}, {0.0: 2}, {0.0: 3, 0.6: 1}]
    d, c = "dyspec:budget=4", "chain:budget=2"
    # writing: (1 s / 10) / (0.25 s / 10) = 4; 10 tokens in 4 steps
    assert _by(groups, "writing", d).speedup == pytest.approx(4.0)
    assert _by(groups, "writing", d).mean_accepted_length == pytest.approx(2.5)
    # math: (14 s / 120) / (6 s / 120), not the mean of the per-prompt 2 and 4; 120 tokens in 29 steps
    assert _by(groups, "math", d).speedup == pytest.approx(14 / 6)
    assert _by(groups, "math", d).mean_accepted_length == pytest.approx(120 / 29)
    assert (_by(groups, "math", d).speedup_min, _by(groups, "math", d).speedup_max) == pytest.approx((2.0, 4.0))
    # chain only ran prompt 1: compared with that prompt's baseline only
    assert _by(groups, "math", c).speedup == pytest.approx(0.5) and _by(groups, "math", c).mean_accepted_length == 2
    assert all(s.method != c for g in groups[:1] for s in g.summaries)
    # pooled: 15 s / 130 vs 6.25 s / 130, 130 tokens in 33 steps
    assert _by(groups, POOLED, d).speedup == pytest.approx(2.4)
    assert _by(groups, POOLED, d).mean_accepted_length == pytest.approx(130 / 33)
    assert _by(groups, "writing", d, 0.6).speedup == pytest.approx(2.0)


def test_pooled_category_is_the_plain_summary():
    records = _category_records()
    assert summarize_by_category(records)[-1].summaries == summarize(records)


def test_no_categories_no_breakdown_and_mixed_runs_are_grouped():
    assert categories(_synthetic_records()) == [] and summarize_by_category(_synthetic_records()) == []
    mixed = _category_records() + [{**r, "prompt_index": 7, "category": ""} for r in _synthetic_records()[:1]]
    assert categories(mixed) == ["writing", "math", UNCATEGORISED]
    assert summarize_by_category(mixed)[2].prompts == {0.0: 1}


# ---------------------------------------------------------------------------------------------- report
def test_category_table_exact_cells():
    groups = summarize_by_category(_category_records())
    assert category_table(groups, 0.0).splitlines() == [
        "| method | writing (n=1) | math (n=2) | all (n=3) |",
        "|---|---|---|---|",
        "| `dyspec:budget=4` | 4.00x / 2.50 | 2.33x / 4.14 | 2.40x / 3.94 |",
        "| `chain:budget=2` | – | 0.50x / 2.00 | 0.50x / 2.00 |",
    ]
    assert category_table(groups, 0.6).splitlines()[0] == "| method | writing (n=1) | all (n=1) |"
    assert category_table(groups, 0.6).splitlines()[2] == "| `dyspec:budget=4` | 2.00x / 2.00 | 2.00x / 2.00 |"


def test_report_adds_category_tables_and_plot(tmp_path):
    path = tmp_path / "results.jsonl"
    _write_results(path, _category_records())
    text = write_report([path], tmp_path / "rep").read_text()
    assert "### By prompt category (temperature 0)" in text and "### By prompt category (temperature 0.6)" in text
    assert "| `dyspec:budget=4` | 4.00x / 2.50 | 2.33x / 4.14 | 2.40x / 3.94 |" in text
    # the pooled cells repeat the main table's figures
    assert "| `dyspec:budget=4` | 4 | 3.94 |" in text and "| 2.40x |" in text
    assert (tmp_path / "rep" / CATEGORY_PLOT).stat().st_size > 1000
    assert f"]({CATEGORY_PLOT})" in text and all(f"]({p})" in text for p in PLOTS)


def test_report_without_categories_is_unchanged(tmp_path):
    path = tmp_path / "results.jsonl"
    _write_results(path, _synthetic_records())
    text = write_report([path], tmp_path / "rep").read_text()
    assert "By prompt category" not in text and CATEGORY_PLOT not in text
    assert not (tmp_path / "rep" / CATEGORY_PLOT).exists()


# ---------------------------------------------------------------------------------------------- turns
def test_turns_option():
    three = Prompt("p", ["one", "two", "three"])
    assert list(turns_to_run(None, three)) == [1, 2, 3] and list(turns_to_run(2, three)) == [1, 2]
    assert list(turns_to_run(5, Prompt("q", ["only"]))) == [1]
    assert parse_turns("all") is None and parse_turns(" 3 ") == 3
    for bad in ("0", "-1", "two", "", "1.5"):
        with pytest.raises(ArborError, match="--turns"):
            parse_turns(bad)
    with pytest.raises(ArborError, match="turns"):
        BenchConfig(turns=0).validate()


def test_bad_turns_fails_before_loading(tmp_path):
    from arborspec.cli import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["bench", "-m", "dyspec:budget=4", "--turns", "two", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--turns must be" in result.output, result.output
    assert not (tmp_path / "x").exists()


def test_later_turns_follow_the_baseline_answers():
    tok = char_tokenizer()
    prompt = Prompt("p", ["First question.", "Second one?", "Third!"])
    base = RunKey(0, 3, BASELINE, 0.6, 1, 0)
    done = {RunKey(0, k, BASELINE, 0.6, 1, 0): {"output_ids": tok(f"ANSWER {k}")["input_ids"]} for k in (1, 2)}
    done[RunKey(0, 1, BASELINE, 0.6, 2, 0)] = {"output_ids": tok("OTHER SEED")["input_ids"]}
    text = tok.decode(conversation_ids(tok, False, prompt, base, done), skip_special_tokens=True)
    order = [text.index(s) for s in ("First question.", "ANSWER 1", "Second one?", "ANSWER 2")]
    assert order == sorted(order) and text.endswith("Third!") and "OTHER SEED" not in text
    with pytest.raises(KeyError):  # turn 3 without the recorded answer to turn 2
        conversation_ids(tok, False, prompt, base, {k: v for k, v in done.items() if k.turn != 2})


@pytest.fixture(scope="module")
def three_turn_dirs(tmp_path_factory):
    """A tiny target + perturbed draft with a character tokenizer; one 3-turn prompt and one single-turn prompt."""
    root = tmp_path_factory.mktemp("tiny3")
    target = tiny_llama(0)
    tok = char_tokenizer()
    for name, model in (("target", target), ("draft", perturbed_copy(target, 1, 0.3))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "prompts.jsonl").write_text(
        '{"turns": ["Hello there.", "Go on?", "And the end!"], "category": "chat"}\n'
        '{"prompt": "Count: 1 2 3", "category": "count"}\n')
    return root


def _three_turn_cfg(root: Path, out: Path, **kw) -> BenchConfig:
    base = dict(target=str(root / "target"), draft=str(root / "draft"), methods=["chain:budget=2"],
                temperatures=[0.0], prompts=str(root / "prompts.jsonl"), num_prompts=None, max_new_tokens=6,
                warmup=0, out_dir=out, turns=None, compare_hf_assisted=False, threads=1)
    return BenchConfig(**{**base, **kw})


def test_three_turn_prompt_runs_every_turn(three_turn_dirs, tmp_path):
    path = run_bench(_three_turn_cfg(three_turn_dirs, tmp_path / "run"), quiet=True)
    header, runs, _ = read_results(path)
    assert header["config"]["turns"] is None
    assert sorted((r["prompt_index"], r["turn"], r["method"]) for r in runs) == sorted(
        (i, t, m) for i, t in ((0, 1), (0, 2), (0, 3), (1, 1)) for m in (BASELINE, "chain:budget=2"))
    assert all(r["same_as_baseline"] for r in runs if r["method"] != BASELINE)
    lengths = {r["turn"]: r["prompt_len"] for r in runs if r["prompt_index"] == 0 and r["method"] == BASELINE}
    assert lengths[1] < lengths[2] < lengths[3]
    done = {RunKey.of(r): r for r in runs}
    prompt = load_prompts(str(three_turn_dirs / "prompts.jsonl"))[0]
    ids = conversation_ids(char_tokenizer(), True, prompt, RunKey(0, 3, BASELINE, 0.0, 0, 0), done)
    assert lengths[3] == len(ids)
    text = (tmp_path / "run" / "report.md").read_text()
    assert "turns=all" in text and "| method | chat (n=1) | count (n=1) | all (n=2) |" in text
    # resume: the same settings add nothing; other turns are refused
    run_bench(_three_turn_cfg(three_turn_dirs, tmp_path / "run", resume=True), quiet=True)
    assert len(read_results(path)[1]) == len(runs)
    with pytest.raises(ArborError, match="turns"):
        run_bench(_three_turn_cfg(three_turn_dirs, tmp_path / "run", resume=True, turns=2), quiet=True)
