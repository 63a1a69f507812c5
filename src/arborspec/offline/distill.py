"""Distil a small draft model for a target causal LM (sequence-level + top-k soft-label KD).

`arborspec distill` runs `distill(cfg)`: three parts (`cfg.stages`), each resumable from what it
left on disk under `cfg.work_path`.

1. **Data.** The target answers the prompts of `corpus.distill_prompts` (built offline, never from
   the evaluation sets) through its chat template, in left-padded batches, greedy or sampled at
   `cfg.sample_temperature` by a seeded coin per batch (sequence-level KD). At every generated
   position the target's top-k log-probabilities (temperature 1) are kept as soft labels. Each
   batch is one shard (`shards.py`): an interrupt loses at most one batch, a rerun goes on after it.
2. **Train.** A small `LlamaForCausalLM` with the target's tokenizer and vocabulary, tied
   embeddings initialised from the target's embedding projected onto its top principal directions
   (PCA), trained with `hard_weight * CE(target tokens) + (1 - hard_weight) * CE(top-k soft labels)`
   (the soft term is the KL to the target's top-k distribution up to a constant), AdamW, warm-up +
   cosine decay (`training.py`). Every `cfg.ckpt_every` steps the draft is evaluated on held-out
   answers and checkpointed, the best evaluation's weights kept apart; Ctrl-C checkpoints after the
   step in flight and stops, `--resume` continues from the checkpoint.
3. **Export.** A standard HF directory (config.json, model.safetensors in `cfg.export_dtype`,
   tokenizer files, generation_config.json) of the best weights, which
   `AutoModelForCausalLM.from_pretrained` loads, plus `metrics.json`.

`load_draft` loads such a directory for a target, refusing one with another vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..common.atomic import save_tensors_atomic, write_atomic
from ..common.chat import eos_ids
from ..common.interrupts import DeferredInterrupt
from ..common.jsonfiles import write_json_atomic
from ..common.progress import progress_bar
from ..common.vocab import check_same_tokenizer, check_vocab_size
from ..errors import ArborError
from ..models import load_model, load_tokenizer, parse_dtype
from .batching import length_batches
from .corpus import distill_prompts
from .generation import (
    batch_is_sampled,
    batch_torch_seed,
    cut_at_eos,
    encode_prompts,
    left_padded,
    pad_token_id,
    sampling_kwargs,
)
from .shards import ShardLoop, claim_data_dir, shard_paths
from .training import (
    TrainingRun,
    WarmupCosine,
    held_out_split,
    interrupt_keeps_work,
    interrupted_at_checkpoint,
    optimizer_step,
    work_dir_for,
)

STAGES = ("data", "train", "export")
WEIGHTS_FILE = "model.safetensors"

# --------------------------------------------------------------------------- config


@dataclass(kw_only=True)
class DistillConfig:
    target: str = "embedded"  # model name or path (arborspec.models.resolve_model_path)
    out_dir: str = "runs/distill/draft"  # final HF directory of the draft
    work_dir: str = ""  # data shards + checkpoints; default: <out_dir>.work
    # draft architecture
    layers: int = 3
    hidden: int = 128
    intermediate: int = 512
    heads: int = 4
    kv_heads: int = 2
    max_position_embeddings: int = 2048
    pca_init: bool = True
    # data generation
    num_prompts: int = 2000
    max_new_tokens: int = 160
    gen_batch_size: int = 16
    topk: int = 32
    sample_fraction: float = 0.5  # share of generation batches that sample instead of greedy
    sample_temperature: float = 0.7
    max_prompt_tokens: int = 96
    data_time_budget_s: float = 0.0  # stop generating after this many seconds (0: no limit)
    # training
    train_steps: int = 0  # 0: derived from epochs
    epochs: float = 3.0
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 30
    weight_decay: float = 0.01
    batch_size: int = 8  # sequences per step
    seq_len: int = 288  # truncate prompt+response to this many tokens
    hard_weight: float = 0.3
    grad_clip: float = 1.0
    ckpt_every: int = 50
    train_time_budget_s: float = 0.0  # stop training (then export) after this long (0: no limit)
    resume: bool = False
    # runtime
    seed: int = 0
    threads: int = 1
    device: str = "cpu"
    dtype: str = "float32"  # training / generation dtype
    export_dtype: str = "float16"
    stages: str = "data,train,export"

    @property
    def work_path(self) -> Path:
        return work_dir_for(self.out_dir, self.work_dir)


# --------------------------------------------------------------------------- vocabulary checks


def _vocab_of(obj):
    """Return (vocab_size, tokenizer-or-None) from a tokenizer, a config, a model, or a path."""
    if isinstance(obj, (str, Path)):
        from transformers import AutoConfig, AutoTokenizer

        path = Path(obj)
        cfg = AutoConfig.from_pretrained(path)
        tok = None
        if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
            tok = AutoTokenizer.from_pretrained(path)
        return cfg.vocab_size, tok
    if hasattr(obj, "get_vocab") and hasattr(obj, "convert_tokens_to_ids"):
        return len(obj), obj
    cfg = getattr(obj, "config", obj)
    return getattr(cfg, "vocab_size", None), None


def check_vocab_match(target, draft, *, probe: str | None = None) -> None:
    """Raise ArborError unless `draft` shares `target`'s vocabulary.

    Each side may be a tokenizer, a config, a model or a HF directory. Checked
    (`common/vocab.py`): the vocabulary sizes and, when both tokenizers are at
    hand, identical token->id maps, special tokens and splitting of text.
    """
    t_size, t_tok = _vocab_of(target)
    d_size, d_tok = _vocab_of(draft)
    if t_tok is not None and d_tok is None and not hasattr(target, "config"):
        t_size = max(t_size, len(t_tok))
    # A tokenizer's len() may be below the (padded) embedding size; only compare like with like.
    tokenizer_vs_padded = (
        t_size is not None
        and d_size is not None
        and (
            (t_tok is not None and d_tok is None and d_size >= t_size)
            or (d_tok is not None and t_tok is None and t_size >= d_size)
        )
    )
    if not tokenizer_vs_padded:
        check_vocab_size(d_size, t_size)
    if t_tok is not None and d_tok is not None:
        check_same_tokenizer(t_tok, d_tok, probe=probe)


def load_draft(path: str | Path, target, dtype=torch.float32):
    """Load a draft HF directory; ArborError when its vocabulary differs from `target`'s."""
    from transformers import AutoModelForCausalLM

    check_vocab_match(target, str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.eval()
    return model


# --------------------------------------------------------------------------- data generation


def _prepare_data_dir(cfg: DistillConfig, prompts: list[str]) -> Path:
    """Create the data folder (refusing one made with other settings); record prompts, settings."""
    data_dir = cfg.work_path / "data"
    settings = {"gen_batch_size": cfg.gen_batch_size, "topk": cfg.topk, "seed": cfg.seed}
    source = (
        "stdlib docstrings (Write/Explain/Implement ...) + hand-written topics x templates; "
        "no MT-Bench/HumanEval"
    )
    record = {
        "num_prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "target": cfg.target,
        "source": source,
    }
    claim_data_dir(data_dir, settings, record, hint="use another --work-dir or the same options")
    lines = "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)
    write_atomic(data_dir / "prompts.jsonl", lambda tmp: tmp.write_text(lines))
    return data_dir


def _generate_shard(
    cfg: DistillConfig, model, tok, prompts: list[str], index: int
) -> tuple[dict, dict, int]:
    """Batch `index`: the target's answers (greedy or sampled, by a seeded coin) and their top-k
    log-probabilities. Returns the shard's (tensors, metadata) and its number of answer tokens."""
    pad_id, eos = pad_token_id(tok), set(eos_ids(tok, model))
    enc = encode_prompts(tok, prompts, cfg.max_prompt_tokens)
    input_ids, attn = left_padded(enc, pad_id)
    sample = batch_is_sampled(cfg.seed, index, cfg.sample_fraction)
    torch.manual_seed(batch_torch_seed(cfg.seed, index))
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=attn.to(model.device),
            max_new_tokens=cfg.max_new_tokens,
            pad_token_id=pad_id,
            return_dict_in_generate=True,
            output_logits=True,
            **sampling_kwargs(cfg.sample_temperature if sample else 0.0),
        )
    seqs = out.sequences[:, input_ids.shape[1] :].cpu()
    logits = torch.stack(out.logits, dim=1).float()  # (B, T, V) raw target logits
    prompt_flat, prompt_off, resp_flat, resp_off, tk_ids, tk_lp = [], [0], [], [0], [], []
    for i, ids in enumerate(enc):
        resp = cut_at_eos(seqs[i].tolist(), eos)
        lp = torch.log_softmax(logits[i, : len(resp)].cpu(), dim=-1)
        v, ix = lp.topk(cfg.topk, dim=-1)
        prompt_flat += ids
        prompt_off.append(len(prompt_flat))
        resp_flat += resp
        resp_off.append(len(resp_flat))
        tk_ids.append(ix.to(torch.int32))
        tk_lp.append(v.to(torch.float16))
    tensors = {
        "prompt_ids": torch.tensor(prompt_flat, dtype=torch.int32),
        "prompt_offsets": torch.tensor(prompt_off, dtype=torch.int64),
        "resp_ids": torch.tensor(resp_flat, dtype=torch.int32),
        "resp_offsets": torch.tensor(resp_off, dtype=torch.int64),
        "topk_ids": torch.cat(tk_ids),
        "topk_logprobs": torch.cat(tk_lp),
    }
    metadata = {
        "mode": "sample" if sample else "greedy",
        "temperature": str(cfg.sample_temperature if sample else 0.0),
    }
    return tensors, metadata, len(resp_flat)


