"""The benchmark harness: metric arithmetic, prompt sets, results files, report, resume and interruption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from arborspec.bench.metrics import speedup_vs_baseline, summarize
from arborspec.bench.prompts import conversation, load_prompts
from arborspec.bench.report import PLOTS, read_results, step_overheads, write_report
from arborspec.bench.run import BenchConfig, RunKey, expand_methods, parse_method_spec, run_bench
from arborspec.common.chat import encode_messages
from arborspec.errors import ArborError

from conftest import char_tokenizer, perturbed_copy, tiny_llama


# ---------------------------------------------------------------------------------------------- helpers
def _steps(accepted, sizes, depths, est, draft, verify, build=None, other=None, probs=None, flags=None):
    n = len(accepted)
    return {"accepted_length": accepted, "tree_size": sizes, "tree_depth": depths, "estimated_length": est,
            "draft_time": draft, "build_time": build or [0.0] * n, "verify_time": verify,
            "other_time": other or [0.0] * n, "draft_forwards": [1] * n,
            "examined_draft_probs": probs or [[] for _ in range(n)], "examined_values": [[] for _ in range(n)],
            "examined_accepted": flags or [[] for _ in range(n)]}


def _run(method, prompt, tokens, wall, steps, same=None, temperature=0.0, budget=None):
    return {"kind": "run", "prompt_index": prompt, "turn": 1, "method": method, "temperature": temperature, "seed": 0,
            "repeat": 0, "name": method.split(":")[0], "budget": budget, "new_tokens": tokens, "wall_time": wall,
            "output_ids": list(range(tokens)), "same_as_baseline": same, "steps": steps}


def _synthetic_records():
    """Two prompts. Baseline: 10 tokens in 1 s, 100 tokens in 10 s. Method: 4x faster on the first, 2x on the
    second."""
    base = [_run("autoregressive", 0, 10, 1.0,
                 _steps([1] * 10, [0] * 10, [0] * 10, [1.0] * 10, [0.0] * 10, [0.1] * 10)),
            _run("autoregressive", 1, 100, 10.0,
                 _steps([1] * 100, [0] * 100, [0] * 100, [1.0] * 100, [0.0] * 100, [0.1] * 100))]
    meth = [
        # 10 tokens in 4 steps: accepted 3, 3, 2, 2; trees of 4 nodes, depth 3
        _run("dyspec:budget=4", 0, 10, 0.25, _steps([3, 3, 2, 2], [4] * 4, [3] * 4, [2.5] * 4, [0.01] * 4, [0.04] * 4,
                                                    probs=[[0.95, 0.05], [0.9], [0.3], [0.25]],
                                                    flags=[[1, 0], [1], [0], [1]]), same=True, budget=4),
        # 100 tokens in 25 steps of 4
        _run("dyspec:budget=4", 1, 100, 5.0, _steps([4] * 25, [4] * 25, [3] * 25, [3.0] * 25, [0.05] * 25,
                                                    [0.15] * 25), same=False, budget=4),
    ]
    return base + meth


# ---------------------------------------------------------------------------------------------- metrics
def test_speedup_is_ratio_of_totals_not_mean_of_ratios():
    recs = _synthetic_records()
    speedup, per_prompt = speedup_vs_baseline(recs[2:], recs[:2])
    # baseline 11 s / 110 tokens, method 5.25 s / 110 tokens -> 11 / 5.25; the mean of ratios would be (4 + 2) / 2 = 3
    assert speedup == pytest.approx(11 / 5.25)
    assert sorted(per_prompt) == pytest.approx([2.0, 4.0])


def test_method_summary_hand_computed():
    base, meth = summarize(_synthetic_records())
    assert base.method == "autoregressive" and base.speedup == pytest.approx(1.0) and base.mean_accepted_length == 1.0
    assert meth.steps == 29 and meth.new_tokens == 110
    assert meth.mean_accepted_length == pytest.approx(110 / 29)  # tokens per target forward, bonus included
    assert meth.accepted_histogram == {2: 2, 3: 2, 4: 25}
    assert meth.mean_tree_size == 4 and meth.total_candidate_tokens == 116 and meth.mean_depth == 3
    assert meth.mean_estimated_length == pytest.approx((4 * 2.5 + 25 * 3.0) / 29)
    assert meth.tokens_per_second == pytest.approx(110 / 5.25)
    assert meth.latency_per_token_ms == pytest.approx(1000 * 5.25 / 110)
    assert meth.speedup == pytest.approx(11 / 5.25)
    assert (meth.speedup_min, meth.speedup_median, meth.speedup_max) == pytest.approx((2.0, 3.0, 4.0))
    draft, verify = 4 * 0.01 + 25 * 0.05, 4 * 0.04 + 25 * 0.15
    assert meth.draft_fraction == pytest.approx(draft / (draft + verify))
    assert meth.verify_fraction == pytest.approx(verify / (draft + verify))
    assert meth.build_other_fraction == pytest.approx(0.0)
    assert meth.greedy_identity_rate == pytest.approx(0.5)


def test_acceptance_vs_draft_prob_bins():
    from arborspec.bench.metrics import acceptance_by_draft_prob

    centres, rates, counts = acceptance_by_draft_prob(_synthetic_records()[2:3], bins=4)
    assert counts == [1, 2, 0, 2]  # 0.05 -> bin 0; 0.25, 0.3 -> bin 1; 0.9, 0.95 -> bin 3
    assert rates == [0.0, 0.5, None, 1.0]


# ---------------------------------------------------------------------------------------------- method specs
def test_method_spec_sweeps_cartesian_product():
    labels = [m.label for m in parse_method_spec("sequoia:budget=8,16:max_depth=4,6")]
    assert labels == ["sequoia:budget=8:max_depth=4", "sequoia:budget=8:max_depth=6",
                      "sequoia:budget=16:max_depth=4", "sequoia:budget=16:max_depth=6"]
    labels = [m.label for m in expand_methods(["chain:budget=2,2", "dyspec:budget=4"])]
    assert labels == ["chain:budget=2", "dyspec:budget=4"]


@pytest.mark.parametrize("spec", ["nosuch:budget=4", "dyspec:budget=0", "dyspec:bogus=1", "dyspec:budget",
                                  ":budget=4", "sequoia:depth=4"])
def test_bad_sweep_value_fails_up_front(spec):
    with pytest.raises(ArborError):
        expand_methods(["chain:budget=2", spec])


# ---------------------------------------------------------------------------------------------- prompts
def test_builtin_prompt_sets_from_installed_packages():
    mt, val = load_prompts("mt-bench"), load_prompts("mt-bench-validation")
    assert len(mt) == 60 and len(val) == 20 and all(len(p.turns) == 2 for p in mt + val)
    assert not {p.id for p in mt} & {p.id for p in val}  # settings are never chosen on the test set
    he = load_prompts("humaneval")
    assert len(he) == 164 and he[0].id == "HumanEval/0" and "def " in he[0].turns[0]
    assert len(load_prompts("mt-bench", 5)) == 5


def test_mt_bench_selection_is_stratified_over_all_eight_categories():
    first = load_prompts("mt-bench", 24)
    counts = {c: sum(p.category == c for p in first) for c in {p.category for p in first}}
    assert len(counts) == 8 and set(counts.values()) == {3}
    assert [p.id for p in first[:3]] == ["81", "91", "102"]  # writing, roleplay, then reasoning past 101
    # the validation slice: every third question after the first 20, in MT-Bench's order
    assert [p.id for p in load_prompts("mt-bench-validation")[:3]] == ["101", "104", "107"]


def test_stratified_order_round_robins_categories():
    from arborspec.bench.prompts import Prompt, stratified

    ps = [Prompt(str(i), ["x"], c) for i, c in enumerate("aaabbc")]
    assert [p.id for p in stratified(ps)] == ["0", "3", "5", "1", "4", "2"]


def test_second_turn_includes_the_first_answer():
    p = load_prompts("mt-bench", 1)[0]
    msgs = conversation(p, ["MY ANSWER"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == "MY ANSWER" and msgs[2]["content"] == p.turns[1]


def test_user_prompt_files(tmp_path):
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "a b"}\n\n{"text": "c"}\n{"question": "d", "id": "q4"}\n{"turns": ["e", "f"]}\n')
    got = load_prompts(str(jl))
    assert [p.turns for p in got] == [["a b"], ["c"], ["d"], ["e", "f"]] and got[2].id == "q4"
    lines = tmp_path / "lines.txt"
    lines.write_text("first prompt\nsecond prompt\n")
    assert [p.turns[0] for p in load_prompts(str(lines))] == ["first prompt", "second prompt"]
    blocks = tmp_path / "blocks.txt"
    blocks.write_text("one\nstill one\n\ntwo\n")
    assert [p.turns[0] for p in load_prompts(str(blocks))] == ["one\nstill one", "two"]


def test_prompt_set_errors(tmp_path):
    with pytest.raises(ArborError, match="unknown prompt set"):
        load_prompts("no-such-set")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ArborError, match="empty"):
        load_prompts(str(empty))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n')
    with pytest.raises(ArborError, match="none of the fields"):
        load_prompts(str(bad))
    with pytest.raises(ArborError, match="directory"):
        load_prompts(str(tmp_path))


# ---------------------------------------------------------------------------------------------- report
def _write_results(path: Path, records, schema=1):
    header = {"kind": "header", "schema": schema, "target": "t", "draft": "d", "device": "cpu",
              "config": {"target": "t", "draft": "d", "prompts": "x", "num_prompts": 2, "turns": 1,
                         "max_new_tokens": 100, "dtype": "float32"},
              "machine": {"cpu_count": 2, "torch_threads": 1}, "versions": {"arborspec": "0.1.0"}}
    path.write_text("\n".join(json.dumps(r) for r in [header, *records]) + "\n")


def _check_report(out: Path, report: Path):
    text = report.read_text()
    assert "| method |" in text and "## Temperature 0" in text
    for name in PLOTS:
        assert (out / name).stat().st_size > 1000, name


def test_report_from_synthetic_results(tmp_path):
    path = tmp_path / "results.jsonl"
    _write_results(path, _synthetic_records())
    report = write_report([path], tmp_path / "rep")
    _check_report(tmp_path / "rep", report)
    assert "2.10x" in report.read_text()  # 11 / 5.25
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    speedups = [m["speedup"] for m in summary["methods"] if m["speedup"] is not None]
    assert speedups and abs(max(speedups) - 11 / 5.25) < 1e-9  # the table's figure, exactly


def test_report_json_prints_and_writes_the_same_result(tmp_path, capsys):
    from arborspec.common.jsonfiles import report_json

    res = {"top1": [0.42, 0.37], "head": "embedded-head"}
    report_json(res, tmp_path / "new" / "q.json")
    assert json.loads((tmp_path / "new" / "q.json").read_text()) == res == json.loads(capsys.readouterr().out)
    report_json(res, None)
    assert json.loads(capsys.readouterr().out) == res


def test_step_overheads_are_read_per_method_in_run_order():
    runs = [{"method": "dyspec:budget=auto", "config": {"builder": "dyspec", "step_overhead": 0.25}},
            {"method": "dyspec:budget=auto", "config": {"builder": "dyspec", "step_overhead": 0.3}},
            {"method": "dyspec:budget=8", "config": {"builder": "dyspec"}},
            {"method": "autoregressive", "config": {"builder": "autoregressive"}}]
    assert step_overheads(runs) == {"dyspec:budget=auto": [0.25, 0.3]}


def test_report_errors(tmp_path):
    old = tmp_path / "old.jsonl"
    _write_results(old, _synthetic_records(), schema=0)
    with pytest.raises(ArborError, match="schema"):
        write_report([old], tmp_path / "r")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ArborError, match="empty"):
        write_report([empty], tmp_path / "r")
    junk = tmp_path / "junk.jsonl"
    junk.write_text("this is not json\n{}\n")
    with pytest.raises(ArborError, match="not valid JSON"):
        write_report([junk], tmp_path / "r")
    with pytest.raises(ArborError, match="does not exist"):
        write_report([tmp_path / "missing.jsonl"], tmp_path / "r")


# ---------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """A tiny random Llama target + a perturbed draft, saved as HF directories with a character tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    target = tiny_llama(0)
    draft = perturbed_copy(target, 1, 0.3)
    tok = char_tokenizer()
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"turns": ["Hello there, tiny model.", "And again?"]}\n{"prompt": "Count: 1 2 3 4"}\n')
    return root


