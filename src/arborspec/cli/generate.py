"""`arborspec generate`, the bare `arborspec` demo, and `arborspec methods`."""

from __future__ import annotations

import contextlib
import inspect
import signal
import sys

import typer

from ..errors import ArborError
from .base import app, err, friendly, out
from .options import ModelOptions, SamplingOptions, grouped

DEMO_PROMPT = "Explain in a few sentences why the sky is blue."
DEMO_NEW_TOKENS = 64
WARMUP_TOKENS = 16  # new tokens of the untimed warm-up generations before a --compare-ar timing


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context) -> None:
    """Lossless tree-based speculative decoding; with no command, answer a demo prompt."""
    if ctx.invoked_subcommand is None:  # plain `arborspec`: `arborspec generate PROMPT -n 64`
        command = ctx.command.get_command(ctx, "generate")
        args = [DEMO_PROMPT, "-n", str(DEMO_NEW_TOKENS)]
        with command.make_context("generate", args, parent=ctx) as sub:
            command.invoke(sub)


class _Streamer:
    """Prints newly committed tokens as text, decoding the whole output each time (safe for
    multi-byte characters).

    While it streams, Ctrl-C only raises a flag (`catch_ctrl_c`); the next step boundary stops the
    generation (a KeyboardInterrupt from here becomes `GenerationInterrupted` with everything
    committed), so the interrupt never lands inside a model or tokenizer call.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids, self.shown, self.stop = tokenizer, [], "", False

    def __call__(self, new: list[int]) -> None:
        self.ids += new
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.startswith(self.shown):
            sys.stdout.write(text[len(self.shown) :])
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
@grouped("sampling", SamplingOptions)
@grouped("models", ModelOptions)
def generate(
    prompt: str = typer.Argument(
        ..., help="the prompt (the chat template is applied for instruct models)"
    ),
    method: str | None = typer.Option(
        None, "--method", "-m", help="tree builder, see `arborspec methods` (default: dyspec)"
    ),
    budget: str | None = typer.Option(
        None,
        "--budget",
        "-b",
        help="tree size (draft nodes per "
        "step), or auto: sized per step by the measured cost "
        "curve (dyspec, dyspec-threshold, opt-tree); default: 3 "
        "on CPU, 32 on a GPU",
    ),
    param: list[str] = typer.Option(
        [], "--param", "-p", help="builder parameter name=value (repeatable)"
    ),
    verifier: str | None = typer.Option(
        None, "--verifier", help="override the verifier (lossy pairings are refused)"
    ),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", "-n"),
    no_chat: bool = typer.Option(False, "--no-chat", help="feed the prompt as raw text"),
    lookup: int | None = typer.Option(
        None,
        "--lookup",
        help="graft up to this many tokens "
        "copied from earlier in the context onto each tree "
        "(default 6; 0: off; never changes the output's "
        "distribution)",
    ),
    compare_ar: bool = typer.Option(
        False,
        "--compare-ar",
        help="also run plain decoding of the "
        "same target and print the speedup (both warmed up first, "
        "untimed)",
    ),
    models: ModelOptions = ModelOptions(),
    sampling: SamplingOptions = SamplingOptions(),
) -> None:
    """Generate a continuation with speculative decoding, streaming the text and printing
    statistics.

    The first line (stderr) says what runs: method, tree size, lookup, target, precision, draft,
    baseline."""
    from transformers.utils import logging as hf_logging

    from ..api import SpeculativeGenerator
    from ..builders import parse_budget, parse_params
    from ..engine.sampling import SamplingConfig
    from ..engine.stats import GenerationInterrupted

    SamplingConfig(
        sampling.temperature, sampling.top_k, sampling.top_p, sampling.draft_temperature
    )  # bad values fail before any model loads
    models.check_placement()
    if not prompt.strip():
        raise ArborError("the prompt is empty: give some text to continue")
    if lookup is not None and lookup < 0:
        raise ArborError(f"--lookup must be >= 0 tokens (0: off), got {lookup}")
    params = parse_params(param)
    own = {
        n
        for n, q in inspect.signature(SpeculativeGenerator).parameters.items()
        if q.kind is not q.VAR_KEYWORD
    }
    taken = sorted(set(params) & own)  # the generator's own options, not the builder's
    if taken:
        name = taken[0]
        how = "" if name in ("pair", "announce") else f": use the --{name.replace('_', '-')} option"
        raise ArborError(f"--param {name}=... is not a builder parameter{how}")

    hf_logging.disable_progress_bar()  # the first line and the text, not a weight-loading bar

    def announce(line: str) -> None:  # before the models load: what is about to run
        err.print(line, style="dim", markup=False, highlight=False)

    gen = SpeculativeGenerator(
        target=models.target,
        draft=models.draft,
        method=method,
        device=models.device,
        dtype=models.dtype,
        verifier=verifier,
        budget=parse_budget(budget),
        device_map=models.device_map,
        max_memory=models.max_memory,
        offload_folder=models.offload_folder,
        draft_logits=models.draft_logits,
        compile=models.compile,
        lookup=lookup,
        announce=announce,
        **params,
    )
    settings = dict(
        do_sample=sampling.temperature > 0,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        draft_temperature=sampling.draft_temperature,
        seed=sampling.seed,
        max_new_tokens=max_new_tokens,
        chat=not no_chat,
    )
    if compare_ar:  # first calls pay one-off costs (allocations, caches); time neither with them
        warm = dict(settings, max_new_tokens=min(max_new_tokens, WARMUP_TOKENS))
        gen.generate(prompt, **warm)
        gen.generate_autoregressive(prompt, **plain(warm))
    try:
        with _Streamer(gen.tokenizer).catch_ctrl_c() as streamer:
            result = gen.generate(prompt, on_tokens=streamer, **settings)
    except GenerationInterrupted as stopped:  # Ctrl-C: what was generated, with its statistics
        sys.stdout.write("\n")
        err.print(stopped.result.summary() + " (interrupted)", highlight=False)
        raise typer.Exit(130) from None
    sys.stdout.write("\n")
    err.print(result.summary(), highlight=False)
    if compare_ar:
        base = gen.generate_autoregressive(prompt, **plain(settings))
        same = (
            "identical tokens"
            if base.output_ids == result.output_ids
            else "different tokens (sampling)"
        )
        err.print(
            f"autoregressive: {base.new_tokens} tokens, {base.tokens_per_second:.1f} tok/s; "
            f"speedup {result.speedup_over(base):.2f}x ({same})",
            highlight=False,
        )


def plain(settings: dict) -> dict:
    """`generate`'s settings for plain decoding, which has no draft side."""
    return {k: v for k, v in settings.items() if k != "draft_temperature"}


@app.command()
@friendly
def methods() -> None:
    """List the registered tree builders, their parameters and their verifier pairing."""
    import dataclasses

    from ..builders import builder_class, builder_names

    for name in builder_names():
        cls = builder_class(name)
        fields = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls) if f.init)
        mode = cls.children_mode.replace("_", " ")
        out.print(f"[bold]{name}[/]  ({mode})  {cls.paper}\n    {fields}", highlight=False)
