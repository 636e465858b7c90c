"""The Sol-Attn backend joins the core's backends (``apply(..., backend="sol_attn")``) when this module is imported;
``accelpatch/__init__.py`` names it among the modules the core hosts."""
from accelpatch.core.backends import register_backend
from accelpatch.sol_attn.config import SolAttnConfig

BACKEND = register_backend(SolAttnConfig)
