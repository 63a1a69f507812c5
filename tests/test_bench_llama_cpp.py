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
    BenchConfig(compare_llama_cpp=True).validate()  # the embedded target's own GGUF by default


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
