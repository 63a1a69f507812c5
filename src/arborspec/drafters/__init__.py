"""Drafters: where tree builders get draft next-token logits (a draft model, or the model-free n-gram drafter)."""

from .model import Drafter, ModelDrafter, NgramDrafter  # noqa: F401
