"""The generation's long-run rate: tokens committed per unit of modelled step cost, over its steps so far.

`budget=auto` (builders/auto_size.py) can size each tree for this step alone, maximising the step's own
rate `E[A](n) / cost(n)`, or for the whole generation. The generation's throughput is total tokens over
total time, `sum A / sum cost`; by the renewal-reward argument (Dinkelbach's lemma) the sizes that maximise
it are those that maximise, at every step, `E[A](n) - lam x cost(n)` with `lam` the best throughput itself.
A step whose draft is confident then grows its tree until a node is worth less than `lam` times its price,
further than its own rate would allow; a step whose draft is unsure stops sooner, down to the root alone
(a plain step). `LongRunRate` estimates `lam` as the generation's committed tokens over the modelled costs
(`engine/cost.CostCurve.step_cost`) of its steps so far, so both sides of the rule are in the same units
(docs/algorithms.md §7). Like the acceptance model, a decoder hands it to its next generation at the same
sampling settings (scaled down to `CARRY_STEPS` steps, `carried`). It never changes the output distribution:
it only chooses how many of the builder's nodes are verified.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_STEPS = 2  # steps seen before the rate is used; before that a step is sized by its own rate
CARRY_STEPS = 8  # steps' worth a decoder's next generation inherits at most (`LongRunRate.carried`)


@dataclass
class LongRunRate:
    tokens: float = 0.0  # committed tokens so far (bonus included)
    cost: float = 0.0    # modelled step costs so far, in units of one plain target forward
    steps: int = 0

    def observe(self, accepted: int, step_cost: float) -> None:
        """One finished step: the tokens it committed and its modelled cost."""
        self.tokens += accepted
        self.cost += step_cost
        self.steps += 1

    def carried(self, cap: int = CARRY_STEPS) -> "LongRunRate":
        """A new tracker with this one's rate, from totals scaled down to at most `cap` steps' worth."""
        scale = min(1.0, cap / self.steps) if self.steps else 1.0
        return LongRunRate(self.tokens * scale, self.cost * scale, min(self.steps, cap))

    @property
    def rate(self) -> float | None:
        """Tokens per unit of modelled cost so far; None until `MIN_STEPS` steps were seen."""
        if self.steps < MIN_STEPS or self.cost <= 0:
            return None
        return self.tokens / self.cost
