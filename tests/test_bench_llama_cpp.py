"""llama.cpp as a peer in `arborspec bench` (bench/llama_cpp.py).

The runs themselves need `llama-cpp-python`, which is not a dependency (it builds llama.cpp from
source): they are skipped where it is not installed. The refusals are checked everywhere.
"""

from __future__ import annotations

import sys

import pytest
from arborspec.bench.llama_cpp import LLAMA_CPP, LlamaCppPeer
from arborspec.bench.run import BenchConfig, run_bench
from arborspec.errors import ArborError

from conftest import MODEL_THREADS


def test_without_the_package_the_error_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if not installed
    with pytest.raises(ArborError, match=r'pip install "llama-cpp-python==') as err:
        LlamaCppPeer(tmp_path / "model.gguf", threads=1, context=256, vocab_size=10)
    assert "\n" not in str(err.value)


def test_option_errors_are_one_line():
    with pytest.raises(ArborError, match="add --compare-llama-cpp"):
        BenchConfig(gguf="model.gguf").validate()
    with pytest.raises(ArborError, match="give --gguf PATH"):
        BenchConfig(target="some/other-model", compare_llama_cpp=True).validate()
    # a built-in target's own GGUF, or the target's path, by default
    for target in ("embedded", "qwen2.5-coder-1.5b", "gemma3-270m", "/models/mine.gguf"):
        BenchConfig(target=target, compare_llama_cpp=True).validate()


def test_an_unknown_llama_cpp_run_is_refused(tmp_path):
    pytest.importorskip("llama_cpp")
    from arborspec.bench.llama_cpp import LLAMA_CPP_DRAFT

    from test_gguf_models import write_tiny_gguf

    peer = LlamaCppPeer(write_tiny_gguf(tmp_path / "t.gguf"), threads=1, context=256, vocab_size=48)
    assert peer.labels() == [LLAMA_CPP, f"{LLAMA_CPP}:lookup=10"]  # no draft model given
    with pytest.raises(ArborError, match="no llama.cpp run"):
        peer.generate(LLAMA_CPP_DRAFT, [1, 7, 12], 4, [2], 0.0, 0, 1.0, 0)


def test_llama_cpp_speculative_runs_of_a_gguf_pair(tmp_path, monkeypatch):
    """A tiny GGUF target with itself as the draft model (`--target` and `--draft` paths): llama.cpp
    runs plain, with prompt lookup and with the draft model; the speculative runs are compared with
    llama.cpp's own plain runs, and a draft that is the target itself agrees with them."""
    pytest.importorskip("llama_cpp")
    import arborspec.bench.llama_cpp as peer_module
    from arborspec.bench.llama_cpp import LLAMA_CPP_DRAFT, LLAMA_CPP_LOOKUP
    from arborspec.bench.report import read_results

    from test_gguf_models import write_tiny_gguf

    monkeypatch.setenv("ARBORSPEC_CACHE", str(tmp_path / "cache"))
    # the tiny model's distributions are flat: draft whatever the top token's probability
    monkeypatch.setattr(peer_module, "DRAFT_P_MIN", 0.0)
    proposed = []
    make_draft = peer_module._draft_model

    def counted_draft(llm, n_max, p_min):
        draft = make_draft(llm, n_max, p_min)
        call = type(draft).__call__
        type(draft).__call__ = lambda self, ids, **kw: proposed.append(call(self, ids)) or proposed[-1]
        return draft

    monkeypatch.setattr(peer_module, "_draft_model", counted_draft)
    target = write_tiny_gguf(tmp_path / "target.gguf", seed=0)
    draft = write_tiny_gguf(tmp_path / "draft.gguf", seed=0)  # the same model
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "a b c a b c a b"}\n{"prompt": "d e f g"}\n')
    cfg = BenchConfig(
        target=str(target),
        draft=str(draft),
        methods=["dyspec:budget=3"],
        temperatures=[0.0],
        prompts=str(prompts),
        num_prompts=None,
        max_new_tokens=24,
        dtype="float32",
        chat=False,
        warmup=0,
        out_dir=tmp_path / "run",
        compare_llama_cpp=True,
        threads=MODEL_THREADS,
    )
    header, runs, notes = read_results(run_bench(cfg, quiet=True))
    by = {(r["method"], r["prompt_index"]): r for r in runs}
    for index in (0, 1):
        plain = by[(LLAMA_CPP, index)]
        assert plain["same_as_baseline"] is None and plain["new_tokens"] >= 1
        for label in (LLAMA_CPP_LOOKUP, LLAMA_CPP_DRAFT):
            run = by[(label, index)]
            assert run["same_as_baseline"] == (run["output_ids"] == plain["output_ids"])
        assert by[(LLAMA_CPP_DRAFT, index)]["same_as_baseline"] is True
        assert "draft model draft.gguf" in by[(LLAMA_CPP_DRAFT, index)]["config"]["builder"]
    assert any("compares them with its own plain runs" in n for n in notes)
    # the draft model proposed up to DRAFT_MAX tokens at a time, and they were accepted
    assert max(len(p) for p in proposed) == peer_module.DRAFT_MAX
    drafted = [r for r in runs if r["method"] == LLAMA_CPP_DRAFT]
    assert len(proposed) < sum(r["new_tokens"] for r in drafted)


def test_a_missing_gguf_file_is_refused(tmp_path):
    pytest.importorskip("llama_cpp")
    with pytest.raises(ArborError, match="does not exist: check --gguf"):
        LlamaCppPeer(tmp_path / "absent.gguf", threads=1, context=256, vocab_size=10)


@pytest.mark.slow
def test_llama_cpp_runs_beside_plain_and_speculative_decoding(tmp_path):
    """One prompt of the embedded target at T = 0 and 0.8: llama.cpp's runs are recorded like any
    method's (tokens up to max_new_tokens, a wall time, not compared with plain decoding), and its
    greedy answer begins as the float32 model's (a prompt whose first tokens are far from a tie
    between the two arithmetics): the GGUF holds the same weights, fed the same prompt ids."""
    pytest.importorskip("llama_cpp")
    from arborspec.bench.report import read_results

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Explain in a few sentences why the sky is blue."}\n')
    cfg = BenchConfig(
        methods=["dyspec:budget=3:lookup=4"],
        temperatures=[0.0, 0.8],
        prompts=str(prompts),
        num_prompts=None,
        max_new_tokens=12,
        dtype="float32",
        warmup=0,
        out_dir=tmp_path / "run",
        compare_llama_cpp=True,
        threads=MODEL_THREADS,
    )
    header, runs, notes = read_results(run_bench(cfg, quiet=True))
    assert any(LLAMA_CPP in n and "not compared" in n for n in notes)
    llama = {r["temperature"]: r for r in runs if r["method"] == LLAMA_CPP}
    plain = {r["temperature"]: r for r in runs if r["method"] == "autoregressive"}
    assert set(llama) == {0.0, 0.8}
    for r in llama.values():
        assert 1 <= r["new_tokens"] <= 12 and r["wall_time"] > 0
        assert r["same_as_baseline"] is None
        assert "plain decoding of SmolLM2-135M-Instruct.Q4_1.gguf" in r["config"]["builder"]
    assert llama[0.0]["output_ids"][:4] == plain[0.0]["output_ids"][:4]
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"`{LLAMA_CPP}`" in report
