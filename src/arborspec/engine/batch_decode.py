"""Batched decoding: several requests in flight, one target forward per step for all of them
(docs/algorithms.md §10).

`BatchDecoder.submit(request)` queues a request at any time and returns its `RequestHandle`,
the per-request object that holds everything of one generation (committed tokens, statistics,
random generator, acceptance model, lookup index); `step()` runs one step for every request in
flight; `cancel(handle)` ends one. A request carries its prompt, its `DecodeConfig` (sampling,
seed, `max_new_tokens`, EOS ids, processors, stopping check) and its own tree builder, or none:
then it is decoded plainly, its root alone fed in the batch's forward.

One step:
  1. requests waiting are admitted (prefilled alone, between steps) while the batch has room;
  2. the batch drafter syncs every speculative request with its committed tokens (one draft
     forward for all of them);
  3. every request's builder grows its own tree. Builders are ordinary sequential code; each runs
     in its own greenlet, and when one asks for draft probabilities (`DraftContext.probs`) it
     waits while the others run up to their own next request, so each round of draft forwards is
     one batched forward for every builder waiting (`BatchDrafter.expand`). A `SharedBudget`
     grows the trees of its requests from one heap instead (builders/shared_budget.py);
  4. context lookup grafts its proposals onto the trees (engine/lookup.py);
  5. one target forward verifies every tree (engine/batch_target.py);
  6. each request's verifier walks its own tree; its caches keep its root and accepted path;
     a request that ends (EOS, stop check, `max_new_tokens`, cancellation) leaves the batch and
     its cache rows are released.

A failure in one request's own code (its builder, its verifier or logits processors, its stopping
check or its `on_tokens` callback) ends that request alone, with stop reason "error" and the
exception in `handle.error`; the others go on. A failure of a batched forward, which every request
shares, propagates from `step()`.

Exactness: requests never attend to each other's rows, and each request's tokens come from its
own rows of the forward, its own verifier and its own generator. On a batch-invariant target
(the int8 CPU target, engine/int8.py) a request's rows equal the rows it would get alone, so its
output is the one it gets decoded alone, whatever it is batched with; on a float target batched
matrix products round differently (docs/algorithms.md §10).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
from greenlet import getcurrent, greenlet

from ..common.timing import clock
from ..errors import ArborError
from .acceptance import AcceptanceModel
from .adapter import ModelAdapter
from .batch_cost import BatchCost, DraftingHistory, batch_cost_for
from .batch_drafts import PerRequestDrafts
from .batch_target import BatchTarget
from .contracts import BatchDrafter, DraftContext, Drafter, TreeBuilder
from .cost import CostCurve, cost_curve_for
from .decode import DecodeConfig, TokenCallback, _finish, check_context, examined_children
from .lm_head import screen_rows
from .lookup import ContextLookup, graft
from .processors import PathProcessor, ProcessedRows
from .stats import GenerationResult, StepStats
from .tree import TokenTree
from .verifiers import VERIFIERS, choose_verifier


@dataclass
class BatchRequest:
    """One request: its prompt, settings, tree builder (None: plain decoding) and context lookup
    (tokens grafted per tree; 0: none). `on_tokens` is called with each step's new tokens;
    `verifier` names one the builder's trees are lossless with (None: its default)."""

    prompt_ids: list[int]
    config: DecodeConfig = field(default_factory=DecodeConfig)
    builder: TreeBuilder | None = None
    lookup: int = 0
    on_tokens: TokenCallback | None = None
    verifier: str | None = None  # None: the builder's default (engine/verifiers.py)


