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

One safetensors shard per batch is written atomically (`shard_00012.safetensors`:
`tokens` int32 flat, `offsets` int64, `prompt_lens` int32, `feats` fp16 with
`len - 1` rows per sequence), so Ctrl-C loses at most the batch in flight and a
rerun continues after the last shard. `meta.json` records the settings; a rerun
with different settings is refused.

The prompt pool (`head_prompts`) mixes the distillation pool (standard-library
docstrings turned into coding questions, everyday topics x task templates) with
prompts of the Spec-Bench task kinds built here from standard-library text:
translation, summarisation, question answering over a passage (the
retrieval-augmented form), and arithmetic word problems with random numbers.
With `prompt_source="self-instruct"` the target writes the prompts itself
(`self_instruct.py`): chat-like user messages, one batch of them per shard.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..common.chat import encode_prompt, eos_ids
from ..common.progress import progress_bar
from ..engine.adapter import decoder_hidden
from ..errors import ArborError
from .generation import cut_at_eos, left_padded, pad_token_id
from .self_instruct import user_turn_prefix, write_queries

SHARD_PREFIX = "shard_"
PROMPT_SOURCES = ("pool", "self-instruct")
LANGUAGES = ["French", "German", "Spanish", "Italian", "Portuguese", "Chinese", "Japanese", "Russian"]
PASSAGE_MODULES = [
    "json", "csv", "argparse", "logging", "pathlib", "itertools", "functools", "collections", "datetime",
    "random", "statistics", "string", "textwrap", "unittest", "sqlite3", "threading", "subprocess", "shutil",
    "tempfile", "heapq", "bisect", "decimal", "fractions", "enum", "dataclasses", "typing", "contextlib", "abc",
    "copy", "pickle", "zipfile", "tarfile", "gzip", "hashlib", "hmac", "secrets", "uuid", "base64", "html",
    "urllib.parse", "email", "calendar", "time", "os", "sys", "re", "math", "cmath", "operator", "inspect", "ast",
    "dis", "traceback", "warnings", "weakref", "queue", "sched", "asyncio", "socket", "select", "signal", "mmap",
    "codecs", "unicodedata", "locale", "gettext", "pprint", "reprlib", "difflib", "filecmp", "glob", "fnmatch",
    "configparser", "plistlib", "timeit", "trace", "doctest", "zoneinfo", "graphlib", "array", "struct",
]
ITEMS = ["apples", "notebooks", "tickets", "cupcakes", "pencils", "bus passes", "plants", "T-shirts", "books", "mugs"]
NAMES = ["Tom", "Aisha", "Lena", "Ravi", "Maria", "Kenji", "Olu", "Sofia", "Ben", "Yara"]


# --------------------------------------------------------------------------- prompt pool


def _module_passages() -> list[tuple[str, str]]:
    """(module name, first paragraphs of its docstring) for standard-library modules with real prose."""
    out = []
    for name in PASSAGE_MODULES:
        try:
            doc = inspect.getdoc(importlib.import_module(name)) or ""
        except Exception:  # pragma: no cover - platform-specific modules
            continue
        text = " ".join(doc.split())[:900]
        if len(text) > 120:
            out.append((name, text))
    return out


def _sentences(passages: list[tuple[str, str]]) -> list[str]:
    out = []
    for _, text in passages:
        for s in text.split(". "):
            s = s.strip()
            if 40 <= len(s) <= 200 and s[0].isupper():
                out.append(s.rstrip(".") + ".")
    return out


def _math_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 25), rng.randint(3, 12)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    forms = [
        f"{name} buys {b} {item} at ${a} each and pays with ${a * b + rng.randint(1, 50)}. How much change does {name} get? Explain step by step.",
        f"A class has {a + b} students. {b} of them are absent and the rest sit in groups of {c}. How many full groups are there, and how many students are left over?",
        f"{name} reads {c} pages a day. The book has {a * c + b} pages. After how many days will {name} finish it? Show your reasoning.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"A train travels {a * c} km in {c} hours. At the same speed, how far does it travel in {b} hours?",
        f"Solve for x: {a}x + {b} = {a * c + b}. Explain each step.",
        f"{name} saves ${a} every week. How many weeks does it take to save ${a * (b + c)}, and what if the weekly amount doubles?",
        f"What is {c}% of {a * 10 + b}? Then explain how to compute a percentage in general.",
    ]
    return rng.choice(forms)


def task_prompts(seed: int = 0) -> list[str]:
    """Translation, summarisation, passage QA and arithmetic prompts (Spec-Bench's task kinds, none of its data)."""
    rng = random.Random(seed + 17)
    passages = _module_passages()
    prompts = []
    for i, sentence in enumerate(_sentences(passages)):
        prompts.append(f"Translate the following sentence into {LANGUAGES[i % len(LANGUAGES)]}:\n\n{sentence}")
    for name, text in passages:
        prompts.append(f"Summarize the following text in two or three sentences:\n\n{text}")
        prompts.append(f"Read the passage and answer the question.\n\nPassage: {text}\n\nQuestion: "
                       f"What is the `{name}` module used for, and what is one thing it provides?")
        prompts.append(f"Here is some documentation:\n\n{text}\n\nWrite a short tutorial paragraph for beginners based on it.")
    prompts += [_math_problem(rng) for _ in range(600)]
    return prompts