def _cfg(root: Path, out: Path, **kw) -> BenchConfig:
    base = dict(target=str(root / "target"), draft=str(root / "draft"), methods=["chain:budget=2", "dyspec:budget=4"],
                temperatures=[0.0, 0.8], prompts=str(root / "prompts.jsonl"), num_prompts=None, max_new_tokens=10,
                seeds=[0, 1], warmup=1, out_dir=out, turns=2, compare_hf_assisted=True, threads=1)
    base.update(kw)
    return BenchConfig(**base)


def _keys(path: Path) -> list[RunKey]:
    return [RunKey.of(r) for r in read_results(path)[1]]


def test_run_bench_end_to_end(tiny_dirs, tmp_path):
    path = run_bench(_cfg(tiny_dirs, tmp_path / "run"), quiet=True)
    header, runs, notes = read_results(path)
    assert header["versions"]["torch"] and header["machine"]["cpu_count"] and header["config"]["methods"]
    # prompt 0 has two turns, prompt 1 one: 3 (prompt, turn); T=0: seed 0 only, 5 labels; T=0.8: 2 seeds x 3 labels
    assert len(runs) == 3 * (5 + 2 * 3)
    assert len(set(_keys(path))) == len(runs)
    greedy = [r for r in runs if r["temperature"] == 0 and r["method"] in ("chain:budget=2", "dyspec:budget=4")]
    assert greedy and all(r["same_as_baseline"] for r in greedy)  # lossless: token for token the baseline's
    spec = [r for r in runs if r["method"] == "dyspec:budget=4"]
    assert all(len(r["steps"]["accepted_length"]) >= 1 and sum(r["steps"]["accepted_length"]) == r["new_tokens"]
               for r in spec)
    assert any("hf-assisted" in n for n in notes)
    assert {r["turn"] for r in runs if r["prompt_index"] == 0} == {1, 2}
    _check_report(tmp_path / "run", tmp_path / "run" / "report.md")
    with pytest.raises(ArborError, match="--resume"):
        run_bench(_cfg(tiny_dirs, tmp_path / "run"), quiet=True)


