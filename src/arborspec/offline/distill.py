"""Distil a small draft model for a target causal LM (sequence-level + top-k soft-label KD).

The pipeline (``distill(cfg)`` / ``python -m arborspec.offline.distill``) has four stages,
each resumable from what it left on disk under ``cfg.work_dir``:

1. **Prompts.** Real instructions built offline, never from MT-Bench or HumanEval
   (those are the held-out evaluation sets, see ``arborspec.offline.draft_quality``):
   (a) the first docstring line of public functions/classes of 68 Python
   standard-library modules, turned into "Write a Python function that ..." /
   "Explain what `mod.func` does" requests, and (b) a hand-written list of 196
   everyday/technical topics crossed with ~16 task templates (explain, tips,
   short story, email, compare, summary, how-to, poem, pros/cons, ...).
   They are de-duplicated and shuffled with ``cfg.seed``.
2. **Data.** The target answers each prompt with its chat template, in
   left-padded batches, alternating greedy and temperature-``cfg.sample_temperature``
   sampling (sequence-level KD). At every generated position the target's top-k
   log-probabilities (temperature 1) are kept as soft labels. Every batch is a
   safetensors shard written atomically, so an interrupt loses at most one batch
   and a rerun resumes after the last shard.
3. **Train.** A small ``LlamaForCausalLM`` with the target's tokenizer and
   vocabulary, tied embeddings initialised from the target's embedding projected
   onto its top principal directions (PCA), trained with
   ``hard_weight * CE(target tokens) + (1 - hard_weight) * CE(top-k soft labels)``
   (the soft term is the KL to the target's top-k distribution up to a constant),
   AdamW, linear warm-up + cosine decay. Checkpoints (safetensors weights +
   optimizer state + JSON state) are written every ``cfg.ckpt_every`` steps and on
   Ctrl-C; ``--resume`` continues from the last one.
4. **Export.** A standard HF directory (config.json, model.safetensors in
   ``cfg.export_dtype``, tokenizer files, generation_config.json) that
   ``AutoModelForCausalLM.from_pretrained`` loads, plus ``metrics.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import math
import os
import random
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..common.chat import encode_prompt, eos_ids
from ..common.jsonfiles import write_json_atomic
from ..common.progress import progress_bar
from ..common.timing import clock
from ..common.vocab import check_same_tokenizer, check_vocab_size
from ..errors import ArborError, Interrupted
from ..models import load_model, load_tokenizer, parse_dtype
from .generation import cut_at_eos, left_padded, pad_token_id

SHARD_PREFIX = "shard_"

# --------------------------------------------------------------------------- config


@dataclass(kw_only=True)
class DistillConfig:
    target: str = "embedded"            # model name/path understood by arborspec.models.resolve_model_path
    out_dir: str = "runs/distill/draft"  # final HF directory of the draft
    work_dir: str = ""                  # data shards + checkpoints; default: <out_dir>.work
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
    sample_fraction: float = 0.5        # fraction of generation batches that sample instead of greedy
    sample_temperature: float = 0.7
    max_prompt_tokens: int = 96
    data_time_budget_s: float = 0.0     # stop generating after this many seconds (0: no limit)
    # training
    train_steps: int = 0                # 0: derived from epochs
    epochs: float = 3.0
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 30
    weight_decay: float = 0.01
    batch_size: int = 8                 # sequences per step
    seq_len: int = 288                  # truncate prompt+response to this many tokens
    hard_weight: float = 0.3
    grad_clip: float = 1.0
    ckpt_every: int = 50
    train_time_budget_s: float = 0.0    # stop training (and export) after this many seconds (0: no limit)
    resume: bool = False
    # runtime
    seed: int = 0
    threads: int = 1
    device: str = "cpu"
    dtype: str = "float32"              # training / generation dtype
    export_dtype: str = "float16"
    stages: str = "data,train,export"

    @property
    def work_path(self) -> Path:
        return Path(self.work_dir) if self.work_dir else Path(str(self.out_dir).rstrip("/") + ".work")


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
    tokenizer_vs_padded = t_size is not None and d_size is not None and (
        (t_tok is not None and d_tok is None and d_size >= t_size) or (d_tok is not None and t_tok is None and t_size >= d_size))
    if not tokenizer_vs_padded:
        check_vocab_size(d_size, t_size)
    if t_tok is not None and d_tok is not None:
        check_same_tokenizer(t_tok, d_tok, probe=probe)


def load_draft(path: str | Path, target, dtype=torch.float32):
    """Load a draft HF directory, refusing it (ArborError) when its vocabulary differs from `target`'s."""
    from transformers import AutoModelForCausalLM

    check_vocab_match(target, str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.eval()
    return model


# --------------------------------------------------------------------------- prompts

STDLIB_MODULES = [
    "os", "os.path", "json", "re", "itertools", "collections", "functools", "math", "statistics",
    "string", "textwrap", "pathlib", "shutil", "datetime", "random", "heapq", "bisect", "operator",
    "fractions", "decimal", "glob", "fnmatch", "difflib", "base64", "hashlib", "hmac", "zlib",
    "gzip", "csv", "calendar", "copy", "pprint", "urllib.parse", "html", "uuid", "secrets",
    "tempfile", "time", "struct", "binascii", "ipaddress", "unicodedata", "shlex", "cmath",
    "colorsys", "keyword", "linecache", "locale", "platform", "zipfile", "tarfile", "logging",
    "contextlib", "dataclasses", "enum", "inspect", "typing", "array", "queue", "threading",
    "email.utils", "http.cookies", "mimetypes", "quopri", "wave", "graphlib", "numbers", "io",
]

CODE_TEMPLATES = [
    "Write a Python function for the following task, with a short docstring: {line}",
    "Explain what `{qual}` does in Python and show a short example.",
    "Implement from scratch (without using `{qual}`) a Python function that does this: {line}",
    "I found `{qual}` in some code. What is it for, and when should I use it?",
]

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "climate change", "volcanoes", "earthquakes",
    "the immune system", "vaccines", "sleep", "meditation", "running a marathon", "learning a new language",
    "the French Revolution", "the Roman Empire", "ancient Egypt", "the printing press", "the Industrial Revolution",
    "the Renaissance", "World War I", "the Cold War", "the Moon landing", "the internet", "electric cars",
    "solar power", "wind energy", "nuclear power", "recycling", "composting", "urban gardening", "beekeeping",
    "coffee", "tea", "bread baking", "fermentation", "vegetarian cooking", "meal planning", "budgeting",
    "saving for retirement", "compound interest", "inflation", "the stock market", "cryptocurrency",
    "starting a small business", "remote work", "job interviews", "writing a resume", "public speaking",
    "time management", "procrastination", "habits", "friendship", "parenting", "adopting a dog", "cats",
    "birdwatching", "hiking", "camping", "traveling to Japan", "visiting Paris", "road trips", "photography",
    "painting with watercolors", "learning the guitar", "jazz", "classical music", "chess", "board games",
    "video game design", "machine learning", "neural networks", "databases", "cloud computing", "cybersecurity",
    "passwords", "open source software", "version control with git", "unit testing", "recursion",
    "sorting algorithms", "binary search", "hash tables", "linked lists", "graph algorithms", "regular expressions",
    "the Linux command line", "Docker containers", "web development", "HTML and CSS", "JavaScript",
    "Python programming", "SQL queries", "APIs", "spreadsheets", "data visualization", "statistics",
    "probability", "prime numbers", "the Pythagorean theorem", "fractions", "calculus", "geometry",
    "the solar system", "Mars exploration", "the ocean", "coral reefs", "rainforests", "deserts", "glaciers",
    "dinosaurs", "evolution", "DNA", "genetics", "the human brain", "the heart", "nutrition", "vitamins",
    "drinking water", "first aid", "yoga", "strength training", "swimming", "cycling to work", "soccer",
    "basketball", "the Olympic Games", "mountains", "rivers", "weather forecasting", "rainbows", "lightning",
    "magnets", "electricity", "gravity", "light", "sound", "atoms", "chemical reactions", "plastics",
    "batteries", "3D printing", "robots", "self-driving cars", "smartphones", "social media", "online privacy",
    "misinformation", "libraries", "reading more books", "writing poetry", "keeping a journal", "minimalism",
    "moving to a new city", "renting an apartment", "home repairs", "houseplants", "cleaning the house",
    "wedding planning", "birthday parties", "volunteering", "democracy", "elections", "taxes",
    "the history of money", "trade", "supply chains", "airplanes", "trains", "bicycles", "bridges",
    "skyscrapers", "architecture", "museums", "theater", "movies", "animation", "comics", "mythology",
    "fairy tales", "the ancient Greeks", "Shakespeare", "philosophy", "ethics", "happiness", "stress",
    "teamwork", "leadership", "negotiation", "customer service", "marketing", "branding", "email etiquette",
    "note taking", "studying for exams", "online courses", "teaching children to read", "kindness",
]

