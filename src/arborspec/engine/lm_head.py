"""The target's LM head, run by the adapter itself: fast single rows, and rows on demand for the verifier.

Why (docs/algorithms.md §7, "Cheaper verification"): the LM head (vocabulary x hidden)
is the largest matrix of a small model. On CPU, `F.linear` on one row (weights stored
[V, H]) runs about twice as slow as the same product against a contiguous [H, V] copy
(7.5 vs ~4 ms for SmolLM2's 49152 x 576 head on 2 cores), and a tree forward pays it
for every node although a verifier only reads the rows on the path it walks (accepted
length of them). So the adapter runs the model's *decoder*, and this module turns
hidden rows into logits:

* `HeadRows.logits(hidden)`: one row against the transposed copy (CPU, heads up to
  1 GiB; it costs that much memory once), several rows by `F.linear` (same weights,
  same float32 math up to summation order);
* `LazyLogits`: indexable like a `[N, V]` logits tensor; row i is computed on first
  access and kept. The verifiers only ever index single rows.

Plain decoding (the baseline) goes through the same single-row product, so every
speedup is measured against a baseline that got the same improvement.

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

MAX_TRANSPOSED_BYTES = 1 << 30  # the transposed single-row copy of the LM head is kept up to this size
# config attributes that make a causal LM's logits differ from lm_head(hidden)
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def placed(head: torch.nn.Module) -> bool:
    """A head under an accelerate hook (device map) or with its weight on `meta`: only its own forward is safe."""
    return getattr(head, "_hf_hook", None) is not None or head.weight.device.type == "meta"


class HeadRows:
    """Logits from last hidden states with the model's own (unmodified) LM head weights."""

    def __init__(self, model) -> None:
        head = model.get_output_embeddings()
        self.supported = type(head) is torch.nn.Linear and not placed(head) and not any(
            getattr(model.config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS)
        self.weight = head.weight if self.supported else None
        self.bias = head.bias if self.supported else None
        # On CPU a contiguous [H, V] copy makes one row a fast vector-matrix product (see the module doc);
        # kept only for heads up to MAX_TRANSPOSED_BYTES, the memory it costs.
        w = self.weight
        small = w is not None and w.numel() * w.element_size() <= MAX_TRANSPOSED_BYTES
        self.weight_t = w.detach().t().contiguous() if small and w.device.type == "cpu" else None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[K, H]` hidden -> `[K, V]` float32 logits."""
        if hidden.shape[0] == 1 and self.weight_t is not None:
            out = torch.mm(hidden, self.weight_t)
            if self.bias is not None:
                out = out + self.bias
        else:
            out = F.linear(hidden, self.weight, self.bias)
        return out.float()


class LazyLogits:
    """`[N, V]` logits of a tree forward, computed row by row on first access (`logits[i]` -> `[V]`)."""

    def __init__(self, hidden: torch.Tensor, head: HeadRows) -> None:
        self.hidden, self.head = hidden, head  # hidden: [N, H]
        self.rows: dict[int, torch.Tensor] = {}
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
            self.rows[i] = self.head.logits(self.hidden[i: i + 1])[0]
            self.seconds += clock(self.hidden.device) - t0
        return self.rows[i]
