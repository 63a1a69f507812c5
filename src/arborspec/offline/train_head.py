"""Train a draft head (`drafters/head.py`) for any Hugging Face causal LM: `arborspec train-head`.

Four parts, each resumable from what it left on disk under `<out>.work/`:

1. **Data** (`head_data.py`): the target's own answers to a prompt pool that
   never contains benchmark data, with the target's features, in shards; with
   `self_instruct` > 0 also answers to user messages the target writes itself
   (`self_instruct.py`), in `<work>/data-self-instruct/`.
2. **Train.** The head reads (token x_r, target feature f_{r-1}) and predicts
   f_r. Loss per predicted row: smooth-L1 between f^_r and f_r (EAGLE's feature
   regression) + `ce_weight` x cross-entropy of the head's logits against the
   target's distribution softmax(LM-head(f_r)), both over the draft vocabulary.
   *Training-time test* (`ttt_steps` > 1, EAGLE-3's idea): pass k feeds the
   head its own pass-(k-1) predictions, attending to the true rows of pass 1
   and to its own earlier predicted rows exactly as a depth-(k-1) tree node
   does at inference, so deeper draft nodes are trained on what they will see.
   AdamW, warm-up + cosine schedule (`training.py`); checkpoints every
   `ckpt_every` steps and on Ctrl-C (which then stops without exporting:
   `Interrupted`); `--resume` continues with the batches an uninterrupted run
   would have seen.
3. **Evaluate** after each epoch on held-out sequences of the same pool and
   report top-1 agreement with the target's greedy token per tree depth
   (depth 1 = chain acceptance at temperature 0).
4. **Export** the best checkpoint: `head.safetensors` + `head.json`.

The draft vocabulary (FR-Spec) is the `draft_vocab` most frequent answer tokens of the
training split; 0 keeps the full vocabulary.
"""

from __future__ import annotations

import random
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..common.interrupts import DeferredInterrupt
from ..common.jsonfiles import write_json_atomic
from ..common.progress import progress_bar
from ..common.timing import clock
from ..drafters.head import DraftHead
from . import batching
from .head_data import (
    HeadDataConfig,
    HeadSequence,
    generate_head_data,
    load_head_data,
    token_frequencies,
)
from .shards import shard_paths
from .training import (
    TrainingRun,
    WarmupCosine,
    has_checkpoint,
    held_out_split,
    interrupt_keeps_work,
    interrupted_at_checkpoint,
    optimizer_step,
    work_dir_for,
)


@dataclass(kw_only=True)
class HeadTrainConfig:
    target: str = "embedded"
    out: str = "runs/head/model"
    work_dir: str = ""  # default: <out>.work
    data: HeadDataConfig = field(default_factory=HeadDataConfig)
    skip_data: bool = False  # train on the shards already on disk
    self_instruct: int = 0  # also this many conversations whose prompts the target writes (0: none)
    draft_vocab: int = 8192  # FR-Spec: K most frequent answer tokens (0: full vocabulary)
    epochs: float = 2.0
    lr: float = 2e-3
    warmup_steps: int = 50
    weight_decay: float = 0.0
    batch_tokens: int = 384  # padded tokens per step (small steps learn faster here)
    max_len: int = 640  # truncate sequences to this many tokens
    ttt_steps: int = 2  # passes of training-time test (1 = plain EAGLE-1 training)
    ce_weight: float = 0.1
    grad_clip: float = 0.5
    val_fraction: float = 0.05
    ckpt_every: int = 200
    time_budget_s: float = 0.0  # stop training after this long (then export); 0: no limit
    resume: bool = False
    init_from: str = ""  # start from this exported head's weights (fresh optimiser and schedule)
    seed: int = 0
    device: str = "cpu"

    @property
    def work_path(self) -> Path:
        return work_dir_for(self.out, self.work_dir)


# --------------------------------------------------------------------------- batching


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, L] token x_r
    prev: torch.Tensor  # [B, L, H] f_{r-1} (row 0 and padding: zeros)
    target: torch.Tensor  # [B, L, H] f_r (zeros where unknown)
    valid: torch.Tensor  # [B, L] bool: f_r known and r is a drafting row (answer region)
    pad: torch.Tensor  # [B, L] bool: real token


