"""Sequoia's dynamic program: the optimal tree shape for a positional acceptance vector (Chen
et al. 2024, App. C.2).

Pure functions. The run-time builder (`builders/sequoia.py`) solves it once per
(size, depth) for its default shape; `offline/calibrate.py` solves it for a
measured acceptance vector and writes the shape to a file (docs/algorithms.md §3).

Under the *positional acceptance* assumption the verifier accepts the k-th
child of an accepted node with probability `p_k`, whatever the tokens. A tree
shape then has score `F(tree) = sum over nodes of prod of p_{child index}
along the node's path` (root = 1), and F is the expected number of tokens
committed per step, bonus included (Proposition C.2).

The bounded-depth dynamic program of App. C.2.2, with `m` counting nodes
*including* the root and `l` the depth bound below the root:

    T(1, l, 0) = 1
    T(m, l, b) = max_{1 <= y < m}  T(y, l, b-1) + p_b * max_j T(m-y, l-1, j)      (b >= 1)

i.e. the root's last (b-th) branch holds `m - y` nodes and the root with its
first b-1 branches the other `y`. (For b = 1 only y = 1 is feasible, which is
the paper's `T(m,l,1) = 1 + p_1 max_j T(m-1, l-1, j)`.) Branching is capped at
K = len(p): a child beyond the measured vector has no acceptance estimate.
The decomposition over the last branch is exact for any p, so no ordering of
p is assumed. One pass gives the optimum for every (size, depth) up to the
bounds, which `choose_size` uses for Sequoia's hardware-aware sizing
(Sec. 3.3): maximise `G(n, d) / (t(n+1) + d c)`.

Shapes come out as index paths (`shapes.py`) for the run-time builder
`builders/sequoia.py`, which samples children without replacement; pair with
the `rejection` verifier (without replacement), Sequoia Alg. 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import ArborError
from .shapes import Shape, validate_shape

# Default acceptance vector when no calibration is given: p_k = 0.6 * 0.4^(k-1), k = 1..16.
# Geometric and decreasing (the shape a sampling-without-replacement verifier shows
# in the Sequoia paper's measurements), summing to just under 1. First child 0.6 is
# a middle-of-the-road draft; calibrate a pair (`offline/calibrate.py`) for its real vector.
DEFAULT_ACCEPTANCE: tuple[float, ...] = tuple(0.6 * 0.4**k for k in range(16))

NEG = -np.inf


@dataclass
class DPTable:
    """The solved dynamic program for sizes up to `max_nodes` (root included) and depths
    up to `max_depth`."""

    p: np.ndarray  # [K] acceptance vector
    # [L+1, M+1] best F with m nodes (root incl.) and depth <= l; -inf if infeasible
    best: np.ndarray
    best_b: np.ndarray  # [L+1, M+1] root branching achieving `best`
    split: np.ndarray  # [L+1, K+1, M+1] argmax y of T(m, l, b)

    @property
    def max_nodes(self) -> int:
        return self.best.shape[1] - 1

    @property
    def max_depth(self) -> int:
        return self.best.shape[0] - 1

    def score(self, size: int, depth: int) -> float:
        """G(size, depth): best F of a tree with `size` draft nodes and depth <=
        `depth` (-inf if none)."""
        return float(self.best[depth, size + 1])


def check_acceptance(p: Sequence[float]) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ArborError(
            "the acceptance vector must be a non-empty list of probabilities p_1, p_2, ..."
        )
    if not np.all((arr >= 0) & (arr <= 1)):
        raise ArborError(f"acceptance probabilities must lie in [0, 1], got {arr.tolist()}")
    return arr


def solve(p: Sequence[float], max_nodes: int, max_depth: int) -> DPTable:
    """Run the App. C.2.2 recursion for all m <= max_nodes, l <= max_depth. O(M^2 L K) in numpy."""
    p = check_acceptance(p)
    m_max, l_max = max_nodes, max_depth
    k_max = min(p.size, max(m_max - 1, 1))
    best = np.full((l_max + 1, m_max + 1), NEG)
    best_b = np.zeros((l_max + 1, m_max + 1), dtype=np.int64)
    split = np.zeros((l_max + 1, k_max + 1, m_max + 1), dtype=np.int64)
    best[:, 1] = 1.0  # the root alone
    m_idx = np.arange(m_max + 1)[:, None]  # [M+1, 1]
    y_idx = np.arange(m_max + 1)[None, :]  # [1, M+1]
    rest = m_idx - y_idx  # [M+1, M+1] nodes in the last branch
    valid = (y_idx >= 1) & (rest >= 1)
    for level in range(1, l_max + 1):
        sub = best[level - 1]  # [M+1] best subtree below a child, depth <= level-1
        t_prev = np.full(m_max + 1, NEG)
        t_prev[1] = 1.0  # T(m, level, 0)
        for b in range(1, k_max + 1):
            branch = np.where(
                np.isfinite(sub), p[b - 1] * np.where(np.isfinite(sub), sub, 0.0), NEG
            )
            cand = np.where(
                valid, t_prev[np.clip(y_idx, 0, m_max)] + branch[np.clip(rest, 0, m_max)], NEG
            )
            t_cur = cand.max(axis=1)  # [M+1]
            split[level, b] = cand.argmax(axis=1)
            better = t_cur > best[level]
            best[level] = np.where(better, t_cur, best[level])
            best_b[level] = np.where(better, b, best_b[level])
            t_prev = t_cur
    return DPTable(p, best, best_b, split)


def rebuild(table: DPTable, nodes: int, depth: int) -> Shape:
    """Index paths of the optimal tree with `nodes` nodes (root included) and depth <= `depth`."""
    paths: list[list[int]] = []

    def grow(prefix: list[int], m: int, level: int) -> None:
        b = int(table.best_b[level, m]) if m > 1 else 0
        while b >= 1:  # peel off the last branch: child b-1 holds m - y nodes
            y = int(table.split[level, b, m])
            child = prefix + [b - 1]
            paths.append(child)
            grow(child, m - y, level - 1)
            m, b = y, b - 1

    grow([], nodes, depth)
    return validate_shape(paths) if paths else []


def optimal_shape(p: Sequence[float], size: int, depth: int | None = None) -> tuple[Shape, float]:
    """The shape with `size` draft nodes (root excluded) and depth <= `depth` maximising
    F; returns (shape, F).

    `depth=None` is the unbounded variant (depth = size).
    """
    depth = size if depth is None else depth
    if size < 1 or depth < 1:
        raise ArborError(f"size and depth must be >= 1, got size={size}, depth={depth}")
    table = solve(p, size + 1, depth)
    score = table.score(size, depth)
    if not np.isfinite(score):
        raise ArborError(
            f"no tree of {size} nodes has depth <= {depth} with at most {len(table.p)} "
            "children per node (the acceptance vector's length): raise the depth or "
            "measure a longer vector"
        )
    return rebuild(table, size + 1, depth), score


def tree_score(shape: Shape, p: Sequence[float]) -> float:
    """F(shape) = 1 + sum over nodes of prod p_{index+1} along the path; children
    beyond len(p) score 0."""
    p = check_acceptance(p)
    total = 1.0
    for path in validate_shape(shape):
        f = 1.0
        for i in path:
            f *= p[i] if i < p.size else 0.0
        total += f
    return total


@lru_cache(maxsize=64)
def _default_shape(budget: int, depth: int, branching: int) -> tuple[tuple[int, ...], ...]:
    shape, _ = optimal_shape(DEFAULT_ACCEPTANCE[:branching], budget, depth)
    return tuple(tuple(path) for path in shape)


def default_shape(budget: int, depth: int, branching: int | None = None) -> Shape:
    """The DP shape for `DEFAULT_ACCEPTANCE` at this size and depth bound, at most `branching`
    children per node (None: the vector's length); used when no shape is given."""
    branching = len(DEFAULT_ACCEPTANCE) if branching is None else int(branching)
    return [list(path) for path in _default_shape(int(budget), int(depth), branching)]


def choose_size(
    p: Sequence[float],
    t: Callable[[int], float] | Sequence[float],
    c: float,
    max_size: int,
    max_depth: int,
) -> tuple[int, int]:
    """Hardware-aware (size, depth): argmax over n <= max_size, d <= max_depth of
    G(n, d) / (t(n+1) + d c).

    `t(k)` is the target's forward time for k new tokens relative to one token
    (a callable, or a sequence indexed by k with t[1] = 1); a tree of n draft
    nodes is verified with n + 1 tokens (the root too). `c` is one draft
    forward relative to one target token; a depth-d tree costs d draft
    forwards (the root's, then one per expanded layer). The ratio is the
    predicted speedup over plain decoding. Ties go to the smaller tree.
    """
    cost = t if callable(t) else (lambda k: float(t[k]))
    table = solve(p, max_size + 1, max_depth)
    best, choice = -np.inf, (1, 1)
    for n in range(1, max_size + 1):
        t_n = cost(n + 1)
        for d in range(1, min(max_depth, n) + 1):
            rate = table.score(n, d) / (t_n + d * c)
            if rate > best + 1e-12:
                best, choice = rate, (n, d)
    return choice


def predicted_speedup(
    p: Sequence[float], t: Callable[[int], float], c: float, size: int, depth: int
) -> float:
    """G(size, depth) / (t(size+1) + depth c): the speedup the hardware-aware model predicts."""
    table = solve(p, size + 1, depth)
    return table.score(size, depth) / (t(size + 1) + depth * c)
