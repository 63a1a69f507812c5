"""The device's defaults (arborspec/defaults.py): every branch of the choice, the generator built
on them, and the first line `arborspec generate` prints."""

from __future__ import annotations

import json

import pytest
import torch
from arborspec.api import SpeculativeGenerator
from arborspec.cli import app
from arborspec.defaults import (
    CPU_BUDGET,
    DEFAULT_LOOKUP,
    GPU_BUDGET,
    INT8_CPU_BUDGET,
    Defaults,
    choose,
    config_dtype,
    device_kind,
    resolve_dtype,
    saved_dtype,
)
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.errors import ArborError
from arborspec.models import ModelPair
from typer.testing import CliRunner

from conftest import char_tokenizer, perturbed_copy, tiny_llama

ALL = ("method", "budget", "lookup", "dtype")
BASELINE = "baseline: plain decoding of the same"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ---------------------------------------------------------------------------------- the choice
@pytest.mark.parametrize("device,embedded,expected", [
    ("cpu", True, Defaults("dyspec", 1, 6, "int8", "cpu", ALL)),
    ("cpu", False, Defaults("dyspec", CPU_BUDGET, 6, "float32", "cpu", ALL)),
    ("cuda", True, Defaults("dyspec", 16, 6, "float32", "gpu", ALL)),
    ("cuda:1", False, Defaults("dyspec", 16, 6, "float32", "gpu", ALL)),
])
def test_nothing_given_takes_the_device_defaults(device, embedded, expected):
    assert choose(device, embedded) == expected
    assert (CPU_BUDGET, INT8_CPU_BUDGET, GPU_BUDGET, DEFAULT_LOOKUP) == (2, 1, 16, 6)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("embedded", [True, False])
def test_explicit_values_always_win(device, embedded):
    given = choose(device, embedded, method="opt-tree", budget=8, lookup=0, dtype="bfloat16")
    assert (given.method, given.budget, given.lookup, given.dtype) == ("opt-tree", 8, 0, "bfloat16")
    assert given.chosen == ()  # nothing taken from the defaults
    auto = choose(device, embedded, budget="auto")
    assert auto.budget == "auto" and auto.chosen == ("method", "lookup", "dtype")


@pytest.mark.parametrize("device,budget", [("cpu", CPU_BUDGET), ("cuda", 16)])
def test_a_method_without_a_budget_gets_the_device_budget(device, budget):
    d = choose(device, False, method="sequoia")
    assert (d.method, d.budget) == ("sequoia", budget)
    assert d.chosen == ("budget", "lookup", "dtype")
    # builder parameters given without a budget define the tree themselves: no budget is imposed
    shaped = choose(device, False, method="sequoia", builder_params=True)
    assert shaped.budget is None and "budget" not in shaped.chosen


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8"])
def test_an_explicit_dtype_is_kept_on_every_device(dtype):
    for device in ("cpu", "cuda"):
        for embedded in (True, False):
            assert choose(device, embedded, dtype=dtype).dtype == dtype
            assert resolve_dtype(dtype, device, embedded) == dtype


def test_auto_dtype_is_int8_only_for_the_embedded_target_on_a_cpu_without_a_map(no_gpu):
    assert resolve_dtype("auto", "cpu", True) == "int8" == resolve_dtype("AUTO", "cpu", True)
    assert resolve_dtype("auto", "cpu", False) == "float32"  # a named model: never quantised
    assert resolve_dtype("auto", "cuda", True) == "float32"
    for placement in (dict(device_map="auto"), dict(device_map="cpu"), dict(max_memory="cpu=2GiB"),
                      dict(device_map="model.layers=disk,lm_head=cpu")):
        assert resolve_dtype("auto", "cpu", True, **placement) == "float32", placement
        d = choose("cpu", True, **placement)  # placed on the CPU: the CPU's sizes
        assert (d.device, d.budget, d.dtype) == ("cpu", CPU_BUDGET, "float32"), placement


def test_auto_dtype_on_a_gpu_is_the_dtype_the_checkpoint_was_saved_in():
    asked = []

    def saved():
        asked.append(True)
        return "bfloat16"

    for embedded in (True, False):  # a built-in target too: its own saved dtype (float32)
        d = choose("cuda", embedded, checkpoint=saved)
        assert (d.dtype, d.budget, d.device) == ("bfloat16", 16, "gpu") and "dtype" in d.chosen
    assert resolve_dtype("auto", "cuda:1", False, checkpoint=saved) == "bfloat16"
    assert choose("cpu", False, device_map={"model": 0}, checkpoint=saved).dtype == "bfloat16"
    assert resolve_dtype("auto", "cpu", False, "0", checkpoint=saved) == "bfloat16"  # mapped to GPU 0
    read = len(asked)
    # a CPU, a map that keeps the model on the host, or a given dtype: the checkpoint is never read
    assert choose("cpu", True, checkpoint=saved).dtype == "int8"
    assert choose("cpu", False, checkpoint=saved).dtype == "float32"
    assert choose("cpu", True, device_map="cpu", checkpoint=saved).dtype == "float32"
    assert resolve_dtype("auto", "cpu", False, {"model": "cpu", "lm_head": "disk"}, checkpoint=saved) == "float32"
    assert choose("cuda", False, dtype="float16", checkpoint=saved).dtype == "float16"
    assert resolve_dtype("float32", "cuda", False, checkpoint=saved) == "float32"
    assert len(asked) == read
    assert choose("cuda", False).dtype == resolve_dtype("auto", "cuda", False) == "float32"  # nothing to read