def make_batch(seqs: list[HeadSequence], max_len: int) -> Batch:
    seqs = [HeadSequence(s.tokens[:max_len], s.feats[: max_len - 1], s.prompt_len) for s in seqs]
    b, length, hidden = len(seqs), max(len(s.tokens) for s in seqs), seqs[0].feats.shape[-1]
    tokens = torch.zeros(b, length, dtype=torch.long)
    prev = torch.zeros(b, length, hidden)
    target = torch.zeros(b, length, hidden)
    valid = torch.zeros(b, length, dtype=torch.bool)
    pad = torch.zeros(b, length, dtype=torch.bool)
    for i, s in enumerate(seqs):
        n = len(s.tokens)
        tokens[i, :n] = s.tokens
        f = s.feats.float()  # f_0 .. f_{n-2}
        prev[i, 1:n] = f
        target[i, : n - 1] = f
        # from the root row predicting the first answer token
        valid[i, max(s.prompt_len - 1, 0) : n - 1] = True
        pad[i, :n] = True
    return Batch(tokens, prev, target, valid, pad)


def token_batches(
    seqs: list[HeadSequence], batch_tokens: int, max_len: int, rng: random.Random
) -> list[list[int]]:
    """Indices grouped by similar length, each batch about `batch_tokens` padded tokens."""
    return batching.token_batches([min(len(s.tokens), max_len) for s in seqs], batch_tokens, rng)


