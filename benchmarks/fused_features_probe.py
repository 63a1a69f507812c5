"""Does the draft head gain from EAGLE-3's fused features here? A same-data, same-steps A/B of two fresh heads.

Issue 8 leaves EAGLE-3's variant (the head reads features fused from a low, a middle and the top layer of the
target instead of the top layer alone) as an option to adopt only if it measures better on this target. This
probe answers that on held-back head data, without touching the shipped head:

* data: the sequences of a head-data directory (`arborspec train-head` shards: token ids + prompt lengths), with
  the target's features recomputed by one teacher-forced float32 pass: the top feature (after the final norm,
  what the shipped head reads) and the outputs of three decoder layers (low, middle, high; each RMS-normalised
  without weights, since raw residual streams carry a few huge channels);
* arm `top`: today's head (`drafters/head.DraftHead`, started from the target's last layer, or fine-tuned from an
  exported head with `--init-from`: then use data that head never saw);
* arm `fused`: the same head behind a learned `fuse` linear over [low; middle; high; top], initialised to pass the
  top feature through and ignore the rest, so both arms start as the same function and see the same batches;
* both train for the same number of steps with the loss of `offline/train_head.head_losses` (one pass, i.e.
  depth 1), then report held-out top-1 agreement with the target's greedy token at depth 1 (chain acceptance at
  T = 0) on the same held-back sequences.

    .venv/bin/python benchmarks/fused_features_probe.py --data runs/head9/data-self-instruct --sequences 400 \
        --init-from src/arborspec/assets/smollm2-head --lr 5e-4 --steps 900 --threads 1 \
        --out benchmarks/fused-features-probe.json

Quality only (no timing); it may share the machine with other jobs.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from arborspec.drafters.head import DraftHead, load_head
from arborspec.models import load_model
from arborspec.offline.head_data import HeadSequence, load_head_data, token_frequencies
from arborspec.offline.train_head import Batch, head_losses, split, token_batches
from arborspec.offline.train_head import make_batch as train_batch


class FusedHead(DraftHead):
    """`DraftHead` whose feature input is `fuse([f_low; f_mid; f_high; f_top])` (last slot: the top feature)."""

    def __init__(self, target_model, vocab_ids, n_slots: int) -> None:
        super().__init__(target_model, vocab_ids=vocab_ids)
        h = self.hidden_size
        self.fuse = nn.Linear(n_slots * h, h, bias=False)
        with torch.no_grad():  # start as the top-only head
            self.fuse.weight.zero_()
            self.fuse.weight[:, (n_slots - 1) * h:] = torch.eye(h)

    def inputs(self, tokens, feats):
        return super().inputs(tokens, self.fuse(feats))


@torch.no_grad()
def teacher_forced_features(model, seqs, layers: list[int]) -> list[torch.Tensor]:
    """Per sequence [n - 1, (len(layers) + 1) * H] float16: normalised layer outputs, then the top feature."""
    decoder = model.get_decoder()
    grabbed: dict[int, torch.Tensor] = {}
    hooks = [decoder.layers[i].register_forward_hook(
        lambda mod, args, out, i=i: grabbed.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i in layers]
    feats = []
    try:
        for k, s in enumerate(seqs):
            top = decoder(input_ids=s.tokens[None, :-1]).last_hidden_state[0]
            parts = [F.rms_norm(grabbed[i][0], (top.shape[-1],)) for i in layers] + [top]
            feats.append(torch.cat(parts, dim=-1).half())
            if k % 50 == 0:
                print(f"features {k}/{len(seqs)}", flush=True)
    finally:
        for h in hooks:
            h.remove()
    return feats


def make_batch(seqs, feats, idx, max_len: int, hidden: int, fused: bool) -> Batch:
    """`train_head.make_batch` over the recomputed features: `prev` keeps every slot for the fused arm and the top
    feature only for the other; the target is always the top feature."""
    batch = train_batch([HeadSequence(seqs[i].tokens, feats[i], seqs[i].prompt_len) for i in idx], max_len)
    return replace(batch, prev=batch.prev if fused else batch.prev[..., -hidden:], target=batch.target[..., -hidden:])


def run_arm(name, head, seqs, feats, train_idx, val_idx, args, hidden) -> dict:
    fused = name == "fused"
    torch.manual_seed(args.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95))
    rng = random.Random(args.seed)
    train_seqs = [seqs[i] for i in train_idx]
    batches: list[list[int]] = []
    t0, history = time.time(), []
    head.train()
    for step in range(args.steps):
        if not batches:
            batches = [[train_idx[i] for i in b] for b in token_batches(train_seqs, args.batch_tokens, args.max_len, rng)]
        idx = batches.pop(0)
        for g in opt.param_groups:  # warm-up, then cosine to 5 %
            frac = step / args.steps
            g["lr"] = args.lr * min(1.0, (step + 1) / 50) * (0.05 + 0.95 * 0.5 * (1 + torch.cos(torch.tensor(frac * 3.14159265)).item()))
        loss, _ = head_losses(head, make_batch(seqs, feats, idx, args.max_len, hidden, fused), 1, args.ce_weight)
        opt.zero_grad(set_to_none=True)
        if torch.is_tensor(loss):
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
        if (step + 1) % max(1, args.steps // 4) == 0 or step + 1 == args.steps:
            history.append({"step": step + 1, **evaluate(head, seqs, feats, val_idx, args, hidden, fused),
                            "elapsed_s": round(time.time() - t0, 1)})
            print(name, history[-1], flush=True)
    return {"final": history[-1], "history": history}


@torch.no_grad()
def evaluate(head, seqs, feats, val_idx, args, hidden, fused) -> dict:
    head.eval()
    hits = n = 0
    for b in token_batches([seqs[i] for i in val_idx], args.batch_tokens, args.max_len, random.Random(0)):
        _, stats = head_losses(head, make_batch(seqs, feats, [val_idx[i] for i in b], args.max_len, hidden, fused),
                               1, args.ce_weight)
        for s in stats:
            hits += s["top1"] * s["n"]
            n += s["n"]
    head.train()
    return {"top1_depth1": round(hits / max(n, 1), 4), "rows": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a head-data directory (train-head's data-self-instruct/ or data/)")
    ap.add_argument("--sequences", type=int, default=400, help="sequences used (the first of a seeded shuffle)")
    ap.add_argument("--layers", default="2,14,26", help="0-based decoder layers fused beside the top feature")
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--ce-weight", type=float, default=1.0)
    ap.add_argument("--batch-tokens", type=int, default=384)
    ap.add_argument("--max-len", type=int, default=640)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--init-from", default="", help="fine-tune this exported head in both arms (default: fresh heads)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/fused-features-probe.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    layers = [int(x) for x in args.layers.split(",")]

    target = load_model("embedded", "cpu", "float32")
    target.requires_grad_(False)
    hidden = target.config.hidden_size
    seqs = load_head_data(Path(args.data))
    random.Random(args.seed).shuffle(seqs)
    seqs = seqs[: args.sequences]
    feats = teacher_forced_features(target, seqs, layers)
    train_seqs, val_seqs = split(seqs, 0.1, args.seed)
    pos = {id(s): i for i, s in enumerate(seqs)}
    train_idx, val_idx = [pos[id(s)] for s in train_seqs], [pos[id(s)] for s in val_seqs]
    start = None
    if args.init_from:  # both arms fine-tune this head (its draft vocabulary too)
        start = load_head(args.init_from, target).state_dict()
        vocab_ids = start["vocab_ids"]
    else:
        freq = token_frequencies(train_seqs, target.get_output_embeddings().weight.shape[0])
        vocab_ids = torch.sort(torch.argsort(freq, descending=True)[: args.draft_vocab]).values

    arms = {}
    for name in ("top", "fused"):
        torch.manual_seed(args.seed)
        head = DraftHead(target, vocab_ids=vocab_ids) if name == "top" else FusedHead(target, vocab_ids, len(layers) + 1)
        head.init_from_target(target)
        if start is not None:
            missing, unexpected = head.load_state_dict(start, strict=False)
            assert not unexpected and set(missing) <= {"fuse.weight"}, (missing, unexpected)
            head.refresh_lm_rows()
        head.requires_grad_(True)
        arms[name] = run_arm(name, head, seqs, feats, train_idx, val_idx, args, hidden)
    result = {"probe": "fused features (EAGLE-3) vs top feature, fresh heads, same data and steps",
              "args": vars(args), "train_sequences": len(train_idx), "val_sequences": len(val_idx),
              "train_answer_tokens": sum(len(seqs[i].tokens) - seqs[i].prompt_len for i in train_idx),
              "arms": arms}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v["final"] for k, v in arms.items()}))


if __name__ == "__main__":
    main()
