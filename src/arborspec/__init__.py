"""arborspec: lossless tree-based speculative decoding on unmodified Hugging Face models.

The layers, bottom up (ARCHITECTURE.md): `common` and `errors`, `engine` (the step
loop), `drafters` and `builders`, `models` (loading a pair) and `defaults` (what runs
when the user does not say), `offline` and `bench`, then this API, `custom_generate` (the
callable for `model.generate(custom_generate=arborspec.generate)`) and the CLI.
"""

from .api import SpeculativeGenerator
from .builders import builder_names, make_builder
from .builders.shared_budget import SharedBudget
from .common.provenance import __version__
from .custom_generate import ArborspecGenerateOutput, generate
from .drafters import DraftHead, load_head
from .engine.batch_decode import BatchDecoder, BatchRequest, RequestHandle
from .engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from .engine.sampling import SamplingConfig
from .engine.stats import GenerationResult, StepStats
from .engine.tree import TokenTree
from .errors import ArborError
from .models import ModelPair, load_pair, pair_from_models

__all__ = [
    "ArborError",
    "ArborspecGenerateOutput",
    "BatchDecoder",
    "BatchRequest",
    "DecodeConfig",
    "DraftHead",
    "GenerationResult",
    "ModelPair",
    "RequestHandle",
    "SamplingConfig",
    "SharedBudget",
    "SpeculativeDecoder",
    "SpeculativeGenerator",
    "StepStats",
    "TokenTree",
    "__version__",
    "autoregressive_generate",
    "builder_names",
    "generate",
    "load_head",
    "load_pair",
    "make_builder",
    "pair_from_models",
]
