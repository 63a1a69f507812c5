"""The decode loop: speculative steps until EOS or `max_new_tokens`, and the plain baseline.

One speculative step (docs/algorithms.md §1):
  1. the drafter syncs with the committed tokens; the builder grows a tree
     rooted at the last committed token (which the target has not seen yet);
  2. one target forward over root + all nodes with tree attention;
  3. the verifier walks the tree: accepted path + one bonus token;
  4. both KV caches keep only the accepted path (compaction).

The target cache always holds every committed token except the last one (the
next root), so the first step's root is the prompt's last token and no
separate "first token" forward is needed.

Likely rows: the verifier reads the LM-head rows of the nodes it walks through, one at a time
(engine/lm_head.py: a screened argmax at temperature 0, a full logits row when sampling). Each
separate read passes over the whole head; several rows in one pass cost less than as many passes
(on the embedded target, 2 CPU threads: a screen of 1 / 2 / 4 rows 2.0 / 2.2 / 2.5 ms, more on
uncertain tree rows; logits rows through oneDNN's packed head 5.0 / 4.1 ms for 2 / 4 rows
against 5.0 ms for one on the transposed copy; docs/algorithms.md §7,
benchmarks/results/verify-probes.json). So before the walk the root's row
and those of the nodes the builder expects to be accepted with probability at least
`LIKELY_ROW_VALUE` are computed in one pass; the walk reads any other row as before. Which rows
are computed ahead changes no token: each row's value is the one it gets alone (screened) or
the same float32 product up to summation order (sampled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..common.timing import clock
from ..common.vocab import check_vocab_size
from ..errors import ArborError
from .acceptance import AcceptanceModel
from .adapter import ModelAdapter
from .allocator import PeriodicTrim
from .contracts import DraftContext, Drafter, TreeBuilder
from .cost import CostCurve, cost_curve_for
from .lm_head import LazyLogits, greedy_token
from .lookup import ContextLookup, LookupPrice, graft
from .processors import PathProcessor, ProcessedRows, Processor
from .sampling import SamplingConfig, probs_from_logits, sample
from .stats import GenerationInterrupted, GenerationResult, StepStats
from .tree import TokenTree
from .verifiers import VERIFIERS, VerifyResult, choose_verifier

# a node's row is computed ahead of the walk from this estimated acceptance probability (module
# doc, "likely rows"), by the kind of row: about where its extra cost in a shared pass equals the
# expected cost of a separate one (screened: a fraction of a pass, more on uncertain tree rows;
# sampled, oneDNN's packed head: a few percent of a pass, so every node)
LIKELY_ROW_VALUE = {"screened": 0.4, "sampled": 0.0}

TokenCallback = Callable[[list[int]], None]
# the sequence so far (prompt + new tokens) -> stop after its last token
StopCheck = Callable[[list[int]], bool]


def likely_rows(tree: TokenTree, greedy: bool) -> list[int]:
    """The root and the nodes the builder values at `LIKELY_ROW_VALUE` or more (module doc)."""
    least = LIKELY_ROW_VALUE["screened" if greedy else "sampled"]
    return [0] + [n for n in range(1, len(tree.tokens)) if tree.values[n] >= least]


@dataclass
class DecodeConfig:
    """One request's settings. `logits_processor`: applied to the target's (and the draft's)
    rows, each on its own path (engine/processors.py), before the sampling transform; None: the
    raw rows, with the greedy screen. `stopping`: asked after every committed token, as
    `generate`'s stopping criteria are; True ends the generation after that token (stop reason
    "stop")."""

    max_new_tokens: int = 128
    sampling: SamplingConfig = SamplingConfig()
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()
    logits_processor: Processor | None = None
    stopping: StopCheck | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ArborError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def check_context(
    prompt_len: int, cfg: DecodeConfig, limit: int, extra: int = 0, who: str = "target"
) -> None:
    if prompt_len < 1:
        raise ArborError("the prompt is empty: give at least one token of text")
    need = prompt_len + cfg.max_new_tokens + extra
    if need > limit:
        raise ArborError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({cfg.max_new_tokens}) + tree depth "
            f"({extra}) exceeds the {who}'s context of {limit} positions: shorten the prompt or "
            "lower --max-new-tokens"
        )


def _finish(
    new: list[int], out: list[int], cfg: DecodeConfig, committed: list[int]
) -> tuple[list[int], str | None]:
    """Cut `new` at max_new_tokens and just after an EOS or the token the stopping check ends on
    (`committed`: the sequence before `new`); return (tokens to commit, stop reason)."""
    room = cfg.max_new_tokens - len(out)
    new = new[:room]
    for i, tok in enumerate(new):
        if tok in cfg.eos_token_ids:
            return new[: i + 1], "eos"
        if cfg.stopping is not None and cfg.stopping(committed + new[: i + 1]):
            return new[: i + 1], "stop"
    return new, ("length" if len(out) + len(new) >= cfg.max_new_tokens else None)


# steps a generation needs before its per-step overhead is taken into the cost curve
MIN_OVERHEAD_STEPS = 4


def examined_children(
    tree: TokenTree, result: VerifyResult
) -> tuple[list[int], list[bool], list[int]]:
    """Children of every node the verifier stood on, whether each was accepted, and each
    one's sibling rank: the draft's proposals, which the acceptance model calibrates. Point masses
    (grafted nodes, engine/lookup.py) are left out: they have no draft probability."""
    nodes, flags, ranks, accepted = [], [], [], set(result.accepted)
    for parent in [0] + result.accepted:
        drafted = [kid for kid in tree.children[parent] if kid not in tree.point_masses]
        for rank, kid in enumerate(drafted):
            nodes.append(kid)
            flags.append(kid in accepted)
            ranks.append(rank)
    return nodes, flags, ranks


class SpeculativeDecoder:
    """Target adapter + drafter + builder + verifier: `generate(prompt_ids)` runs one sequence."""

    def __init__(
        self,
        target: ModelAdapter,
        drafter: Drafter,
        builder: TreeBuilder,
        verifier: str | None = None,
        cost: CostCurve | None = None,
        carry: bool = True,
        lookup: int = 0,
    ) -> None:
        """`cost`: the step cost curve for builders that size trees by it (`budget=auto`); None:
        measured on first use (once per process, `engine/cost.cost_curve_for`; one curve for
        temperature 0's steps, whose verifier reads screened argmaxes, one for sampling's, which
        read full rows), and the step's overhead outside the timed forwards learnt again from each
        of this decoder's generations of at least `MIN_OVERHEAD_STEPS` steps, for the next one
        (`CostCurve.with_overhead_of`; docs/algorithms.md §7).

        `carry`: each generation starts from the acceptance model its predecessor at the same
        sampling settings ended with (scaled down: `AcceptanceModel.carried`) instead of from face
        value. Only `budget=auto` builders read it, to size trees: the output distribution never
        changes, but above temperature 0 which sample a seed gives then depends on the decoder's
        earlier generations; False makes every generation reproducible from its seed alone.

        `lookup`: graft up to this many tokens copied from earlier in the context onto every tree
        (`engine/lookup.py`; 0: none), whatever the verifier: the rejection verifiers judge the
        grafted nodes as point-mass proposals (docs/algorithms.md §9)."""
        if lookup < 0:
            raise ArborError(f"lookup must be >= 0 tokens (0: off), got {lookup}")
        check_vocab_size(drafter.vocab_size, target.vocab_size)
        self.target, self.drafter, self.builder = target, drafter, builder
        self.cost = cost
        # a measured curve learns the step's overhead from every generation
        self.learn_overhead = cost is None
        # greedy or not -> the measured curve with what it has learnt
        self.curves: dict[bool, CostCurve] = {}
        self.requested_verifier = verifier
        self.carry = carry
        self.lookup = lookup
        self.learnt: dict[SamplingConfig, AcceptanceModel] = {}  # per sampling settings

    def generate(
        self, prompt_ids: list[int], cfg: DecodeConfig, on_tokens: TokenCallback | None = None
    ) -> GenerationResult:
        verifier_name = choose_verifier(
            self.builder.children_mode, cfg.sampling, self.requested_verifier
        )
        verify = VERIFIERS[verifier_name]
        self.context_lookup = ContextLookup(self.lookup) if self.lookup else None
        # budget=auto at T = 0: the lookup's chains priced like the tree's nodes (engine/lookup.py)
        priced = bool(self.context_lookup) and self.builder.needs_cost and cfg.sampling.greedy
        self.lookup_price = LookupPrice() if priced else None
        depth = max(self.builder.depth_limit, self.lookup if self.context_lookup else 0) + 1
        check_context(len(prompt_ids), cfg, self.target.max_positions, depth)
        check_context(len(prompt_ids), cfg, self.drafter.max_positions, depth, who="draft")
        draft_cfg = cfg.sampling.draft_side()
        gen = torch.Generator(device=self.target.device).manual_seed(cfg.seed)

        # the curve (and what it learnt) of this kind of step
        if self.builder.needs_cost and self.learn_overhead:
            greedy = cfg.sampling.greedy
            self.cost = self.curves.get(greedy) or cost_curve_for(self.target, self.drafter, greedy)
        previous = self.learnt.get(cfg.sampling) if self.carry else None
        self.acceptance = previous.carried() if previous else AcceptanceModel()
        self.target.reset()
        self.drafter.reset()
        features = self.drafter.uses_target_features
        self.target.capture_hidden(features)
        committed = list(prompt_ids)
        out: list[int] = []
        steps: list[StepStats] = []
        trim = PeriodicTrim(self.target.device)
        t_start = clock(self.target.device)
        stop = None
        try:
            if len(prompt_ids) > 1:
                # no LM-head row: the root is fed with the tree
                self.target.feed(torch.tensor(prompt_ids[:-1]))
                if features:
                    self.drafter.observe(self.target.last_hidden)
            while stop is None:
                stop = self._step(
                    committed, out, steps, cfg, draft_cfg, verify, gen, features, on_tokens
                )
                trim.advance(steps[-1].accepted_length)
        except KeyboardInterrupt:
            raise GenerationInterrupted(
                self._result(prompt_ids, out, steps, t_start, "interrupted", verifier_name)
            ) from None
        self.learnt[cfg.sampling] = self.acceptance
        result = self._result(prompt_ids, out, steps, t_start, stop, verifier_name)
        if self.builder.needs_cost and self.learn_overhead and len(steps) >= MIN_OVERHEAD_STEPS:
            # for the next generation: one slow generation (the first after the curve was timed)
            # fixes nothing
            self.cost = self.curves[cfg.sampling.greedy] = self.cost.with_overhead_of(steps)
        return result

    def _result(self, prompt_ids, out, steps, t_start, stop, verifier_name) -> GenerationResult:
        """The generation's result; `step_overhead`: the overhead its trees were sized with."""
        wall = clock(self.target.device) - t_start
        return GenerationResult(
            method=self.builder.name,
            prompt_ids=list(prompt_ids),
            output_ids=list(out),
            steps=list(steps),
            wall_time=wall,
            stop_reason=stop,
            config={"builder": self.builder.describe(), "verifier": verifier_name}
            | (
                {
                    "step_overhead": round(self.cost.step_overhead, 4),
                    "draft_overhead": round(self.cost.draft_overhead, 4),
                    "token_cost": round(self.cost.token_cost, 4),
                }
                if self.builder.needs_cost
                else {}
            ),
        )

    def _step(
        self,
        committed: list[int],
        out: list[int],
        steps: list[StepStats],
        cfg: DecodeConfig,
        draft_cfg: SamplingConfig,
        verify,
        gen: torch.Generator,
        features: bool,
        on_tokens: TokenCallback | None,
    ) -> str | None:
        """One speculative step (module docstring): extends `committed`, `out` and `steps`;
        returns the stop reason."""
        t0 = clock(self.target.device)
        root_logits = self.drafter.begin(committed)
        process = (
            PathProcessor(cfg.logits_processor, committed, self.target.device)
            if cfg.logits_processor is not None
            else None
        )
        ctx = DraftContext(
            self.drafter, draft_cfg, gen, root_logits, self.cost, self.acceptance, process
        )
        tree = self.builder.build(ctx, committed[-1])
        # the builder's tree (grafted nodes have no draft probability)
        calibrated = self.acceptance.expected_length(tree)
        chain = self.context_lookup.propose(committed) if self.context_lookup else []
        if chain and self.lookup_price is not None and self.cost is not None:
            chain = self.lookup_price.prefix(
                chain, calibrated, tree.size, self.drafter.forwards, self.cost
            )
        grafted = graft(tree, chain) if chain else []
        t1 = clock(self.target.device)
        past = self.target.cache_len
        # [N, V], rows computed as the verifier reads them
        logits = self.target.tree_forward(tree, lazy=True)
        if process is not None:  # each row processed on its own path when the verifier reads it
            logits = ProcessedRows(logits, lambda i: tree.path_tokens(i), process)
        t2 = clock(self.target.device)
        if isinstance(logits, LazyLogits):
            logits.prefetch(likely_rows(tree, cfg.sampling.greedy), cfg.sampling.greedy)
        result = verify(tree, logits, cfg.sampling, gen)
        new, stop = _finish(
            [tree.tokens[n] for n in result.accepted] + [result.bonus], out, cfg, committed
        )
        # all of them unless EOS / max_new_tokens cut the step short
        kept = result.accepted[: len(new) - 1]
        self.target.compact(past + 1, [past + n for n in kept])
        if features:  # the root's and the kept nodes' features: exact target states, no draft error
            self.drafter.observe(self.target.last_hidden[[0] + kept])
        self.drafter.commit(tree, kept)
        committed += new
        out += new
        if on_tokens is not None:
            on_tokens(new)
        t3 = clock(self.target.device)
        # the acceptance model calibrates the draft's probabilities: grafted nodes are left out
        kids, flags, ranks = examined_children(tree, result)
        # LM-head rows the verifier computed: part of verification
        head_time = getattr(logits, "seconds", 0.0)
        examined_probs = [tree.draft_probs[k] for k in kids]
        self.acceptance.update(examined_probs, flags, ranks)
        lookup_accepted = sum(1 for n in kept if n in tree.point_masses)
        if self.lookup_price is not None:
            self.lookup_price.update(len(grafted), lookup_accepted)
        steps.append(
            StepStats(
                accepted_length=len(new),
                tree_size=tree.size,
                tree_depth=tree.depth,
                estimated_length=tree.estimated_accept_length(),
                calibrated_length=calibrated,
                draft_time=self.drafter.forward_time,
                build_time=max(0.0, t1 - t0 - self.drafter.forward_time),
                verify_time=t2 - t1 + head_time,
                other_time=t3 - t2 - head_time,
                draft_forwards=self.drafter.forwards,
                examined_draft_probs=examined_probs,
                examined_values=[tree.values[k] for k in kids],
                examined_accepted=flags,
                lookup_nodes=len(grafted),
                lookup_accepted=lookup_accepted,
            )
        )
        return stop


