"""Tree builders, one file per paper, and the registry that names them. Importing this package
registers them all."""

# (each registers itself)
from . import c2t, c2t_chain, chain, dyspec, eagle2, opt_tree, sequoia, specinfer  # noqa: F401
from .registry import builder_class, builder_names, make_builder, parse_budget, parse_params

__all__ = ["builder_class", "builder_names", "make_builder", "parse_budget", "parse_params"]
