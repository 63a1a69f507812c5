"""Tree builders, one file per paper. Importing this package registers them all."""

from . import c2t, chain, dyspec, eagle2, opt_tree, sequoia, specinfer  # noqa: F401
from .base import DraftContext, TreeBuilder, draw_children  # noqa: F401
