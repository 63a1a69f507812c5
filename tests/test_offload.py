"""Targets placed by a device map (accelerate) with layers and the LM head offloaded to the CPU and the disk.

A tiny target saved to a folder is loaded back with `load_model(device_map=...)`; the
engine must give exactly the tokens of plain decoding and of the same model loaded
normally, compact every layer's cache, and leave an offloaded LM head to the model's
own forward. The placement options parse exactly or fail with one-line `ArborError`s.
"""

import os

import arborspec.models.device_map as device_maps
import pytest
import torch
from arborspec.builders.registry import make_builder
from arborspec.cli import app
from arborspec.drafters import ModelDrafter, NgramDrafter
from arborspec.drafters.head import DraftHead, HeadDrafter, load_head, target_fingerprint
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.engine.lm_head import HeadRows
from arborspec.engine.placement import execution_device, is_offloaded, materialised
from arborspec.engine.tree import TokenTree
from arborspec.errors import ArborError
from arborspec.models import load_model, parse_device_map, parse_max_memory, placement_kwargs
from typer.testing import CliRunner

from conftest import assert_greedy_identical, greedy_reference, perturbed_copy, tiny_llama
from test_adapter import COMPACTED_PATH, assert_caches_equal, forward_and_compact

GiB = 2**30
# layers on "cpu" and on "disk", the LM head on disk
LAYERS_AND_HEAD = ("model.embed_tokens=cpu,model.layers.0=cpu,model.layers.1=disk,model.layers.2=cpu,"
                   "model.norm=cpu,lm_head=disk")
# the embedding, the LM head (what the draft head reads from the target), the first layer and the final norm on disk
HEAD_READS_ON_DISK = ("model.embed_tokens=disk,model.layers.0=disk,model.layers.1=cpu,model.layers.2=cpu,"
                      "model.norm=disk,lm_head=disk")
PROMPTS = [[1, 17, 42, 8, 23], [5, 60, 61, 62, 60, 61, 62, 60]]


def assert_as_plain_model(placed, plain, drafter, builder, helped=True):
    """Greedy output on the placed target == its plain decoding == HF generate (the shared check), and == plain
    decoding of the same model loaded without a device map."""
    for spec, prompt in zip(assert_greedy_identical(placed, drafter, builder, PROMPTS, helped=helped), PROMPTS):
        assert spec.output_ids == greedy_reference(plain, prompt)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(plain target, its folder, a draft that often agrees with it, the tmp root)."""
    root = tmp_path_factory.mktemp("offload")
    target = tiny_llama(0, layers=3)
    target.save_pretrained(root / "target")
    return target, str(root / "target"), perturbed_copy(target, 1, 0.3), root


def offloaded(saved, device_map: str):
    _, path, _, root = saved
    return load_model(path, device_map=device_map, offload_folder=root / "offload")


@pytest.fixture(scope="module")
def placed(saved):
    return offloaded(saved, LAYERS_AND_HEAD)


# --------------------------------------------------------------------------- the placed model


def test_layers_and_head_are_offloaded(placed):
    assert set(placed.hf_device_map.values()) == {"cpu", "disk"}
    assert placed.lm_head.weight.device.type == "meta" and is_offloaded(placed.lm_head)
    assert placed.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    assert not is_offloaded(placed.model.layers[0].self_attn.q_proj)
    assert execution_device(placed) == torch.device("cpu")
    lm = ModelAdapter(placed)
    assert lm.device == torch.device("cpu") and not lm.head.supported  # the model's own forward fetches the head


def test_a_head_under_a_hook_uses_the_models_own_forward(saved):
    """Even with its weight in place, a head under an accelerate hook is left to the model's forward."""
    import copy

    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    model = copy.deepcopy(saved[0])
    assert HeadRows(model).supported
    add_hook_to_module(model.lm_head, AlignDevicesHook(execution_device="cpu"))
    assert not HeadRows(model).supported


def test_materialised_weights_are_the_checkpoints(saved, placed):
    plain = saved[0]
    assert torch.equal(materialised(placed.lm_head), plain.lm_head.weight)
    assert materialised(placed.lm_head, "bias") is None
    assert materialised(placed.model.norm) is placed.model.norm.weight  # in place: the tensor itself


