"""arborspec: lossless tree-based speculative decoding on unmodified Hugging Face models."""

from .api import ModelPair, SpeculativeGenerator, load_pair
from .engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from .errors import ArborError
from .builders.registry import builder_names, make_builder
from .engine.sampling import SamplingConfig
from .engine.stats import GenerationResult, StepStats
from .engine.tree import TokenTree

__version__ = "0.1.0"
__all__ = [
    "ArborError", "DecodeConfig", "GenerationResult", "ModelPair", "SamplingConfig", "SpeculativeDecoder",
    "SpeculativeGenerator", "StepStats", "TokenTree", "autoregressive_generate", "builder_names", "load_pair",
    "make_builder",
]
