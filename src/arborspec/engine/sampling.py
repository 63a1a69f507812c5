"""Sampling transforms (temperature, top-k, top-p), identical on the draft and target sides.

Semantics follow Hugging Face `generate`: temperature scales the logits, then
top-k keeps the k largest, then top-p keeps the smallest set of tokens whose
probability mass reaches `top_p` (always at least one token). Temperature 0
means greedy: the target distribution is one-hot at the argmax.

At target temperature 0 the draft side still needs a real distribution to
build a tree from (a one-hot draft can only ever propose a chain), so
`draft_side()` uses `draft_temperature` there (default `GREEDY_DRAFT_TEMPERATURE`,
0: ordered draws, docs/algorithms.md §7); greedy verification is lossless for
any tree, so this choice changes speed only, never the output. Above
temperature 0 the draft side uses the target's own transform.

`draft_temperature = 0` asks for *ordered draws* at target temperature 0: the
builders that draw children without replacement (chain, Sequoia, DySpec) take
each node's most likely draft tokens in order instead of sampling them, and
value them with the draft distribution at `ORDERED_VALUE_TEMPERATURE` (0.8: the
draft head is under-confident, and slightly sharpened values grow deeper trees
where it is confident; docs/algorithms.md §7). Greedy verification
makes this lossless too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..errors import ArborError

# draft side at target temperature 0: ordered draws (docs/algorithms.md §7)
GREEDY_DRAFT_TEMPERATURE = 0.0
# the temperature ordered draws are valued at (module docstring; docs/algorithms.md §7)
ORDERED_VALUE_TEMPERATURE = 0.8


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    # draft side at temperature 0 (None: GREEDY_DRAFT_TEMPERATURE; 0: ordered draws)
    draft_temperature: float | None = None
    # set only by `draft_side()` for draft_temperature 0 (never a constructor argument: ordered
    # draws are lossless under greedy verification only): keyed draws take the top tokens in order
    ordered_draws: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.draft_temperature is not None and not self.draft_temperature >= 0:
            raise ArborError(
                f"draft temperature must be >= 0 (0 = the draft's most likely tokens in order), "
                f"got {self.draft_temperature}"
            )
        if not self.temperature >= 0:
            raise ArborError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ArborError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ArborError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def draft_side(self) -> SamplingConfig:
        """The transform applied to draft logits (see module docstring)."""
        if not self.greedy:
            return self
        temperature = (
            GREEDY_DRAFT_TEMPERATURE if self.draft_temperature is None else self.draft_temperature
        )
        # ordered draws, valued at `ORDERED_VALUE_TEMPERATURE` (module docstring)
        if temperature == 0:
            ordered = replace(self, temperature=ORDERED_VALUE_TEMPERATURE, draft_temperature=None)
            object.__setattr__(ordered, "ordered_draws", True)
            return ordered
        return replace(self, temperature=temperature, draft_temperature=None)


def sampling_config(
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    draft_temperature: float | None = None,
) -> SamplingConfig:
    """From `transformers.generate`-style arguments: `do_sample=False` is greedy whatever the
    temperature; temperature 0 is greedy too. `draft_temperature` is the draft
    side's at temperature 0."""
    if temperature is not None and temperature < 0:
        raise ArborError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not do_sample or temperature == 0:
        return SamplingConfig(0.0, top_k, top_p, draft_temperature)
    return SamplingConfig(temperature, top_k, top_p, draft_temperature)


def warp_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Apply temperature, top-k, top-p to `[..., V]` logits; removed tokens get -inf."""
    logits = logits.float()
    if not cfg.greedy and cfg.temperature != 1.0:
        logits = logits / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - cfg.top_p)
        remove_sorted[..., -1] = False  # keep at least the most likely token
        remove = remove_sorted.scatter(-1, idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """`[..., V]` logits -> probabilities under `cfg` (one-hot argmax when greedy)."""
    if cfg.greedy:
        out = torch.zeros_like(logits, dtype=torch.float32)
        return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return warp_logits(logits, cfg).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from a `[V]` distribution (need not sum to 1), by its inverse CDF: one uniform
    against the float64 cumulative sums; a token of probability 0 has an empty interval and is
    never drawn. (`torch.multinomial` draws one exponential per token for a single sample: 1.0 ms
    on a 49152-token vocabulary on 2 CPU threads, against 0.08 ms here;
    benchmarks/results/verify-probes.json.)"""
    cdf = probs.detach().reshape(-1).cumsum(0, dtype=torch.float64)
    total = cdf[-1]
    if not bool(total > 0):  # also NaN
        raise RuntimeError("invalid distribution to sample from (sum of probabilities <= 0)")
    u = torch.rand(1, generator=generator, dtype=torch.float64, device=generator_device(generator))
    index = torch.searchsorted(cdf, u.to(cdf.device) * total, right=True)
    return min(int(index), probs.numel() - 1)


def gumbel_like(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard Gumbel noise of the same shape, from `generator` (CPU noise, moved
    to probs' device)."""
    u = torch.rand(
        probs.shape, generator=generator, dtype=torch.float32, device=generator_device(generator)
    )
    return (-torch.log(-torch.log(u.clamp_(1e-20, 1.0 - 1e-7)))).to(probs.device)


def sample_without_replacement(
    probs: torch.Tensor, k: int, gumbel: torch.Tensor, support: torch.Tensor | None = None
) -> list[int]:
    """The first k draws of sampling without replacement from `probs` `[V]`.

    Sorting `log p + G` (G i.i.d. Gumbel) in descending order gives exactly the
    sequence "draw from p, zero it, renormalise, draw again ...". Only the
    support (tokens with p > 0) can be drawn, so `gumbel` holds either one draw
    per vocabulary entry (`[V]`) or one per support token, in vocabulary order
    (cheaper for a drafter with a reduced vocabulary; `support`, when the caller
    has it, saves finding it again). Stops early when fewer than k tokens have
    non-zero probability.
    """
    if support is None:
        support = probability_support(probs)
    k = min(k, support.numel())
    if k == 0:
        return []
    # the noise is drawn on the CPU (keyed generators, DraftContext.gumbel); the draft on any device
    noise = gumbel if gumbel.numel() == support.numel() else gumbel[support.to(gumbel.device)]
    keys = torch.log(probs[support]) + noise.to(probs.device)
    return support[torch.topk(keys, k).indices].tolist()


def probability_support(probs: torch.Tensor) -> torch.Tensor:
    """Indices of the tokens with probability > 0, in vocabulary order."""
    return torch.nonzero(probs > 0).squeeze(-1)


def generator_device(generator: torch.Generator | None) -> torch.device | str:
    """Where a generator's draws are made (CPU when there is none)."""
    return generator.device if generator is not None else "cpu"