def test_tree_logits_equal_the_plain_models(saved, placed):
    plain = saved[0]
    tree = TokenTree.from_root(5)
    a = tree.add(0, 11)
    tree.add(0, 12)
    tree.add(a, 13)
    lms = [ModelAdapter(placed), ModelAdapter(plain)]
    for lm in lms:
        lm.prefill(torch.tensor([3, 14, 15, 9]))
    got, want = lms[0].tree_forward(tree, lazy=True), lms[1].tree_forward(tree)
    assert torch.is_tensor(got) and torch.allclose(got, want, atol=1e-5)


def test_compaction_keeps_the_path_in_every_layer(saved, placed):
    lm = forward_and_compact(placed)
    assert len(lm.cache.layers) == placed.config.num_hidden_layers
    for model in (placed, saved[0]):  # a fresh prefill of the path, offloaded and plain
        fresh = ModelAdapter(model)
        fresh.prefill(torch.tensor(COMPACTED_PATH))
        assert_caches_equal(lm.cache, fresh.cache)


# --------------------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("name", ["dyspec", "opt-tree"])
def test_greedy_tokens_equal_plain_decoding(saved, placed, name):
    plain, _, draft, _ = saved
    assert_as_plain_model(placed, plain, ModelDrafter(draft), make_builder(name, budget=8))


def test_ngram_drafter_on_an_offloaded_target(saved, placed):
    drafter = NgramDrafter(placed.config.vocab_size)
    assert_as_plain_model(placed, saved[0], drafter, make_builder("dyspec", budget=8), helped=False)


def test_draft_head_on_a_target_with_its_embedding_and_head_on_disk(saved, tmp_path):
    """The head reads the target's embedding and LM head (offloaded: from the hooks) and its features (a hook)."""
    plain = saved[0]
    target = offloaded(saved, HEAD_READS_ON_DISK)
    assert {target.model.embed_tokens.weight.device.type, target.lm_head.weight.device.type} == {"meta"}
    assert target_fingerprint(target) == target_fingerprint(plain)
    torch.manual_seed(0)
    head = DraftHead(plain)
    head.init_from_target(plain)
    head.save(tmp_path / "head", "tiny", plain)
    loaded = load_head(tmp_path / "head", target)  # refuses another target: the fingerprint must match
    assert torch.equal(loaded.lm_rows, plain.lm_head.weight)
    assert_as_plain_model(target, plain, HeadDrafter(loaded), make_builder("dyspec", budget=8), helped=False)


# --------------------------------------------------------------------------- the options


