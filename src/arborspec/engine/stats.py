"""Result dataclasses: what one speculative step and one generation produced.

Conventions (used everywhere, docs/algorithms.md §1): *accepted length* counts
the tokens committed by a step **including the bonus token**; *tree size*
counts draft nodes, root excluded. The figures of one generation are the
properties below; the benchmark's figures over many runs (ratios of totals)
are computed from its results records in `bench/metrics.py`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(kw_only=True)
class StepStats:
    # committed tokens this step, bonus included (after truncation at EOS/max_new_tokens)
    accepted_length: int
    tree_size: int  # draft nodes verified (root excluded)
    tree_depth: int
    estimated_length: float  # the builder's own E[accepted length] = 1 + sum of node values
    draft_time: float  # seconds in draft forwards (model or n-gram)
    build_time: float  # tree construction other than draft forwards
    verify_time: float  # the target's tree forward + the LM-head rows the verifier read
    other_time: float  # verification walk, KV compaction, bookkeeping
    draft_forwards: int = 0
    # E[accepted length] under the generation's online acceptance model (before this step)
    calibrated_length: float = 0.0
    # For acceptance-vs-draft-probability plots: every child the verifier examined
    examined_draft_probs: list[float] = field(default_factory=list)
    examined_values: list[float] = field(default_factory=list)
    examined_accepted: list[bool] = field(default_factory=list)
    # nodes grafted from earlier in the context (engine/lookup.py), part of tree_size
    lookup_nodes: int = 0
    lookup_accepted: int = 0  # accepted tokens that were grafted nodes


@dataclass(kw_only=True)
class GenerationResult:
    method: str
    prompt_ids: list[int]
    output_ids: list[int]  # new tokens only (committed ids; never re-tokenised text)
    text: str = ""  # the decoded output, filled in by the API (the engine sees token ids only)
    steps: list[StepStats]
    wall_time: float  # seconds from the first forward to the last token, prefill included
    stop_reason: str  # "eos" | "length" | "stop" (a stopping check) | "interrupted"
    config: dict = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def mean_accepted_length(self) -> float:
        return self.new_tokens / len(self.steps) if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0

    def speedup_over(self, baseline: GenerationResult) -> float:
        """Baseline seconds per token / this generation's seconds per token."""
        return (baseline.wall_time / baseline.new_tokens) / (self.wall_time / self.new_tokens)

    @property
    def mean_tree_size(self) -> float:
        return sum(s.tree_size for s in self.steps) / len(self.steps) if self.steps else 0.0

    def summary(self) -> str:
        t = {
            k: sum(getattr(s, k) for s in self.steps)
            for k in ("draft_time", "build_time", "verify_time", "other_time")
        }
        total = sum(t.values()) or 1.0
        return (
            f"{self.method}: {self.new_tokens} tokens in {len(self.steps)} steps, accepted length "
            f"{self.mean_accepted_length:.2f}/step, tree {self.mean_tree_size:.1f} nodes, "
            f"{self.tokens_per_second:.1f} tok/s, time draft {t['draft_time'] / total:.0%} / build "
            f"{t['build_time'] / total:.0%} / verify {t['verify_time'] / total:.0%} / other "
            f"{t['other_time'] / total:.0%}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during a generation: still a `KeyboardInterrupt`, carrying what was generated so far
    (`result`, stop reason "interrupted": every committed token and every finished step)."""

    def __init__(self, result: GenerationResult) -> None:
        super().__init__("generation interrupted")
        self.result = result
