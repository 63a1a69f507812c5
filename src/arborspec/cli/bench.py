"""`arborspec bench`, `arborspec bench-batch`, `arborspec bench-serve` and `arborspec report`: the
benchmark against plain decoding, the concurrency benchmark against plain batched decoding, the
server's load test, and their reports."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import ArborError
from .base import app, err, friendly
from .options import ModelOptions, SamplingOptions, grouped


@app.command()
@friendly
@grouped("sampling", SamplingOptions, only=("top_k", "top_p", "draft_temperature"))
@grouped("models", ModelOptions)
def bench(
    method: list[str] | None = typer.Option(
        None,
        "--method",
        "-m",
        help="method sweep spec, "
        "repeatable: dyspec:budget=8,16,32 or "
        "sequoia:budget=16:max_depth=4,6 (default: this "
        "device's generate defaults, e.g. "
        "dyspec:budget=2:lookup=6)",
    ),
    temperatures: str = typer.Option("0", "--temperatures", help="comma list, e.g. 0,0.6"),
    prompts: str = typer.Option(
        "mt-bench",
        "--prompts",
        help="mt-bench, humaneval, a JSONL/text file, or hf:NAME[:CONFIG][@SPLIT]",
    ),
    num_prompts: int | None = typer.Option(
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
    compare_llama_cpp: bool = typer.Option(
        False,
        "--compare-llama-cpp",
        help="also time llama.cpp on the target's GGUF file: plain decoding, prompt-lookup "
        "speculation and, when the draft model has a GGUF file, speculation with it (needs "
        "llama-cpp-python installed)",
    ),
    gguf: str | None = typer.Option(
        None,
        "--gguf",
        help="the GGUF file llama.cpp runs (default: a built-in target's own, or the --target "
        ".gguf path)",
    ),
    turns: str = typer.Option(
        "1",
        "--turns",
        help="user turns per prompt, at most: 1 = first "
        "turns, 2 = MT-Bench's second turns too, all = every turn of each "
        "prompt (turn k follows the baseline's own earlier answers)",
    ),
    no_chat: bool = typer.Option(False, "--no-chat"),
    threads: int | None = typer.Option(None, "--threads", help="torch CPU threads"),
    models: ModelOptions = ModelOptions(),
    sampling: SamplingOptions = SamplingOptions(),
) -> None:
    """Benchmark methods against plain decoding (same process, interleaved); writes JSONL results,
    tables and plots."""
    from ..bench.run import BenchConfig, parse_number_list, parse_turns, run_bench
    from ..catalog import int8_by_default
    from ..common.extras import require_plots
    from ..defaults import choose
    from ..models import default_draft, is_draft_model

    require_plots()  # before any work: the report ends with its plots
    models.check_placement()
    if not method:  # the device's defaults, as `arborspec generate` runs them
        d = choose(
            models.device,
            int8_by_default(models.target),
            models.device_map,
            models.max_memory,
            draft_model=is_draft_model(models.draft or default_draft(models.target)),
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
        compare_llama_cpp=compare_llama_cpp,
        gguf=gguf,
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


@app.command("bench-batch")
@friendly
@grouped("sampling", SamplingOptions, only=("top_k", "top_p", "draft_temperature"))
@grouped(
    "models",
    ModelOptions,
    only=("target", "draft", "device", "dtype", "draft_logits", "compile"),
)
def bench_batch(
    method: list[str] | None = typer.Option(
        None,
        "--method",
        "-m",
        help="method sweep spec, repeatable: a builder as `bench` takes it "
        "(dyspec:budget=1,2,3:lookup=6), or shared:max_nodes=8[:max_depth=D][:budget=B|auto]"
        ":lookup=6 for one node budget over the whole batch (default: this device's generate "
        "defaults); plain batched decoding always runs as the baseline",
    ),
    concurrency: str = typer.Option(
        "1,2,4,8,16", "--concurrency", help="comma list of client counts"
    ),
    arrival: str = typer.Option(
        "burst,staggered",
        "--arrival",
        help="burst: every client starts at once; staggered: client i starts i plain steps "
        "later; each client sends its next prompt as soon as its previous request ends",
    ),
    temperatures: str = typer.Option("0", "--temperatures", help="comma list, e.g. 0,0.6"),
    prompts: str = typer.Option(
        "mt-bench",
        "--prompts",
        help="mt-bench (the stratified selection `bench` uses), humaneval, a JSONL/text file, or "
        "hf:NAME[:CONFIG][@SPLIT]; first turns",
    ),
    num_prompts: int | None = typer.Option(
        16, "--num-prompts", help="first N prompts of the set: the requests of every run"
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    repeats: int = typer.Option(1, "--repeats"),
    warmup: int = typer.Option(1, "--warmup", help="untimed warm-up runs per method"),
    sequential: bool = typer.Option(
        False,
        "--sequential",
        help="also time plain decoding one request after another (concurrency 1, burst)",
    ),
    out_dir: Path = typer.Option(
        Path("runs/bench-batch"),
        "--out",
        "-o",
        help="results folder (results.jsonl, report.md, concurrency.png, summary.json)",
    ),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run in --out"),
    no_chat: bool = typer.Option(False, "--no-chat"),
    threads: int | None = typer.Option(None, "--threads", help="torch CPU threads"),
    models: ModelOptions = ModelOptions(),
    sampling: SamplingOptions = SamplingOptions(),
) -> None:
    """Benchmark batched decoding with concurrent clients: every method against plain batched
    decoding (same process, same requests, interleaved); writes JSONL results, a table and a
    plot."""
    from ..bench.batch_config import ConcurrencyConfig, parse_arrivals, parse_concurrency
    from ..bench.batch_runner import run_concurrency
    from ..bench.run import parse_number_list
    from ..catalog import int8_by_default
    from ..common.extras import require_plots
    from ..defaults import choose
    from ..models import default_draft, is_draft_model

    require_plots()  # before any work: the report ends with its plot
    levels = parse_concurrency(concurrency)
    arrivals = parse_arrivals(arrival)
    if not method:  # the device's defaults, as `arborspec generate` runs them
        d = choose(
            models.device,
            int8_by_default(models.target),
            draft_model=is_draft_model(models.draft or default_draft(models.target)),
        )
        method = [f"{d.method}:budget={d.budget}:lookup={d.lookup}"]
    cfg = ConcurrencyConfig(
        target=models.target,
        draft=models.draft,
        draft_logits=models.draft_logits,
        methods=list(method),
        temperatures=parse_number_list(temperatures, float, "--temperatures"),
        prompts=prompts,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        concurrency=levels,
        arrivals=arrivals,
        repeats=repeats,
        warmup=warmup,
        sequential=sequential,
        device=models.device,
        dtype=models.resolved_dtype,
        out_dir=out_dir,
        resume=resume,
        chat=not no_chat,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        draft_temperature=sampling.draft_temperature,
        threads=threads,
        compile=models.compile,
    )
    err.print(f"results: {run_concurrency(cfg)}", highlight=False)


@app.command(
    "bench-serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
@friendly
def bench_serve(
    ctx: typer.Context,
    url: str | None = typer.Option(
        None, "--url", help="load an existing server (default: start `arborspec serve` here)"
    ),
    api_key: str | None = typer.Option(None, "--api-key", envvar="ARBORSPEC_API_KEY"),
    concurrency: str = typer.Option("1,4,16", "--concurrency", help="comma list of clients"),
    modes: str = typer.Option(
        "speculative,plain",
        "--modes",
        help="speculative: the server's own settings; plain: `speculative: false`",
    ),
    prompts: str = typer.Option(
        "mt-bench", "--prompts", help="mt-bench, humaneval, a JSONL/text file; first turns"
    ),
    num_prompts: int | None = typer.Option(16, "--num-prompts", help="requests per cell"),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n"),
    temperature: float = typer.Option(0.0, "--temperature", "-t"),
    repeats: int = typer.Option(1, "--repeats"),
    warmup: int = typer.Option(1, "--warmup", help="untimed warm-up rounds per mode"),
    out_dir: Path = typer.Option(
        Path("runs/bench-serve"), "--out", "-o", help="results.jsonl, report.md, summary.json"
    ),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run in --out"),
) -> None:
    """Load-test the server with concurrent `openai` clients: speculative requests against the
    same server's plain ones (`speculative: false`). Options after `--` go to `arborspec serve`,
    e.g. `arborspec bench-serve -- --dtype int8 --per-request-budget`."""
    from ..bench.batch_config import parse_concurrency
    from ..bench.serve_load import ServeLoadConfig, run_serve_load

    try:
        import openai  # noqa: F401
    except ImportError:
        raise ArborError("bench-serve needs the openai client: pip install openai") from None
    cfg = ServeLoadConfig(
        url=url,
        api_key=api_key,
        server_args=list(ctx.args),
        prompts=prompts,
        num_prompts=num_prompts,
        max_tokens=max_tokens,
        temperature=temperature,
        concurrency=parse_concurrency(concurrency),
        modes=[m.strip() for m in modes.split(",") if m.strip()],
        repeats=repeats,
        warmup=warmup,
        out_dir=out_dir,
        resume=resume,
    )
    err.print(f"results: {run_serve_load(cfg)}", highlight=False)


@app.command()
@friendly
def report(
    results: list[Path] = typer.Argument(
        ...,
        help="results.jsonl files written by `arborspec bench`, or one written by "
        "`arborspec bench-batch`",
    ),
    out_dir: Path = typer.Option(Path("runs/report"), "--out", "-o"),
) -> None:
    """Re-render tables and plots from saved results, without running any model."""
    from ..bench.batch_report import is_concurrency_results, write_concurrency_report
    from ..bench.report import write_report
    from ..common.extras import require_plots

    require_plots()  # before any work: the report ends with its plots
    batch = [p for p in results if is_concurrency_results(p)]
    if batch and len(results) > 1:
        raise ArborError(
            f"{batch[0]} holds `arborspec bench-batch` results: render it alone, one file at a time"
        )
    if batch:
        path = write_concurrency_report(batch[0], out_dir)
    else:
        path = write_report(list(results), out_dir)
    err.print(f"report: {path}", highlight=False)
