"""`arborspec dev ...`: the commands for whoever works on arborspec itself, not needed to generate,
serve or benchmark: the randomized soak, Sequoia shape files, the training prompts' overlap with
the benchmark sets, and the profile of a forward or a step."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer import Option as Opt

from ..errors import ArborError
from .base import app, err, friendly
from .options import ModelOptions, check_positive, grouped

dev = typer.Typer(
    no_args_is_help=True,
    help="Developer tools: the randomized soak, Sequoia shapes, prompt overlap, profiles.",
)
app.add_typer(dev, name="dev")


@dev.command()
@friendly
def soak(
    steps: int = Opt(10_000, "--steps", help="speculative steps to check (over many random cases)"),
    seed: int = Opt(0, "--seed"),
    replay: int | None = Opt(
        None, "--replay", help="re-run one case by the case seed a failure printed"
    ),
    out: Path | None = Opt(None, "--out", "-o", help="write the report as JSON"),
) -> None:
    """Randomized soak on tiny random Llama pairs: builders, budgets, sampling settings, prompts;
    every invariant checked."""
    from ..offline.soak import soak as run

    if steps < 1:
        raise ArborError(f"--steps must be >= 1, got {steps}")
    report = run(steps, seed, replay=replay)
    err.print(
        f"soak: {report.cases} cases, {report.steps} steps, {report.tokens} tokens, "
        f"{len(report.failures)} failures, {report.seconds:.0f} s",
        highlight=False,
    )
    for f in report.failures:
        err.print(
            f"  FAIL case {f.case_seed} step {f.step}: {f.description}: {f.message}\n"
            f"    reproduce: arborspec dev soak --replay {f.case_seed}",
            highlight=False,
        )
    if out is not None:
        out.write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    if report.failures:
        raise typer.Exit(1)


@dev.command("sequoia-shape")
@friendly
def sequoia_shape(
    calibration_file: Path = typer.Argument(..., help="a file written by `arborspec calibrate`"),
    out: Path = Opt(Path("sequoia-shape.json"), "--out", "-o"),
    size: int | None = Opt(None, "--size", help="tree size; omit for the hardware-aware choice"),
    depth: int | None = Opt(None, "--depth"),
    max_size: int = Opt(128, "--max-size"),
    max_depth: int = Opt(12, "--max-depth"),
) -> None:
    """Write the optimal Sequoia tree shape (DP, App. C.2.2) for a calibration; use it with
    -m sequoia -p shape=FILE."""
    from ..offline.calibrate import write_sequoia_shape

    shape, meta = write_sequoia_shape(
        calibration_file, out, size=size, depth=depth, max_size=max_size, max_depth=max_depth
    )
    facts = ", ".join(f"{k}={v}" for k, v in meta.items() if isinstance(v, (int, float, str)))
    err.print(
        f"shape of {len(shape)} nodes, depth {max(len(p) for p in shape)} -> {out} ({facts})",
        highlight=False,
    )


@dev.command("prompt-overlap")
@friendly
@grouped("models", ModelOptions, only=("target",))
def prompt_overlap(
    data_dir: Path = Opt(
        ..., "--data-dir", help="head data shards (train-head's <work>/data-self-instruct)"
    ),
    ngram: int = Opt(8, "--ngram", help="words in the shared sequences counted"),
    out: Path | None = Opt(
        None, "--out", "-o", help="write the JSON here (default: stdout only)"
    ),
    models: ModelOptions = ModelOptions(),
) -> None:
    """Do training prompts overlap the benchmark sets? Exact matches and shared word n-grams of
    the user messages in head data shards against every MT-Bench turn and HumanEval prompt
    (`--target`: whose tokenizer rendered them)."""
    from ..common.jsonfiles import report_json
    from ..offline.prompt_overlap import shard_overlap

    check_positive(ngram=ngram)
    report_json(shard_overlap(data_dir, models.target, ngram), str(out) if out else None)


PROFILES = ("forward", "steps")


@dev.command()
@friendly
@grouped("models", ModelOptions, only=("target", "draft", "draft_logits"))
def profile(
    what: str = typer.Argument(
        ...,
        help="forward: a target forward of each row count by operator group and submodule, per "
        "precision; steps: plain decoding and each -m method, every step split by phase",
    ),
    dtype: str | None = Opt(
        None,
        "--dtype",
        help="forward: the precisions compared, comma-separated (default float32,int8); steps: "
        "the target's (default int8)",
    ),
    sizes: str = Opt("1,4,16", "--sizes", help="forward: the row counts, comma-separated"),
    context: int = Opt(200, "--context", help="forward: cached random tokens before the rows"),
    repeats: int = Opt(21, "--repeats", help="forward: timed forwards per precision and size"),
    rounds: int = Opt(10, "--rounds", help="forward: profiled forwards per precision and size"),
    traced: bool = Opt(
        False, "--traced", help="forward: replay an int8 target's forwards (default: eager)"
    ),
    method: list[str] = Opt(
        [],
        "--method",
        "-m",
        help="steps: a method as `arborspec bench` takes it, one value per parameter "
        "(repeatable; default dyspec:budget=1:lookup=6)",
    ),
    prompts: str = Opt("mt-bench", "--prompts", help="steps: the prompt set, as `bench` takes it"),
    num_prompts: int = Opt(8, "--num-prompts", help="steps: prompts (first turns)"),
    max_new_tokens: int = Opt(128, "--max-new-tokens", help="steps: new tokens per prompt"),
    temperature: float = Opt(0.0, "--temperature", "-t", help="steps: 0 = greedy; > 0 samples"),
    threads: int = Opt(0, "--threads", help="torch threads (0 = torch's default)"),
    out: Path | None = Opt(
        None, "--out", "-o", help="write the JSON here (default: stdout only)"
    ),
    models: ModelOptions = ModelOptions(),
) -> None:
    """Where the time goes on the CPU: a target forward by operator (torch.profiler), or a
    speculative step by phase against a plain token (bench/profile.py)."""
    import torch

    from ..bench.profile import (
        ForwardProfileConfig,
        StepSplitConfig,
        profile_forwards,
        split_steps,
    )
    from ..bench.run import parse_number_list
    from ..common.jsonfiles import report_json
    from ..common.provenance import stamp

    if what not in PROFILES:
        raise ArborError(f"profile {what!r}: use forward or steps")
    if threads < 0:
        raise ArborError(f"--threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)

    def show(row: dict) -> None:
        err.print(json.dumps(row), highlight=False, markup=False)

    if what == "forward":
        dtypes = tuple(d.strip() for d in (dtype or "float32,int8").split(",") if d.strip())
        cfg = ForwardProfileConfig(
            target=models.target,
            dtypes=dtypes,
            sizes=tuple(parse_number_list(sizes, int, "--sizes")),
            context=context,
            repeats=repeats,
            rounds=rounds,
            traced=traced,
        )
        result = profile_forwards(cfg, show)
    else:
        if dtype is not None and "," in dtype:
            raise ArborError("profile steps runs one precision: give --dtype one value")
        result = split_steps(
            StepSplitConfig(
                target=models.target,
                draft=models.draft,
                dtype=dtype or "int8",
                draft_logits=models.draft_logits,
                methods=tuple(method) or StepSplitConfig.methods,
                prompts=prompts,
                num_prompts=num_prompts,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
            ),
            show,
        )
    report_json({**result, **stamp()}, str(out) if out else None)