def head_prompts(num: int, seed: int = 0) -> list[str]:
    """A deterministic shuffled pool of `num` instructions (no benchmark data): distillation pool + task prompts."""
    from .distill import stdlib_prompts, topic_prompts

    pool = list(dict.fromkeys(stdlib_prompts() + topic_prompts(seed) + task_prompts(seed)))
    random.Random(seed).shuffle(pool)
    if num > len(pool):
        print(f"arborspec: only {len(pool)} distinct prompts available (asked for {num})", file=sys.stderr)
    return pool[:num]


# --------------------------------------------------------------------------- generation


@dataclass(kw_only=True)
class HeadDataConfig:
    target: str = "embedded"
    num_prompts: int = 6000
    max_new_tokens: int = 160
    max_prompt_tokens: int = 384
    batch_size: int = 32
    sample_fraction: float = 0.4          # share of batches sampled (the rest greedy)
    sample_temperature: float = 0.7
    seed: int = 0
    time_budget_s: float = 0.0            # stop after this many seconds (0: no limit); rerun to continue
    prompt_source: str = "pool"           # "pool": the built-in pool; "self-instruct": the target writes the prompts
    query_temperature: float = 1.0        # self-instruct: sampling temperature of the user messages
    max_query_tokens: int = 64            # self-instruct: a user message not closed within this is dropped
    query_openings: bool = False          # self-instruct: start each message with a generic opening (OPENINGS)

    def settings(self) -> dict:
        d = asdict(self)
        d.pop("time_budget_s")
        if self.prompt_source == "pool":  # the pool's settings as they were before self-instruct existed
            for key in ("prompt_source", "query_temperature", "max_query_tokens"):
                d.pop(key)
        if not self.query_openings:  # the settings of data made before openings existed
            d.pop("query_openings")
        return d


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _batches(prompts: list[list[int]], batch_size: int, seed: int) -> list[list[int]]:
    """Indices grouped into batches of similar prompt length (less padding), batch order shuffled."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed + 5).shuffle(batches)
    return batches


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


def generate_head_data(cfg: HeadDataConfig, model, tokenizer, data_dir: Path, progress: bool = True,
                       prompts: list[str] | None = None, source: str = "") -> dict:
    """Generate (or continue generating) shards into `data_dir`; return token counts.

    `prompts` replaces the training pool (used for held-out evaluation sets, with `source` naming them).
    """
    from safetensors.torch import save_file

    if cfg.prompt_source not in PROMPT_SOURCES:
        raise ArborError(f"unknown prompt source {cfg.prompt_source!r}: use one of {', '.join(PROMPT_SOURCES)}")
    data_dir.mkdir(parents=True, exist_ok=True)
    meta_path = data_dir / "meta.json"
    settings = cfg.settings()
    if prompts is not None:
        settings["prompts"] = source or "custom"
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        if old.get("settings") != settings:
            raise ArborError(f"{data_dir} holds head data made with other settings: use another --out or the same options")
    self_instruct = prompts is None and cfg.prompt_source == "self-instruct"
    if self_instruct:
        source = ("self-instruct: user messages sampled from the target after its chat template's user-turn opening "
                  "(Magpie), no prompt set read")
        user_turn_prefix(tokenizer)  # a template-less tokenizer fails here, before anything is generated
        num_prompts = cfg.num_prompts
        batches = [range(i, min(i + cfg.batch_size, num_prompts)) for i in range(0, num_prompts, cfg.batch_size)]
    else:
        if prompts is None:
            prompts = head_prompts(cfg.num_prompts, cfg.seed)
            source = ("stdlib docstrings -> coding questions; topics x task templates; translation, summarisation, "
                      "passage QA and arithmetic prompts from stdlib text; never MT-Bench, HumanEval or Spec-Bench data")
        encoded = [encode_prompt(tokenizer, p)[-cfg.max_prompt_tokens:] for p in prompts]
        num_prompts = len(prompts)
        batches = _batches(encoded, cfg.batch_size, cfg.seed)
    _write_atomic(meta_path, lambda p: p.write_text(json.dumps({
        "settings": settings, "num_prompts": num_prompts, "sources": source}, indent=2) + "\n"))
    pad_id, eos_set = pad_token_id(tokenizer), set(eos_ids(tokenizer, model))
    done = {int(p.stem[len(SHARD_PREFIX):]) for p in data_dir.glob(f"{SHARD_PREFIX}*.safetensors")}
    recorder = FeatureRecorder(model)
    t0, new_tokens, stored = time.time(), 0, count_tokens(data_dir)
    try:
        with progress_bar(progress) as bar:
            task = bar.add_task("head data", total=len(batches), completed=len(done), info="")
            for b, idx in enumerate(batches):
                if b in done:
                    continue
                if cfg.time_budget_s and time.time() - t0 > cfg.time_budget_s:
                    print(f"arborspec: data time budget reached; rerun to continue ({stored} tokens so far)", file=sys.stderr)
                    break
                sampled = random.Random(cfg.seed * 1_000_003 + b).random() < cfg.sample_fraction
                if self_instruct:
                    queries = batch_queries(model, tokenizer, cfg, b, len(idx), eos_set)
                    enc = [encode_prompt(tokenizer, q)[-cfg.max_prompt_tokens:] for q in queries]
                else:
                    enc = [encoded[i] for i in idx]
                if not enc:  # every user message of this batch ran past max_query_tokens: nothing to answer
                    continue
                shard, n_new = _generate_batch(model, recorder, enc, pad_id, eos_set, cfg, sampled,
                                               seed=cfg.seed * 7919 + b)
                _write_atomic(data_dir / f"{SHARD_PREFIX}{b:05d}.safetensors",
                              lambda p: save_file(shard, str(p), metadata={"mode": "sample" if sampled else "greedy"}))
                new_tokens += n_new
                stored += int(shard["tokens"].numel())
                rate = new_tokens / max(time.time() - t0, 1e-9)
                bar.update(task, advance=1, info=f"{stored} tokens stored, {rate:.0f} new tok/s")
    finally:
        recorder.close()
    return {"tokens": stored, "new_tokens_this_run": new_tokens}


def batch_queries(model, tokenizer, cfg: HeadDataConfig, batch: int, n: int, end_ids: set[int]) -> list[str]:
    """The self-instructed user messages of data batch `batch` (`self_instruct.write_queries`, seeded by the data
    seed and the batch index only, so a batch's messages can be written again without its answers)."""
    return write_queries(model, tokenizer, n, seed=cfg.seed * 104_729 + batch, end_ids=end_ids,
                         max_tokens=cfg.max_query_tokens, temperature=cfg.query_temperature, openings=cfg.query_openings)


@torch.inference_mode()
def _generate_batch(model, recorder: FeatureRecorder, enc: list[list[int]], pad_id: int, eos_set: set[int],
                    cfg: HeadDataConfig, sampled: bool, seed: int) -> tuple[dict, int]:
    input_ids, attn = left_padded(enc, pad_id)
    width = input_ids.shape[1]
    torch.manual_seed(seed)
    kwargs = dict(do_sample=True, temperature=cfg.sample_temperature, top_k=0, top_p=1.0) if sampled else dict(do_sample=False)
    recorder.chunks = []
    out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attn.to(model.device),
                         max_new_tokens=cfg.max_new_tokens, pad_token_id=pad_id, **kwargs)
    feats = recorder.take().float().cpu()  # [B, width + T - 1, H]
    seqs = out[:, width:].cpu()
    tokens, offsets, prompt_lens, rows, n_new = [], [0], [], [], 0
    for i, ids in enumerate(enc):
        resp = cut_at_eos(seqs[i].tolist(), eos_set)
        n = len(resp)
        seq = ids + resp
        start = width - len(ids)
        rows.append(feats[i, start:start + len(seq) - 1])
        tokens += seq
        offsets.append(len(tokens))
        prompt_lens.append(len(ids))
        n_new += n
    shard = {"tokens": torch.tensor(tokens, dtype=torch.int32), "offsets": torch.tensor(offsets, dtype=torch.int64),
             "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int32), "feats": torch.cat(rows).to(torch.float16)}
    return shard, n_new


# --------------------------------------------------------------------------- reading


@dataclass
class HeadSequence:
    tokens: torch.Tensor      # [n] int64
    feats: torch.Tensor       # [n - 1, H] float16: feature of tokens[0..n-2]
    prompt_len: int


def shard_paths(data_dir: Path) -> list[Path]:
    return sorted(Path(data_dir).glob(f"{SHARD_PREFIX}*.safetensors"))


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
        raise ArborError(f"no head data in {data_dir}: run `arborspec train-head` without --skip-data first")
    out = []
    for path in paths:
        s = load_file(str(path))
        offs, fo = s["offsets"].tolist(), 0
        for i in range(len(offs) - 1):
            n = offs[i + 1] - offs[i]
            out.append(HeadSequence(s["tokens"][offs[i]:offs[i + 1]].long(), s["feats"][fo:fo + n - 1],
                                    int(s["prompt_lens"][i])))
            fo += n - 1
    return out


def token_frequencies(seqs: list[HeadSequence], vocab_size: int) -> torch.Tensor:
    """Counts of each token id over the answers (FR-Spec ranks the draft vocabulary by these)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s.tokens[s.prompt_len:], minlength=vocab_size)
    return counts
