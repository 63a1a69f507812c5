"""Shared fixtures: tiny randomly initialised Llama pairs (seconds on CPU), the embedded model, and
`TableDrafter`, the one test double for a drafter whose distributions come from a table."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from arborspec.engine.contracts import DraftContext, Drafter
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.tree import TokenTree

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


def char_tokenizer():
    """A character-level tokenizer for the tiny models' 96 tokens (no chat template), to save beside them."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 124)]  # 92 printable characters + 4 specials = the tiny models' 96 tokens
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate(chars)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")


class TableDrafter(Drafter):
    """A drafter whose next-token distribution after each token path is `table(path)` (`[V]` probabilities).

    Counts draft forwards (`expand` calls) and the rows they asked for.
    """

    def __init__(self, table: Callable[[tuple[int, ...]], torch.Tensor], vocab_size: int) -> None:
        self.table, self.vocab_size = table, vocab_size
        self.forwards, self.rows = 0, 0

    def dist(self, path: tuple[int, ...]) -> torch.Tensor:  # [V]
        return self.table(tuple(path))

    def begin(self, committed: list[int]) -> torch.Tensor:
        return self.dist(()).log()

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:  # [K, V]
        self.forwards += 1
        self.rows += len(nodes)
        return torch.stack([self.dist(tuple(tree.path_tokens(n))).log() for n in nodes])


def random_table(vocab: int, seed: int, power: float = 3.0, zero_share: float = 0.0,
                 bump: float = 0.0) -> Callable[[tuple[int, ...]], torch.Tensor]:
    """A fixed pseudo-random distribution per token path: `rand ** power`, a `zero_share` of exact
    zeros, and `bump` added to one random token (so no distribution is all zeros)."""

    def table(path: tuple[int, ...]) -> torch.Tensor:
        gen = torch.Generator().manual_seed(hash((seed, *path)) & (2**62 - 1))
        w = torch.rand(vocab, generator=gen) ** power
        if zero_share:
            w[torch.rand(vocab, generator=gen) < zero_share] = 0.0
        if bump:
            w[int(torch.randint(vocab, (1,), generator=gen))] += bump
        return w / w.sum()

    return table


def table_ctx(drafter: Drafter, seed: int = 0, temperature: float = 1.0) -> DraftContext:
    """The draft side of one step rooted after token 0, with a seeded generator."""
    return DraftContext(drafter, SamplingConfig(temperature=temperature), torch.Generator().manual_seed(seed),
                        drafter.begin([0]))


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
def small_vocab_pair():
    """A 16-token target and a perturbed copy as draft: small enough for exact distributions (Monte-Carlo tests)."""
    target = tiny_llama(5, vocab=16, hidden=32, init=0.4)
    return target, perturbed_copy(target, 6, 0.5)


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded SmolLM2 target (converted once, cached)."""
    from arborspec.models import load_model, load_tokenizer

    return load_model("embedded"), load_tokenizer("embedded")