def autoregressive_generate(
    target: ModelAdapter,
    prompt_ids: list[int],
    cfg: DecodeConfig,
    on_tokens: TokenCallback | None = None,
) -> GenerationResult:
    """Plain decoding through the same adapter: the baseline every speedup is measured against."""
    check_context(len(prompt_ids), cfg, target.max_positions)
    gen = torch.Generator(device=target.device).manual_seed(cfg.seed)
    target.reset()
    out: list[int] = []
    steps: list[StepStats] = []
    trim = PeriodicTrim(target.device)
    t_start = clock(target.device)
    stop = None

    def result(reason: str | None) -> GenerationResult:
        return GenerationResult(
            method="autoregressive",
            prompt_ids=list(prompt_ids),
            output_ids=list(out),
            steps=list(steps),
            wall_time=clock(target.device) - t_start,
            stop_reason=reason,
            config={"builder": "autoregressive"},
        )

    try:
        logits = target.feed(torch.tensor(prompt_ids))  # the last row's logits, computed as read
        while stop is None:
            t0 = clock(target.device)
            if cfg.logits_processor is not None:
                process = PathProcessor(cfg.logits_processor, prompt_ids + out, target.device)
                logits = ProcessedRows(logits, lambda i: (), process)
            token = (
                greedy_token(logits, 0)
                if cfg.sampling.greedy
                else sample(probs_from_logits(logits[0], cfg.sampling), gen)
            )
            new, stop = _finish([token], out, cfg, prompt_ids + out)
            out += new
            if on_tokens is not None:
                on_tokens(new)
            if stop is None:
                logits = target.feed(torch.tensor([token]))
            t1 = clock(target.device)
            steps.append(
                StepStats(
                    accepted_length=1,
                    tree_size=0,
                    tree_depth=0,
                    estimated_length=1.0,
                    draft_time=0.0,
                    build_time=0.0,
                    verify_time=t1 - t0,
                    other_time=0.0,
                )
            )
            trim.advance(1)
    except KeyboardInterrupt:
        raise GenerationInterrupted(result("interrupted")) from None
    return result(stop)