@pytest.fixture
def no_gpu(monkeypatch):
    """This machine as a CPU-only one, wherever the test runs."""
    monkeypatch.setattr(device_maps, "_accelerators", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_max_memory_parses_exactly(monkeypatch):
    monkeypatch.setattr(device_maps, "_accelerators", lambda: 2)
    assert parse_max_memory("0=10GiB,cpu=20GiB") == {0: 10 * GiB, "cpu": 20 * GiB}
    assert parse_max_memory("cpu=2GiB") == {"cpu": 2 * GiB}
    assert parse_max_memory(" CPU = 1.5 GB , cuda:1=512MiB, disk=100") == {"cpu": 1_500_000_000, 1: 512 * 2**20,
                                                                          "disk": 100}
    assert parse_max_memory({0: "1KiB", "cpu": 4096}) == {0: 1024, "cpu": 4096}
    assert parse_max_memory("cpu=1kb,disk=2TB") == {"cpu": 1000, "disk": 2 * 10**12}
    assert parse_max_memory(None) is None


@pytest.mark.parametrize("spec,message", [
    ("cpu", "not DEVICE=SIZE"), ("cpu=", "not DEVICE=SIZE"), ("=1GB", "not DEVICE=SIZE"),
    ("cpu=lots", "not a memory size"), ("cpu=1.5", "not a memory size"), ("cpu=-1GB", "not a memory size"),
    ("cpu=0", "not a memory size"), ("cpu=10GiBs", "not a memory size"), ("cpu=inf", "not a memory size"),
    ("0=10GiB,cpu=20GiB", "GPU 0"), ("cuda:0=1GB", "GPU 0"), ("gpu7=1GB", "not a device"), ("meta=1GB", "meta"),
    (" , ", "empty"),
])
def test_bad_max_memory_is_one_line(no_gpu, spec, message):
    with pytest.raises(ArborError, match=message) as info:
        parse_max_memory(spec)
    assert "\n" not in str(info.value)


def test_device_map_parses_exactly(no_gpu):
    assert parse_device_map("auto") == "auto" and parse_device_map("sequential") == "sequential"
    assert parse_device_map("cpu") == "cpu"
    assert parse_device_map("model.layers.0=cpu, lm_head=DISK") == {"model.layers.0": "cpu", "lm_head": "disk"}
    assert parse_device_map({"model": "cpu", "lm_head": "disk"}) == {"model": "cpu", "lm_head": "disk"}
    assert parse_device_map(None) is None


@pytest.mark.parametrize("spec,message", [
    ("cuda", "cuda"), ("cuda:1", "cuda:1"), ("0", "GPU 0"), ("model=cpu,lm_head=cuda:0", "cuda:0"),
    ("model=cpu,lm_head=2", "GPU 2"), ("disk", "--max-memory cpu="), ("fast", "not a device"),
    ("lm_head=", "MODULE=DEVICE"),
])
def test_bad_device_map_is_one_line(no_gpu, spec, message):
    with pytest.raises(ArborError, match=message) as info:
        parse_device_map(spec)
    assert "\n" not in str(info.value)


def test_placement_keywords(tmp_path):
    assert placement_kwargs() == {}
    alone = placement_kwargs(max_memory="cpu=2GiB")  # implies auto, offloads to a folder of this process
    assert alone["device_map"] == "auto" and alone["max_memory"] == {"cpu": 2 * GiB}
    assert os.path.isdir(alone["offload_folder"])
    assert placement_kwargs("cpu", offload_folder=tmp_path) == {"device_map": "cpu", "offload_folder": str(tmp_path)}
    with pytest.raises(ArborError, match="needs --device-map"):
        placement_kwargs(offload_folder=tmp_path)


def test_max_memory_alone_offloads_what_does_not_fit(saved):
    """`max_memory` below the model's size: the rest goes to disk, and the adapter still runs it."""
    plain, path, _, root = saved
    model = load_model(path, max_memory="cpu=20000", offload_folder=root / "small")
    assert "disk" in set(model.hf_device_map.values())
    prompt, cfg = PROMPTS[0], DecodeConfig(max_new_tokens=8)
    assert (autoregressive_generate(ModelAdapter(model), prompt, cfg).output_ids
            == autoregressive_generate(ModelAdapter(plain), prompt, cfg).output_ids)


def test_a_map_transformers_refuses_is_one_line(saved):
    _, path, _, root = saved
    with pytest.raises(ArborError, match="cannot place model .* does not give any device") as info:
        load_model(path, device_map="model.layers=disk", offload_folder=root / "refused")  # no device for the rest
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("args,message", [
    (["--max-memory", "cpu=lots"], "not a memory size"),
    (["--device-map", "cuda:0"], "cuda:0"),
    (["--offload-folder", "/tmp/x"], "needs --device-map"),
])
def test_cli_refuses_bad_placement_in_one_line(no_gpu, args, message):
    for command in (["generate", "hello"], ["bench", "-m", "dyspec:budget=8"], ["calibrate"], ["train-c2t"]):
        result = CliRunner().invoke(app, [*command, "--target", "/no/such/dir", *args])
        assert result.exit_code == 2, (command, result.output)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], (command, result.output)


def test_cli_passes_the_placement_to_the_loader(monkeypatch, tmp_path):
    seen = {}

    def fake_load_pair(*args):
        seen["args"] = args
        raise ArborError("stop here")

    monkeypatch.setattr("arborspec.api.load_pair", fake_load_pair)
    result = CliRunner().invoke(app, ["generate", "hi", "--draft", "ngram", "--max-memory", "cpu=2GiB",
                                      "--device-map", "auto", "--offload-folder", str(tmp_path)])
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen["args"][4:] == ("auto", "cpu=2GiB", tmp_path, "auto")  # placement, then --draft-logits
    result = CliRunner().invoke(app, [])  # the demo: generate's defaults spelled out, no placement
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen["args"][4:] == (None, None, None, "auto")
