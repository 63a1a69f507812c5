"""The two contracts the step loop consumes: `Drafter` (where draft logits come from) and
`TreeBuilder` (how a tree is grown from them, drawing through a `DraftContext`).

The engine's decode loop is written against these classes only; the implementations live one
layer up, in `drafters/` (a draft model, the n-gram drafter) and `builders/` (one file per
paper). Keeping the contracts here is what lets every import point downwards: drafters and
builders import the engine, never the other way round.

A builder declares `children_mode`, which fixes the verifier it must be paired with
(docs/algorithms.md §2):

* "without_replacement": siblings were *sampled* one after another from the renormalised
  residual of the parent's draft distribution (verifier: `rejection`);
* "with_replacement": siblings are i.i.d. draws (verifier: `rejection-wr`);
* "selected": nodes were *chosen* by their own probability or a score (verifier: `greedy`
  at temperature 0, `sample-match` above).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ArborError
from .acceptance import AcceptanceModel
from .cost import CostCurve
from .processors import PathProcessor, draft_row
from .sampling import SamplingConfig, gumbel_like, probs_from_logits
from .tree import ChildrenMode, TokenTree


class Drafter(ABC):
    """Answers, for any node of the tree being built, "what does the draft predict
    after the path to it?".

    Contract: `expand(tree, nodes)` is only called for nodes whose ancestors were expanded
    before (a node's parent is always expanded: its children were drawn from the parent's
    distribution).
    """

    vocab_size: int
    forward_time: float = 0.0  # seconds spent in draft forwards since the last `begin`
    forwards: int = 0
    # True: the engine calls `observe` with the target's last hidden states
    uses_target_features: bool = False

    @abstractmethod
    def begin(self, committed: list[int]) -> torch.Tensor:
        """Sync with the committed tokens (the last one is the tree root); return the
        root's logits `[V]`."""

    @abstractmethod
    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        """Logits `[K, V]` of the next token after the path to each of `nodes` (non-root)."""

    def commit(self, tree: TokenTree, accepted: list[int]) -> None:  # noqa: B027 (optional hook: no-op by default)
        """Called after verification with the accepted path (node indices, root excluded)."""

    def reset(self) -> None:  # noqa: B027 (optional hook: no-op by default)
        """Forget everything (a new prompt follows)."""

    def observe(self, features: torch.Tensor) -> None:  # noqa: B027 (optional hook: no-op by default)
        """Target features `[k, H]` (last hidden states) of the next k committed tokens, in order.

        Only called when `uses_target_features`; after it, the features of every
        committed token except the last (the next root) have been observed.
        """

    def observe_sequence(self, target, ids: list[int]) -> None:
        """Outside the step loop (the cost curve's timing, calibration, C2T data): a drafter that
        reads the target's features observes those of every token of `ids`, from one forward of
        `target` (a `ModelAdapter`: `features_along`); any other drafter ignores the call.
        Call it after `reset`."""
        if not self.uses_target_features:
            return
        if target is None:
            raise ValueError(
                "a drafter that reads the target's features needs the target to "
                "run along the sequence"
            )
        self.observe(target.features_along(ids))

    def spawn(self) -> Drafter:
        """A fresh drafter of the same kind sharing this one's weights, with state of its own: one
        per request when a batch drafts request by request (engine/batch_drafts.py)."""
        raise ArborError(f"{type(self).__name__} cannot draft for a batch of requests")

    def batched(self) -> BatchDrafter | None:
        """A drafter that drafts for every request of a batch in one forward per call, where this
        kind has one (the draft head); None: one spawned drafter per request."""
        return None

    @property
    def max_positions(self) -> int:
        return 1 << 30

    @property
    def cache_len(self) -> int:
        """Tokens in the drafter's KV cache between steps (never more than the committed
        ones); 0 without one."""
        return 0


class BatchDrafter(ABC):
    """The draft side of a batch of requests (engine/batch_decode.py), each known by its key:
    the `Drafter` calls, each for several requests at once.

    `join` starts a request from its prompt (with the target's features of every prompt token but
    the last, for a drafter with `uses_target_features`), `begin` syncs requests with their
    committed tokens and gives their roots' logits, `expand` drafts tree nodes of several requests'
    trees, `commit` ends their step (with the target's features of the root and the accepted nodes),
    `leave` forgets a request. `forward_time`/`forwards` count since the last `begin`."""

    uses_target_features: bool = False
    vocab_size: int
    forward_time: float = 0.0
    forwards: int = 0

    @abstractmethod
    def join(self, key, prompt_ids: list[int], features: torch.Tensor | None) -> None: ...

    @abstractmethod
    def leave(self, key) -> None: ...

    @abstractmethod
    def begin(self, committed: dict) -> dict:
        """key -> committed tokens  =>  key -> the root's logits `[V]`."""

    @abstractmethod
    def expand(self, items: list[tuple]) -> list[torch.Tensor]:
        """`(key, tree, nodes)` items -> each item's logits `[K, V]`."""

    @abstractmethod
    def commit(self, items: list[tuple], features: dict) -> None:
        """`(key, tree, accepted)` items; `features`: key -> `[1 + accepted, H]` target features
        (or None) of the root and the accepted nodes."""


