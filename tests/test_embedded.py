"""The embedded SmolLM2-135M-Instruct target: greedy speculative decoding equals plain decoding and HF generate
(real prompts, fp32, every registered builder, the default draft of the embedded pair), and the CLI's
`generate` and bare command on it.
"""

import pytest
import torch
from arborspec.builders.registry import builder_names, make_builder
from arborspec.cli import app
from arborspec.common.chat import encode_prompt, eos_ids
from arborspec.models import load_pair
from typer.testing import CliRunner

from conftest import MODEL_THREADS, assert_greedy_identical

pytestmark = pytest.mark.slow  # the embedded model

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying focused while studying.",
]
N = 16


@pytest.fixture(scope="module")
def pair():
    threads = torch.get_num_threads()
    torch.set_num_threads(MODEL_THREADS)  # a real model (conftest)
    yield load_pair("embedded")
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", builder_names())
def test_embedded_greedy_identity(pair, name):
    model, tok = pair.target.model, pair.tokenizer
    prompts = [encode_prompt(tok, p) for p in PROMPTS]
    assert_greedy_identical(model, pair.drafter, make_builder(name, budget=16), prompts, N,
                            eos=eos_ids(tok, model), pad=tok.eos_token_id)


def test_cli_generate_on_embedded_pair():
    result = CliRunner().invoke(app, ["generate", PROMPTS[0], "--method", "chain", "--budget", "3",
                                      "--max-new-tokens", "12", "--compare-ar"])
    assert result.exit_code == 0, result.output
    assert "Paris" in result.output
    assert "accepted length" in result.output and "speedup" in result.output and "identical tokens" in result.output


def test_bare_command_runs_the_demo():
    result = CliRunner().invoke(app, [])
    assert result.exit_code == 0, result.output
    assert "blue" in result.output.lower() and "accepted length" in result.output
