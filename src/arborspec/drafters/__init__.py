"""Drafters: where tree builders get draft next-token logits for the nodes they expand.

* `ModelDrafter` (`model.py`): a Hugging Face draft model with its own KV cache;
* `NgramDrafter` (`ngram.py`): model-free, from earlier occurrences in the context;
* `HeadDrafter` (`head.py`): an EAGLE-style draft head on the target's own features.

All implement the `Drafter` contract of `engine/contracts.py`, re-exported here.
"""

from ..engine.contracts import Drafter
from .head import DraftHead, HeadDrafter, load_head
from .model import ModelDrafter
from .ngram import NgramDrafter

__all__ = ["DraftHead", "Drafter", "HeadDrafter", "ModelDrafter", "NgramDrafter", "load_head"]