@pytest.mark.parametrize("written,expected", [
    ({"dtype": "float16"}, "float16"), ({"dtype": "bfloat16"}, "bfloat16"), ({"dtype": "float32"}, "float32"),
    ({"torch_dtype": "bfloat16"}, "bfloat16"),  # a config written by an older transformers
    ({}, "float32"), ({"dtype": "float8_e4m3fn"}, "float32"),  # none, or none that loads as auto here
])
def test_the_saved_dtype_is_read_from_the_config_as_transformers_auto_reads_it(tmp_path, written, expected):
    config = tiny_llama(0).config.to_dict()
    for key in ("dtype", "torch_dtype"):
        config.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(config | written))
    assert saved_dtype(str(tmp_path)) == expected
    assert config_dtype(type("Config", (), {"dtype": getattr(torch, expected)})()) == expected


def test_a_config_that_cannot_be_read_leaves_float32_and_the_error_to_loading(tmp_path):
    assert saved_dtype(str(tmp_path / "nowhere")) == "float32"
    (tmp_path / "config.json").write_text("{not json")
    assert saved_dtype(str(tmp_path)) == "float32"


def test_device_maps_run_on_a_gpu_when_they_name_one_or_a_strategy_finds_one(monkeypatch):
    assert device_kind("cpu") == "cpu" and device_kind("cuda") == device_kind("cuda:1") == "gpu"
    assert device_kind("cpu", {"model.layers.0": 0, "lm_head": "cpu"}) == "gpu"
    assert device_kind("cpu", {"model": "cpu", "lm_head": "disk"}) == "cpu"
    assert device_kind("cpu", "model.layers=cuda:0,lm_head=cpu") == "gpu"
    assert device_kind("cpu", "0") == "gpu"
    for available, kind in ((False, "cpu"), (True, "gpu")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda available=available: available)
        assert device_kind("cpu", "auto") == device_kind("cpu", "balanced") == kind
        assert device_kind("cpu", None, "0=10GiB,cpu=20GiB") == kind  # max_memory alone: auto
    d = choose("cpu", True, device_map="auto")
    assert (d.device, d.budget, d.dtype) == ("gpu", 16, "float32")


def test_a_bad_device_is_one_line():
    with pytest.raises(ArborError, match="not a device"):
        choose("gpu-please", True)


# ---------------------------------------------------------------------------------- the generator
@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(0)
    return target, perturbed_copy(target, 1, 0.3)


def _pair(tiny, name="tiny-target"):
    target, draft = tiny
    return ModelPair(name, "tiny-draft", ModelAdapter(target), ModelDrafter(draft),
                     char_tokenizer())


def test_the_generator_without_arguments_loads_and_runs_the_defaults(tiny, monkeypatch):
    seen = {}

    def fake_load_pair(*args):
        seen["args"] = args
        return _pair(tiny, args[0])

    monkeypatch.setattr("arborspec.api.load_pair", fake_load_pair)
    gen = SpeculativeGenerator()
    assert seen["args"][:4] == ("embedded", None, "cpu", "int8")  # the embedded target's fast path
    assert gen.settings == Defaults("dyspec", 1, 6, "int8", "cpu", ALL)
    assert (gen.builder.name, gen.builder.budget, gen.decoder.lookup) == ("dyspec", 1, 6)
    named = SpeculativeGenerator(target="some/model", method="chain")
    assert seen["args"][:4] == ("some/model", None, "cpu", "float32")
    assert (named.builder.name, named.builder.budget, named.decoder.lookup) == ("chain", CPU_BUDGET, 6)
    mine = SpeculativeGenerator(target="some/model", method="chain", budget=4, lookup=0,
                                dtype="bfloat16")
    assert seen["args"][3] == "bfloat16" and (mine.builder.budget, mine.decoder.lookup) == (4, 0)
    gpu = SpeculativeGenerator(device="cuda")  # the embedded target was saved in float32
    assert seen["args"][2:4] == ("cuda", "float32") and gpu.builder.budget == 16
    assert gpu.describe().startswith("dyspec, 16 draft nodes + lookup 6 | target "
                                     "embedded SmolLM2-135M-Instruct (float32, cpu) | ")
    monkeypatch.setattr("arborspec.api.saved_dtype", lambda path: {"some/model": "bfloat16"}.get(path))
    hub = SpeculativeGenerator(target="some/model", device="cuda")  # read from its config on a GPU
    assert seen["args"][2:4] == ("cuda", "bfloat16") and hub.settings.dtype == "bfloat16"
    SpeculativeGenerator(target="some/model", device="cuda", dtype="float16")
    assert seen["args"][3] == "float16"