def generate_data(cfg: DistillConfig, model, tok, progress: bool = True) -> Path:
    """Part 1: target responses + top-k soft labels, one safetensors shard per batch (resumable)."""
    prompts = distill_prompts(cfg.num_prompts, cfg.seed)
    data_dir = _prepare_data_dir(cfg, prompts)
    size = cfg.gen_batch_size
    loop = ShardLoop(
        data_dir,
        math.ceil(len(prompts) / size),
        label="generate",
        time_budget_s=cfg.data_time_budget_s,
        progress=progress,
    )
    for b in loop:
        batch = prompts[b * size : (b + 1) * size]
        tensors, metadata, tokens = _generate_shard(cfg, model, tok, batch, b)
        loop.save(b, tensors, metadata, tokens)
    return data_dir


def load_data(data_dir: Path) -> list[dict]:
    """Read all shards into a list of examples {ids, resp_start, topk_ids, topk_logprobs}."""
    from safetensors.torch import load_file

    examples = []
    for path in shard_paths(data_dir):
        d = load_file(str(path))
        po, ro = d["prompt_offsets"].tolist(), d["resp_offsets"].tolist()
        for i in range(len(po) - 1):
            p = d["prompt_ids"][po[i] : po[i + 1]].long()
            r = d["resp_ids"][ro[i] : ro[i + 1]].long()
            if len(r) == 0:
                continue
            examples.append(
                {
                    "ids": torch.cat([p, r]),
                    "resp_start": len(p),
                    "topk_ids": d["topk_ids"][ro[i] : ro[i + 1]].long(),
                    "topk_logprobs": d["topk_logprobs"][ro[i] : ro[i + 1]].float(),
                }
            )
    return examples


