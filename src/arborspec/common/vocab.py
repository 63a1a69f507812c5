"""The one vocabulary check: a draft (or a C2T classifier) must speak the target's vocabulary.

Speculation compares token ids, so a draft with another vocabulary is refused
before anything runs: same number of output rows, and, when both tokenizers
are at hand, the same token -> id map, special tokens and splitting of text.
"""

from __future__ import annotations

from ..errors import ArborError

DRAFT_FIX = (
    "use a draft trained with the target's tokenizer (`arborspec distill` makes "
    "one), or --draft ngram"
)
PROBE_TEXT = "Hello, world! def f(x): return x ** 2  # ünïcödé 123"


def check_vocab_size(
    have: int | None, target: int | None, *, what: str = "the draft", fix: str = DRAFT_FIX
) -> None:
    """Refuse `what` when its vocabulary size differs from the target's (None:
    unknown, not checked)."""
    if have is not None and target is not None and have != target:
        raise ArborError(f"{what} has a vocabulary of {have} tokens, the target {target}: {fix}")


def check_same_tokenizer(
    target_tok, draft_tok, *, what: str = "the draft", probe: str | None = None
) -> None:
    """Refuse a draft tokenizer that maps tokens to other ids, has other special tokens or splits
    text differently."""
    fix = "use the target's tokenizer"
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise ArborError(
            f"{what} uses a different tokenizer from the target (token -> id maps differ): {fix}"
        )
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if a is not None and b is not None and a != b:
            raise ArborError(f"{what}'s {attr} ({b}) differs from the target's ({a}): {fix}")
    text = probe or PROBE_TEXT
    if target_tok(text)["input_ids"] != draft_tok(text)["input_ids"]:
        raise ArborError(f"{what}'s tokenizer splits text differently from the target's: {fix}")
