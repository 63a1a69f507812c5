"""Self-distillation data for a draft head: the target's own answers and its last hidden states.

A draft head (`head.py`) learns to predict the target's next last-layer hidden
state (its *feature*) from the current feature and the next token. Its training
data is therefore the target talking: for a pool of instructions that never
includes the benchmark sets (MT-Bench, HumanEval), the target answers through
its chat template in left-padded batches, alternating greedy and sampled
batches, and a forward hook on the target's decoder keeps the feature of every
token it processes (prompt tokens from the prefill, answer tokens from the
decode steps; the last token of an answer has none, nothing was computed after
it). Storing token ids next to the features keeps everything needed to
recompute features by one teacher-forced pass if the target changes precision.

Each batch is one shard (`shards.py`, `shard_00012.safetensors`: `tokens` int32
flat, `offsets` int64, `prompt_lens` int32, `feats` fp16 with `len - 1` rows per
sequence), so Ctrl-C loses at most the batch in flight and a rerun continues
after the last shard. `meta.json` records the settings; a rerun with different
settings is refused.

The prompts are the pool `corpus.head_prompts` (coding questions from
standard-library docstrings, everyday topics x task templates, and prompts of
the Spec-Bench task kinds built from standard-library text), or, with
`prompt_source="self-instruct"`, user messages the target writes itself
(`self_instruct.py`), one batch of them per shard.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..common.chat import eos_ids
from ..engine.adapter import decoder_hidden
from ..errors import ArborError
from .batching import length_batches
from .corpus import head_prompts
from .generation import (
    batch_is_sampled,
    batch_torch_seed,
    cut_at_eos,
    encode_prompts,
    left_padded,
    pad_token_id,
    sampling_kwargs,
)
from .self_instruct import user_turn_prefix, write_queries
from .shards import ShardLoop, claim_data_dir, shard_paths

PROMPT_SOURCES = ("pool", "self-instruct")
POOL_SOURCE = (
    "stdlib docstrings -> coding questions; topics x task templates; translation, "
    "summarisation, passage QA and arithmetic prompts from stdlib text; never MT-Bench, "
    "HumanEval or Spec-Bench data"
)
SELF_INSTRUCT_SOURCE = (
    "self-instruct: user messages sampled from the target after its chat "
    "template's user-turn opening (Magpie), no prompt set read"
)


# --------------------------------------------------------------------------- generation


@dataclass(kw_only=True)
class HeadDataConfig:
    target: str = "embedded"
    num_prompts: int = 6000
    max_new_tokens: int = 160
    max_prompt_tokens: int = 384
    batch_size: int = 32
    sample_fraction: float = 0.4  # share of batches sampled (the rest greedy)
    sample_temperature: float = 0.7
    seed: int = 0
    time_budget_s: float = 0.0  # stop after this many seconds (0: no limit); rerun to continue
    # "pool": the built-in pool; "self-instruct": the target writes the prompts
    prompt_source: str = "pool"
    query_temperature: float = 1.0  # self-instruct: sampling temperature of the user messages
    max_query_tokens: int = 64  # self-instruct: a user message not closed within this is dropped
    # self-instruct: start each message with a generic opening (OPENINGS)
    query_openings: bool = False

    def settings(self) -> dict:
        """The settings a data folder is made with (`meta.json`); a rerun must give the same ones.

        Fields that do not apply are left out (the self-instruct ones for the pool, `query_openings`
        when off), so a folder's settings stay those of data made without these options."""
        d = asdict(self)
        d.pop("time_budget_s")
        if self.prompt_source == "pool":
            for key in ("prompt_source", "query_temperature", "max_query_tokens"):
                d.pop(key)
        if not self.query_openings:
            d.pop("query_openings")
        return d


class FeatureRecorder:
    """Forward hook on the target's decoder that keeps `last_hidden_state` of every call."""

    def __init__(self, model) -> None:
        self.chunks: list[torch.Tensor] = []
        self.handle = model.get_decoder().register_forward_hook(self._hook)

    def _hook(self, module, args, output) -> None:
        self.chunks.append(decoder_hidden(output).detach())

    def take(self) -> torch.Tensor:
        out = torch.cat(self.chunks, dim=1)
        self.chunks = []
        return out

    def close(self) -> None:
        self.handle.remove()


