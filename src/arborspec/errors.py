"""The one exception type users see: a one-line message that says what to do.

The CLI catches `ArborError` and prints its message without a traceback; the
Python API lets it propagate so callers can handle it.
"""


class ArborError(ValueError):
    """Bad input or an unusable environment, with a message that says how to fix it."""
