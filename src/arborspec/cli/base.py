"""The `arborspec` Typer app, its two consoles, and one-line errors for every command."""

from __future__ import annotations

import functools

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import ArborError, Interrupted

app = typer.Typer(
    add_completion=False, no_args_is_help=False, help="Lossless tree-based speculative decoding."
)
err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


def friendly(fn):
    """Turn ArborError into a one-line message (exit 2) and Ctrl-C into a clean exit (130); a tool
    stopped by Ctrl-C (`Interrupted`) says where its work is kept and how to continue."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ArborError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)  # "[serve]" kept
            raise typer.Exit(2) from None
        except KeyboardInterrupt as exc:
            err.print(str(exc) if isinstance(exc, Interrupted) else "interrupted", highlight=False)
            raise typer.Exit(130) from None

    return wrapper
