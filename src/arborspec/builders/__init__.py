"""Tree builders, one file per paper. Importing this package registers them all."""

from . import chain, sequoia, specinfer  # noqa: F401
from .base import DraftContext, TreeBuilder, draw_children  # noqa: F401
