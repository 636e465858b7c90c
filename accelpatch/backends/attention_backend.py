"""Moved to :mod:`accelpatch.sol_attn.diffusers_backend` (issue #33: Sol-Attn in one place). This path still imports, as that very module, for one
release, with a DeprecationWarning."""
from accelpatch._moved import alias

alias(__name__, "accelpatch.sol_attn.diffusers_backend")
