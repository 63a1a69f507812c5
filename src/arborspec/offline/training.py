"""What the training tools share: `distill.py` trains a draft model, `train_head.py` a draft head.

* `WarmupCosine`: the learning rate, a linear warm-up, then a cosine decay to a floor over the
  planned steps or the time budget, whichever runs out first, so that a run stopped by its
  budget ends annealed.
* `optimizer_step`: one optimizer step at a given learning rate, with gradient clipping.
* `TrainingRun`: what makes a run resumable. Its state (the step, the training time, the
  held-out history, the best evaluation, and what the tool adds) is saved with the weights and
  the optimizer state in one checkpoint file, `<dir>/ckpt.pt`, written atomically. A run started
  with `resume` goes on from the checkpoint's weights, optimizer moments and step, so with the
  tool's seeded batch order it continues exactly as the uninterrupted run would have. The time
  budget counts the training time of every run of the same checkpoint.
* `held_out_split`: the seeded split into training and held-out items.
* `work_dir_for`, `interrupt_keeps_work`, `interrupted_at_checkpoint`: where a tool keeps its
  work, and what it says when Ctrl-C stops it.

Each tool keeps its own loop (what a step computes, when it evaluates, what counts as best);
Ctrl-C is deferred to the end of a step by `common/interrupts.DeferredInterrupt`.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from ..common.atomic import write_atomic
from ..common.timing import clock
from ..errors import ArborError, Interrupted

CHECKPOINT_FILE = "ckpt.pt"
T = TypeVar("T")


def work_dir_for(out: str | Path, work_dir: str | Path = "") -> Path:
    """A tool's work folder (data shards, checkpoints): `work_dir`, else `<out>.work`."""
    return Path(work_dir) if work_dir else Path(str(out).rstrip("/") + ".work")


# --------------------------------------------------------------------------- schedule and step


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warm-up over `warmup_steps`, then cosine decay from `lr` to `min_ratio * lr`."""

    lr: float
    warmup_steps: int
    min_ratio: float = 0.05

    def at(self, step: int, total: int, time_fraction: float = 0.0) -> float:
        """The rate of step `step` (0-based) of `total`. The decay follows whichever is further
        along: the steps after the warm-up, or `time_fraction` (the share of the budget used)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        frac = (step - self.warmup_steps) / max(1, total - self.warmup_steps)
        frac = min(1.0, max(frac, time_fraction))
        decay = (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * frac))
        return self.lr * (self.min_ratio + decay)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    loss,
    params: Iterable[torch.Tensor],
    lr: float,
    grad_clip: float,
) -> None:
    """Set every group's rate to `lr`, back-propagate `loss`, clip the gradients' norm at
    `grad_clip` (0: no clipping) and step. A `loss` that is not a tensor (no row of the batch
    counted) steps nothing."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    if not torch.is_tensor(loss):
        return
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()


def held_out_split(items: list[T], n_held_out: int, rng: random.Random) -> tuple[list[T], list[T]]:
    """(training items, held-out items): the first `n_held_out` of a shuffle by `rng` held out."""
    order = list(range(len(items)))
    rng.shuffle(order)
    return [items[i] for i in order[n_held_out:]], [items[i] for i in order[:n_held_out]]


# --------------------------------------------------------------------------- checkpoints


def has_checkpoint(ckpt_dir: Path) -> bool:
    return (Path(ckpt_dir) / CHECKPOINT_FILE).is_file()


def save_checkpoint(
    ckpt_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict
) -> None:
    """Weights, optimizer state and the run's `state` in `<ckpt_dir>/ckpt.pt`, atomically."""
    blob = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "state": state}
    write_atomic(Path(ckpt_dir) / CHECKPOINT_FILE, lambda tmp: torch.save(blob, tmp))


def load_checkpoint(
    ckpt_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict:
    """Load a checkpoint's weights and optimizer state into `model` and `optimizer`; return its
    state."""
    path = Path(ckpt_dir) / CHECKPOINT_FILE
    blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict) or not {"model", "optimizer", "state"} <= blob.keys():
        raise ArborError(f"{path} is not a checkpoint of this version: start without --resume")
    model.load_state_dict(blob["model"])
    optimizer.load_state_dict(blob["optimizer"])
    return blob["state"]


class TrainingRun:
    """The resumable side of one training run: `state`, the checkpoint in `ckpt_dir`, the budget.

    `state` always holds "step", "elapsed_s" (training seconds over every run of this
    checkpoint), "history" (held-out evaluations), "best" (the best of them) and "best_score"
    (what it was judged by), plus the tool's own `extra` entries. With `resume` and a checkpoint
    on disk, the weights, the optimizer and `state` come from it (`resumed` is then True).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        ckpt_dir: Path,
        *,
        resume: bool,
        time_budget_s: float = 0.0,
        extra: dict | None = None,
        label: str = "arborspec",
    ) -> None:
        self.model, self.optimizer, self.ckpt_dir = model, optimizer, Path(ckpt_dir)
        self.time_budget_s = time_budget_s
        self.state = {
            "step": 0,
            "elapsed_s": 0.0,
            "history": [],
            "best": None,
            "best_score": None,
            **(extra or {}),
        }
        self.resumed = resume and has_checkpoint(self.ckpt_dir)
        if self.resumed:
            self.state = load_checkpoint(self.ckpt_dir, model, optimizer)
            print(
                f"{label}: resuming from {self.ckpt_dir} at step {self.state['step']}",
                file=sys.stderr,
            )
        elif has_checkpoint(self.ckpt_dir):
            print(
                f"{label}: {self.ckpt_dir} exists; starting over (use --resume to continue it)",
                file=sys.stderr,
            )
        self._start = clock() - self.state["elapsed_s"]

    def elapsed(self) -> float:
        """Training seconds so far, earlier runs of this checkpoint included."""
        return clock() - self._start

    def time_fraction(self) -> float:
        """The share of the time budget used (0 without a budget)."""
        return self.elapsed() / self.time_budget_s if self.time_budget_s else 0.0

    def out_of_time(self) -> bool:
        return bool(self.time_budget_s) and self.elapsed() > self.time_budget_s

    def record(self, evaluation: dict, score: float, higher_is_better: bool) -> bool:
        """Append `evaluation` to the history; True when its `score` is the best so far (ties
        count), and it becomes `state["best"]`."""
        state = self.state
        state["history"].append(evaluation)
        best = state["best_score"]
        if best is not None and (score < best if higher_is_better else score > best):
            return False
        state["best"], state["best_score"] = evaluation, score
        return True

    def save(self) -> None:
        """Checkpoint the weights, the optimizer and `state` (its training time brought up to
        date)."""
        self.state["elapsed_s"] = self.elapsed()
        save_checkpoint(self.ckpt_dir, self.model, self.optimizer, self.state)


# --------------------------------------------------------------------------- Ctrl-C


def interrupted_at_checkpoint(ckpt_dir: Path) -> Interrupted:
    """The error raised after Ctrl-C made a train loop checkpoint and stop."""
    return Interrupted(
        f"interrupted; checkpoint kept in {ckpt_dir}; rerun with --resume to continue"
    )


@contextmanager
def interrupt_keeps_work(work_dir: Path) -> Iterator[None]:
    """Ctrl-C outside a train loop (generating data, loading, exporting) becomes `Interrupted`
    saying where the work is kept: every file on disk is whole (atomic writes), so `--resume`
    continues."""
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted; data shards and checkpoints kept in {work_dir}; "
            "rerun with --resume to continue"
        ) from None
