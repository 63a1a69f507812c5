"""arborspec: lossless tree-based speculative decoding on unmodified Hugging Face models.

The layers, bottom up (ARCHITECTURE.md): `common` and `errors`, `engine` (the step
loop), `drafters` and `builders`, `models` (loading a pair) and `defaults` (what runs
when the user does not say), `offline` and `bench`, then this API and the CLI.
"""

from .api import ModelPair, SpeculativeGenerator, load_pair
from .builders import builder_names, make_builder
from .common.provenance import __version__
from .engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from .engine.sampling import SamplingConfig
from .engine.stats import GenerationResult, StepStats
from .engine.tree import TokenTree
from .errors import ArborError

__all__ = [
    "ArborError",
    "DecodeConfig",
    "GenerationResult",
    "ModelPair",
    "SamplingConfig",
    "SpeculativeDecoder",
    "SpeculativeGenerator",
    "StepStats",
    "TokenTree",
    "__version__",
    "autoregressive_generate",
    "builder_names",
    "load_pair",
    "make_builder",
]