class RequestHandle:
    """A request in flight and everything of its generation (never shared with another)."""

    def __init__(self, key: int, request: BatchRequest, verifier: str) -> None:
        self.key, self.request = key, request
        cfg = request.config
        self.verifier = verifier
        self.verify = VERIFIERS[verifier]
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.draft_cfg = cfg.sampling.draft_side()
        self.acceptance = AcceptanceModel()
        self.lookup = ContextLookup(request.lookup) if request.lookup else None
        self.committed = list(request.prompt_ids)
        self.output: list[int] = []
        self.steps: list[StepStats] = []
        self.stop_reason: str | None = None
        self.lookup_proposed = self.lookup_accepted = 0  # grafted lookup tokens, accepted ones
        self.submitted_at = clock()
        self.started_at: float | None = None  # admitted to the batch
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.result: GenerationResult | None = None
        self.error: BaseException | None = None  # what ended the request, stop reason "error"
        self.ctx: DraftContext | None = None  # the step's draft side

    @property
    def speculative(self) -> bool:
        return self.request.builder is not None

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def rows(self) -> int:
        """The most rows a step of this request feeds the target: its root and its tree."""
        builder = self.request.builder
        return (
            1
            + (builder.budget if builder is not None else 0)
            + (self.lookup.max_tokens if self.lookup else 0)
        )

    def _finish(self, reason: str) -> None:
        self.stop_reason = reason
        self.finished_at = clock()
        builder = self.request.builder
        self.result = GenerationResult(
            method=builder.name if builder is not None else "autoregressive",
            prompt_ids=list(self.request.prompt_ids),
            output_ids=list(self.output),
            steps=list(self.steps),
            wall_time=self.finished_at - self.submitted_at,
            stop_reason=reason,
            config={
                "builder": builder.describe() if builder is not None else "autoregressive",
                "verifier": self.verifier,
                "batched": True,
            },
        )


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a blocking batch: `.results` holds every request's partial result (stop reason
    "cancelled"), nothing generated is lost."""

    def __init__(self, results: list[GenerationResult]) -> None:
        super().__init__()
        self.results = results


class _Waiting(Drafter):
    """One request's drafter inside a step: `expand` hands its nodes to the step's coordinator and
    waits for the batched forward that drafts them with every other waiting request's."""

    def __init__(self, key: int, vocab_size: int, coordinator) -> None:
        self.key, self.vocab_size, self.coordinator = key, vocab_size, coordinator
        self.forward_time, self.forwards = 0.0, 0

    def begin(self, committed: list[int]) -> torch.Tensor:  # the batch drafter begins
        raise RuntimeError("a batched request's drafter begins with the batch")

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        self.forwards += 1
        return self.coordinator.switch([(self.key, tree, nodes)])[0]


