"""The benchmark: every method config against plain decoding, same process, same
prompts, interleaved.

    cfg = BenchConfig(methods=["dyspec:budget=16,32", "sequoia:budget=16:max_depth=6"],
                      temperatures=[0, 0.6], prompts="mt-bench", num_prompts=10)
    results = run_bench(cfg)        # runs/bench/results.jsonl + report.md + plots

`arborspec bench` builds the same `BenchConfig` from its options.

Honest measurement, in the spirit of gpt-fast and Spec-Bench:
* the pair is loaded once; per prompt the autoregressive baseline runs first,
  then each method config, so machine drift hits all of them alike;
* warm-up generations are run first and not recorded;
* tokens are the committed ids (`GenerationResult.output_ids`) for every
  method, never re-tokenised text; speedups are ratios of *totals*
  (seconds per token summed over the same runs, see `metrics.py`);
* at temperature 0 only the first seed runs (the output does not depend on it)
  and each record says whether its tokens equal the baseline's.

The results file is JSON Lines: one header record (config, versions, machine),
then one record per (prompt, turn, method config, temperature, seed, repeat),
each flushed as soon as it exists, so Ctrl-C loses nothing and `resume=True`
continues where a run stopped. Multi-turn prompts (MT-Bench's two turns, a
JSONL `turns` list of any length) run up to `turns` user turns each (None =
all of them); turn k is asked after the *baseline's* answers to turns 1..k-1
(the target's own answers, same temperature, seed and repeat), so every method
sees the same later prompts (`conversation_ids`).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..builders import make_builder, parse_params
from ..catalog import EMBEDDED_TARGET, gguf_file, has_gguf_file
from ..common.chat import encode_messages, eos_ids
from ..common.progress import progress_bar
from ..common.provenance import utc_timestamp
from ..common.timing import clock
from ..drafters import ModelDrafter
from ..engine.contracts import TreeBuilder
from ..engine.cost import cost_curve_for
from ..engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate, check_context
from ..engine.sampling import SamplingConfig, sampling_config
from ..errors import ArborError
from ..models import (
    EMBEDDED_DRAFT,
    SHIPPED_DRAFT_DIR,
    ModelPair,
    default_draft,
    draft_precision,
    head_int8,
    load_model,
    load_pair,
    placement_kwargs,
)
from .llama_cpp import LLAMA_CPP, LLAMA_CPP_CONTEXT, LlamaCppPeer, is_llama_cpp
from .prompts import Prompt, conversation, load_prompts
from .report import BASELINE, HF_ASSISTED, HF_GENERATE, SCHEMA_VERSION, write_report
from .results import (
    RecordKey,
    ResultsFile,
    check_resume_compatible,
    open_results,
    pair_fields,
    record_missing,
    record_runs,
)

# Header fields that must match for `resume` to append to an existing results file
RESUME_KEYS = (
    "target",
    "draft",
    "draft_logits",
    "prompts",
    "num_prompts",
    "max_new_tokens",
    "device",
    "dtype",
    "turns",
    "chat",
    "top_k",
    "top_p",
    "device_map",
    "max_memory",
    "compile",
)


@dataclass(kw_only=True)
class BenchConfig:
    target: str = "embedded"
    draft: str | None = None  # None = the target's default draft (embedded draft, else ngram)
    # a draft head's precision (layer and logits): auto (int8 on CPU), float, int8
    # (models.load_pair)
    draft_logits: str = "auto"
    # sweep specs, see parse_method_spec
    methods: list[str] = field(default_factory=lambda: ["dyspec:budget=16"])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    prompts: str = "mt-bench"
    num_prompts: int | None = 10
    max_new_tokens: int = 128
    seeds: list[int] = field(default_factory=lambda: [0])
    repeats: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    # placement of the target (models.placement_kwargs): overrides device
    device_map: str | None = None
    max_memory: str | None = None
    offload_folder: str | None = None
    warmup: int = 1  # warm-up generations per method before timing (not recorded)
    out_dir: Path = Path("runs/bench")
    resume: bool = False
    compare_hf_assisted: bool = False
    # llama.cpp's plain decoding of a GGUF file as a peer (bench/llama_cpp.py); `gguf`: the file
    # (None: the embedded target's own)
    compare_llama_cpp: bool = False
    gguf: str | None = None
    # user turns per prompt, at most (2 = MT-Bench's second turn too); None = every turn
    turns: int | None = 1
    chat: bool = True
    top_k: int = 0
    top_p: float = 1.0
    # draft side at temperature 0 (None: the measured default)
    draft_temperature: float | None = None
    threads: int | None = None  # torch threads (None = leave torch's default)
    # the target's decoder through torch.compile, for every method and the baselines
    compile: bool = False

    def validate(self) -> None:
        if not self.methods:
            raise ArborError(
                "give at least one method to benchmark, e.g. --method dyspec:budget=16,32"
            )
        head_int8(self.draft_logits, self.device, bool(self.device_map or self.max_memory))
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ArborError(f"temperatures must be >= 0 (0 = greedy), got {self.temperatures}")
        if not self.seeds:
            raise ArborError("give at least one seed")
        for name, value in (("max_new_tokens", self.max_new_tokens), ("repeats", self.repeats)):
            if value < 1:
                raise ArborError(f"{name} must be >= 1, got {value}")
        if self.warmup < 0:
            raise ArborError(f"warmup must be >= 0, got {self.warmup}")
        if self.turns is not None and (not isinstance(self.turns, int) or self.turns < 1):
            raise ArborError(
                "turns must be a whole number >= 1, or None for every turn of each "
                f"prompt; got {self.turns!r}"
            )
        if self.threads is not None and self.threads < 1:
            raise ArborError(f"threads must be >= 1, got {self.threads}")
        if self.gguf is not None and not self.compare_llama_cpp:
            raise ArborError("--gguf names the file llama.cpp runs: add --compare-llama-cpp")
        if self.compare_llama_cpp and self.gguf is None and not has_gguf_file(self.target):
            raise ArborError(
                "--compare-llama-cpp needs the target's GGUF file for a target that is neither "
                "built in nor a .gguf path: give --gguf PATH"
            )
        # one-line errors
        SamplingConfig(max(self.temperatures), self.top_k, self.top_p, self.draft_temperature)
        placement_kwargs(self.device_map, self.max_memory, self.offload_folder)

    def to_json(self) -> dict:
        d = asdict(self)
        d["out_dir"] = str(self.out_dir)
        return d


DECODER_KEYS = ("lookup",)  # method-spec keys for the decoder, not the builder


@dataclass(frozen=True)
class MethodConfig:
    """One point of a sweep: a builder name and its parameters."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        return ":".join([self.name] + [f"{k}={v}" for k, v in self.params])

    @property
    def lookup(self) -> int:
        """`lookup=K`: the decoder grafts up to K context-lookup tokens onto each tree
        (engine/lookup.py); not a builder parameter."""
        value = dict(self.params).get("lookup", 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ArborError(
                f"method {self.label!r}: lookup must be a whole number of "
                f"tokens >= 0, got {value!r}"
            )
        return value

    def make(self) -> TreeBuilder:
        params = {k: v for k, v in self.params if k not in DECODER_KEYS}
        return make_builder(self.name, budget=params.pop("budget", None), **params)


def parse_method_spec(spec: str) -> list[MethodConfig]:
    """`"sequoia:budget=8,16:max_depth=6"` -> one MethodConfig per point of the cartesian product.

    >>> [m.label for m in parse_method_spec("dyspec:budget=8,16")]
    ['dyspec:budget=8', 'dyspec:budget=16']
    """
    name, *parts = [p.strip() for p in spec.strip().split(":")]
    if not name:
        raise ArborError(f"method spec {spec!r} has no method name: write e.g. dyspec:budget=16,32")
    axes: list[list[tuple[str, Any]]] = []
    for part in parts:
        if "=" not in part:
            raise ArborError(f"in {spec!r}: {part!r} must look like name=value[,value...]")
        key, values = part.split("=", 1)
        items = [v for v in values.split(",") if v.strip()]
        if not items:
            raise ArborError(f"in {spec!r}: parameter {key!r} has no value")
        axes.append([next(iter(parse_params([f"{key}={v}"]).items())) for v in items])
    return [MethodConfig(name, tuple(point)) for point in itertools.product(*axes)]


def expand_methods(specs: list[str]) -> list[MethodConfig]:
    """Parse every spec and build every builder once, so a bad sweep value fails
    before any model loads."""
    out: list[MethodConfig] = []
    for spec in specs:
        for m in parse_method_spec(spec):
            # each raises a one-line ArborError on an unknown method or a bad value
            m.make(), m.lookup
            if m not in out:
                out.append(m)
    return out


# ------------------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class RunKey(RecordKey):
    prompt_index: int
    turn: int
    method: str
    temperature: float
    seed: int
    repeat: int


def steps_record(steps) -> dict:
    """Per-step statistics, column by column (compact JSON; `metrics.py` reads these columns)."""
    cols: dict[str, list] = {
        k: []
        for k in (
            "accepted_length",
            "tree_size",
            "tree_depth",
            "estimated_length",
            "calibrated_length",
            "draft_time",
            "build_time",
            "verify_time",
            "other_time",
            "draft_forwards",
            "examined_draft_probs",
            "examined_values",
            "examined_accepted",
            "lookup_nodes",
            "lookup_accepted",
        )
    }
    for s in steps:
        for k in (
            "accepted_length",
            "tree_size",
            "tree_depth",
            "draft_forwards",
            "lookup_nodes",
            "lookup_accepted",
        ):
            cols[k].append(int(getattr(s, k)))
        cols["estimated_length"].append(round(float(s.estimated_length), 5))
        cols["calibrated_length"].append(round(float(s.calibrated_length), 5))
        for k in ("draft_time", "build_time", "verify_time", "other_time"):
            cols[k].append(round(float(getattr(s, k)), 7))
        cols["examined_draft_probs"].append([round(float(p), 5) for p in s.examined_draft_probs])
        cols["examined_values"].append([round(float(v), 5) for v in s.examined_values])
        cols["examined_accepted"].append([int(a) for a in s.examined_accepted])
    return cols


def prepare_output(cfg: BenchConfig) -> tuple[Path, dict | None, dict[RunKey, dict]]:
    """Create/check the output dir; with `resume`, read what is there. Returns (path, old
    header, done runs)."""
    path, header, records = open_results(cfg.out_dir, cfg.resume)
    return path, header, {RunKey.of(r): r for r in records}


# ------------------------------------------------------------------------------------------ running
@dataclass
class Generated:
    """One generation as the benchmark records it."""

    output_ids: list[int]
    wall_time: float  # seconds
    steps: list  # per-step `StepStats` (none for transformers' own generate)
    stop_reason: str
    config: dict


class _Runner:
    """Holds the loaded pair and one decoder per method config for one benchmark run."""

    def __init__(self, cfg: BenchConfig, pair: ModelPair, methods: list[MethodConfig]) -> None:
        self.cfg, self.pair, self.methods = cfg, pair, methods
        self.eos = eos_ids(pair.tokenizer, pair.target.model)
        self.decoders = {
            m.label: SpeculativeDecoder(pair.target, pair.drafter, m.make(), lookup=m.lookup)
            for m in methods
        }
        self.hf = [HF_GENERATE, HF_ASSISTED] if cfg.compare_hf_assisted else []
        self.assistant, self.assistant_how = (
            self._assistant() if cfg.compare_hf_assisted else (None, "")
        )
        self.llama = self._llama_cpp() if cfg.compare_llama_cpp else None
        self.peers = self.hf + (self.llama.labels() if self.llama is not None else [])
        # budget=auto: no fixed size (the label says auto; the report shows the chosen sizes)
        self.budgets = {
            label: None if dec.builder.needs_cost else dec.builder.budget
            for label, dec in self.decoders.items()
        }

    def _assistant(self):
        """transformers' assisted-generation peer: the pair's draft model; for a draft head (which
        transformers cannot run) the embedded target's distilled draft model where the package
        has it (a source checkout: the wheel leaves it out); else prompt lookup (None)."""
        if isinstance(self.pair.drafter, ModelDrafter):
            return self.pair.drafter.lm.model, "the draft model as assistant_model"
        draft = self.pair.draft_name
        not_runnable = f"the pair's draft ({draft}) is not a model transformers can run"
        embedded = self.pair.target_name == EMBEDDED_TARGET
        if embedded and (SHIPPED_DRAFT_DIR / "config.json").is_file():
            model = load_model(
                EMBEDDED_DRAFT, self.pair.target.device, draft_precision(self.cfg.dtype)
            )
            return model, (
                f"the embedded distilled draft ({EMBEDDED_DRAFT}) as assistant_model, since "
                f"{not_runnable}"
            )
        missing = (
            f" and the embedded distilled draft ({EMBEDDED_DRAFT}) is only in a source checkout"
            if embedded
            else ""
        )
        return None, f"prompt lookup (prompt_lookup_num_tokens=10), since {not_runnable}{missing}"

    def _llama_cpp(self) -> LlamaCppPeer:
        """llama.cpp on the target's GGUF file (bench/llama_cpp.py), and on the draft's when the
        pair's draft model has one, as many threads as torch."""
        import torch

        gguf = self.cfg.gguf or gguf_file(self.cfg.target)
        return LlamaCppPeer(
            gguf,
            threads=torch.get_num_threads(),
            context=min(self.pair.target.max_positions, LLAMA_CPP_CONTEXT),
            vocab_size=self.pair.target.vocab_size,
            draft_gguf=gguf_file(self.pair.draft_name)
            if isinstance(self.pair.drafter, ModelDrafter)
            else None,
        )

    def labels(self) -> list[str]:
        return [BASELINE] + [m.label for m in self.methods] + self.peers

    def decode_config(
        self, temperature: float, seed: int, max_new_tokens: int | None = None
    ) -> DecodeConfig:
        sampling = sampling_config(
            temperature > 0, temperature, self.cfg.top_k, self.cfg.top_p, self.cfg.draft_temperature
        )
        return DecodeConfig(
            max_new_tokens=max_new_tokens or self.cfg.max_new_tokens,
            sampling=sampling,
            seed=seed,
            eos_token_ids=self.eos,
        )

    def generate(
        self,
        label: str,
        ids: list[int],
        temperature: float,
        seed: int,
        max_new_tokens: int | None = None,
    ) -> Generated:
        """Run the baseline, a method config or transformers' generate (by
        `label`) on prompt `ids`."""
        dcfg = self.decode_config(temperature, seed, max_new_tokens)
        if label in (HF_GENERATE, HF_ASSISTED):
            return self.hf_generate(label, ids, dcfg)
        if is_llama_cpp(label):
            out, wall, stop = self.llama.generate(
                label,
                ids,
                dcfg.max_new_tokens,
                list(self.eos),
                temperature,
                self.cfg.top_k,
                self.cfg.top_p,
                seed,
            )
            return Generated(out, wall, [], stop, {"builder": self.llama.describe(label)})
        if label == BASELINE:
            result = autoregressive_generate(self.pair.target, ids, dcfg)
        else:
            result = self.decoders[label].generate(ids, dcfg)
        return Generated(
            result.output_ids, result.wall_time, result.steps, result.stop_reason, result.config
        )

    def hf_generate(self, label: str, ids: list[int], dcfg: DecodeConfig) -> Generated:
        """Transformers' own `generate` (plain, or assisted by the draft model / prompt
        lookup). Greedy only."""
        import torch
        from transformers.utils import logging as hf_logging

        model = self.pair.target.model
        kwargs: dict[str, Any] = dict(
            max_new_tokens=dcfg.max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=list(self.eos) or None,
            pad_token_id=(self.eos[0] if self.eos else 0),
        )
        how = "plain"
        if label == HF_ASSISTED:
            if self.assistant is not None:
                kwargs["assistant_model"], how = self.assistant, "assistant_model"
            else:
                kwargs["prompt_lookup_num_tokens"], how = 10, "prompt_lookup_num_tokens=10"
        input_ids = torch.tensor([ids], device=self.pair.target.device)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            with torch.inference_mode():
                t0 = clock()
                seq = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
                wall = clock(input_ids.device) - t0
        finally:
            hf_logging.set_verbosity(verbosity)
        out = [int(t) for t in seq[0, len(ids) :]]
        stop = "eos" if out and out[-1] in self.eos else "length"
        return Generated(out, wall, [], stop, {"builder": f"transformers.generate({how})"})

    def runs_for(self, label: str, temperature: float) -> bool:
        return label not in self.hf or temperature == 0


def turns_to_run(turns: int | None, prompt: Prompt) -> range:
    """Turn numbers (from 1) of `prompt` to benchmark: at most `turns` of them,
    every one for None."""
    return range(1, min(turns or len(prompt.turns), len(prompt.turns)) + 1)


def conversation_ids(
    tokenizer, chat: bool, prompt: Prompt, base_key: RunKey, done: dict[RunKey, dict]
) -> list[int]:
    """Token ids of turn `base_key.turn` of `prompt`: its earlier user turns, each followed by the
    baseline's recorded answer to it (same prompt, temperature, seed and repeat as `base_key`), then
    the new user turn."""
    answers = [
        tokenizer.decode(done[replace(base_key, turn=k)]["output_ids"], skip_special_tokens=True)
        for k in range(1, base_key.turn)
    ]
    return encode_messages(tokenizer, conversation(prompt, answers), chat)


def _plan(
    cfg: BenchConfig, prompts: list[Prompt]
) -> Iterator[tuple[int, Prompt, int, float, int, int]]:
    """(prompt index, prompt, turn, temperature, seed, repeat) in run order; greedy runs use the
    first seed only. A prompt's turns run in order, so turn k's baseline answers to turns 1..k-1
    exist when it starts."""
    for index, prompt in enumerate(prompts):
        for turn in turns_to_run(cfg.turns, prompt):
            for temperature in cfg.temperatures:
                for seed in cfg.seeds[:1] if temperature == 0 else cfg.seeds:
                    for repeat in range(cfg.repeats):
                        yield index, prompt, turn, float(temperature), seed, repeat


def run_bench(cfg: BenchConfig, pair=None, quiet: bool = False) -> Path:
    """Run the sweep, write `results.jsonl` + the report into `cfg.out_dir`;
    return the results path.

    `pair`: an already loaded `api.ModelPair` (tests, notebooks); otherwise `cfg.target`/`cfg.draft`
    are loaded. Ctrl-C stops the run, keeps every finished record, still writes the report, then
    raises `Interrupted` (a KeyboardInterrupt) saying how to continue.
    """
    import torch

    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    methods = expand_methods(cfg.methods)
    prompts = load_prompts(cfg.prompts, cfg.num_prompts)
    path, old_header, done = prepare_output(cfg)
    if pair is None:
        cfg.draft = cfg.draft or default_draft(cfg.target)
        pair = load_pair(
            cfg.target,
            cfg.draft,
            cfg.device,
            cfg.dtype,
            cfg.device_map,
            cfg.max_memory,
            cfg.offload_folder,
            cfg.draft_logits,
            cfg.compile,
        )
    else:
        cfg.draft = cfg.draft or pair.draft_name
    runner = _Runner(cfg, pair, methods)
    header = _header(cfg, runner)
    if old_header is not None:
        check_resume_compatible(old_header, header, path, RESUME_KEYS)
    first_ids = {
        i: encode_messages(pair.tokenizer, conversation(p, []), cfg.chat)
        for i, p in enumerate(prompts)
    }
    _check_lengths(runner, first_ids)

    def runs(results: ResultsFile) -> None:
        if old_header is None:
            results.write(header)
        elif cfg.compare_hf_assisted:
            results.write(_hf_note(runner))
        _warm_up(runner, first_ids[0], quiet)
        _sweep(runner, prompts, first_ids, done, results, quiet)

    return record_runs(path, Path(cfg.out_dir), runs, _write_report, quiet)


def _check_lengths(runner: _Runner, first_ids: dict[int, list[int]]) -> None:
    """Fail before the first run if a prompt + max_new_tokens + the deepest tree would
    not fit the context."""
    depth = max([d.builder.depth_limit for d in runner.decoders.values()] + [0]) + 1
    longest = max(first_ids.values(), key=len)
    dcfg = runner.decode_config(0.0, 0)
    check_context(len(longest), dcfg, runner.pair.target.max_positions, depth)
    check_context(len(longest), dcfg, runner.pair.drafter.max_positions, depth, who="draft")


def _header(cfg: BenchConfig, runner: _Runner) -> dict:
    builders = {m.label: runner.decoders[m.label].builder for m in runner.methods}
    methods = [
        {
            "label": m.label,
            "name": m.name,
            "params": dict(m.params),
            "budget": runner.budgets[m.label],
            "describe": builders[m.label].describe(),
        }
        for m in runner.methods
    ]
    record = {
        "kind": "header",
        "schema": SCHEMA_VERSION,
        "config": cfg.to_json(),
        "methods": methods,
        **pair_fields(runner.pair),
        "draft_logits": _draft_logits(runner.pair.drafter),
        "cost_curve": cost_curve_for(
            runner.pair.target, runner.pair.drafter, greedy=cfg.temperatures[0] == 0
        ).as_dict(),
        "timestamp": utc_timestamp(),
    }
    notes = [_hf_note(runner)["text"]] if cfg.compare_hf_assisted else []
    if runner.llama is not None:
        notes.append(_llama_note(runner))
    if notes:
        record["notes"] = notes
    return record


def _draft_logits(drafter) -> str | None:
    """A draft head's precision ("int8 layer and logits", "int8 logits" or "float"; older results
    files: "int8" or "float" for the logits); None for other drafters."""
    head = getattr(drafter, "head", None)
    if head is None:
        return None
    if head.int8_layers:
        return "int8 layer and logits" if head.int8_logits else "int8 layer"
    return "int8 logits" if head.int8_logits else "float"


def _hf_note(runner: _Runner) -> dict:
    how = runner.assistant_how
    return {
        "kind": "note",
        "text": f"{HF_ASSISTED}: transformers generate() with {how}; greedy runs only "
        f"(temperature > 0 skipped); {HF_GENERATE} is plain transformers generate().",
    }


def _llama_note(runner: _Runner) -> str:
    llama = runner.llama
    runs = "; ".join(f"`{label}`: {llama.describe(label)}" for label in llama.labels())
    return (
        f"{runs}. The same prompt tokens; a different model numerically (its GGUF's weights, "
        "8-bit activations), so its tokens are not compared with plain decoding's: its "
        "speculative runs' 'greedy identical' compares them with its own plain runs."
    )


def _warm_up(runner: _Runner, ids: list[int], quiet: bool) -> None:
    """A few short unrecorded generations per method: first-call allocations and kernel selection
    stay out of timing."""
    if runner.cfg.warmup == 0:
        return
    temperature = runner.cfg.temperatures[0]
    with progress_bar(not quiet) as progress:
        task = progress.add_task("warm-up", total=runner.cfg.warmup * len(runner.labels()), info="")
        for label in runner.labels():
            for _ in range(runner.cfg.warmup):
                if runner.runs_for(label, 0.0):
                    runner.generate(
                        label,
                        ids,
                        0.0 if label in runner.hf else temperature,
                        runner.cfg.seeds[0],
                        min(runner.cfg.max_new_tokens, 16),
                    )
                progress.advance(task)


def _sweep(
    runner: _Runner,
    prompts: list[Prompt],
    first_ids: dict[int, list[int]],
    done: dict[RunKey, dict],
    results: ResultsFile,
    quiet: bool,
) -> None:
    cfg = runner.cfg
    plan = list(_plan(cfg, prompts))
    labels = runner.labels()
    total = sum(runner.runs_for(lab, t) for *_, t, _s, _r in plan for lab in labels)

    def runs():
        for index, prompt, turn, temperature, seed, repeat in plan:
            base_key = RunKey(index, turn, BASELINE, temperature, seed, repeat)
            # later turns follow the target's own (baseline) earlier answers, recorded by then
            ids = (
                first_ids[index]
                if turn == 1
                else conversation_ids(runner.pair.tokenizer, cfg.chat, prompt, base_key, done)
            )
            for label in labels:
                if not runner.runs_for(label, temperature):
                    continue
                key = RunKey(index, turn, label, temperature, seed, repeat)
                description = f"prompt {index + 1}/{len(prompts)} t{turn} T={temperature:g} {label}"
                yield key, description, functools.partial(_run_one, runner, key, prompt, ids, done)

    record_missing(results, done, runs(), total, "bench", quiet)


def _run_one(
    runner: _Runner, key: RunKey, prompt: Prompt, ids: list[int], done: dict[RunKey, dict]
) -> dict:
    baseline = done.get(replace(key, method=BASELINE))
    run = runner.generate(key.method, ids, key.temperature, key.seed)
    same = None
    # llama.cpp runs another model (the GGUF's own arithmetic): its speculative runs are compared
    # with its own plain run (bench/llama_cpp.py), its plain run with nothing
    if is_llama_cpp(key.method):
        baseline = None if key.method == LLAMA_CPP else done.get(replace(key, method=LLAMA_CPP))
    if key.temperature == 0 and key.method != BASELINE and baseline is not None:
        same = run.output_ids == baseline["output_ids"]
    name = key.method.split(":")[0]
    return {
        "kind": "run",
        **asdict(key),
        "name": name,
        "budget": runner.budgets.get(key.method),
        "prompt_id": prompt.id,
        "category": prompt.category,
        "prompt_len": len(ids),
        "new_tokens": len(run.output_ids),
        "wall_time": round(run.wall_time, 6),
        "stop_reason": run.stop_reason,
        "output_ids": run.output_ids,
        "same_as_baseline": same,
        "config": run.config,
        "steps": steps_record(run.steps),
    }


def _write_report(path: Path, out_dir: Path) -> Path:
    return write_report([path], out_dir)


# ---------------------------------------------------------------------------------------- CLI shell
def parse_number_list(text: str, kind: type, what: str) -> list:
    """`"0,0.6"` -> [0.0, 0.6]; one-line error on anything else."""
    try:
        values = [kind(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise ArborError(
            f"{what} must be a comma-separated list of numbers, e.g. 0,0.6; got {text!r}"
        ) from None
    if not values:
        raise ArborError(f"give at least one value for {what}")
    return values


def parse_turns(text: str) -> int | None:
    """`--turns`: `"2"` -> 2, `"all"` -> None (every turn of each prompt); one-line
    error on anything else."""
    value = text.strip().lower()
    if value == "all":
        return None
    if value.isdecimal() and value.isascii() and int(value) >= 1:
        return int(value)
    raise ArborError(f"--turns must be a whole number >= 1 or 'all', got {text!r}")
