"""`ModelDrafter`: draft logits from a Hugging Face draft model (the `Drafter` contract is in
`engine/contracts.py`).

The drafter follows the committed sequence across steps. Tree nodes are fed
depth by depth: one forward per call, with a tree mask over the draft's own KV
cache (docs/algorithms.md §4). After verification the accepted path's KV rows
are kept (compaction), the rest is cropped, and tokens the draft has not seen
yet are fed at the next `begin`, as one forward with a causal mask (so that a decoder replayed
from traces, engine/traced.py, takes it too).

`int8_logits`: the draft's logits from an int8 copy of its LM head (per-channel weights, per-row
activation scales, engine/int8.py; CPU). A draft model's LM head is its largest matrix (Qwen2.5's
151,936-token head is a quarter of the 0.5B model) and a float32 row of it costs about as much as
the rest of an int8 forward; the draft's precision never changes the output, only how often the
target agrees.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from ..common.timing import clock
from ..engine.adapter import ModelAdapter
from ..engine.contracts import Drafter
from ..engine.int8 import int8_rows_linear, pack_int8_weight
from ..engine.tree import TokenTree


def tree_rows_allowed(
    tree: TokenTree, nodes: list[int], base: int, past: int, row_of: dict[tuple[int, ...], int]
) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
    """Attention pattern of a draft cache forward feeding `nodes` as rows `past, past + 1, ...`.

    Each row sees the committed rows `[0, base)`, the cache rows of its ancestors (`row_of`: token
    path -> cache row, filled as nodes are fed) and itself. Returns `[K, past + K]` bool
    and the nodes' paths.
    """
    k = len(nodes)
    allowed = torch.zeros(k, past + k, dtype=torch.bool)
    allowed[:, :base] = True
    paths = [tuple(tree.path_tokens(n)) for n in nodes]
    for row, path in enumerate(paths):
        for d in range(1, len(path)):
            # KeyError here = contract broken (ancestor not expanded)
            allowed[row, row_of[path[:d]]] = True
        allowed[row, past + row] = True
    return allowed, paths


class ModelDrafter(Drafter):
    """A Hugging Face draft model with its own KV cache, fed depth by depth."""

    def __init__(
        self, model, int8_logits: bool = False, vocab_ids: Sequence[int] | None = None
    ) -> None:
        """`int8_logits`: logits from an int8 copy of the LM head (module doc); `vocab_ids`: the
        draft vocabulary, the tokens the draft may propose besides those of the request's own
        context (module doc); None: every token."""
        self.lm = ModelAdapter(model)
        self.vocab_size = self.lm.vocab_size
        self.slots: dict[tuple[int, ...], int] = {}  # token path from the root -> draft cache row
        self.base = 0  # committed tokens in the cache after `begin`
        head = model.get_output_embeddings() if self.lm.head.supported else None
        self._vocab = None  # the draft vocabulary's ids (sorted), None: the whole head
        self._vocab_set: frozenset[int] = frozenset()  # the same ids, for membership
        self._head_rows = None  # float LM-head rows of a cut vocabulary (without int8_logits)
        self._int8_head = None  # (packed int8 LM-head rows, their bias, their count)
        # this request's context tokens outside the draft vocabulary, and their head rows
        self._extra: list[int] = []
        self._extra_set: set[int] = set()
        self._extra_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        self._noted = 0  # committed tokens whose ids `_extra` has taken into account
        if head is None:
            return
        weight, bias = head.weight.detach(), head.bias
        if vocab_ids is not None:
            ids = torch.tensor(sorted(set(vocab_ids)), dtype=torch.long, device=weight.device)
            self._vocab = ids
            self._vocab_set = frozenset(ids.tolist())
            weight = weight.index_select(0, ids)
            bias = None if bias is None else bias.detach().index_select(0, ids)
            self._head_rows = (weight, bias)
        if int8_logits and self.lm.device.type == "cpu":
            self._int8_head = (pack_int8_weight(weight), bias, weight.shape[0])

    @property
    def int8_logits(self) -> bool:
        return self._int8_head is not None

    @property
    def draft_vocab_size(self) -> int:
        """How many tokens the LM head computes logits for (without the context's own)."""
        return self.vocab_size if self._vocab is None else self._vocab.numel()

    @torch.inference_mode()
    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[K, H]` last hidden states -> `[K, V]` float32 logits (-inf outside the draft
        vocabulary and the context's tokens)."""
        if self._int8_head is not None:
            packed, bias, rows = self._int8_head
            small = int8_rows_linear(hidden, packed, bias, rows).float()
        elif self._head_rows is not None:
            small = torch.nn.functional.linear(hidden, *self._head_rows).float()
        else:
            return self.lm.head.logits(hidden)
        if self._vocab is None:
            return small
        out = torch.full(
            (hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device
        ).index_copy_(1, self._vocab, small)
        if self._extra:
            ids, weight, bias = self._context_rows()
            out[:, ids] = torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias).float()
        return out

    def _context_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The context tokens' ids and LM-head rows (weight, bias), gathered again only when the
        request's context brought new ones."""
        if self._extra_rows is None or self._extra_rows[0].numel() != len(self._extra):
            head = self.lm.model.get_output_embeddings()
            ids = torch.tensor(self._extra, dtype=torch.long, device=head.weight.device)
            bias = None if head.bias is None else head.bias.detach().index_select(0, ids)
            self._extra_rows = (ids, head.weight.detach().index_select(0, ids), bias)
        return self._extra_rows

    def _note_context(self, committed: list[int]) -> None:
        """Tokens of the request's context outside the draft vocabulary join it for this request
        (module doc)."""
        if self._vocab is None:
            return
        for token in committed[self._noted :]:
            if token not in self._vocab_set and token not in self._extra_set:
                self._extra_set.add(token)
                self._extra.append(token)
        self._noted = len(committed)

    def spawn(self) -> ModelDrafter:
        twin = copy.copy(self)
        twin.lm = copy.copy(self.lm)  # the same model and LM head, a cache of its own
        twin.reset()
        return twin

    @property
    def max_positions(self) -> int:
        return self.lm.max_positions

    @property
    def cache_len(self) -> int:
        return self.lm.cache_len

    def reset(self) -> None:
        self.lm.reset()
        self.slots = {}
        # the context's own tokens leave the vocabulary with their request (new objects: a
        # spawned twin shares nothing of its parent's request)
        self._extra, self._extra_set, self._extra_rows, self._noted = [], set(), None, 0

    def begin(self, committed: list[int]) -> torch.Tensor:
        self.forward_time, self.forwards = 0.0, 0
        self._note_context(committed)
        if self.lm.cache_len >= len(committed):  # never expected, but keep the root's row fresh
            self.lm.crop_to(len(committed) - 1)
        past = self.lm.cache_len
        pending = committed[past:]
        t0 = clock()
        if not self.lm.head.supported:
            logits = self.lm.prefill(torch.tensor(pending, dtype=torch.long))
        elif past and len(pending) > 1:  # a chain: causal, as a masked forward
            allowed = torch.ones(len(pending), past + len(pending), dtype=torch.bool).tril_(past)
            positions = torch.arange(past, past + len(pending)).unsqueeze(0)
            ids = torch.tensor(pending, dtype=torch.long)
            logits = self._logits(self.lm.hidden_forward(ids, positions, allowed)[-1:])[0]
        else:
            logits = self._logits(self.lm.hidden_forward(torch.tensor(pending))[-1:])[0]
        self._tick(t0)
        self.base = len(committed)
        self.slots = {(): self.base - 1}
        return logits

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        past = self.lm.cache_len
        allowed, paths = tree_rows_allowed(tree, nodes, self.base, past, self.slots)
        positions = [self.base - 1 + tree.depths[n] for n in nodes]
        t0 = clock()
        if self.lm.head.supported:
            ids = torch.tensor([tree.tokens[n] for n in nodes], dtype=torch.long)
            pos = torch.tensor(positions, dtype=torch.long).unsqueeze(0)
            logits = self._logits(self.lm.hidden_forward(ids, pos, allowed))
        else:
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
        self.forward_time += clock(self.lm.device) - t0
        self.forwards += 1