TOPIC_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Give me five practical tips about {t}.",
    "Write a short story that involves {t}.",
    "Write a friendly email to a colleague about {t}.",
    "What are the pros and cons of {t}?",
    "Summarize the most important facts about {t} in a short paragraph.",
    "How do I get started with {t}? Give step-by-step instructions.",
    "Write a short poem about {t}.",
    "What are common misconceptions about {t}?",
    "Explain {t} to a ten-year-old.",
    "Write three quiz questions with answers about {t}.",
    "Why is {t} important? Answer in a few sentences.",
    "Compare {t} and {u}: how are they similar and how are they different?",
    "Write a short blog post introduction about {t}.",
    "Create a one-week plan for someone who wants to learn about {t}.",
    "Describe the history of {t} briefly.",
]


def _first_doc_line(obj) -> str | None:
    doc = inspect.getdoc(obj)
    if not doc:
        return None
    line = doc.strip().splitlines()[0].strip()
    if len(line) < 15 or len(line) > 160 or "(" in line[:1] or line.lower().startswith(("deprecated", "alias", "internal", "see ")):
        return None
    if not any(c.isalpha() for c in line) or "->" in line or line.endswith(")") and "(" in line.split(" ")[0]:
        return None
    return line


def stdlib_prompts() -> list[str]:
    prompts = []
    for mod_name in STDLIB_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except Exception:  # pragma: no cover - platform-specific modules
            continue
        names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
        for name in sorted(set(names)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name, None)
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            line = _first_doc_line(obj)
            if line is None:
                continue
            qual = f"{mod_name}.{name}"
            # two of the four templates per object, chosen deterministically
            h = sum(map(ord, qual))
            for k in (h % len(CODE_TEMPLATES), (h + 1) % len(CODE_TEMPLATES)):
                prompts.append(CODE_TEMPLATES[k].format(line=line, qual=qual))
    return prompts


