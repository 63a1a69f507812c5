"""`arborspec bench` and `arborspec report`: the benchmark against plain decoding and its report."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .base import app, err, friendly
from .options import ModelOptions, SamplingOptions, grouped


@app.command()
@friendly
@grouped("sampling", SamplingOptions, only=("top_k", "top_p", "draft_temperature"))
@grouped("models", ModelOptions)
def bench(
    method: Optional[list[str]] = typer.Option(
        None,
        "--method",
        "-m",
        help="method sweep spec, "
        "repeatable: dyspec:budget=8,16,32 or "
        "sequoia:budget=16:max_depth=4,6 (default: this "
        "device's generate defaults, e.g. "
        "dyspec:budget=3:lookup=6)",
    ),
    temperatures: str = typer.Option("0", "--temperatures", help="comma list, e.g. 0,0.6"),
    prompts: str = typer.Option(
        "mt-bench",
        "--prompts",
        help="mt-bench, humaneval, a JSONL/text file, or hf:NAME[:CONFIG][@SPLIT]",
    ),
    num_prompts: Optional[int] = typer.Option(
        10, "--num-prompts", help="first N prompts of the set"
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    seeds: str = typer.Option("0", "--seeds", help="comma list (temperature > 0 only)"),
    repeats: int = typer.Option(1, "--repeats"),
    warmup: int = typer.Option(1, "--warmup", help="untimed warm-up generations per method"),
    out_dir: Path = typer.Option(
        Path("runs/bench"), "--out", "-o", help="results folder (results.jsonl, report.md, plots)"
    ),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run in --out"),
    compare_hf_assisted: bool = typer.Option(
        False,
        "--compare-hf-assisted",
        help="also time transformers generate() and assisted generation",
    ),
    turns: str = typer.Option(
        "1",
        "--turns",
        help="user turns per prompt, at most: 1 = first "
        "turns, 2 = MT-Bench's second turns too, all = every turn of each "
        "prompt (turn k follows the baseline's own earlier answers)",
    ),
    no_chat: bool = typer.Option(False, "--no-chat"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads"),
    models: ModelOptions = ModelOptions(),
    sampling: SamplingOptions = SamplingOptions(),
) -> None:
    """Benchmark methods against plain decoding (same process, interleaved); writes JSONL results,
    tables and plots."""
    from ..bench.run import BenchConfig, parse_number_list, parse_turns, run_bench
    from ..defaults import choose
    from ..models import EMBEDDED_TARGET

    models.check_placement()
    if not method:  # the device's defaults, as `arborspec generate` runs them
        d = choose(
            models.device, models.target == EMBEDDED_TARGET, models.device_map, models.max_memory
        )
        method = [f"{d.method}:budget={d.budget}:lookup={d.lookup}"]
    cfg = BenchConfig(
        target=models.target,
        draft=models.draft,
        draft_logits=models.draft_logits,
        methods=list(method),
        temperatures=parse_number_list(temperatures, float, "--temperatures"),
        prompts=prompts,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        seeds=parse_number_list(seeds, int, "--seeds"),
        repeats=repeats,
        device=models.device,
        dtype=models.resolved_dtype,
        warmup=warmup,
        out_dir=out_dir,
        resume=resume,
        compare_hf_assisted=compare_hf_assisted,
        turns=parse_turns(turns),
        chat=not no_chat,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        draft_temperature=sampling.draft_temperature,
        threads=threads,
        device_map=models.device_map,
        max_memory=models.max_memory,
        offload_folder=str(models.offload_folder) if models.offload_folder else None,
        compile=models.compile,
    )
    err.print(f"results: {run_bench(cfg)}", highlight=False)


@app.command()
@friendly
def report(
    results: list[Path] = typer.Argument(
        ..., help="results.jsonl files written by `arborspec bench`"
    ),
    out_dir: Path = typer.Option(Path("runs/report"), "--out", "-o"),
) -> None:
    """Re-render tables and plots from saved results, without running any model."""
    from ..bench.report import write_report

    path = write_report(list(results), out_dir)
    err.print(f"report: {path}", highlight=False)
