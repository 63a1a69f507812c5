"""The embedded SmolLM2-135M-Instruct target: greedy speculative decoding equals plain decoding and HF generate.

Real prompts, fp32, every registered builder, the default draft of the embedded pair.
"""

import pytest
import torch
from typer.testing import CliRunner

from arborspec.api import SpeculativeGenerator, encode_prompt, load_pair
from arborspec.cli import app
from arborspec.builders.registry import builder_names

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying focused while studying.",
]
N = 16


@pytest.fixture(scope="module")
def pair():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a real model: use both cores
    yield load_pair("embedded")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def references(pair):
    model, tok = pair.target.model, pair.tokenizer
    refs = []
    plain = SpeculativeGenerator(method="chain", budget=1, pair=pair)
    for p in PROMPTS:
        ids = encode_prompt(tok, p)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=N, do_sample=False, pad_token_id=tok.eos_token_id)
        hf = out[0, len(ids):].tolist()
        base = plain.generate_autoregressive(p, max_new_tokens=N).output_ids
        assert base == hf[: len(base)], "plain decoding through the adapter differs from HF generate"
        refs.append(base)
    return refs


@pytest.mark.parametrize("name", builder_names())
def test_embedded_greedy_identity(pair, references, name):
    gen = SpeculativeGenerator(method=name, budget=16, pair=pair)
    for prompt, ref in zip(PROMPTS, references):
        spec = gen.generate(prompt, max_new_tokens=N)
        assert spec.output_ids == ref, (name, prompt)
        assert len(spec.output_ids) == N or spec.stop_reason == "eos"


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