class DraftContext:
    """The draft side of one step: cached per-node draft probabilities and keyed random noise.

    `probs(tree, nodes)` returns `[K, V]` draft probabilities (after the draft-side
    sampling transform) at each node, running the drafter only for nodes not
    seen before in this step. `gumbel(tree, node)` returns Gumbel noise keyed by
    the node's token path and the step's seed, so that two builders growing the
    same node see the same random draws (what makes DySpec's greedy and
    threshold variants comparable).
    """

    def __init__(
        self,
        drafter: Drafter,
        cfg: SamplingConfig,
        generator: torch.Generator,
        root_logits: torch.Tensor,
        cost: CostCurve | None = None,
        acceptance: AcceptanceModel | None = None,
        process: PathProcessor | None = None,
    ):
        self.drafter, self.cfg, self.generator = drafter, cfg, generator
        self.process = process
        # the measured step cost curve, for builders that size trees by it (budget=auto)
        self.cost = cost
        # the generation's online acceptance model (engine/acceptance.py), if any
        self.acceptance = acceptance
        self.step_seed = int(
            torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)
        )
        self._probs: dict[tuple[int, ...], torch.Tensor] = {
            (): probs_from_logits(draft_row(process, [], root_logits), cfg)
        }
        self.vocab_size = root_logits.shape[-1]

    def probs(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:  # [K, V]
        keys = [tuple(tree.path_tokens(n)) for n in nodes]
        todo = list(dict.fromkeys(n for n, key in zip(nodes, keys) if key not in self._probs))
        if todo:
            self.store(tree, todo, self.drafter.expand(tree, todo))
        return torch.stack([self._probs[key] for key in keys])

    def missing(self, tree: TokenTree, nodes: list[int]) -> list[int]:
        """The nodes among `nodes` whose draft probabilities are not known yet, once each."""
        return list(
            dict.fromkeys(n for n in nodes if tuple(tree.path_tokens(n)) not in self._probs)
        )

    def store(self, tree: TokenTree, nodes: list[int], logits: torch.Tensor) -> None:
        """Keep the draft probabilities of `nodes` from their draft logits `[K, V]` (processed on
        their paths, then the draft-side sampling transform)."""
        if self.process is not None:
            logits = torch.stack(
                [draft_row(self.process, tree.path_tokens(n), row) for n, row in zip(nodes, logits)]
            )
        for n, row in zip(nodes, probs_from_logits(logits, self.cfg)):
            self._probs[tuple(tree.path_tokens(n))] = row

    def acceptance_rate(self, q: float, rank: int) -> float:
        """The generation's calibrated acceptance rate of a draw of draft probability q and sibling
        rank `rank` (engine/acceptance.py; q itself without an acceptance model)."""
        return self.acceptance.rate(q, rank) if self.acceptance is not None else q

    def has_probs(self, tree: TokenTree, node: int) -> bool:
        """Whether `probs(tree, [node])` is already known this step (no draft forward needed)."""
        return tuple(tree.path_tokens(node)) in self._probs

    def gumbel(
        self, tree: TokenTree, node: int, size: int | None = None
    ) -> torch.Tensor:  # [size or V]
        """`size` draws keyed by the node's path (default: one per vocabulary entry; a builder asks
        for one per support token of the node's draft distribution,
        `sampling.sample_without_replacement`)."""
        # no noise: the draws are the most likely tokens in order (sampling.py)
        if self.cfg.ordered_draws:
            return torch.zeros(size or self.vocab_size)
        key = hash((self.step_seed, tuple(tree.path_tokens(node)))) & ((1 << 63) - 1)
        gen = torch.Generator().manual_seed(key)
        return gumbel_like(torch.empty(size or self.vocab_size), gen)


@dataclass(kw_only=True)
class TreeBuilder(ABC):
    """Base class of the builders: keyword-only dataclasses of their parameters, registered by name.

    One vocabulary for the size of a tree, accepted by every builder:

    * `budget`: draft nodes per step, the most a tree may hold (root excluded);
    * `max_depth`: the deepest a tree may grow (`None`: the builder's own rule,
      bounded by the budget);
    * `topk`: children per expanded node (`None`: the builder's own rule).

    Fields hold what was asked for and keep their type; derived values are properties.
    Per-call diagnostics are returned by the builder's own methods, never stored on it,
    so one builder can serve several decoders.
    """

    name: ClassVar[str]
    children_mode: ClassVar[ChildrenMode]
    paper: ClassVar[str] = ""

    budget: int = 16
    max_depth: int | None = None
    topk: int | None = None

    @abstractmethod
    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        """Grow a tree rooted at `root_token` from the draft distributions in `ctx`."""

    @property
    def needs_cost(self) -> bool:
        """True when `build` sizes the tree by the measured cost curve: a builder with `auto=true`
        (`budget=auto`); the engine then passes the curve in the `DraftContext`."""
        return bool(getattr(self, "auto", False))

    @property
    def depth_limit(self) -> int:
        """The deepest tree this builder can make (for context-length checks): a tree of at most
        `budget` nodes is at most that deep, and `max_depth` caps it."""
        return min(self.budget, self.max_depth or self.budget)

    @classmethod
    def from_params(cls, **params) -> TreeBuilder:
        """The builder for user-given parameters, derived defaults filled in.

        `budget` is present only when the user gave one (the CLI's `--budget`, a sweep value);
        a builder whose other defaults follow the budget overrides this.
        """
        return cls(**params)

    def describe(self) -> str:
        fields = ", ".join(
            f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self) if f.repr
        )
        return f"{self.name}({fields})"
