"""arborspec: lossless tree-based speculative decoding on unmodified Hugging Face models."""

from .api import ModelPair, SpeculativeGenerator, load_pair
from .decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from .errors import ArborError
from .registry import builder_names, make_builder
from .sampling import SamplingConfig
from .stats import GenerationResult, StepStats
from .tree import TokenTree

__version__ = "0.1.0"
__all__ = [
    "ArborError", "DecodeConfig", "GenerationResult", "ModelPair", "SamplingConfig", "SpeculativeDecoder",
    "SpeculativeGenerator", "StepStats", "TokenTree", "autoregressive_generate", "builder_names", "load_pair",
    "make_builder",
]
