"""What a draft of a given acceptance would give batched decoding on this machine
(docs/evaluation.md (l)).

    .venv/bin/python benchmarks/tools/oracle_drafts.py --out benchmarks/results/oracle-drafts.json

The embedded target in int8; `--concurrency` clients in a closed loop over one queue of the
stratified MT-Bench selection (first turns, burst arrival, as `arborspec bench-batch` runs them),
T = 0, `--max-new-tokens` each. Plain batched decoding runs first; its outputs (each request's
greedy answer, the one it gets alone on this batch-invariant target) are the reference.

An *oracle* drafter then proposes, at every position of a request's answer, the reference token
with probability p and a wrong one otherwise (decided once per position by a seeded draw, so every
configuration sees the same right and wrong positions), and a chain builder of depth d drafts
from it: the request's tree is a chain whose first k tokens are accepted when the first k
positions are right. Drafting is free (no draft forward), so each figure is an upper bound for a
real draft of that acceptance: the target forward, the screen, verification and compaction are
paid exactly as with any draft. Beside the oracles the real methods run with the draft head
(`-m`, the `bench-batch` method syntax), so their measured tokens per step place them on the
oracle's curve.

Per configuration: tokens/s, tokens per step per request, and its ratio to plain batched
decoding. Plain runs before the first configuration and after every `--plain-every`
configurations; a configuration's ratio is to the mean of the two plain runs around it, and
the figures are medians over `--rounds` rounds (their order rotated). Every output is checked
equal to the reference.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

import torch
from arborspec.bench.batch_clients import closed_loop
from arborspec.bench.batch_config import expand_batch_methods
from arborspec.bench.prompts import conversation, load_prompts
from arborspec.builders.registry import make_builder
from arborspec.common.chat import encode_messages, eos_ids
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import stamp
from arborspec.engine.batch_decode import BatchDecoder, BatchRequest
from arborspec.engine.contracts import Drafter
from arborspec.engine.decode import DecodeConfig
from arborspec.engine.tree import TokenTree
from arborspec.models import load_pair

WRONG_LOGIT = -30.0  # every other token's logit: the proposed token has probability ~1


class OracleDrafter(Drafter):
    """Proposes each request's reference token with probability `p` (module doc). One spawned
    drafter per request; it finds its request's reference by the prompt at the first `begin`."""

    def __init__(self, references: dict[tuple, tuple[int, list[int]]], p: float, vocab: int):
        self.references, self.p, self.vocab_size = references, p, vocab
        self._reset()

    def _reset(self) -> None:
        self.index: int | None = None
        self.reference: list[int] = []
        self.start = 0  # prompt length
        self.generated = 0  # answer tokens committed before the root's next token

    def spawn(self) -> OracleDrafter:
        return OracleDrafter(self.references, self.p, self.vocab_size)

    def reset(self) -> None:
        self._reset()

    def is_right(self, position: int) -> bool:
        # the same draw for every p and every run: rng(prompt, position) < p
        return random.Random(self.index * 1_000_003 + position).random() < self.p

    def proposal(self, position: int, path_right: bool) -> torch.Tensor:
        logits = torch.full((self.vocab_size,), WRONG_LOGIT)
        if position >= len(self.reference):
            logits[0] = 0.0
            return logits
        token = self.reference[position]
        if not (path_right and self.is_right(position)):
            token = (token + 1) % self.vocab_size  # never the target's greedy token
        logits[token] = 0.0
        return logits

    def begin(self, committed: list[int]) -> torch.Tensor:
        if self.index is None:
            for prompt, (index, reference) in self.references.items():
                if tuple(committed[: len(prompt)]) == prompt:
                    self.index, self.reference, self.start = index, reference, len(prompt)
                    break
            else:
                raise RuntimeError("the oracle has no reference for this prompt")
        self.generated = len(committed) - self.start
        return self.proposal(self.generated, True)

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        rows = []
        for node in nodes:
            path = tree.path_tokens(node)
            at = self.generated
            right = path == self.reference[at : at + len(path)]
            rows.append(self.proposal(at + len(path), right))
        return torch.stack(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--accept", default="0.5,0.6,0.7,0.8,1.0", help="oracle acceptances p")
    ap.add_argument("--depths", default="1,3", help="oracle chain depths d")
    ap.add_argument("-m", "--method", action="append", dest="methods", help="real methods beside")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--plain-every", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/oracle-drafts.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    accepts = [float(x) for x in args.accept.split(",")]
    depths = [int(x) for x in args.depths.split(",")]
    methods = expand_batch_methods(
        args.methods
        or ["shared:max_nodes=8:lookup=6", "dyspec:budget=1:lookup=6", "chain:budget=1"]
    )
    pair = load_pair(dtype="int8", draft="embedded-head")
    eos = eos_ids(pair.tokenizer, pair.target.model)
    prompts = load_prompts("mt-bench", args.num_prompts)
    ids = [encode_messages(pair.tokenizer, conversation(p, [])) for p in prompts]
    vocab = pair.target.model.config.vocab_size
    by_label = {m.label: m for m in methods}
    oracle_points = {f"oracle-p{p}-d{d}": (p, d) for d in depths for p in accepts}
    references: dict[tuple, tuple[int, list[int]]] = {}

    def run(label: str) -> tuple[dict, list[list[int]]]:
        method = by_label.get(label)
        builder, drafter, lookup, shared = None, None, 0, None
        if method is not None:
            builder, drafter = method.make(), pair.drafter
            lookup, shared = method.lookup, method.shared()
        elif label in oracle_points:
            p, d = oracle_points[label]
            builder = make_builder("chain", budget=d)
            drafter = OracleDrafter(references, p, vocab)
        decoder = BatchDecoder(
            pair.target, drafter, max_rows=1024, max_requests=args.concurrency, shared=shared
        )

        def submit(index: int):
            cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, seed=index, eos_token_ids=eos)
            return decoder.submit(BatchRequest(list(ids[index]), cfg, builder, lookup=lookup))

        handles, wall = closed_loop(
            decoder, list(range(len(ids))), [0.0] * min(args.concurrency, len(ids)), submit
        )
        outputs = [list(handles[i].output) for i in range(len(ids))]
        tokens = sum(len(o) for o in outputs)
        request_steps = sum(len(handles[i].steps) for i in range(len(ids)))
        return {
            "label": label,
            "tokens_per_second": tokens / wall,
            "tokens_per_request_step": tokens / request_steps,
        }, outputs

    # warm-up and reference: plain's outputs are every request's greedy answer
    _, reference = run("plain")
    for i, out in enumerate(reference):
        references[tuple(ids[i])] = (i, out)
    labels = list(oracle_points) + [m.label for m in methods]
    for label in labels:
        run(label)  # warm-up: every forward's trace, the shared budget's cost measurement
    per_label: dict[str, list[dict]] = {label: [] for label in labels}
    plains: list[float] = []
    identical = {label: True for label in labels}
    for r in range(args.rounds):
        shift = (r * len(labels)) // max(args.rounds, 1)
        order = labels[shift:] + labels[:shift]
        row, _ = run("plain")
        before = row["tokens_per_second"]
        plains.append(before)
        pending: list[dict] = []
        for k, label in enumerate(order):
            row, outputs = run(label)
            identical[label] &= outputs == reference
            pending.append(row)
            if (k + 1) % args.plain_every == 0 or k + 1 == len(order):
                plain_row, _ = run("plain")
                after = plain_row["tokens_per_second"]
                plains.append(after)
                for done in pending:
                    done["ratio"] = done["tokens_per_second"] / ((before + after) / 2)
                    per_label[done["label"]].append(done)
                    shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in done.items()}
                    print(json.dumps(shown), flush=True)
                pending, before = [], after

    def summary(label: str) -> dict:
        rows = per_label[label]
        med = lambda key: round(statistics.median(r[key] for r in rows), 3)  # noqa: E731
        return {
            "label": label,
            "rounds": len(rows),
            "ratio": med("ratio"),
            "ratios": [round(r["ratio"], 3) for r in rows],
            "tokens_per_second": med("tokens_per_second"),
            "tokens_per_request_step": med("tokens_per_request_step"),
            "identical_to_plain": identical[label],
        }

    out = {
        **stamp(),
        "threads": args.threads,
        "concurrency": args.concurrency,
        "prompts": len(ids),
        "max_new_tokens": args.max_new_tokens,
        "plain_tokens_per_second": [round(x, 2) for x in plains],
        "oracles": [
            {"p": p, "depth": d, **summary(label)} for label, (p, d) in oracle_points.items()
        ],
        "methods": [summary(m.label) for m in methods],
    }
    write_json_atomic(out, args.out)
    for row in out["oracles"] + out["methods"]:
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
