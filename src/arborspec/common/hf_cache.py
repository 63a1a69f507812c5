"""The keyword under which a Hugging Face forward takes its KV cache.

transformers renamed `past_key_values` to `cache` during the 5.x series; the old name
is deprecated (a warning on every forward) and goes away in 5.40, while the first 5.x
releases know only the old one. `cache_kwargs(module, cache)` names the argument the way
the installed version's `module.forward` declares it, so the project runs on every
transformers 5 release its requirements allow.
"""

from __future__ import annotations

import inspect
from functools import cache


@cache
def _cache_name(forward_type: type) -> str:
    params = inspect.signature(forward_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(module, cache) -> dict:
    """`{name: cache}` for `module(...)`, with the name its forward declares (`cache`, else
    `past_key_values`)."""
    return {_cache_name(type(module)): cache}
