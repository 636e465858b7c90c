"""Kernels with no knowledge of models: the fused lossless ops (``accelpatch.ops.fused``) and the BF16 GEMMs
(``accelpatch.ops.gemm``). Importing this is cheap: Triton is imported lazily, only when a Triton kernel is used.

The Sol-Attn op moved to :mod:`accelpatch.sol_attn.op` (issue #33: Sol-Attn in one place); ``sol_attn``,
``sol_attn_varlen`` and ``SolAttnStats`` are still found here for one release, with a DeprecationWarning."""
from typing import Any

_MOVED = ("sol_attn", "sol_attn_varlen", "SolAttnStats")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib
        import warnings

        warnings.warn(f"accelpatch.ops.{name} moved to accelpatch.sol_attn.op.{name}; import it from there (the old "
                      "name goes in the next release)", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("accelpatch.sol_attn.op"), name)
    raise AttributeError(f"module 'accelpatch.ops' has no attribute {name!r}")