# --------------------------------------------------------------------------- draft model


def draft_config(cfg: DistillConfig, target_config):
    """A small Llama config with the target's vocabulary, special ids, RoPE base, norm epsilon."""
    from transformers import LlamaConfig

    if cfg.hidden % cfg.heads:
        raise ArborError(f"--hidden {cfg.hidden} is not divisible by --heads {cfg.heads}")
    if cfg.heads % cfg.kv_heads:
        raise ArborError(f"--heads {cfg.heads} is not divisible by --kv-heads {cfg.kv_heads}")
    rope = getattr(target_config, "rope_parameters", None) or {
        "rope_type": "default",
        "rope_theta": getattr(target_config, "rope_theta", 10000.0),
    }
    return LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-5),
        rope_parameters=dict(rope),
        tie_word_embeddings=True,
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=getattr(target_config, "pad_token_id", None),
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        use_cache=True,
    )


def pca_embedding(target_embedding: torch.Tensor, dim: int) -> torch.Tensor:
    """Project the target's (V, H) embedding onto its top-`dim` principal directions -> (V, dim)."""
    emb = target_embedding.detach().float()
    mean = emb.mean(0, keepdim=True)
    # right singular vectors of the centred matrix = principal directions
    _, _, vh = torch.linalg.svd(emb - mean, full_matrices=False)
    return emb @ vh[:dim].T