class _Failed:
    """What a builder's greenlet returns when the builder raised."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _guarded(run):
    try:
        return run()
    except Exception as error:  # one request's failure, not the batch's
        return _Failed(error)


def expand_many(items: list[tuple]) -> list[torch.Tensor]:
    """For a builder running in a step's greenlet (builders/shared_budget.py): draft `(key, tree,
    nodes)` items of several requests in the step's next batched forward."""
    return getcurrent().parent.switch(items)


class BatchDecoder:
    """Requests in flight on one target (and one drafter): `submit`, `step`, `cancel`."""

    def __init__(
        self,
        target: ModelAdapter,
        drafter: Drafter | None = None,
        max_rows: int = 256,
        max_requests: int = 64,
        shared=None,
        cost: CostCurve | None = None,
    ) -> None:
        """`max_rows`: the most rows a step's target forward may hold; requests wait to be admitted
        while the batch's bound (each request's root, tree budget and lookup) would pass it.
        `max_requests`: the most requests in flight. `shared`: a `SharedBudget` growing the trees
        of every request whose builder it takes (builders/shared_budget.py) from one heap, sized by
        `cost` (None: measured on first use, engine/cost.py)."""
        if max_rows < 1 or max_requests < 1:
            raise ArborError("max_rows and max_requests must be >= 1")
        self.adapter = target
        self.target = BatchTarget(target)
        self.drafter = drafter
        self.drafts: BatchDrafter | None = None
        if drafter is not None:
            self.drafts = drafter.batched() or PerRequestDrafts(drafter)
        self.max_rows, self.max_requests = max_rows, max_requests
        self.shared = shared
        self.cost = cost  # given: used for every step; else measured per kind of step (`_cost`)
        self._costs: dict[bool, CostCurve] = {}
        self.batch_cost: BatchCost | None = None
        self.history: DraftingHistory | None = None
        self.queue: list[RequestHandle] = []
        self.active: list[RequestHandle] = []
        self._keys = itertools.count()

    # ------------------------------------------------------------------ requests
    def submit(self, request: BatchRequest) -> RequestHandle:
        """Queue a request (checked now: context length, verifier); it joins at the next step."""
        return self.enqueue(self.handle_for(request))

    def handle_for(self, request: BatchRequest) -> RequestHandle:
        """Check a request (context length, verifier, rows) and make its handle, without queueing
        it: a server checks requests on one thread and steps the decoder on another."""
        cfg = request.config
        builder = request.builder
        if builder is not None and self.drafts is None:
            raise ArborError("a speculative request needs a drafter: give the decoder one")
        mode = builder.children_mode if builder is not None else "selected"
        verifier = choose_verifier(mode, cfg.sampling, request.verifier)
        depth = 0
        if builder is not None:
            depth = max(builder.depth_limit, request.lookup) + 1
            check_context(
                len(request.prompt_ids), cfg, self.drafter.max_positions, depth, who="draft"
            )
        check_context(len(request.prompt_ids), cfg, self.adapter.max_positions, depth)
        handle = RequestHandle(next(self._keys), request, verifier)
        if handle.rows > self.max_rows:
            raise ArborError(
                f"one step of this request feeds up to {handle.rows} rows, more than the batch's "
                f"max_rows ({self.max_rows}): raise max_rows or lower the tree budget"
            )
        return handle

    def enqueue(self, handle: RequestHandle) -> RequestHandle:
        """Queue a handle made by `handle_for`; it joins at the next step."""
        self.queue.append(handle)
        return handle

    def cancel(self, handle: RequestHandle) -> None:
        """End a request now (stop reason "cancelled"), keeping what it generated."""
        if handle.done:
            return
        if handle in self.queue:
            self.queue.remove(handle)
        else:
            self._leave(handle)
        handle._finish("cancelled")

    @property
    def idle(self) -> bool:
        return not self.queue and not self.active

    def run(self) -> None:
        """Step until every request submitted so far has ended."""
        while not self.idle:
            self.step()

    # ------------------------------------------------------------------ membership
    def _admit(self) -> None:
        rows = sum(h.rows for h in self.active)
        while self.queue and len(self.active) < self.max_requests:
            handle = self.queue[0]
            if self.active and rows + handle.rows > self.max_rows:
                break
            self.queue.pop(0)
            features = self.target.join(handle.key, handle.committed)
            if handle.speculative:
                self.drafts.join(handle.key, handle.committed, features)
            handle.started_at = clock()
            self.active.append(handle)
            rows += handle.rows

    def _leave(self, handle: RequestHandle) -> None:
        self.active.remove(handle)
        self.target.leave(handle.key)
        if handle.speculative:
            self.drafts.leave(handle.key)

    # ------------------------------------------------------------------ the step
    def step(self) -> list[RequestHandle]:
        """One step for every request in flight; returns the requests that ended in it."""
        self._admit()
        if not self.active:
            return []
        t0 = clock()
        spec = [h for h in self.active if h.speculative]
        trees: dict[int, TokenTree] = {}
        grafts: dict[int, list[int]] = {}
        proposals = {h.key: h.lookup.propose(h.committed) for h in spec if h.lookup is not None}
        draft_time = forwards = 0
        self.lookup_kept = {}  # a shared budget's choice: how much of each proposal to graft
        failed: dict[int, Exception] = {}  # requests whose own code raised in this step
        ended = []
        if spec:
            trees = self._draft(spec, proposals, failed)
            draft_time, forwards = self.drafts.forward_time, self.drafts.forwards
            for h in [h for h in spec if h.key in failed]:
                self._fail(h, failed.pop(h.key))
                ended.append(h)
            spec = [h for h in spec if not h.done]
            if not self.active:
                return ended
        for h in self.active:
            if not h.speculative:
                trees[h.key] = TokenTree.from_root(h.committed[-1])
            elif h.key in proposals:
                chain = proposals[h.key][: self.lookup_kept.get(h.key, len(proposals[h.key]))]
                grafts[h.key] = graft(trees[h.key], chain)
        t1 = clock()
        logits, hidden, width = self.target.verify_forward(trees)
        self._screen_walks(trees, logits)
        t2 = clock()
        kept: dict[int, list[int]] = {}
        news: dict[int, list[int]] = {}
        results = {}
        for h in self.active:
            try:
                verified = self._verify(h, trees[h.key], logits[h.key])
                kept[h.key], news[h.key], results[h.key] = verified
            except Exception as error:  # this request's verifier, processors or stopping check
                failed[h.key] = error
                kept[h.key], news[h.key] = [], []
        self.target.keep(kept, width)
        if spec:
            features = (
                {h.key: hidden[h.key][[0] + kept[h.key]] for h in spec}
                if self.drafts.uses_target_features
                else {}
            )
            self.drafts.commit([(h.key, trees[h.key], kept[h.key]) for h in spec], features)
        t3 = clock()
        if self.history is not None:
            self._learn(spec, trees, news, forwards, (t0, t1, t3))
        for h in list(self.active):
            if h.key in failed:
                self._fail(h, failed[h.key])
                ended.append(h)
                continue
            result, stop, head_time = results[h.key]
            new = news[h.key]
            h.committed += new
            h.output += new
            if h.first_token_at is None and new:
                h.first_token_at = t3
            if h.request.on_tokens is not None:
                try:
                    h.request.on_tokens(new)
                except Exception as error:  # the request's own callback
                    self._fail(h, error)
                    ended.append(h)
                    continue
            h.steps.append(
                self._stats(h, trees[h.key], result, kept[h.key], grafts.get(h.key, []),
                            (t0, t1, t2, t3), draft_time, forwards, head_time, len(new))
            )
            if stop is not None:
                self._leave(h)
                h._finish(stop)
                ended.append(h)
        return ended

    def _verify(self, h: RequestHandle, tree: TokenTree, rows) -> tuple:
        """One request's verifier on its rows: (kept nodes, new tokens, (result, stop reason,
        head seconds))."""
        cfg = h.request.config
        if cfg.logits_processor is not None:
            process = PathProcessor(cfg.logits_processor, h.committed, self.adapter.device)
            rows = ProcessedRows(rows, lambda i: tree.path_tokens(i), process)
        result = h.verify(tree, rows, cfg.sampling, h.generator)
        new, stop = _finish(
            [tree.tokens[n] for n in result.accepted] + [result.bonus], h.output, cfg, h.committed
        )
        return result.accepted[: len(new) - 1], new, (result, stop, getattr(rows, "seconds", 0.0))

    def _fail(self, handle: RequestHandle, error: Exception) -> None:
        """End one request whose own code raised (stop reason "error"), keeping its output."""
        if handle in self.active:
            self._leave(handle)
        handle.error = error
        handle._finish("error")

    def _screen_walks(self, trees: dict, logits: dict) -> None:
        """The rows the greedy verifiers will read: every row of every tree of a greedy walk,
        screened for all requests in one pass (`screen_rows`; each pass reads the screen's whole
        int8 head, and a batch's walks read most of their trees' rows: docs/algorithms.md §10).
        The verifiers then walk their trees over these rows."""
        screen_rows([
            (logits[h.key], node)
            for h in self.active
            if h.verifier == "greedy" and h.request.config.logits_processor is None
            for node in range(trees[h.key].num_nodes)
        ])

    def _draft(
        self, spec: list[RequestHandle], proposals: dict, failed: dict
    ) -> dict[int, TokenTree]:
        """Steps 2-3 of the module doc: the batch drafter's `begin`, then every builder in its own
        greenlet, their draft requests answered round by round in one batched forward each. A
        builder that raises fails its requests (`failed`: key -> exception)."""
        coordinator = getcurrent()
        shared = [
            h for h in spec if self.shared is not None and self.shared.takes(h.request.builder)
        ]
        cost = None
        if any(h.request.builder.needs_cost for h in spec):
            cost = self._cost(spec)
        trees: dict[int, TokenTree] = {}
        others = [h for h in self.active if h not in shared]
        other_rows = [h.rows for h in others]
        packed = self.target.packs
        batch_cost = None
        if shared:
            batch_cost = self._batch_cost()
            if not self.shared.worth_drafting(self.history):
                # drafting is not expected to pay: no draft forward this step (the drafter
                # catches up at its next `begin`), lookup tokens only where they pay
                for h in shared:
                    h.ctx = None
                grown, self.lookup_kept = self.shared.build_many(
                    None,
                    {h.key: h.committed[-1] for h in shared},
                    self._lookups(shared, proposals),
                    batch_cost, 0.0, other_rows, packed,
                )
                trees.update(grown)
                spec = [h for h in spec if h not in shared]
                shared = []
        roots = self.drafts.begin({h.key: h.committed for h in spec}) if spec else {}
        for h in spec:
            cfg = h.request.config
            process = (
                PathProcessor(cfg.logits_processor, h.committed, self.adapter.device)
                if cfg.logits_processor is not None
                else None
            )
            waiting = _Waiting(h.key, self.drafts.vocab_size, coordinator)
            h.ctx = DraftContext(
                waiting, h.draft_cfg, h.generator, roots[h.key], cost, h.acceptance, process
            )
        pending: dict = {}  # greenlet -> its draft items

        def started(key, run) -> None:
            worker = greenlet(lambda: _guarded(run))
            pending[worker] = key
            answer(worker, worker.switch())

        def answer(worker, value) -> None:
            key = pending.pop(worker)
            if worker.dead and isinstance(value, _Failed):
                failed.update({k: value.error for k in (key if isinstance(key, tuple) else (key,))})
            elif worker.dead:
                trees.update(value if isinstance(key, tuple) else {key: value})
            else:
                pending[worker] = key
                asked[worker] = value

        asked: dict = {}
        for h in spec:
            if h not in shared:
                started(h.key, lambda h=h: h.request.builder.build(h.ctx, h.committed[-1]))
        if shared:

            def grow_shared() -> dict:
                grown, self.lookup_kept = self.shared.build_many(
                    {h.key: h.ctx for h in shared},
                    {h.key: h.committed[-1] for h in shared},
                    self._lookups(shared, proposals),
                    batch_cost,
                    self.history.overhead,
                    others=other_rows,
                    packed=packed,
                )
                return grown

            started(tuple(h.key for h in shared), grow_shared)
        while asked:
            round_ = list(asked.items())
            asked.clear()
            out = self.drafts.expand([item for _, items in round_ for item in items])
            start = 0
            for worker, items in round_:
                part = out[start : start + len(items)]
                start += len(items)
                answer(worker, worker.switch(part))
        return trees

    def _learn(self, spec, trees, news, forwards, times) -> None:
        """What a step tells the shared budget's drafting history (engine/batch_cost.py)."""
        t0, t1, t3 = times
        shared = [h for h in spec if self.shared.takes(h.request.builder)]
        if not shared:
            return
        drafted = any(h.ctx is not None for h in shared)
        if drafted:
            self.history.record((t1 - t0) - forwards * self.batch_cost.draft(len(self.active)))
        self.history.timed(sum(len(new) for new in news.values()), t3 - t0, drafted)

    @staticmethod
    def _lookups(handles: list[RequestHandle], proposals: dict) -> dict:
        """key -> (the lookup's proposal, the request's rate of accepted lookup tokens so far,
        Laplace-smoothed) for a shared budget to value."""
        return {
            h.key: (proposals[h.key], (h.lookup_accepted + 1) / (h.lookup_proposed + 2))
            for h in handles
            if h.key in proposals
        }

    def _batch_cost(self) -> BatchCost:
        """The batch's measured costs (once per process and pair) and this decoder's drafting
        history (engine/batch_cost.py)."""
        if self.batch_cost is None:
            self.batch_cost = batch_cost_for(self.adapter, self.drafter)
            self.history = DraftingHistory(self.batch_cost)
        return self.batch_cost

    def _cost(self, spec: list[RequestHandle]) -> CostCurve:
        """The cost curve of this step's kind: greedy when every speculating request is (its
        verifier reads screened argmaxes), else sampled; each measured once per process
        (engine/cost.py). A curve given to the decoder serves every step."""
        if self.cost is not None:
            return self.cost
        greedy = all(h.request.config.sampling.greedy for h in spec)
        if greedy not in self._costs:
            self._costs[greedy] = cost_curve_for(self.adapter, self.drafter, greedy)
        return self._costs[greedy]

    def _stats(
        self, h, tree, result, kept, grafted, times, draft_time, forwards, head_time, accepted
    ) -> StepStats:
        t0, t1, t2, t3 = times
        kids, flags, ranks = examined_children(tree, result)  # grafted nodes left out
        lookup_accepted = sum(1 for n in kept if n in tree.point_masses)
        h.lookup_proposed += len(grafted)
        h.lookup_accepted += lookup_accepted
        examined = [tree.draft_probs[k] for k in kids]
        if h.speculative:
            h.acceptance.update(examined, flags, ranks)
        return StepStats(
            accepted_length=accepted,
            tree_size=tree.size,
            tree_depth=tree.depth,
            estimated_length=tree.estimated_accept_length(),
            draft_time=draft_time,
            build_time=max(0.0, t1 - t0 - draft_time),
            verify_time=t2 - t1 + head_time,
            other_time=max(0.0, t3 - t2 - head_time),
            draft_forwards=h.ctx.drafter.forwards if h.ctx is not None else 0,
            examined_draft_probs=examined,
            examined_values=[tree.values[k] for k in kids],
            examined_accepted=flags,
            lookup_nodes=len(grafted),
            lookup_accepted=lookup_accepted,
        )
