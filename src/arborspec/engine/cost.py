"""The measured cost curve of a step: `t(n)`, one target forward over n tree
rows, relative to one row.

A speculative step costs `t(n)` for verifying a tree of n rows (root included) plus
the draft's forwards, and gets back the accepted length. On a CPU `t(n)/t(1)` is far
from linear (docs/algorithms.md §7): the first extra row is the expensive one. The
`CostCurve` is what `budget=auto` (builders/auto_size.py) divides by, what Sequoia's
offline sizing uses (offline/calibrate.py), and what `arborspec bench` records in its
results header.

`measure_cost_curve` times star-shaped trees (the shape does not change the cost of a
dense-masked forward) over a cache of random tokens, the way a step runs them (the decoder
on every row, the LM head on the rows the verifier reads: `READ_ROWS`; at temperature 0,
`greedy`, only their screened argmax, engine/lm_head.py), and one draft forward of one new token.
`cost_curve_for` measures once per process and (model, drafter, device, dtype, greedy), then serves
the cached curve. (`drafter` arguments are `engine.contracts.Drafter`s; this module does not import
the contracts, which import it.)
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import asdict, dataclass, replace

import torch

from ..common.timing import clock, median_seconds
from .adapter import ModelAdapter
from .lm_head import greedy_token
from .tree import TokenTree

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64)
TABLE_ROWS = 258  # t() is tabulated for trees of up to 256 nodes + root
MIN_FIT = 8  # steps of a generation needed to fit what a draft forward and a committed token cost
# LM-head rows a timed tree forward computes: a verifier reads accepted length of them (~2 here)
READ_ROWS = 2


@dataclass(frozen=True)
class CostCurve:
    tokens: tuple[int, ...]  # n at which t was measured (rows of the forward, root included)
    relative: tuple[float, ...]  # t(n) / t(1)
    one_token_s: float  # t(1) in seconds
    draft_cost: float = 0.0  # one draft forward (one new token) / t(1)
    context: int = 0  # cache length of the timing forwards
    # per step, the time outside the timed forwards (building, bookkeeping) / t(1)
    step_overhead: float = 0.0
    # per draft forward, the step time it adds beyond `draft_cost` (learnt) / t(1)
    draft_overhead: float = 0.0
    # per committed token beyond READ_ROWS, the time it adds (LM-head row, caches) / t(1)
    token_cost: float = 0.0

    def t(self, rows: int) -> float:
        """t(rows)/t(1): linear interpolation between measured points, linear extrapolation beyond
        (tabulated once for the row counts trees use: `budget=auto` asks for it per grown node)."""
        table = self._table
        return table[rows] if 0 <= rows < len(table) else self._interpolate(rows)

    @functools.cached_property
    def _table(self) -> tuple[float, ...]:
        return tuple(self._interpolate(rows) for rows in range(TABLE_ROWS))

    def _interpolate(self, rows: int) -> float:
        xs, ys = self.tokens, self.relative
        if rows <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if rows <= xs[i]:
                w = (rows - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + w * (ys[i] - ys[i - 1])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + slope * (rows - xs[-1])

    def step_cost(self, tree_size: int, draft_forwards: int) -> float:
        """One step in units of t(1): verify `tree_size` draft nodes + the root, plus the draft
        forwards and the step's fixed overhead."""
        return self.t(tree_size + 1) + draft_forwards * self.forward_cost + self.step_overhead

    @property
    def forward_cost(self) -> float:
        """What one draft forward adds to a step / t(1): the timed forward and the
        overhead learnt for it."""
        return self.draft_cost + self.draft_overhead

    def step_costs(self, draft_forwards: int, up_to: int) -> tuple[float, ...]:
        """`step_cost(n, draft_forwards)` for n = 0..up_to (at least), tabulated once per forward
        count for this curve (`budget=auto`'s growth rules ask for them for every grown node)."""
        table = self._step_tables.get(draft_forwards)
        if table is None or len(table) <= up_to:
            table = tuple(
                self.step_cost(n, draft_forwards) for n in range(max(up_to, TABLE_ROWS - 2) + 1)
            )
            self._step_tables[draft_forwards] = table
        return table

    def cheapest_growth(self, size: int, draft_forwards: int, cap: int) -> float:
        """The least average cost per node of growing a tree of `size` nodes to some m in size+1
        .. cap: min over m of `(step_cost(m) - step_cost(size)) / (m - size)` (infinite when
        size >= cap); cached."""
        key = (size, draft_forwards, cap)
        if key not in self._cheapest:
            costs = self.step_costs(draft_forwards, cap)
            self._cheapest[key] = min(
                ((costs[m] - costs[size]) / (m - size) for m in range(size + 1, cap + 1)),
                default=float("inf"),
            )
        return self._cheapest[key]

    @functools.cached_property
    def _cheapest(self) -> dict[tuple[int, int, int], float]:
        return {}

    @functools.cached_property
    def _step_tables(self) -> dict[int, tuple[float, ...]]:
        return {}

    def with_overhead_of(self, steps) -> CostCurve:
        """This curve with its overheads measured from a generation's `StepStats`. A step's time in
        units of t(1), less what the curve predicts for its tree (`t(n + 1)`) and its timed draft
        forwards, is modelled as

            step_overhead + draft_overhead x forwards + token_cost x (accepted tokens - READ_ROWS)

        and fitted over the generation's steps when it has at least `MIN_FIT` of them with at
        least two different numbers of forwards and of accepted tokens (else the two slopes are kept
        and only the overhead is learnt). Both slopes are needed: a step that pays more forwards
        grows a deeper tree and commits more tokens, and every committed token costs time of its own
        (the verifier's LM-head row for it, cache compaction, the draft catching up), so a fit on
        forwards alone charges them to the forwards. Slopes are never below 0 (a negative one is
        dropped and the rest refitted); `step_overhead` is then the median over steps of what the
        slopes leave, never below 0.

        The fit minimises absolute, not squared, deviations: a run of steps the machine slowed down
        (another process, memory pressure) would otherwise decide the slopes (a committed token
        charged half a forward shrinks every later tree to nothing; docs/algorithms.md §7). Steps
        without a tree (plain decoding) are ignored; a generation that built no tree at all learnt
        nothing about the slopes but must not keep a bad fit for good (trees of size 0 would never
        correct it): it halves them."""
        rows = [
            (
                float(s.draft_forwards),
                float(s.accepted_length - READ_ROWS),
                (s.draft_time + s.build_time + s.verify_time + s.other_time) / self.one_token_s
                - self.t(s.tree_size + 1)
                - s.draft_forwards * self.draft_cost,
            )
            for s in steps
            if s.tree_size > 0
        ]
        if not rows:
            return (
                replace(
                    self, draft_overhead=self.draft_overhead / 2, token_cost=self.token_cost / 2
                )
                if steps
                else self
            )
        return replace(self, **self._fit(rows))

    def _fit(self, rows: list[tuple[float, float, float]]) -> dict[str, float]:
        """The overhead and the two slopes of `with_overhead_of` from rows (forwards, tokens
        - READ_ROWS, gap)."""
        slopes = {"draft_overhead": self.draft_overhead, "token_cost": self.token_cost}
        if len(rows) >= MIN_FIT:
            columns = {"draft_overhead": [r[0] for r in rows], "token_cost": [r[1] for r in rows]}
            free = [name for name, col in columns.items() if len(set(col)) >= 2]
            while free:
                x = torch.tensor(
                    [[1.0] + [columns[n][k] for n in free] for k in range(len(rows))],
                    dtype=torch.float64,
                )
                y = torch.tensor([[r[2]] for r in rows], dtype=torch.float64)
                fit = least_absolute_deviations(x, y)[1:].tolist()
                if min(fit) >= 0:
                    slopes.update(zip(free, fit))
                    break
                dropped = free.pop(fit.index(min(fit)))
                slopes[dropped] = 0.0
        overhead = statistics.median(
            g - slopes["draft_overhead"] * f - slopes["token_cost"] * a for f, a, g in rows
        )
        return {"step_overhead": max(0.0, overhead), **slopes}

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CostCurve:
        return cls(
            tuple(int(x) for x in data["tokens"]),
            tuple(float(y) for y in data["relative"]),
            float(data["one_token_s"]),
            float(data.get("draft_cost", 0.0)),
            int(data.get("context", 0)),
            float(data.get("step_overhead", 0.0)),
            float(data.get("draft_overhead", 0.0)),
            float(data.get("token_cost", 0.0)),
        )