def scaled_pca_embedding(target_embedding: torch.Tensor, dim: int, std: float) -> torch.Tensor:
    """PCA projection rescaled to element std `std`: the tied LM head then starts near-uniform (loss
    ~ ln V) instead of with the target's large logits, while keeping the target's token geometry."""
    proj = pca_embedding(target_embedding, dim)
    return proj * (std / proj.std().clamp_min(1e-12))


def build_draft(cfg: DistillConfig, target) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(draft_config(cfg, target.config))
    if cfg.pca_init:
        emb = target.get_input_embeddings().weight
        if cfg.hidden <= emb.shape[1]:
            init = scaled_pca_embedding(emb, cfg.hidden, model.config.initializer_range)
            with torch.no_grad():
                model.get_input_embeddings().weight.copy_(init)
    model.tie_weights()
    return model


def _save_weights(model, path: Path, dtype: torch.dtype | None = None) -> None:
    """The draft's weights as safetensors, without the LM head (tied to the embedding)."""
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    if dtype is not None:
        weights = {k: v.to(dtype) for k, v in weights.items()}
    save_tensors_atomic(weights, path, metadata={"format": "pt"})


def _load_weights(model, path: Path) -> None:
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path)), strict=False)
    model.tie_weights()


# --------------------------------------------------------------------------- training


def _epoch_batches(train: list[dict], cfg: DistillConfig, epoch: int) -> list[list[int]]:
    """Epoch `epoch`'s batches: similar lengths together, in an order seeded by seed and epoch."""
    rng = random.Random(cfg.seed * 31 + epoch)
    return length_batches([len(e["ids"]) for e in train], cfg.batch_size, rng, random_ties=True)