def generate_head_data(
    cfg: HeadDataConfig,
    model,
    tokenizer,
    data_dir: Path,
    progress: bool = True,
    prompts: list[str] | None = None,
    source: str = "",
) -> dict:
    """Generate (or continue generating) shards into `data_dir`; return token counts.

    `prompts` replaces the training pool (used for held-out evaluation sets, with
    `source` naming them).
    """
    if cfg.prompt_source not in PROMPT_SOURCES:
        raise ArborError(
            f"unknown prompt source {cfg.prompt_source!r}: use one of {', '.join(PROMPT_SOURCES)}"
        )
    settings = cfg.settings()
    if prompts is not None:
        settings["prompts"] = source or "custom"
    self_instruct = prompts is None and cfg.prompt_source == "self-instruct"
    if self_instruct:
        source = SELF_INSTRUCT_SOURCE
        user_turn_prefix(tokenizer)  # a template-less tokenizer fails here, before any generation
        num_prompts, size = cfg.num_prompts, cfg.batch_size
        batches = [range(i, min(i + size, num_prompts)) for i in range(0, num_prompts, size)]
    else:
        if prompts is None:
            prompts, source = head_prompts(cfg.num_prompts, cfg.seed), POOL_SOURCE
        encoded = encode_prompts(tokenizer, prompts, cfg.max_prompt_tokens)
        num_prompts = len(prompts)
        rng = random.Random(cfg.seed + 5)
        batches = length_batches([len(p) for p in encoded], cfg.batch_size, rng)
    claim_data_dir(
        data_dir,
        settings,
        {"num_prompts": num_prompts, "sources": source},
        hint="use another --out or the same options",
    )
    pad_id, eos_set = pad_token_id(tokenizer), set(eos_ids(tokenizer, model))
    recorder = FeatureRecorder(model)
    stored = count_tokens(data_dir)
    loop = ShardLoop(
        data_dir,
        len(batches),
        label="head data",
        time_budget_s=cfg.time_budget_s,
        progress=progress,
    )
    try:
        for b in loop:
            sampled = batch_is_sampled(cfg.seed, b, cfg.sample_fraction)
            if self_instruct:
                queries = batch_queries(model, tokenizer, cfg, b, len(batches[b]), eos_set)
                enc = encode_prompts(tokenizer, queries, cfg.max_prompt_tokens)
            else:
                enc = [encoded[i] for i in batches[b]]
            if not enc:  # every user message of this batch ran past max_query_tokens
                continue
            shard, n_new = _generate_batch(
                model,
                recorder,
                enc,
                pad_id,
                eos_set,
                cfg,
                sampled,
                seed=batch_torch_seed(cfg.seed, b),
            )
            loop.save(b, shard, {"mode": "sample" if sampled else "greedy"}, n_new)
            stored += int(shard["tokens"].numel())
    finally:
        recorder.close()
    return {"tokens": stored, "new_tokens_this_run": loop.new_tokens}


def batch_queries(
    model, tokenizer, cfg: HeadDataConfig, batch: int, n: int, end_ids: set[int]
) -> list[str]:
    """The self-instructed user messages of data batch `batch` (`self_instruct.write_queries`,
    seeded by the data seed and the batch index only, so a batch's messages can be written again
    without its answers)."""
    return write_queries(
        model,
        tokenizer,
        n,
        seed=cfg.seed * 104_729 + batch,
        end_ids=end_ids,
        max_tokens=cfg.max_query_tokens,
        temperature=cfg.query_temperature,
        openings=cfg.query_openings,
    )


@torch.inference_mode()
def _generate_batch(
    model,
    recorder: FeatureRecorder,
    enc: list[list[int]],
    pad_id: int,
    eos_set: set[int],
    cfg: HeadDataConfig,
    sampled: bool,
    seed: int,
) -> tuple[dict, int]:
    input_ids, attn = left_padded(enc, pad_id)
    width = input_ids.shape[1]
    torch.manual_seed(seed)
    recorder.chunks = []
    out = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=attn.to(model.device),
        max_new_tokens=cfg.max_new_tokens,
        pad_token_id=pad_id,
        **sampling_kwargs(cfg.sample_temperature if sampled else 0.0),
    )
    feats = recorder.take().float().cpu()  # [B, width + T - 1, H]
    seqs = out[:, width:].cpu()
    tokens, offsets, prompt_lens, rows, n_new = [], [0], [], [], 0
    for i, ids in enumerate(enc):
        resp = cut_at_eos(seqs[i].tolist(), eos_set)
        n = len(resp)
        seq = ids + resp
        start = width - len(ids)
        rows.append(feats[i, start : start + len(seq) - 1])
        tokens += seq
        offsets.append(len(tokens))
        prompt_lens.append(len(ids))
        n_new += n
    shard = {
        "tokens": torch.tensor(tokens, dtype=torch.int32),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int32),
        "feats": torch.cat(rows).to(torch.float16),
    }
    return shard, n_new


# --------------------------------------------------------------------------- reading


@dataclass
class HeadSequence:
    tokens: torch.Tensor  # [n] int64
    feats: torch.Tensor  # [n - 1, H] float16: feature of tokens[0..n-2]
    prompt_len: int


def count_tokens(data_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in shard_paths(data_dir):
        with safe_open(str(path), "pt") as f:
            total += f.get_slice("tokens").get_shape()[0]
    return total


def load_head_data(data_dir: Path) -> list[HeadSequence]:
    """All sequences of all shards, in shard order."""
    from safetensors.torch import load_file

    paths = shard_paths(data_dir)
    if not paths:
        raise ArborError(
            f"no head data in {data_dir}: run `arborspec train-head` without --skip-data first"
        )
    out = []
    for path in paths:
        s = load_file(str(path))
        offs, fo = s["offsets"].tolist(), 0
        for i in range(len(offs) - 1):
            n = offs[i + 1] - offs[i]
            out.append(
                HeadSequence(
                    s["tokens"][offs[i] : offs[i + 1]].long(),
                    s["feats"][fo : fo + n - 1],
                    int(s["prompt_lens"][i]),
                )
            )
            fo += n - 1
    return out


def token_frequencies(seqs: list[HeadSequence], vocab_size: int) -> torch.Tensor:
    """Counts of each token id over the answers (FR-Spec ranks the draft vocabulary by these)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s.tokens[s.prompt_len :], minlength=vocab_size)
    return counts
