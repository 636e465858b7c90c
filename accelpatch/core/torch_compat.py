"""Torch internals whose behaviour differs across the supported torch versions, each feature-detected here once.

:func:`is_exporting`: ``torch.compiler.is_exporting()`` is True only under ``torch.export`` (and AOTInductor) in
eager code on every version, but Dynamo up to torch 2.11 folds the call to a constant True while tracing *any*
region, ``torch.compile`` included (torch 2.13 reads the flag instead). Code that must tell a compiled region from
an exported one (counters count in compiled code; an exported program runs outside accelpatch) reads the flag
itself, which Dynamo traces as a guarded module constant on 2.11 and 2.13 alike; where a torch lacks the flag, the
public function is the fallback.
"""
from __future__ import annotations

import torch

#: the module attribute ``torch.compiler.is_exporting()`` returns outside Dynamo (set by torch.export's tracing
#: context, strict and non-strict, and by AOTInductor); None where this torch has no such flag
_FLAG_HOLDER = torch.compiler if isinstance(getattr(torch.compiler, "_is_exporting_flag", None), bool) else None


def is_exporting() -> bool:
    """True while ``torch.export`` (or AOTInductor) traces, False in eager code and under ``torch.compile``."""
    if _FLAG_HOLDER is not None:
        return _FLAG_HOLDER._is_exporting_flag
    return torch.compiler.is_exporting()


def describe() -> str:
    """How :func:`is_exporting` reads the export state on this torch (for ``accelpatch.doctor()``)."""
    return ("torch.compiler._is_exporting_flag (Dynamo-safe)" if _FLAG_HOLDER is not None
            else "torch.compiler.is_exporting() (no flag on this torch)")