def test_the_generator_on_a_given_pair_takes_its_precision_and_stays_exact(tiny):
    gen = SpeculativeGenerator(pair=_pair(tiny))  # a draft model: trees sized from both models' costs
    assert gen.settings == Defaults("dyspec", "auto", 6, "float32", "cpu", ALL[:3])
    assert gen.describe() == ("dyspec, auto-sized trees of at most 32 draft nodes + lookup 6 | target "
                              f"tiny-target (float32, cpu) | draft tiny-draft (float32) | {BASELINE} "
                              "float32 target")
    prompt = [1, 17, 42, 8, 23]
    out = gen.generate(prompt, max_new_tokens=24)
    cfg = DecodeConfig(max_new_tokens=24, eos_token_ids=(2,))
    assert out.output_ids == autoregressive_generate(ModelAdapter(tiny[0]), prompt, cfg).output_ids
    auto = SpeculativeGenerator(pair=_pair(tiny), budget="auto", lookup=0)
    assert auto.describe().startswith("dyspec, auto-sized trees of at most 32 draft nodes | ")


# ---------------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def tiny_dirs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-defaults")
    tok = char_tokenizer()
    for name, model in zip(("target", "draft"), tiny):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


def test_generate_names_method_size_precision_draft_and_baseline_first(tiny_dirs):
    target, draft = str(tiny_dirs / "target"), str(tiny_dirs / "draft")
    pair = ["--target", target, "--draft", draft, "--no-chat"]
    result = CliRunner().invoke(app, ["generate", "Hello there", *pair, "-n", "8", "--compare-ar"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        f"dyspec, auto-sized trees of at most 32 draft nodes + lookup 6 | target {target} (float32, cpu) "
        f"| draft {draft} (int8) | {BASELINE} float32 target")
    assert "identical tokens" in result.stderr
    result = CliRunner().invoke(app, ["generate", "Hello there", *pair, "-n", "4", "-m", "chain",
                                      "--budget", "2", "--lookup", "0", "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        f"chain, 2 draft nodes | target {target} (bfloat16, cpu) | draft {draft} (int8) | "
        f"{BASELINE} bfloat16 target")
    result = CliRunner().invoke(app, ["generate", "Hello there", *pair, "-n", "4", "--draft-dtype", "float",
                                      "--dtype", "bfloat16", "--budget", "2"])
    assert result.exit_code == 0, result.output
    assert f"| draft {draft} (bfloat16) |" in result.stderr.splitlines()[0]


def test_bench_without_a_method_runs_the_device_defaults(tiny_dirs, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Count: 1 2 3 4"}\n')
    result = CliRunner().invoke(app, ["bench", "--target", str(tiny_dirs / "target"),
                                      "--draft", str(tiny_dirs / "draft"),
                                      "--prompts", str(prompts),
                                      "-n", "6", "--warmup", "0", "--no-chat", "--threads", "1",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    header = json.loads((tmp_path / "run" / "results.jsonl").read_text().splitlines()[0])
    assert header["config"]["methods"] == ["dyspec:budget=auto:lookup=6"]  # a draft model
    assert header["config"]["dtype"] == "float32"


@pytest.mark.parametrize("embedded,dtype,budget", [
    (True, "auto", 1), (True, "int8", 1), (True, "float32", CPU_BUDGET), (False, "auto", CPU_BUDGET),
    (False, "int8", 1), (False, "bfloat16", CPU_BUDGET),
])
def test_the_cpu_budget_follows_the_precision_the_target_runs_in(embedded, dtype, budget):
    """On a CPU the int8 target gets INT8_CPU_BUDGET draft nodes (its forwards are replayed and a plain token
    costs little beyond its weights), any other precision CPU_BUDGET; explicit or chosen alike."""
    d = choose("cpu", embedded, dtype=dtype)
    assert d.budget == budget and "budget" in d.chosen
    assert choose("cpu", embedded, dtype=dtype, budget=5).budget == 5
    # a draft model: the tree sized each step from both models' measured costs, whatever the precision
    assert choose("cpu", embedded, dtype=dtype, draft_model=True).budget == "auto"
    assert choose("cuda", embedded, draft_model=True).budget == 16