def _collate(examples, idx, seq_len, pad_id):
    rows = [examples[i] for i in idx]
    width = min(seq_len, max(len(r["ids"]) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    pos_b, pos_t, hard, tk_ids, tk_lp = [], [], [], [], []
    for b, r in enumerate(rows):
        n = min(width, len(r["ids"]))
        ids[b, :n] = r["ids"][:n]
        mask[b, :n] = 1
        s = r["resp_start"]
        # response token j sits at position s + j and is predicted by the logits at s + j - 1
        m = max(0, min(len(r["topk_ids"]), n - s))
        if m == 0:
            continue
        pos_b.append(torch.full((m,), b, dtype=torch.long))
        pos_t.append(torch.arange(s - 1, s - 1 + m))
        hard.append(r["ids"][s : s + m])
        tk_ids.append(r["topk_ids"][:m])
        tk_lp.append(r["topk_logprobs"][:m])
    return (
        ids,
        mask,
        torch.cat(pos_b),
        torch.cat(pos_t),
        torch.cat(hard),
        torch.cat(tk_ids),
        torch.cat(tk_lp),
    )


def _loss(model, batch, hard_weight):
    ids, mask, pb, pt, hard, tk_ids, tk_lp = batch
    hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    logits = model.lm_head(hidden[pb, pt]).float()
    logp = torch.log_softmax(logits, dim=-1)
    ce_hard = -logp.gather(1, hard[:, None]).squeeze(1).mean()
    p = torch.softmax(tk_lp, dim=-1)  # target top-k, renormalised
    ce_soft = -(p * logp.gather(1, tk_ids)).sum(-1).mean()
    with torch.no_grad():
        agree = (logits.argmax(-1) == tk_ids[:, 0]).float().mean()
    loss = hard_weight * ce_hard + (1 - hard_weight) * ce_soft
    return loss, ce_hard.detach(), ce_soft.detach(), agree, len(hard)


@torch.no_grad()
def _evaluate(model, examples, cfg, pad_id):
    model.eval()
    tot = n = agree = hard_sum = 0.0
    for i in range(0, len(examples), cfg.batch_size):
        idx = list(range(i, min(len(examples), i + cfg.batch_size)))
        batch = _collate(examples, idx, cfg.seq_len, pad_id)
        loss, ce_hard, ce_soft, ag, cnt = _loss(model, batch, cfg.hard_weight)
        tot += loss.item() * cnt
        hard_sum += ce_hard.item() * cnt
        agree += ag.item() * cnt
        n += cnt
    model.train()
    return {
        "val_loss": tot / max(n, 1),
        "val_ce_hard": hard_sum / max(n, 1),
        "val_top1_agreement": agree / max(n, 1),
        "val_tokens": int(n),
    }


def _split_examples(examples: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
    """(train, validation): a seeded shuffle; up to 64 examples (1 in 20) are held out."""
    n_val = max(1, min(64, len(examples) // 20)) if len(examples) > 1 else 0
    train, val = held_out_split(examples, n_val, random.Random(seed))
    return train or val, val


def _optimizer(model, cfg: DistillConfig) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8)


class _Distillation:
    """The draft's training: its run (`training.TrainingRun`), evaluation and smoothed metrics."""

    def __init__(self, cfg: DistillConfig, model, val: list[dict], pad_id: int) -> None:
        self.cfg, self.model, self.val, self.pad_id = cfg, model, val, pad_id
        self.run = TrainingRun(
            model,
            _optimizer(model, cfg),
            cfg.work_path / "checkpoint",
            resume=cfg.resume,
            time_budget_s=cfg.train_time_budget_s,
            extra={"epoch": 0, "batch_in_epoch": 0, "tokens_seen": 0},
            label="distill",
        )
        if self.run.resumed:
            model.tie_weights()
        self.best_dir = cfg.work_path / "best"
        self.smoothed = {"loss": None, "hard": None, "agree": None}
        self.saved_at = -1

    def step(self, batch, lr: float) -> None:
        """One optimizer step at learning rate `lr`."""
        loss, ce_hard, _, agree, cnt = _loss(self.model, batch, self.cfg.hard_weight)
        params = list(self.model.parameters())
        optimizer_step(self.run.optimizer, loss, params, lr, self.cfg.grad_clip)
        state = self.run.state
        state["step"] += 1
        state["batch_in_epoch"] += 1
        state["tokens_seen"] += int(cnt)
        for k, v in (("loss", loss.item()), ("hard", ce_hard.item()), ("agree", agree.item())):
            self.smoothed[k] = v if self.smoothed[k] is None else 0.95 * self.smoothed[k] + 0.05 * v

    def checkpoint(self) -> dict:
        """Evaluate, record, checkpoint (keeping the best weights apart); returns the evaluation."""
        run, state = self.run, self.run.state
        seconds = run.elapsed()
        ev = _evaluate(self.model, self.val, self.cfg, self.pad_id)
        entry = {
            "step": state["step"],
            "train_seconds": round(seconds, 1),
            "tokens_seen": state["tokens_seen"],
            **{k: round(v, 4) if isinstance(v, float) else v for k, v in ev.items()},
        }
        best = run.record(entry, ev["val_loss"], higher_is_better=False)
        run.save()
        if best:
            _save_weights(self.model, self.best_dir / WEIGHTS_FILE)
            write_json_atomic(state, self.best_dir / "state.json", indent=2)
        write_json_atomic(state["history"], self.cfg.work_path / "train_history.json", indent=2)
        self.saved_at = state["step"]
        return ev

    def log(self, ev: dict, total: int) -> None:
        r, state = self.smoothed, self.run.state
        print(
            f"distill: step {state['step']}/{total} ep {state['epoch']} "
            f"train loss {r['loss']:.3f} top1 {r['agree']:.3f} | val loss {ev['val_loss']:.3f} "
            f"ce {ev['val_ce_hard']:.3f} top1 {ev['val_top1_agreement']:.3f} | "
            f"{self.run.elapsed():.0f}s",
            file=sys.stderr,
            flush=True,
        )


def _train_loop(
    job: _Distillation, train: list[dict], total: int, interrupt: DeferredInterrupt, progress: bool
) -> None:
    """Steps until `total`, the time budget or Ctrl-C; each epoch has its own seeded batch order,
    and the state's (epoch, batch in epoch) says where a resumed run goes on."""
    cfg, run, state = job.cfg, job.run, job.run.state
    schedule = WarmupCosine(cfg.lr, cfg.warmup_steps, cfg.min_lr_ratio)
    batches = _epoch_batches(train, cfg, state["epoch"])
    with progress_bar(progress) as bar:
        task = bar.add_task("train", total=total, completed=state["step"], info="")
        while state["step"] < total:
            if state["batch_in_epoch"] >= len(batches):
                state["epoch"] += 1
                state["batch_in_epoch"] = 0
                batches = _epoch_batches(train, cfg, state["epoch"])
            lr = schedule.at(state["step"], total, run.time_fraction())
            job.step(_collate(train, batches[state["batch_in_epoch"]], cfg.seq_len, job.pad_id), lr)
            r = job.smoothed
            bar.update(
                task,
                completed=state["step"],
                info=f"ep {state['epoch']} loss {r['loss']:.3f} ce {r['hard']:.3f} "
                f"top1 {r['agree']:.3f} lr {lr:.2e}",
            )
            if state["step"] % cfg.ckpt_every == 0 or state["step"] == total:
                job.log(job.checkpoint(), total)
            if interrupt.requested or run.out_of_time():
                if job.saved_at != state["step"]:
                    job.checkpoint()
                if interrupt.requested:
                    raise interrupted_at_checkpoint(run.ckpt_dir)
                print(
                    f"distill: train time budget reached at step {state['step']}/{total}",
                    file=sys.stderr,
                )
                break


def train_draft(cfg: DistillConfig, target, tok, progress: bool = True) -> dict:
    """Part 2: train the draft on the shards; returns the training metrics (also in
    work_dir/train_metrics.json)."""
    data_dir = cfg.work_path / "data"
    examples = load_data(data_dir)
    if not examples:
        raise ArborError(
            f"no training data in {data_dir}: run the data stage first (--stages data)"
        )
    train, val = _split_examples(examples, cfg.seed)
    train_tokens = sum(len(e["topk_ids"]) for e in train)
    per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = cfg.train_steps or max(1, int(round(cfg.epochs * per_epoch)))
    model = build_draft(cfg, target).to(cfg.device)
    model.train()
    job = _Distillation(cfg, model, val, pad_token_id(tok))
    with DeferredInterrupt(
        "distill: interrupt received: saving a checkpoint after this step (Ctrl-C again to abort)"
    ) as interrupt:
        _train_loop(job, train, total, interrupt, progress)
    state = job.run.state
    best = state["best"] or {}
    metrics = {
        "train_examples": len(train),
        "val_examples": len(val),
        "train_response_tokens": train_tokens,
        "steps": state["step"],
        "planned_steps": total,
        "epochs_done": round(state["tokens_seen"] / max(train_tokens, 1), 2),
        "tokens_seen": state["tokens_seen"],
        "train_seconds": round(job.run.elapsed(), 1),
        "best_step": best.get("step"),
        "best_val_loss": state["best_score"],
        "final": state["history"][-1] if state["history"] else None,
    }
    write_json_atomic(metrics, cfg.work_path / "train_metrics.json", indent=2)
    return metrics


# --------------------------------------------------------------------------- export


def export_draft(cfg: DistillConfig, target, tok, train_metrics: dict | None = None) -> Path:
    """Part 3: write a standard HF directory (fp16 by default) of the best evaluated weights."""
    from transformers import GenerationConfig

    best = cfg.work_path / "best"
    if not (best / WEIGHTS_FILE).is_file():
        raise ArborError(
            f"no trained draft in {cfg.work_path}: run the train stage first (--stages train)"
        )
    if train_metrics is None and (cfg.work_path / "train_metrics.json").is_file():
        train_metrics = json.loads((cfg.work_path / "train_metrics.json").read_text())
    model = build_draft(dataclasses.replace(cfg, pca_init=False), target)
    _load_weights(model, best / WEIGHTS_FILE)
    dtype = parse_dtype(cfg.export_dtype)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.config.dtype = dtype
    model.config.save_pretrained(out)
    _save_weights(model, out / WEIGHTS_FILE, dtype)
    GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
    ).save_pretrained(out)
    tok.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    state = json.loads((best / "state.json").read_text())
    architecture = {
        "layers": cfg.layers,
        "hidden": cfg.hidden,
        "intermediate": cfg.intermediate,
        "heads": cfg.heads,
        "kv_heads": cfg.kv_heads,
        "vocab_size": model.config.vocab_size,
        "tied_embeddings": True,
        "pca_init": cfg.pca_init,
    }
    metrics = {
        "target": cfg.target,
        "architecture": architecture,
        "parameters": n_params,
        "export_dtype": cfg.export_dtype,
        "dir_bytes": size,
        "checkpoint": best.name,
        "checkpoint_step": state.get("step"),
        "train": train_metrics,
        "history": state.get("history", []),
        "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("resume",)},
    }
    write_json_atomic(metrics, out / "metrics.json", indent=2)
    check_vocab_match(tok, str(out))
    return out


# --------------------------------------------------------------------------- driver


def distill(cfg: DistillConfig, progress: bool = True) -> Path:
    """Run the selected parts (`cfg.stages`, default all); return the exported draft directory."""
    torch.set_num_threads(max(1, cfg.threads))
    stages = {s.strip() for s in cfg.stages.split(",") if s.strip()}
    unknown = stages - set(STAGES)
    if unknown:
        raise ArborError(f"unknown stage(s) {sorted(unknown)}: use {', '.join(STAGES)}")
    cfg.work_path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(dataclasses.asdict(cfg), cfg.work_path / "config.json", indent=2)
    tok = load_tokenizer(cfg.target)
    target = load_model(cfg.target, device=cfg.device, dtype=cfg.dtype)
    with interrupt_keeps_work(cfg.work_path):
        if "data" in stages:
            generate_data(cfg, target, tok, progress=progress)
        result = None
        if "train" in stages:
            result = train_draft(cfg, target, tok, progress=progress)
        if "export" in stages:
            export_draft(cfg, target, tok, result)
    return Path(cfg.out_dir)