def test_interrupt_then_resume_completes_without_duplicates(tiny_dirs, tmp_path, monkeypatch):
    from arborspec.bench import run as bench

    cfg = dict(methods=["dyspec:budget=4"], temperatures=[0.0], turns=1, compare_hf_assisted=False, warmup=0)
    full = run_bench(_cfg(tiny_dirs, tmp_path / "full", **cfg), quiet=True)
    calls = {"n": 0}
    real = bench._Runner.generate

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(bench._Runner, "generate", flaky)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt, match="finished runs kept in .*--resume"):  # Ctrl-C on the 3rd generation
        run_bench(_cfg(tiny_dirs, out, **cfg), quiet=True)
    path = out / "results.jsonl"
    assert len(_keys(path)) == 2 and (out / "report.md").is_file()
    monkeypatch.setattr(bench._Runner, "generate", real)
    run_bench(_cfg(tiny_dirs, out, resume=True, **cfg), quiet=True)
    assert sorted(_keys(path), key=repr) == sorted(_keys(full), key=repr)
    # a file cut mid-record (killed while writing) also resumes cleanly
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + lines[2][:17])
    run_bench(_cfg(tiny_dirs, out, resume=True, **cfg), quiet=True)
    keys = _keys(path)
    assert len(keys) == len(set(keys)) and set(keys) == set(_keys(full))
    full_ids = {RunKey.of(r): r["output_ids"] for r in read_results(full)[1]}
    assert all(full_ids[RunKey.of(r)] == r["output_ids"] for r in read_results(path)[1])  # greedy: same tokens
    with pytest.raises(ArborError, match="max_new_tokens"):
        run_bench(_cfg(tiny_dirs, out, resume=True, **{**cfg, "max_new_tokens": 5}), quiet=True)


