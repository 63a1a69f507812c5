"""Shared fixtures: tiny randomly initialised Llama pairs (seconds on CPU) and the embedded model."""

from __future__ import annotations


import pytest
import torch

# Tiny test models gain nothing from threads, and parallel threads fight over 2 cores.
torch.set_num_threads(1)


def tiny_llama(seed: int, vocab: int = 96, hidden: int = 48, layers: int = 2, init: float = 0.3, max_pos: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos,
        initializer_range=init, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg).eval()
    return model


def perturbed_copy(model, seed: int, noise: float):
    """A draft that agrees with the target often but not always."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=gen))
    return draft


def assert_greedy_identical(target, draft, builder, prompt=(1, 17, 42, 8, 23), max_new_tokens=24):
    """Greedy speculative output == plain decoding == HF generate (up to HF's EOS stop); the tree must help."""
    from arborspec.engine.adapter import ModelAdapter
    from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
    from arborspec.drafters import ModelDrafter

    prompt = list(prompt)
    cfg = DecodeConfig(max_new_tokens=max_new_tokens)
    spec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), builder).generate(prompt, cfg)
    plain = autoregressive_generate(ModelAdapter(target), prompt, cfg)
    hf = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=0)
    hf_new = hf[0, len(prompt):].tolist()  # HF stops at EOS (id 2); our config has no EOS
    assert spec.output_ids == plain.output_ids
    assert plain.output_ids[: len(hf_new)] == hf_new and len(hf_new) >= 8
    assert max(s.accepted_length for s in spec.steps) > 1  # the tree actually helped
    return spec


@pytest.fixture(scope="session")
def tiny_pair():
    target = tiny_llama(0)
    draft = perturbed_copy(target, 1, 0.3)
    return target, draft


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded SmolLM2 target (converted once, cached)."""
    from arborspec.models import load_model, load_tokenizer

    return load_model("embedded"), load_tokenizer("embedded")