def topic_prompts(seed: int = 0) -> list[str]:
    rng = random.Random(seed + 1)
    prompts = []
    for i, t in enumerate(TOPICS):
        for tpl in TOPIC_TEMPLATES:
            u = TOPICS[(i + 1 + rng.randrange(len(TOPICS) - 1)) % len(TOPICS)]
            prompts.append(tpl.format(t=t, u=u))
    return prompts


def build_prompts(num: int, seed: int = 0) -> list[str]:
    """Deterministic, de-duplicated, shuffled list of `num` training instructions (half code, half topics when possible)."""
    code = list(dict.fromkeys(stdlib_prompts()))
    topics = list(dict.fromkeys(topic_prompts(seed)))
    rng = random.Random(seed)
    rng.shuffle(code)
    rng.shuffle(topics)
    n_code = min(len(code), max(num // 3, num - len(topics)))
    chosen = code[:n_code] + topics[: num - n_code]
    chosen = list(dict.fromkeys(chosen))
    rng.shuffle(chosen)
    return chosen[:num]


# --------------------------------------------------------------------------- data generation


def _save_safetensors_atomic(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def _prepare_data_dir(cfg: DistillConfig, prompts: list[str]) -> Path:
    """Create the data folder, refuse one made with other settings, and record the prompts and settings."""
    data_dir = cfg.work_path / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = {"num_prompts": len(prompts), "gen_batch_size": cfg.gen_batch_size, "topk": cfg.topk,
            "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "target": cfg.target,
            "source": "stdlib docstrings (Write/Explain/Implement ...) + hand-written topics x templates; no MT-Bench/HumanEval"}
    meta_path = data_dir / "meta.json"
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        if old.get("gen_batch_size") != cfg.gen_batch_size or old.get("topk") != cfg.topk or old.get("seed") != cfg.seed:
            raise ArborError(f"{data_dir} holds data made with other settings ({old}); use another --work-dir")
    write_json_atomic(meta, meta_path, indent=2)
    (data_dir / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return data_dir


def _generate_shard(cfg: DistillConfig, model, tok, prompts: list[str], index: int) -> tuple[dict, dict, int]:
    """Batch `index`: the target's answers (greedy or sampled, by a seeded coin) and their top-k log-probabilities.

    Returns (tensors, metadata) of the shard and the number of response tokens.
    """
    pad_id, eos = pad_token_id(tok), set(eos_ids(tok, model))
    enc = [encode_prompt(tok, p)[-cfg.max_prompt_tokens:] for p in prompts]
    input_ids, attn = left_padded(enc, pad_id)
    sample = random.Random(cfg.seed * 1_000_003 + index).random() < cfg.sample_fraction
    torch.manual_seed(cfg.seed * 7919 + index)
    gen_kwargs = dict(do_sample=True, temperature=cfg.sample_temperature, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids.to(model.device), attention_mask=attn.to(model.device),
            max_new_tokens=cfg.max_new_tokens, pad_token_id=pad_id, return_dict_in_generate=True,
            output_logits=True, **gen_kwargs,
        )
    seqs = out.sequences[:, input_ids.shape[1]:].cpu()
    logits = torch.stack(out.logits, dim=1).float()  # (B, T, V) raw target logits
    prompt_flat, prompt_off, resp_flat, resp_off, tk_ids, tk_lp = [], [0], [], [0], [], []
    for i, ids in enumerate(enc):
        resp = cut_at_eos(seqs[i].tolist(), eos)
        lp = torch.log_softmax(logits[i, :len(resp)].cpu(), dim=-1)
        v, ix = lp.topk(cfg.topk, dim=-1)
        prompt_flat += ids
        prompt_off.append(len(prompt_flat))
        resp_flat += resp
        resp_off.append(len(resp_flat))
        tk_ids.append(ix.to(torch.int32))
        tk_lp.append(v.to(torch.float16))
    tensors = {"prompt_ids": torch.tensor(prompt_flat, dtype=torch.int32),
               "prompt_offsets": torch.tensor(prompt_off, dtype=torch.int64),
               "resp_ids": torch.tensor(resp_flat, dtype=torch.int32),
               "resp_offsets": torch.tensor(resp_off, dtype=torch.int64),
               "topk_ids": torch.cat(tk_ids), "topk_logprobs": torch.cat(tk_lp)}
    metadata = {"mode": "sample" if sample else "greedy", "temperature": str(cfg.sample_temperature if sample else 0.0)}
    return tensors, metadata, len(resp_flat)


def generate_data(cfg: DistillConfig, model, tok, progress: bool = True) -> Path:
    """Stage 2: target responses + top-k soft labels, one safetensors shard per batch (resumable)."""
    prompts = build_prompts(cfg.num_prompts, cfg.seed)
    data_dir = _prepare_data_dir(cfg, prompts)
    n_batches = math.ceil(len(prompts) / cfg.gen_batch_size)
    done = {int(p.stem[len(SHARD_PREFIX):]) for p in data_dir.glob(f"{SHARD_PREFIX}*.safetensors")}
    t0 = clock()
    new_tokens = 0
    with progress_bar(progress) as bar:
        task = bar.add_task("generate", total=n_batches, completed=len(done), info="")
        for b in range(n_batches):
            if b in done:
                continue
            if cfg.data_time_budget_s and clock() - t0 > cfg.data_time_budget_s:
                print(f"distill: data time budget reached after {b} batches", file=sys.stderr)
                break
            batch = prompts[b * cfg.gen_batch_size:(b + 1) * cfg.gen_batch_size]
            tensors, metadata, tokens = _generate_shard(cfg, model, tok, batch, b)
            _save_safetensors_atomic(tensors, data_dir / f"{SHARD_PREFIX}{b:05d}.safetensors", metadata=metadata)
            new_tokens += tokens
            bar.update(task, advance=1, info=f"{new_tokens} tok, {new_tokens / max(clock() - t0, 1e-9):.1f} tok/s")
    return data_dir


def load_data(data_dir: Path) -> list[dict]:
    """Read all shards into a list of examples {ids, resp_start, topk_ids, topk_logprobs}."""
    from safetensors.torch import load_file

    examples = []
    for path in sorted(data_dir.glob(f"{SHARD_PREFIX}*.safetensors")):
        d = load_file(str(path))
        po, ro = d["prompt_offsets"].tolist(), d["resp_offsets"].tolist()
        for i in range(len(po) - 1):
            p = d["prompt_ids"][po[i]:po[i + 1]].long()
            r = d["resp_ids"][ro[i]:ro[i + 1]].long()
            if len(r) == 0:
                continue
            examples.append({"ids": torch.cat([p, r]), "resp_start": len(p),
                             "topk_ids": d["topk_ids"][ro[i]:ro[i + 1]].long(),
                             "topk_logprobs": d["topk_logprobs"][ro[i]:ro[i + 1]].float()})
    return examples


# --------------------------------------------------------------------------- draft model


def draft_config(cfg: DistillConfig, target_config):
    """A small Llama config sharing the target's vocabulary, special ids, RoPE base and norm epsilon."""
    from transformers import LlamaConfig

    if cfg.hidden % cfg.heads:
        raise ArborError(f"--hidden {cfg.hidden} is not divisible by --heads {cfg.heads}")
    if cfg.heads % cfg.kv_heads:
        raise ArborError(f"--heads {cfg.heads} is not divisible by --kv-heads {cfg.kv_heads}")
    rope = getattr(target_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": getattr(target_config, "rope_theta", 10000.0)}
    return LlamaConfig(
        vocab_size=target_config.vocab_size, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-5), rope_parameters=dict(rope),
        tie_word_embeddings=True, bos_token_id=target_config.bos_token_id, eos_token_id=target_config.eos_token_id,
        pad_token_id=getattr(target_config, "pad_token_id", None), hidden_act="silu",
        attention_bias=False, mlp_bias=False, use_cache=True,
    )


def pca_embedding(target_embedding: torch.Tensor, dim: int) -> torch.Tensor:
    """Project the target's (V, H) embedding onto its top-`dim` principal directions -> (V, dim)."""
    emb = target_embedding.detach().float()
    mean = emb.mean(0, keepdim=True)
    # right singular vectors of the centred matrix = principal directions
    _, _, vh = torch.linalg.svd(emb - mean, full_matrices=False)
    return emb @ vh[:dim].T


def scaled_pca_embedding(target_embedding: torch.Tensor, dim: int, std: float) -> torch.Tensor:
    """PCA projection rescaled to element std `std`: the tied LM head then starts near-uniform (loss ~ ln V)
    instead of with the target's large logits, while keeping the target's token geometry."""
    proj = pca_embedding(target_embedding, dim)
    return proj * (std / proj.std().clamp_min(1e-12))


def build_draft(cfg: DistillConfig, target) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(draft_config(cfg, target.config))
    if cfg.pca_init:
        emb = target.get_input_embeddings().weight
        if cfg.hidden <= emb.shape[1]:
            with torch.no_grad():
                model.get_input_embeddings().weight.copy_(scaled_pca_embedding(emb, cfg.hidden, model.config.initializer_range))
    model.tie_weights()
    return model


# --------------------------------------------------------------------------- training


def _batches(examples, batch_size, rng):
    """Length-bucketed random batches (indices)."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i]["ids"]), rng.random()))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(chunks)
    return chunks


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
        hard.append(r["ids"][s:s + m])
        tk_ids.append(r["topk_ids"][:m])
        tk_lp.append(r["topk_logprobs"][:m])
    return ids, mask, torch.cat(pos_b), torch.cat(pos_t), torch.cat(hard), torch.cat(tk_ids), torch.cat(tk_lp)


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
    return hard_weight * ce_hard + (1 - hard_weight) * ce_soft, ce_hard.detach(), ce_soft.detach(), agree, len(hard)


def _lr_at(cfg: DistillConfig, step: int, total: int, time_frac: float = 0.0) -> float:
    """Linear warm-up then cosine decay to min_lr_ratio * lr. With a time budget, the decay follows
    whichever is further along, the steps or the budget, so the LR is annealed when the budget ends."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = min(1.0, max(time_frac, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def _save_checkpoint(ckpt_dir: Path, model, opt, state: dict) -> None:
    from safetensors.torch import save_file

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    tmp = ckpt_dir / "model.safetensors.tmp"
    save_file(weights, str(tmp))
    os.replace(tmp, ckpt_dir / "model.safetensors")
    # optimizer state: tensors by parameter index in safetensors, scalars in JSON (no pickles)
    names = {id(p): n for n, p in model.named_parameters()}
    opt_tensors, opt_scalars = {}, {}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            for k, v in st.items():
                if torch.is_tensor(v):
                    opt_tensors[f"{names[id(p)]}::{k}"] = v.detach().cpu().contiguous()
                else:
                    opt_scalars[f"{names[id(p)]}::{k}"] = v
    tmp = ckpt_dir / "optimizer.safetensors.tmp"
    save_file(opt_tensors, str(tmp))
    os.replace(tmp, ckpt_dir / "optimizer.safetensors")
    write_json_atomic({**state, "optimizer_scalars": opt_scalars}, ckpt_dir / "state.json", indent=2)


def _load_checkpoint(ckpt_dir: Path, model, opt) -> dict:
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(ckpt_dir / "model.safetensors")), strict=False)
    model.tie_weights()
    state = json.loads((ckpt_dir / "state.json").read_text())
    tensors = load_file(str(ckpt_dir / "optimizer.safetensors"))
    scalars = state.pop("optimizer_scalars", {})
    params = dict(model.named_parameters())
    for key, v in list(tensors.items()) + list(scalars.items()):
        name, k = key.split("::")
        if name in params:
            opt.state[params[name]][k] = v
    return state


@torch.no_grad()
def _evaluate(model, examples, cfg, pad_id):
    model.eval()
    tot = n = agree = hard_sum = 0.0
    for i in range(0, len(examples), cfg.batch_size):
        batch = _collate(examples, list(range(i, min(len(examples), i + cfg.batch_size))), cfg.seq_len, pad_id)
        loss, ce_hard, ce_soft, ag, cnt = _loss(model, batch, cfg.hard_weight)
        tot += loss.item() * cnt
        hard_sum += ce_hard.item() * cnt
        agree += ag.item() * cnt
        n += cnt
    model.train()
    return {"val_loss": tot / max(n, 1), "val_ce_hard": hard_sum / max(n, 1), "val_top1_agreement": agree / max(n, 1), "val_tokens": int(n)}


def _split_examples(examples: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
    """(train, validation): a seeded shuffle; up to 64 examples (1 in 20) are held out."""
    perm = list(range(len(examples)))
    random.Random(seed).shuffle(perm)
    n_val = max(1, min(64, len(examples) // 20)) if len(examples) > 1 else 0
    val = [examples[i] for i in perm[:n_val]]
    return [examples[i] for i in perm[n_val:]] or val, val


def _optimizer(model, cfg: DistillConfig) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8)


class _Training:
    """One training session: the model, its optimizer, the resumable state and its checkpoints."""

    def __init__(self, cfg: DistillConfig, model, val: list[dict], pad_id: int) -> None:
        self.cfg, self.model, self.val, self.pad_id = cfg, model, val, pad_id
        self.opt = _optimizer(model, cfg)
        self.ckpt_dir, self.best_dir = cfg.work_path / "checkpoint", cfg.work_path / "best"
        self.state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "train_seconds": 0.0, "tokens_seen": 0,
                      "history": [], "best_val_loss": None}
        if cfg.resume and (self.ckpt_dir / "state.json").is_file():
            self.state = _load_checkpoint(self.ckpt_dir, model, self.opt)
            print(f"distill: resumed from {self.ckpt_dir} at step {self.state['step']}", file=sys.stderr)
        elif (self.ckpt_dir / "state.json").is_file():
            print(f"distill: {self.ckpt_dir} exists; starting over (use --resume to continue it)", file=sys.stderr)
        self.t_start = clock() - self.state["train_seconds"]  # earlier sessions count
        self.t_session = clock()
        self.smoothed = {"loss": None, "hard": None, "agree": None}

    def step(self, batch, lr: float) -> None:
        """One optimizer step at learning rate `lr`."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        loss, ce_hard, _, agree, cnt = _loss(self.model, batch, self.cfg.hard_weight)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.state["step"] += 1
        self.state["batch_in_epoch"] += 1
        self.state["tokens_seen"] += int(cnt)
        for k, v in (("loss", loss.item()), ("hard", ce_hard.item()), ("agree", agree.item())):
            self.smoothed[k] = v if self.smoothed[k] is None else 0.95 * self.smoothed[k] + 0.05 * v

    def checkpoint(self) -> dict:
        """Evaluate, save the last checkpoint (and the best one), append to the history; returns the evaluation."""
        state = self.state
        state["train_seconds"] = clock() - self.t_start
        ev = _evaluate(self.model, self.val, self.cfg, self.pad_id)
        state["history"].append({"step": state["step"], "train_seconds": round(state["train_seconds"], 1),
                                 "tokens_seen": state["tokens_seen"],
                                 **{k: round(v, 4) if isinstance(v, float) else v for k, v in ev.items()}})
        _save_checkpoint(self.ckpt_dir, self.model, self.opt, state)
        if state["best_val_loss"] is None or ev["val_loss"] <= state["best_val_loss"]:
            state["best_val_loss"] = ev["val_loss"]
            state["best_step"] = state["step"]
            _save_checkpoint(self.best_dir, self.model, self.opt, state)
        write_json_atomic(state["history"], self.cfg.work_path / "train_history.json", indent=2)
        return ev

    def session_fraction(self) -> float:
        """Share of the training time budget this session has used (0 without a budget)."""
        budget = self.cfg.train_time_budget_s
        return (clock() - self.t_session) / budget if budget else 0.0

    def log_checkpoint(self, ev: dict, total: int) -> None:
        r, state = self.smoothed, self.state
        print(f"distill: step {state['step']}/{total} ep {state['epoch']} train loss {r['loss']:.3f} top1 {r['agree']:.3f} | "
              f"val loss {ev['val_loss']:.3f} ce {ev['val_ce_hard']:.3f} top1 {ev['val_top1_agreement']:.3f} | "
              f"{clock() - self.t_start:.0f}s", file=sys.stderr, flush=True)


class _CheckpointOnInterrupt:
    """While active, the first Ctrl-C sets `requested` (the loop saves a checkpoint and stops); a second one aborts."""

    def __init__(self) -> None:
        self.requested, self._old = False, None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ndistill: interrupt received: saving a checkpoint after this step (Ctrl-C again to abort)", file=sys.stderr)

    def __enter__(self) -> "_CheckpointOnInterrupt":
        if _main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _train_loop(run: _Training, train: list[dict], total: int, interrupt: _CheckpointOnInterrupt, progress: bool) -> None:
    """Steps until `total`, the time budget or Ctrl-C; epochs reshuffle the length buckets with a seeded RNG."""
    cfg, state = run.cfg, run.state
    batches = _batches(train, cfg.batch_size, random.Random(cfg.seed * 31 + state["epoch"]))
    with progress_bar(progress) as bar:
        task = bar.add_task("train", total=total, completed=state["step"], info="")
        while state["step"] < total:
            if state["batch_in_epoch"] >= len(batches):
                state["epoch"] += 1
                state["batch_in_epoch"] = 0
                batches = _batches(train, cfg.batch_size, random.Random(cfg.seed * 31 + state["epoch"]))
            lr = _lr_at(cfg, state["step"], total, run.session_fraction())
            run.step(_collate(train, batches[state["batch_in_epoch"]], cfg.seq_len, run.pad_id), lr)
            r = run.smoothed
            bar.update(task, completed=state["step"],
                       info=f"ep {state['epoch']} loss {r['loss']:.3f} ce {r['hard']:.3f} top1 {r['agree']:.3f} lr {lr:.2e}")
            if state["step"] % cfg.ckpt_every == 0 or state["step"] == total:
                run.log_checkpoint(run.checkpoint(), total)
            if interrupt.requested:
                run.checkpoint()
                raise Interrupted(f"interrupted; checkpoint kept in {run.ckpt_dir}; rerun with --resume to continue")
            if cfg.train_time_budget_s and run.session_fraction() > 1:
                run.checkpoint()
                print(f"distill: train time budget reached at step {state['step']}/{total}", file=sys.stderr)
                break


def train_draft(cfg: DistillConfig, target, tok, progress: bool = True) -> dict:
    """Stage 3: train the draft on the shards; returns a dict of training metrics (also in work_dir/train_metrics.json)."""
    data_dir = cfg.work_path / "data"
    examples = load_data(data_dir)
    if not examples:
        raise ArborError(f"no training data in {data_dir}: run the data stage first (--stages data)")
    train, val = _split_examples(examples, cfg.seed)
    train_tokens = sum(len(e["topk_ids"]) for e in train)
    total = cfg.train_steps or max(1, int(round(cfg.epochs * math.ceil(len(train) / cfg.batch_size))))
    model = build_draft(cfg, target).to(cfg.device)
    model.train()
    run = _Training(cfg, model, val, pad_token_id(tok))
    with _CheckpointOnInterrupt() as interrupt:
        _train_loop(run, train, total, interrupt, progress)
    state = run.state
    metrics = {
        "train_examples": len(train), "val_examples": len(val), "train_response_tokens": train_tokens,
        "steps": state["step"], "planned_steps": total, "epochs_done": round(state["tokens_seen"] / max(train_tokens, 1), 2),
        "tokens_seen": state["tokens_seen"], "train_seconds": round(clock() - run.t_start, 1),
        "best_step": state.get("best_step"), "best_val_loss": state.get("best_val_loss"),
        "final": state["history"][-1] if state["history"] else None,
    }
    write_json_atomic(metrics, cfg.work_path / "train_metrics.json", indent=2)
    return metrics


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# --------------------------------------------------------------------------- export


def export_draft(cfg: DistillConfig, target, tok, train_metrics: dict | None = None, checkpoint: str = "best") -> Path:
    """Stage 4: write a standard HF directory (fp16 by default) from the best (or last) checkpoint."""
    from safetensors.torch import load_file
    from transformers import GenerationConfig

    ckpt = cfg.work_path / checkpoint
    if not (ckpt / "model.safetensors").is_file():
        ckpt = cfg.work_path / "checkpoint"
    if not (ckpt / "model.safetensors").is_file():
        raise ArborError(f"no checkpoint in {cfg.work_path}: run the train stage first (--stages train)")
    if train_metrics is None and (cfg.work_path / "train_metrics.json").is_file():
        train_metrics = json.loads((cfg.work_path / "train_metrics.json").read_text())
    model = build_draft(dataclasses.replace(cfg, pca_init=False), target)
    model.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=False)
    model.tie_weights()
    dtype = parse_dtype(cfg.export_dtype)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.config.dtype = dtype
    model.config.save_pretrained(out)
    weights = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    _save_safetensors_atomic(weights, out / "model.safetensors", metadata={"format": "pt"})
    GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id,
                     pad_token_id=model.config.pad_token_id).save_pretrained(out)
    tok.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    state = json.loads((ckpt / "state.json").read_text())
    metrics = {
        "target": cfg.target, "architecture": {"layers": cfg.layers, "hidden": cfg.hidden, "intermediate": cfg.intermediate,
                                               "heads": cfg.heads, "kv_heads": cfg.kv_heads, "vocab_size": model.config.vocab_size,
                                               "tied_embeddings": True, "pca_init": cfg.pca_init},
        "parameters": n_params, "export_dtype": cfg.export_dtype, "dir_bytes": size, "checkpoint": str(ckpt.name),
        "checkpoint_step": state.get("step"), "train": train_metrics,
        "history": state.get("history", []),
        "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("resume",)},
    }
    write_json_atomic(metrics, out / "metrics.json", indent=2)
    check_vocab_match(tok, str(out))
    return out


# --------------------------------------------------------------------------- driver


def _load_target(cfg: DistillConfig):
    tok = load_tokenizer(cfg.target)
    model = load_model(cfg.target, device=cfg.device, dtype=cfg.dtype)
    return model, tok


def distill(cfg: DistillConfig, progress: bool = True) -> Path:
    """Run the selected stages (`cfg.stages`, default all) end to end; return the exported draft directory."""
    torch.set_num_threads(max(1, cfg.threads))
    stages = {s.strip() for s in cfg.stages.split(",") if s.strip()}
    unknown = stages - {"data", "train", "export"}
    if unknown:
        raise ArborError(f"unknown stage(s) {sorted(unknown)}: use data, train, export")
    cfg.work_path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(dataclasses.asdict(cfg), cfg.work_path / "config.json", indent=2)
    target, tok = _load_target(cfg)
    try:
        if "data" in stages:
            generate_data(cfg, target, tok, progress=progress)
        result = None
        if "train" in stages:
            result = train_draft(cfg, target, tok, progress=progress)
        out = Path(cfg.out_dir)
        if "export" in stages:
            export_draft(cfg, target, tok, result)
    except Interrupted:
        raise
    except KeyboardInterrupt:  # outside training: every shard and checkpoint on disk is whole (atomic writes)
        raise Interrupted(f"interrupted; data shards and checkpoints kept in {cfg.work_path}; "
                          "rerun with --resume to continue") from None
    return out


def _parse_args(argv=None) -> DistillConfig:
    p = argparse.ArgumentParser(prog="python -m arborspec.offline.distill", description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(DistillConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            typ = {"int": int, "float": float, "str": str}.get(f.type if isinstance(f.type, str) else f.type.__name__, str)
            p.add_argument(flag, type=typ, default=f.default)
    p.add_argument("--out", dest="out_dir", help="alias of --out-dir")
    ns = p.parse_args(argv)
    kwargs = {f.name: getattr(ns, f.name) for f in dataclasses.fields(DistillConfig)}
    return DistillConfig(**kwargs)


def main(argv=None) -> int:
    cfg = _parse_args(argv)
    try:
        out = distill(cfg, progress=True)
    except ArborError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"distill: {exc}" if isinstance(exc, Interrupted) else "distill: interrupted", file=sys.stderr)
        return 130
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