def least_absolute_deviations(x: torch.Tensor, y: torch.Tensor, rounds: int = 50) -> torch.Tensor:
    """The `b` minimising sum |y - x b| (`x [n, k]`, `y [n, 1]`, float64), by iteratively reweighted
    least squares from the least-squares solution; exact data is fitted exactly."""
    b = torch.linalg.lstsq(x, y).solution
    for _ in range(rounds):
        weights = (y - x @ b).abs().clamp_min(1e-6).rsqrt()
        nb = torch.linalg.lstsq(x * weights, y * weights).solution
        if torch.allclose(nb, b, rtol=0.0, atol=1e-9):
            break
        b = nb
    return b[:, 0]


def random_context(vocab_size: int, length: int, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (length,), generator=gen).tolist()


def measure_target_times(
    target: ModelAdapter,
    context: list[int],
    sizes=DEFAULT_SIZES,
    repeats: int = 5,
    greedy: bool = False,
) -> tuple[list[int], list[float], float]:
    """t(k) for each k in `sizes`: a k-row tree forward over a cache of `context`; returns
    (sizes, t(k)/t(1), t(1) s).
    `greedy`: the verifier's rows are read as temperature 0 reads them (screened
    argmax), else as full rows.

    The sizes are timed round-robin (one untimed round first, then `repeats` timed rounds), so that
    a slow start (cold caches, allocator growth) spreads over every size instead of inflating the
    one timed first: t(1), which every ratio divides by. Each size keeps its fastest round:
    interference (a garbage collection, another process) only ever adds time, and one slowed t(1)
    would otherwise shrink every ratio and make `budget=auto` grow trees too large
    (docs/algorithms.md §7)."""
    sizes = sorted(set(sizes) | {1})
    target.reset()
    target.prefill(torch.tensor(context))
    past = target.cache_len
    runs = []
    for k in sizes:
        tree = TokenTree.from_root(context[-1])
        for j in range(k - 1):  # a star: shape does not change the cost of a dense-masked forward
            tree.add(0, (context[j % len(context)] + j) % target.vocab_size)

        def run(tree=tree):
            logits = target.tree_forward(tree, lazy=True)
            # the rows a verifier reads (engine/lm_head.py)
            for row in range(min(READ_ROWS, tree.num_nodes)):
                greedy_token(logits, row) if greedy else logits[row]
            clock(target.device)  # wait for the device before the crop
            target.crop_to(past)

        runs.append(run)
    times: list[list[float]] = [[] for _ in sizes]
    for round_ in range(repeats + 1):
        for i, run in enumerate(runs):
            seconds = median_seconds(run, 1)
            if round_:  # round 0 warms every size up
                times[i].append(seconds)
    target.reset()
    fastest = [min(t) for t in times]
    return sizes, [s / fastest[0] for s in fastest], fastest[0]


