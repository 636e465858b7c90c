"""Kernels with no knowledge of models (sol_attn: block-sparse attention). Importing this is
cheap: Triton is imported lazily, only when a Triton implementation is actually used."""
from .sol_attn import SolAttnStats, sol_attn, sol_attn_varlen

__all__ = ["sol_attn", "sol_attn_varlen", "SolAttnStats"]
