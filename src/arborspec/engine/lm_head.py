"""The target's LM head, run by the adapter itself: fast single rows, and rows on
demand for the verifier.

Why (docs/algorithms.md §7, "Cheaper verification"): the LM head (vocabulary x hidden)
is the largest matrix of a small model. On CPU, `F.linear` on one row (weights stored
[V, H]) runs about twice as slow as the same product against a contiguous [H, V] copy
(9.6 vs 5.0 ms for SmolLM2's 49152 x 576 head on 2 cores;
benchmarks/results/verify-probes.json), and a tree forward pays it
for every node although a verifier only reads the rows on the path it walks (accepted
length of them). So the adapter runs the model's *decoder*, and this module turns
hidden rows into logits:

* `HeadRows.logits(hidden)`: one row against the transposed copy (CPU, heads up to
  1 GiB; it costs that much memory once), several rows against oneDNN's packed copy of
  the head where the transposed one is kept (made on the first call of several rows, the
  same memory again; its kernel reads the weights once for all rows: 5.0 / 4.1 / 4.7 ms for
  2 / 4 / 8 rows of the embedded target's head on 2 threads, against 10.2 / 19.5 / 17.9 for
  `torch.mm` on the transposed copy; benchmarks/results/verify-probes.json), else by
  `F.linear` (same weights, same float32 math up to summation order);
* `LazyLogits`: indexable like a `[N, V]` logits tensor; row i is computed on first
  access and kept. The verifiers only ever index single rows;
* `GreedyScreen` (temperature 0; `LazyLogits.argmax`): the argmax of a row without its
  full float32 logits. An int8 copy of the head gives every logit up to a bound proven
  per token from the two quantisation steps; only the tokens whose interval reaches the
  best lower bound (a handful) get their float32 logit, and the largest of those wins.
  The true argmax is always among them, so the token is the one the full float32 row
  gives, up to float32 summation order as above (docs/algorithms.md §7).

Plain decoding (the baseline) goes through the same single-row product and the same screen,
so every speedup is measured against a baseline that got the same improvement, and a tree's
greedy verdicts are the plain decoder's bit for bit.

Only heads whose logits are exactly `lm_head(hidden)` qualify (an `nn.Linear`, no
final soft-capping or logit scaling in the model's config) and whose weights are in
place: a head placed by a device map carries an accelerate hook and may keep its
weight on the `meta` device until its own forward runs (engine/placement.py). For
anything else `HeadRows.supported` is False and the adapter asks the model for its
logits as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.timing import clock
from .int8 import (
    int8_rows_product,
    pack_int8_weight,
    packed_int8_values,
    rounded_like_kernel,
    weight_scales,
)

# the transposed single-row copy of the LM head is kept up to this size
MAX_TRANSPOSED_BYTES = 1 << 30
# oneDNN's linear on a packed float32 weight (PyTorch's CPU builds; what inductor's CPU backend
# calls): several rows read the weight once (module doc)
_MKLDNN_REORDER = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
_MKLDNN_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
# config attributes that make a causal LM's logits differ from lm_head(hidden)
_LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_multiplier_scale",
)


def placed(head: torch.nn.Module) -> bool:
    """A head under an accelerate hook (device map) or with its weight on `meta`: only its
    own forward is safe."""
    return getattr(head, "_hf_hook", None) is not None or head.weight.device.type == "meta"


class GreedyScreen:
    """`argmax(h W^T)` for one hidden row from an int8 screen plus a few float32 rows (module doc).

    The row's `OUTLIERS` largest channels go through float32 (against the transposed copy of the
    head: k contiguous rows); the rest is quantised per row (scale s_h, 8 bits) and multiplied with
    the weights in int8 per channel (7 bits, `engine/int8.py`) with integer sums. For token v the
    screen's logit then differs from the exact `h . w_v` by at most (Cauchy-Schwarz, twice)

        |h - h^|_2 |w_v|_2 + |h^|_2 |w_v - w^_v|_2   (+ float32 rounding: 2 H 2^-24 |h|_2 |w_v|_2)

    where h^ is the quantised rest of the row (computed exactly, in float64) and w_v - w^_v the
    known rounding of the weights (norms precomputed per token); the two quantisation terms are
    widened by 0.1 %. Every token whose upper bound reaches the best lower bound is a candidate,
    and the exact argmax always is one (on the embedded target's answers: 22 of 49152 at the
    median). The candidates get `h . w_v` in float32; the first largest wins
    (`torch.argmax`'s rule: ids in order).
    """

    OUTLIERS = 4  # channels of the row kept in float32: the final norm's few huge channels would
    # otherwise set the row's quantisation scale (with none kept, 276 candidates at the median);
    # more channels mean fewer candidates but a float32 head row added per channel and row
    # (docs/algorithms.md §7)

    def __init__(
        self, weight: torch.Tensor, weight_t: torch.Tensor
    ) -> None:  # [V, H] float32 CPU; its [H, V] copy
        self.weight, self.weight_t = weight.detach(), weight_t
        self.packed = pack_int8_weight(self.weight)
        w = self.weight.double()
        scales = weight_scales(self.weight)  # s_v, as packed
        rounding = w - packed_int8_values(self.packed).double() * scales[:, None]
        self.norm_w = w.norm(dim=1).float()  # |w_v|_2
        self.norm_err = rounding.norm(dim=1).float()  # |w_v - w^_v|_2
        self.hidden_size = self.weight.shape[1]
        self.candidates = 0  # float32 rows computed so far (statistics and tests)

    def bounds(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Screen logits `[K, V]` and their error bounds `[K, V]` for float32 rows `[K, H]`: one
        int8 product for all of them (exact integer sums, so each row's values are those it gets
        alone), the rest row by row."""
        k = min(self.OUTLIERS, self.hidden_size)
        keep = rows.abs().topk(k, dim=1).indices  # [K, k]
        rest = rows.clone()
        rest.scatter_(1, keep, 0.0)
        # x: the rows in units of their scales; `rounded`: the 8-bit values the kernel used
        approx, x, scales = int8_rows_product(rest, self.packed)
        rounded_rows = rounded_like_kernel(x).double()
        bounds = torch.empty_like(approx)
        for i in range(rows.shape[0]):
            row, kept = rows[i : i + 1], keep[i]
            # the kept channels' float32 products, added one head row at a time (contiguous rows of
            # the transposed copy: no gathered copy of k rows of the head per hidden row)
            for channel, value in zip(kept.tolist(), row[0, kept].tolist()):
                approx[i].add_(self.weight_t[channel], alpha=value)
            scale = float(scales[i])
            xd, rounded = x[i].double(), rounded_rows[i]
            norm_h = float(row.double().norm())
            # |h - h^|_2 over the quantised channels
            gap = scale * float((xd - rounded).norm()) + 2.0**-24 * norm_h
            norm_hat = scale * float(rounded.norm())  # |h^|_2
            per_w = 1.001 * gap + 2 * self.hidden_size * 2.0**-24 * norm_h
            torch.add(self.norm_w * per_w, self.norm_err, alpha=1.001 * norm_hat, out=bounds[i])
        return approx, bounds

    def argmax(self, hidden: torch.Tensor) -> int | None:
        """The greedy token of `hidden` `[1, H]`; None when the row is not finite (let
        the full row decide)."""
        return self.argmax_rows(hidden.reshape(1, -1))[0]

    def argmax_rows(self, hidden: torch.Tensor) -> list[int | None]:
        """`argmax` of every row of `hidden` `[K, H]`, the screen's int8 product run once for all
        (batched decoding); each row's answer is the one it gets alone."""
        rows = hidden.float()
        approx, bound = self.bounds(rows)
        floor = (approx - bound).amax(dim=1, keepdim=True)
        upper = approx.add_(bound) >= floor  # approx is ours: its upper bounds in place
        tokens: list[int | None] = []
        for i in range(rows.shape[0]):
            cand = torch.nonzero(upper[i])[:, 0]
            if cand.numel() == 0:  # NaN or inf in the row: no interval reaches anything
                tokens.append(None)
                continue
            self.candidates += cand.numel()
            if cand.numel() == 1:
                tokens.append(int(cand[0]))
                continue
            exact = torch.mv(self.weight.index_select(0, cand), rows[i])
            tokens.append(int(cand[int(exact.argmax())]))
        return tokens


def screen_for(
    weight: torch.Tensor | None, weight_t: torch.Tensor | None, bias: torch.Tensor | None
) -> GreedyScreen | None:
    """A greedy screen for a float32 CPU head without bias, with its transposed copy (fbgemm's int8
    kernels); else None (the full row decides)."""
    if (
        weight is None
        or weight_t is None
        or bias is not None
        or weight.device.type != "cpu"
        or weight.dtype != torch.float32
    ):
        return None
    try:
        return GreedyScreen(weight, weight_t)
    except RuntimeError:  # no fbgemm int8 kernels in this build
        return None


class HeadRows:
    """Logits from last hidden states with the model's own (unmodified) LM head weights."""

    def __init__(self, model) -> None:
        head = model.get_output_embeddings()
        self.supported = (
            type(head) is torch.nn.Linear
            and not placed(head)
            and not any(
                getattr(model.config, name, None) not in (None, 1, 1.0)
                for name in _LOGIT_TRANSFORMS
            )
        )
        self.weight = head.weight if self.supported else None
        self.bias = head.bias if self.supported else None
        # On CPU a contiguous [H, V] copy makes one row a fast vector-matrix product (see the module
        # doc); kept only for heads up to MAX_TRANSPOSED_BYTES, the memory it costs.
        w = self.weight
        small = w is not None and w.numel() * w.element_size() <= MAX_TRANSPOSED_BYTES
        self.weight_t = w.detach().t().contiguous() if small and w.device.type == "cpu" else None
        # temperature 0: argmax without the full row (module doc)
        self.screen = screen_for(w, self.weight_t, self.bias)
        # several rows (sampled trees): oneDNN's packed weights, made when first needed (module
        # doc); False where this build cannot make them
        self.packed: torch.Tensor | bool | None = None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[K, H]` hidden -> `[K, V]` float32 logits."""
        if hidden.shape[0] == 1 and self.weight_t is not None:
            out = torch.mm(hidden, self.weight_t)
            if self.bias is not None:
                out = out + self.bias
        elif self.weight_t is not None and hidden.dtype == torch.float32 and self._packed_rows():
            out = _MKLDNN_LINEAR(hidden, self.packed, self.bias, "none", [], "")
        else:
            out = F.linear(hidden, self.weight, self.bias)
        return out.float()

    def _packed_rows(self) -> bool:
        """Whether several rows go through oneDNN's packed copy of the head (made on first use, the
        head's size in memory; module doc)."""
        if self.packed is None:
            self.packed = False  # a build without oneDNN's CPU kernels
            if _MKLDNN_REORDER is not None and _MKLDNN_LINEAR is not None:
                try:
                    self.packed = _MKLDNN_REORDER(self.weight.detach(), 8)
                except RuntimeError:
                    pass
        return self.packed is not False

    def greedy(self, hidden: torch.Tensor) -> int:
        """The argmax token of one hidden row `[1, H]` (the screen where there is one)."""
        return self.greedy_rows(hidden)[0]

    def greedy_rows(self, hidden: torch.Tensor) -> list[int]:
        """`greedy` of every row of `hidden` `[K, H]`, screened together (batched decoding)."""
        tokens = (
            self.screen.argmax_rows(hidden) if self.screen is not None else [None] * len(hidden)
        )
        return [
            t if t is not None else int(self.logits(hidden[i : i + 1])[0].argmax())
            for i, t in enumerate(tokens)
        ]


class LazyLogits:
    """`[N, V]` logits of a tree forward, computed row by row on first access
    (`logits[i]` -> `[V]`)."""

    def __init__(self, hidden: torch.Tensor, head: HeadRows) -> None:
        self.hidden, self.head = hidden, head  # hidden: [N, H]
        self.rows: dict[int, torch.Tensor] = {}
        self.best: dict[int, int] = {}
        self.seconds = 0.0  # spent computing rows (the step statistics count it as verification)

    def __len__(self) -> int:
        return self.hidden.shape[0]

    @torch.inference_mode()
    def __getitem__(self, i: int) -> torch.Tensor:
        i = int(i)
        if i < 0:
            i += len(self)
        if i not in self.rows:
            t0 = clock(self.hidden.device)
            self.rows[i] = self.head.logits(self.hidden[i : i + 1])[0]
            self.seconds += clock(self.hidden.device) - t0
        return self.rows[i]

    @torch.inference_mode()
    def prefetch(self, rows: list[int], greedy: bool) -> None:
        """Compute `rows` ahead of the verifier in one pass over the head: their screened greedy
        tokens (`greedy`, through `screen_rows`: each the token `argmax` gives the row alone) or
        their logits rows (one product of several rows reads the head's weights once; the same
        float32 math as a row alone up to summation order, as `HeadRows.logits` says). A row the
        verifier then does not read costs a fraction of a separate pass (module doc of
        engine/decode.py, "likely rows")."""
        if greedy:
            screen_rows([(self, i) for i in rows])
            return
        todo = [i for i in dict.fromkeys(int(i) % len(self) for i in rows) if i not in self.rows]
        if len(todo) < 2:  # one row: as the verifier would compute it
            return
        t0 = clock(self.hidden.device)
        out = self.head.logits(self.hidden[todo])
        for row, i in enumerate(todo):
            self.rows[i] = out[row]
        self.seconds += clock(self.hidden.device) - t0

    @torch.inference_mode()
    def argmax(self, i: int) -> int:
        """Row i's greedy token, through `HeadRows.greedy` (never from a row computed for sampling:
        the same function as plain decoding's, so the verdicts match it bit for bit)."""
        i = int(i) % len(self)
        if i not in self.best:
            t0 = clock(self.hidden.device)
            self.best[i] = self.head.greedy(self.hidden[i : i + 1])
            self.seconds += clock(self.hidden.device) - t0
        return self.best[i]


def greedy_token(logits, i: int) -> int:
    """Row i's argmax token of a plain `[N, V]` logits tensor, or through the rows' own `argmax`
    (`LazyLogits`: screened; processed rows: their full row)."""
    return int(logits[i].argmax()) if isinstance(logits, torch.Tensor) else logits.argmax(i)


@torch.inference_mode()
def screen_rows(rows: list[tuple[LazyLogits, int]]) -> None:
    """The greedy tokens of rows of several `LazyLogits` on one head (`(logits, row)` pairs), in one
    screened pass: batched decoding screens every row of every request's tree this way before
    its greedy verifiers walk them, one pass over the head for all. Each row's token is the one
    `argmax` gives it alone."""
    todo = [(lazy, i) for lazy, i in rows if i not in lazy.best]
    if not todo:
        return
    first = todo[0][0]
    t0 = clock(first.hidden.device)
    hidden = torch.cat([lazy.hidden[i : i + 1] for lazy, i in todo])
    for (lazy, i), token in zip(todo, first.head.greedy_rows(hidden)):
        lazy.best[i] = token
    first.seconds += clock(first.hidden.device) - t0