def measure_draft_seconds(
    drafter, context: list[int], repeats: int, target: ModelAdapter | None = None
) -> float:
    """Seconds of one draft forward feeding one new token after `context` (the fastest of
    `repeats`, as for the target).

    A drafter that reads target features (a draft head) first observes the target's
    features of `context`, from one forward of `target` (`Drafter.observe_sequence`).
    """
    drafter.reset()
    drafter.observe_sequence(target, context)
    drafter.begin(context[: -repeats - 1])
    times = []
    for j in range(repeats):
        t0 = clock()
        drafter.begin(context[: len(context) - repeats + j])
        times.append(clock() - t0)
    drafter.reset()
    return min(times)


def measure_cost_curve(
    target: ModelAdapter,
    drafter=None,
    context_len: int = 128,
    sizes=DEFAULT_SIZES,
    repeats: int = 5,
    seed: int = 0,
    greedy: bool = False,
) -> CostCurve:
    """Time the target over trees of `sizes` rows (and one draft forward) after a random
    context; `greedy`: the verifier's rows read as at temperature 0."""
    context = random_context(target.vocab_size, context_len + repeats + 2, seed)
    tokens, relative, one = measure_target_times(
        target, context[:context_len], sizes, repeats, greedy
    )
    draft = (
        measure_draft_seconds(drafter, context, repeats, target) / one
        if drafter is not None
        else 0.0
    )
    return CostCurve(tuple(tokens), tuple(relative), one, draft, context_len)


_CACHE: dict[tuple, CostCurve] = {}


def cost_curve_for(target: ModelAdapter, drafter=None, greedy: bool = False) -> CostCurve:
    """The cost curve of this target (and drafter), measured on first use in this process; `greedy`:
    of temperature 0's steps, whose verifier reads screened argmaxes instead of
    full LM-head rows."""
    key = (id(target.model), id(drafter), str(target.device), str(target.dtype), greedy)
    if key not in _CACHE:
        _CACHE[key] = measure_cost_curve(target, drafter, greedy=greedy)
    return _CACHE[key]