def test_bench_command_options_fail_before_loading(tiny_dirs, tmp_path):
    from arborspec.cli import app
    from typer.testing import CliRunner

    for args, needle in [(["--temperatures", "0,hot"], "comma-separated"),
                         (["--temperatures", "0,0.6", "--top-p", "0"], "top_p")]:
        result = CliRunner().invoke(app, ["bench", "-m", "dyspec:budget=4", "--out", str(tmp_path / "x"), *args])
        assert result.exit_code == 2 and needle in result.output, result.output
    assert not (tmp_path / "x").exists()
    with pytest.raises(ArborError, match="exceeds"):
        run_bench(_cfg(tiny_dirs, tmp_path / "long", max_new_tokens=600), quiet=True)


def test_unwritable_output_dir_fails_before_loading(tiny_dirs, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ArborError, match="cannot write"):
        run_bench(_cfg(tiny_dirs, blocker / "sub"), quiet=True)


def test_encode_conversation_without_chat_template(tiny_dirs):
    tok = char_tokenizer()
    p = load_prompts(str(tiny_dirs / "prompts.jsonl"))[0]
    ids = encode_messages(tok, conversation(p, ["ok"]))
    assert tok.decode(ids, skip_special_tokens=True).endswith("And again?")


def test_results_header_names_the_draft_heads_precision():
    """The header records a head's precision as run (layer and logits); the report reads old files' logits-only
    values."""
    from types import SimpleNamespace

    from arborspec.bench.report import _head_precision
    from arborspec.bench.run import _draft_logits

    def drafter(layers, logits):
        return SimpleNamespace(head=SimpleNamespace(int8_layers=layers, int8_logits=logits))

    assert _draft_logits(drafter(True, True)) == "int8 layer and logits"
    assert _draft_logits(drafter(False, True)) == "int8 logits"
    assert _draft_logits(drafter(False, False)) == "float"
    assert _draft_logits(SimpleNamespace()) is None  # not a head
    assert [_head_precision(v) for v in ("int8", "float", "int8 layer and logits")] == [
        "int8 logits", "float logits", "int8 layer and logits"]
