"""A target and its drafter: `ModelPair`, and the drafter a name stands for beside a loaded target
(`named_drafter`: the n-gram drafter, a draft head, or a draft model in the precision that goes
with the target's, its vocabulary checked against the target's)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..catalog import cache_root
from ..common.vocab import check_same_tokenizer, check_vocab_size
from ..drafters import Drafter, HeadDrafter, ModelDrafter, NgramDrafter, load_head
from ..drafters.draft_vocab import frequent_tokens
from ..engine.adapter import ModelAdapter
from ..errors import ArborError
from .hf import load_model, load_tokenizer
from .names import NGRAM_DRAFT, is_head_dir, resolve_head_dir, resolve_model_path
from .precision import INT8, draft_precision, drafter_precision, model_precision, parse_dtype


@dataclass
class ModelPair:
    """A loaded target (wrapped in its adapter), a drafter and the target's tokenizer."""

    target_name: str
    draft_name: str
    target: ModelAdapter
    drafter: Drafter
    tokenizer: Any

    @functools.cached_property
    def precision(self) -> str:
        """The target's precision as loaded: float32, float16, bfloat16 or int8."""
        return model_precision(self.target.model)

    @functools.cached_property
    def draft_precision(self) -> str | None:
        """What the drafter computes in: a draft model's precision, a draft head's (int8 when its
        logits are), None for a drafter without weights (n-gram)."""
        return drafter_precision(self.drafter)


def check_same_vocabulary(target_model, target_tok, draft_model, draft_name: str) -> None:
    """Refuse a draft whose vocabulary differs from the target's (speculation
    would be meaningless)."""
    rows = [m.get_output_embeddings().weight.shape[0] for m in (draft_model, target_model)]
    check_vocab_size(*rows, what=f"draft {draft_name!r}")
    if target_tok is None:  # a loaded target given without its tokenizer: the size check only
        return
    try:
        draft_tok = load_tokenizer(draft_name)
    except ArborError:
        return  # a draft without its own tokenizer files is accepted on matching vocabulary size
    check_same_tokenizer(target_tok, draft_tok, what=f"draft {draft_name!r}")


# A draft model that runs int8 on a CPU drafts from a cut vocabulary (drafters/draft_vocab.py) when
# its own has at least CUT_VOCAB_FROM tokens: then its LM head is a large share of its forward
# (Qwen2.5's 151,936 x 896 head, a quarter of the 0.5B model). DRAFT_VOCAB: the cut's size.
CUT_VOCAB_FROM = 100_000
DRAFT_VOCAB = 32_768


def named_drafter(
    draft: str, adapter: ModelAdapter, tokenizer, precision: str, int8_head: bool
) -> Drafter:
    """The drafter a name stands for next to the target in `adapter`: "ngram", a draft-head
    directory or a shipped head's name, else a draft model's id or directory (loaded in the
    precision that goes with the target's, its vocabulary checked)."""
    if draft == NGRAM_DRAFT:
        return NgramDrafter(adapter.vocab_size)
    if is_head_dir(draft):
        head = load_head(
            resolve_head_dir(draft),
            adapter.model,
            parse_dtype(precision),
            int8_logits=int8_head,
            int8_layers=int8_head,
        )
        return HeadDrafter(head)
    draft_model = load_draft_model(draft, adapter, tokenizer, precision, int8_head)
    vocab = None
    if int8_head and draft_model.config.get_text_config().vocab_size >= CUT_VOCAB_FROM:
        vocab = frequent_tokens(tokenizer, DRAFT_VOCAB, cache_root() / "draft-vocab")
    return ModelDrafter(draft_model, int8_logits=int8_head, vocab_ids=vocab)


def load_draft_model(
    draft: str, adapter: ModelAdapter, tokenizer, precision: str, int8: bool
):
    """A draft model on the target's device, its vocabulary checked: in int8 (engine/int8.py, any
    CPU target: a draft's precision never changes the output) when `int8`, unless its attention
    needs what the int8 path lacks (logit soft-capping: then in float32); else in the target's
    floating dtype."""
    precision_of_draft = draft_precision(precision)
    if int8:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(resolve_model_path(draft))
        if not getattr(config.get_text_config(decoder=True), "attn_logit_softcapping", None):
            precision_of_draft = INT8
    draft_model = load_model(draft, adapter.device, precision_of_draft)
    check_same_vocabulary(adapter.model, tokenizer, draft_model, draft)
    return draft_model
