"""Give freed heap memory back to the operating system during long CPU generations.

Why: every step grows the KV caches by a tree's rows and crops them back (engine/adapter.py),
so tensors of slowly growing sizes are allocated and freed thousands of times. glibc's
allocator keeps such freed blocks in its heap rather than returning them, and a long
generation's resident memory then grows beyond its KV cache (docs/evaluation.md (e):
the 4,096-token runs). `malloc_trim(0)` returns that memory, for a few milliseconds per
call. Speculative and plain decoding both call it every `TRIM_EVERY`
committed tokens, so comparisons stay fair.

Elsewhere than Linux with glibc (or on a CUDA device, whose memory has its own allocator)
this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

TRIM_EVERY = 128  # committed tokens between two trims


def _load_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (e.g. musl has no malloc_trim)
        return None


_TRIM = _load_trim()


def release_free_memory() -> bool:
    """Return freed heap memory to the OS (glibc); True when the call was made."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class PeriodicTrim:
    """Call `release_free_memory` each time `every` more tokens have been committed (CPU
    generations only)."""

    def __init__(self, device, every: int = TRIM_EVERY) -> None:
        self.active = str(device).startswith("cpu") and _TRIM is not None
        self.every, self.tokens, self.calls = every, 0, 0

    def advance(self, new_tokens: int) -> None:
        if self.active:
            before = self.tokens // self.every
            self.tokens += new_tokens
            if self.tokens // self.every > before:
                release_free_memory()
                self.calls += 1
