"""Does the draft head agree less with the int8 target than with the float32 one it was trained on?

    .venv/bin/python benchmarks/head_target_agreement.py --num-prompts 8 --out benchmarks/head-target-agreement.json

For the first MT-Bench turns, each target (float32, int8: docs/algorithms.md §8) writes its greedy answer; on each
answer, the head's teacher-forced top-1 agreement per depth (`offline/train_head.head_losses`, as `head_quality`
measures it) is taken with the features and greedy tokens of either target. The head runs in float32 (its training
precision) so that only the target side differs.
"""

from __future__ import annotations

import argparse

import torch

from arborspec.common.chat import encode_prompt
from arborspec.common.jsonfiles import report_json
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.drafters.head import load_head
from arborspec.models import load_model, load_tokenizer, resolve_head_dir
from arborspec.offline.draft_quality import mtbench_first_turns
from arborspec.offline.head_data import HeadSequence
from arborspec.offline.train_head import head_losses, make_batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head", default="embedded-head")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--depths", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/head-target-agreement.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tok = load_tokenizer("embedded")
    targets = {name: load_model("embedded", "cpu", name).requires_grad_(False) for name in ("float32", "int8")}
    head = load_head(resolve_head_dir(args.head), targets["float32"])
    hits: dict[str, list[float]] = {}
    with torch.inference_mode():
        for prompt in mtbench_first_turns()[: args.num_prompts]:
            ids = torch.tensor(encode_prompt(tok, prompt, True))
            for writer, model in targets.items():
                seq = model.generate(ids[None], max_new_tokens=args.max_new_tokens, do_sample=False)[0]
                for reader, other in targets.items():
                    feats = other.get_decoder()(input_ids=seq[None]).last_hidden_state[0, :-1]
                    _, stats = head_losses(head, make_batch([HeadSequence(seq, feats.half(), len(ids))], 10_000),
                                           args.depths, 0.1)
                    for s in stats:
                        acc = hits.setdefault(f"answers {writer}, features and labels {reader}, depth {s['depth']}", [0.0, 0])
                        acc[0] += s["top1"] * s["n"]
                        acc[1] += s["n"]
    top1 = {key: round(h / n, 4) for key, (h, n) in sorted(hits.items())}
    for key, value in top1.items():
        print(f"{key}: {value}")
    report_json({"created": utc_timestamp(), "args": vars(args), "versions": versions(), "machine": machine_info(),
                 "top1": top1, "positions": {key: n for key, (_, n) in sorted(hits.items())}}, args.out)


if __name__ == "__main__":
    main()
