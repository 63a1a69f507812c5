"""`NgramDrafter`: model-free drafting from the context itself (prompt-lookup decoding,
generalised to trees).

It matches the longest suffix of the context against earlier context and turns
the continuations it finds into a next-token distribution, so any target can be
sped up on repetitive text without a draft model (`--draft ngram`).
"""

from __future__ import annotations

import numpy as np
import torch

from ..common.timing import clock
from ..engine.contracts import Drafter
from ..engine.tree import TokenTree


class NgramDrafter(Drafter):
    """Next-token distribution from continuations of earlier occurrences of the context's suffix.

    For each suffix length n = max_n..1 the tokens that followed earlier
    occurrences of the last n tokens are counted; the distributions are mixed
    with weight proportional to n (longer matches are more trustworthy), and a
    small share of the context's unigram counts keeps every seen token possible.
    Logits are log-probabilities (-inf for tokens never seen in the context).
    """

    def __init__(self, vocab_size: int, max_n: int = 4, unigram_share: float = 0.05) -> None:
        self.vocab_size, self.max_n, self.unigram_share = vocab_size, max_n, unigram_share
        self.context = np.zeros(0, dtype=np.int64)

    def spawn(self) -> NgramDrafter:
        return NgramDrafter(self.vocab_size, self.max_n, self.unigram_share)

    def begin(self, committed: list[int]) -> torch.Tensor:
        self.forward_time, self.forwards = 0.0, 0
        self.context = np.asarray(committed, dtype=np.int64)
        return self._logits(self.context)

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        t0 = clock()
        rows = [self._logits(np.concatenate([self.context, tree.path_tokens(n)])) for n in nodes]
        self.forward_time += clock() - t0
        self.forwards += 1
        return torch.stack(rows)

    def next_token_probs(self, context: np.ndarray) -> torch.Tensor:
        probs = torch.zeros(self.vocab_size, dtype=torch.float64)
        total_weight = 0.0
        for n in range(min(self.max_n, len(context) - 1), 0, -1):
            suffix = context[-n:]
            # windows ending before the last token
            windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)
            hits = np.nonzero((windows == suffix).all(axis=1))[0]
            if hits.size == 0:
                continue
            nxt = torch.from_numpy(context[hits + n])
            counts = torch.bincount(nxt, minlength=self.vocab_size).double()
            probs += n * counts / counts.sum()
            total_weight += n
        unigram = torch.bincount(torch.from_numpy(context), minlength=self.vocab_size).double()
        unigram /= unigram.sum()
        if total_weight == 0:
            return unigram.float()
        probs = (1 - self.unigram_share) * probs / total_weight + self.unigram_share * unigram
        return probs.float()

    def _logits(self, context: np.ndarray) -> torch.Tensor:
        return torch.log(self.next_token_probs(context))
