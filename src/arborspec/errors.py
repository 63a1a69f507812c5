"""The exceptions users see: a one-line message that says what to do.

The CLI catches `ArborError` and prints its message without a traceback (exit 2),
and prints an `Interrupted`'s message on Ctrl-C (exit 130); the Python API lets
both propagate so callers can handle them.
"""


class ArborError(ValueError):
    """Bad input or an unusable environment, with a message that says how to fix it."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a long-running tool after its work so far was saved: still a
    `KeyboardInterrupt`, with a one-line message saying where that work is kept and how to
    continue it (`--resume`)."""