def ttt_mask(pad: torch.Tensor, step: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [B, 1, L, step*L] for pass `step` (1-based) over the keys of passes 1..step.

    Pass k row r is a depth-(k-1) tree node whose root is row r-k+1: it sees the
    true rows 0..r-k+1 of pass 1, row r-k+m of each pass m in 2..k-1, and itself.
    """
    b, length = pad.shape
    r = torch.arange(length)
    blocks = [(r[None, :] <= (r[:, None] - step + 1))]  # pass 1
    for m in range(2, step + 1):
        blocks.append(r[None, :] == (r[:, None] - step + m))
    allowed = torch.cat(blocks, dim=1)[None].expand(b, -1, -1) & pad.repeat(1, step)[:, None, :]
    # a row always sees itself
    allowed = (
        allowed
        | torch.cat(
            [
                torch.zeros(length, (step - 1) * length, dtype=torch.bool),
                torch.eye(length, dtype=torch.bool),
            ],
            dim=1,
        )[None]
    )
    mask = torch.zeros(allowed.shape, dtype=dtype)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def head_losses(
    head: DraftHead, batch: Batch, ttt_steps: int, ce_weight: float
) -> tuple[torch.Tensor, list[dict]]:
    """Total loss and per-pass statistics (top-1 agreement with the target's greedy
    token, over valid rows)."""
    from transformers import DynamicCache

    dev = head.vocab_ids.device
    tokens, prev, target = batch.tokens.to(dev), batch.prev.to(dev), batch.target.to(dev)
    b, length = tokens.shape
    pos = torch.arange(length, device=dev)[None].expand(b, -1)
    with torch.no_grad():
        t_logits = head.draft_logits(target)  # [B, L, K] target over the draft vocabulary
        t_prob = t_logits.softmax(-1)
        t_top = t_logits.argmax(-1)
    cache = DynamicCache(config=head.body.config)
    feats_in, total, stats = prev, 0.0, []
    for step in range(1, ttt_steps + 1):
        mask = ttt_mask(batch.pad, step, prev.dtype).to(dev)
        pred = head(tokens, feats_in, position_ids=pos, attention_mask=mask, past_key_values=cache)
        valid = batch.valid.clone()
        valid[:, : step - 1] = False
        # the pass-k root (row r-k+1) must itself be a drafting row: only rows whose root is in the
        # answer count
        if step > 1:
            valid[:, step - 1 :] &= batch.valid[:, : length - step + 1]
        valid = valid.to(dev)
        if valid.any():
            p, t = pred[valid], target[valid]
            vloss = F.smooth_l1_loss(p, t)
            logp = head.draft_logits(p).log_softmax(-1)
            ploss = -(t_prob[valid] * logp).sum(-1).mean()
            total = total + (0.8 ** (step - 1)) * (vloss + ce_weight * ploss)
            hits = (logp.argmax(-1) == t_top[valid]).float()
            stats.append(
                {
                    "depth": step,
                    "vloss": float(vloss.detach()),
                    "ploss": float(ploss.detach()),
                    "top1": float(hits.mean()),
                    "n": int(valid.sum()),
                }
            )
        feats_in = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1].detach()], dim=1)
    return total, stats


# --------------------------------------------------------------------------- training


def split(
    seqs: list[HeadSequence], val_fraction: float, seed: int
) -> tuple[list[HeadSequence], list[HeadSequence]]:
    """(training, held-out) sequences: a `val_fraction` share (at least one) held out, seeded."""
    n_val = max(1, int(len(seqs) * val_fraction)) if len(seqs) > 1 else 0
    return held_out_split(seqs, n_val, random.Random(seed + 99))


@torch.no_grad()
def evaluate(head: DraftHead, seqs: list[HeadSequence], cfg: HeadTrainConfig) -> dict:
    """Top-1 agreement per depth on `seqs` (teacher forcing; depth 1 = chain acceptance at T=0)."""
    head.eval()
    hits: dict[int, list[float]] = {}
    losses = []
    for idx in token_batches(seqs, cfg.batch_tokens, cfg.max_len, random.Random(0)):
        loss, stats = head_losses(
            head, make_batch([seqs[i] for i in idx], cfg.max_len), cfg.ttt_steps, cfg.ce_weight
        )
        losses.append(float(loss))
        for s in stats:
            acc = hits.setdefault(s["depth"], [0.0, 0.0])
            acc[0] += s["top1"] * s["n"]
            acc[1] += s["n"]
    head.train()
    out = {f"top1_depth{d}": round(h / max(n, 1), 4) for d, (h, n) in sorted(hits.items())}
    out["loss"] = round(sum(losses) / max(len(losses), 1), 4)
    return out


def _new_head(cfg: HeadTrainConfig, target_model, freq: torch.Tensor, resuming: bool) -> DraftHead:
    """A head initialised from the target, over the `cfg.draft_vocab` most frequent answer tokens;
    with `init_from` (and no checkpoint to resume) starting from that exported head's weights."""
    vocab_ids = None
    if cfg.draft_vocab:
        vocab_ids = torch.sort(torch.argsort(freq, descending=True)[: cfg.draft_vocab]).values
    head = DraftHead(target_model, vocab_ids=vocab_ids)
    head.init_from_target(target_model)
    if cfg.init_from and not resuming:
        from ..drafters.head import load_head

        # refuses a head of another target
        state = load_head(cfg.init_from, target_model).state_dict()
        state["vocab_ids"] = head.vocab_ids  # the draft vocabulary follows this run's data
        head.load_state_dict(state)
        head.refresh_lm_rows()
        print(f"arborspec: starting from the weights of {cfg.init_from}", file=sys.stderr)
    return head


def train(
    cfg: HeadTrainConfig, target_model, train_seqs, val_seqs, progress: bool = True
) -> tuple[DraftHead, dict]:
    """Train a head; returns it and the training record. Ctrl-C (first) ends the step in flight,
    checkpoints and returns with `interrupted` set; `resume` continues with the batches an
    uninterrupted run would have seen next."""
    torch.manual_seed(cfg.seed)
    freq = token_frequencies(train_seqs, target_model.get_output_embeddings().weight.shape[0])
    ckpt_dir = cfg.work_path / "checkpoint"
    head = _new_head(cfg, target_model, freq, resuming=cfg.resume and has_checkpoint(ckpt_dir))
    head.train()
    params = [p for n, p in head.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    rng = random.Random(cfg.seed)
    per_epoch = len(token_batches(train_seqs, cfg.batch_tokens, cfg.max_len, random.Random(0)))
    total = max(1, int(per_epoch * cfg.epochs))
    run = TrainingRun(head, opt, ckpt_dir, resume=cfg.resume, time_budget_s=cfg.time_budget_s)
    state = run.state
    if run.resumed:
        head.refresh_lm_rows()
        # replay the finished epochs' shuffles: the same batch order as the uninterrupted run
        for _ in range(state["step"] // per_epoch):
            token_batches(train_seqs, cfg.batch_tokens, cfg.max_len, rng)
    coverage = float(freq[head.vocab_ids].sum()) / max(1, float(freq.sum()))
    schedule = WarmupCosine(cfg.lr, cfg.warmup_steps)
    notice = (
        "arborspec: interrupt received: saving a checkpoint after this step (Ctrl-C again to abort)"
    )
    with DeferredInterrupt(notice) as interrupt, progress_bar(progress) as bar:
        task = bar.add_task("train head", total=total, completed=state["step"], info="")
        epoch_batches: list[list[int]] = []
        while state["step"] < total and not interrupt.requested:
            if not epoch_batches:
                epoch_batches = token_batches(train_seqs, cfg.batch_tokens, cfg.max_len, rng)
                # resuming: skip what this epoch already did
                epoch_batches = epoch_batches[state["step"] % per_epoch :]
            idx = epoch_batches.pop(0)
            lr = schedule.at(state["step"], total, run.time_fraction())
            batch = make_batch([train_seqs[i] for i in idx], cfg.max_len)
            loss, stats = head_losses(head, batch, cfg.ttt_steps, cfg.ce_weight)
            optimizer_step(opt, loss, params, lr, cfg.grad_clip)
            state["step"] += 1
            top = " ".join(f"d{s['depth']}={s['top1']:.2f}" for s in stats)
            shown = float(loss.detach() if torch.is_tensor(loss) else loss)
            bar.update(task, advance=1, info=f"loss {shown:.3f} top1 {top}")
            end_of_epoch = state["step"] % per_epoch == 0 or state["step"] == total
            out_of_time = run.out_of_time()
            if end_of_epoch or out_of_time:
                metrics = evaluate(head, val_seqs, cfg)
                metrics.update(
                    step=state["step"],
                    epoch=round(state["step"] / per_epoch, 3),
                    elapsed_s=round(run.elapsed(), 1),
                )
                print(f"arborspec: held-out {metrics}", file=sys.stderr)
                if run.record(metrics, metrics["top1_depth1"], higher_is_better=True):
                    head.save(cfg.work_path / "best", cfg.target, target_model)
            if state["step"] % cfg.ckpt_every == 0 or end_of_epoch:
                run.save()
            if out_of_time:
                print("arborspec: training time budget reached", file=sys.stderr)
                break
    run.save()
    info = {
        "steps": state["step"],
        "total_steps": total,
        "history": state["history"],
        "best": state["best"],
        "train_seconds": round(state["elapsed_s"], 1),
        "draft_vocab_coverage": round(coverage, 4),
        "interrupted": interrupt.requested,
    }
    return head, info


def train_head(cfg: HeadTrainConfig, progress: bool = True) -> Path:
    """All four parts; returns the exported head directory. Ctrl-C raises `Interrupted` saying what
    is kept (whole data shards, the checkpoint of the last finished step); nothing is exported."""
    from ..models import load_model, load_tokenizer

    tokenizer = load_tokenizer(cfg.target)
    target = load_model(cfg.target, cfg.device, "float32")
    with interrupt_keeps_work(cfg.work_path):
        return _stages(cfg, target, tokenizer, progress)


def self_instruct_data(cfg: HeadTrainConfig) -> HeadDataConfig:
    """The data settings of the self-instructed part (same answers' settings, the
    target's own prompts)."""
    return replace(cfg.data, prompt_source="self-instruct", num_prompts=cfg.self_instruct)


def _stages(cfg: HeadTrainConfig, target, tokenizer, progress: bool) -> Path:
    data_dir, chat_dir = cfg.work_path / "data", cfg.work_path / "data-self-instruct"
    # the self-instructed part first; --data-time-budget-s is the time of both parts
    if not cfg.skip_data:
        t0, budget = clock(), cfg.data.time_budget_s
        if cfg.self_instruct:
            generate_head_data(
                self_instruct_data(cfg), target, tokenizer, chat_dir, progress=progress
            )
        left = budget - (clock() - t0)
        if not budget or left > 0:
            generate_head_data(
                replace(cfg.data, time_budget_s=left if budget else 0.0),
                target,
                tokenizer,
                data_dir,
                progress=progress,
            )
    chat = load_head_data(chat_dir) if shard_paths(chat_dir) else []
    # neither: its error says what to run
    pool = load_head_data(data_dir) if shard_paths(data_dir) or not chat else []
    seqs = pool + chat
    train_seqs, val_seqs = split(seqs, cfg.val_fraction, cfg.seed)
    target.requires_grad_(False)
    head, info = train(cfg, target, train_seqs, val_seqs, progress)
    if info["interrupted"]:
        raise interrupted_at_checkpoint(cfg.work_path / "checkpoint")
    best_dir = cfg.work_path / "best"
    if (best_dir / "head.safetensors").is_file():
        from ..drafters.head import load_head

        head = load_head(best_dir, target)
    n_answer = sum(len(s.tokens) - s.prompt_len for s in seqs)
    extra = {
        "training": {
            **info,
            "config": {k: v for k, v in asdict(cfg).items() if k != "data"},
            "data": {
                **cfg.data.settings(),
                "sequences": len(seqs),
                "answer_tokens": n_answer,
                "all_tokens": sum(len(s.tokens) for s in seqs),
                "self_instructed_sequences": len(chat),
            },
        }
    }
    out = head.save(cfg.out, cfg.target, target, extra=extra)
    write_json_atomic(extra["training"], Path(cfg.out) / "training.json", indent=2)
    return out
