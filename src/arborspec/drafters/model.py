"""Drafters: where a tree builder gets draft next-token logits for the nodes it expands.

A drafter follows the committed sequence across steps and answers, for any
node of the tree being built, "what does the draft predict after the path to
this node?". Two kinds:

* `ModelDrafter` — a Hugging Face draft model. Nodes are fed depth by depth
  (one forward per call, with a tree mask over the draft's own KV cache); after
  verification the accepted path's KV rows are kept (compaction), the rest is
  cropped, and tokens the draft has not seen yet are fed at the next `begin`.
* `NgramDrafter` — model-free: matches the longest suffix of the context
  against earlier context and turns the continuations it finds into a
  next-token distribution (prompt-lookup decoding, generalised to trees).

Contract: `expand(tree, nodes)` may only be called for nodes whose ancestors
were expanded before (a node's parent is always expanded: its children were
drawn from the parent's distribution).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import numpy as np
import torch

from ..engine.adapter import ModelAdapter
from ..engine.tree import TokenTree


class Drafter(ABC):
    vocab_size: int
    forward_time: float = 0.0  # seconds spent in draft forwards since the last `begin`
    forwards: int = 0
    uses_target_features: bool = False  # True: the engine calls `observe` with the target's last hidden states

    @abstractmethod
    def begin(self, committed: list[int]) -> torch.Tensor:
        """Sync with the committed tokens (the last one is the tree root); return the root's logits `[V]`."""

    @abstractmethod
    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        """Logits `[K, V]` of the next token after the path to each of `nodes` (non-root)."""

    def commit(self, tree: TokenTree, accepted: list[int]) -> None:
        """Called after verification with the accepted path (node indices, root excluded)."""

    def reset(self) -> None:
        """Forget everything (a new prompt follows)."""

    def observe(self, features: torch.Tensor) -> None:
        """Target features `[k, H]` (last hidden states) of the next k committed tokens, in order.

        Only called when `uses_target_features`; after it, the features of every
        committed token except the last (the next root) have been observed.
        """

    @property
    def max_positions(self) -> int:
        return 1 << 30


class ModelDrafter(Drafter):
    def __init__(self, model) -> None:
        self.lm = ModelAdapter(model)
        self.vocab_size = self.lm.vocab_size
        self.slots: dict[tuple[int, ...], int] = {}  # token path from the root -> draft cache row
        self.base = 0  # committed tokens in the cache after `begin`

    @property
    def max_positions(self) -> int:
        return self.lm.max_positions

    def reset(self) -> None:
        self.lm.reset()
        self.slots = {}

    def begin(self, committed: list[int]) -> torch.Tensor:
        self.forward_time, self.forwards = 0.0, 0
        if self.lm.cache_len >= len(committed):  # never expected, but keep the root's row fresh
            self.lm.crop_to(len(committed) - 1)
        pending = torch.tensor(committed[self.lm.cache_len:], dtype=torch.long)
        t0 = time.perf_counter()
        logits = self.lm.prefill(pending)
        self._tick(t0)
        self.base = len(committed)
        self.slots = {(): self.base - 1}
        return logits

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        past, k = self.lm.cache_len, len(nodes)
        allowed = torch.zeros(k, past + k, dtype=torch.bool)
        allowed[:, : self.base] = True
        paths = [tuple(tree.path_tokens(n)) for n in nodes]
        for row, path in enumerate(paths):
            for d in range(1, len(path)):
                allowed[row, self.slots[path[:d]]] = True  # KeyError here = contract broken (ancestor not expanded)
            allowed[row, past + row] = True
        positions = [self.base - 1 + tree.depths[n] for n in nodes]
        t0 = time.perf_counter()
        logits = self.lm.nodes_forward([tree.tokens[n] for n in nodes], positions, allowed)
        self._tick(t0)
        for row, path in enumerate(paths):
            self.slots[path] = past + row
        return logits

    def commit(self, tree: TokenTree, accepted: list[int]) -> None:
        keep, path = [], ()
        for node in accepted:  # the accepted prefix whose KV the draft already holds
            path = path + (tree.tokens[node],)
            if path not in self.slots:
                break
            keep.append(self.slots[path])
        self.lm.compact(self.base, keep)
        self.slots = {}

    def _tick(self, t0: float) -> None:
        if self.lm.device.type == "cuda":
            torch.cuda.synchronize(self.lm.device)
        self.forward_time += time.perf_counter() - t0
        self.forwards += 1


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

    def begin(self, committed: list[int]) -> torch.Tensor:
        self.forward_time, self.forwards = 0.0, 0
        self.context = np.asarray(committed, dtype=np.int64)
        return self._logits(self.context)

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        t0 = time.perf_counter()
        rows = [self._logits(np.concatenate([self.context, tree.path_tokens(n)])) for n in nodes]
        self.forward_time += time.perf_counter() - t0
        self.forwards += 1
        return torch.stack(rows)

    def next_token_probs(self, context: np.ndarray) -> torch.Tensor:
        probs = torch.zeros(self.vocab_size, dtype=torch.float64)
        total_weight = 0.0
        for n in range(min(self.max_n, len(context) - 1), 0, -1):
            suffix = context[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # windows ending before the last token
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
