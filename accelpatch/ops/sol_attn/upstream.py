"""Delegation to the upstream `sol_attn` package (NVlabs Sana, sol-engine branch) when it fits.

Upstream limits (sol_attn.md section 1): importable package, CUDA with compute capability >= 8.0,
bf16, head dim 128, contiguous BTHD; kv_splits > 1 only on SM90. A call outside them falls back to
our own implementation; every fallback is counted in `fallback_counts`, the latest reason is kept
in `last_fallback_reason`, and each distinct reason warns once.
"""
from __future__ import annotations

import collections
import importlib.util
import warnings

import torch

fallback_counts: collections.Counter = collections.Counter()
last_fallback_reason: str | None = None
_warned: set = set()
_importable: bool | None = None


def importable() -> bool:
    """Whether the upstream `sol_attn` package can be imported (cached)."""
    global _importable
    if _importable is None:
        _importable = importlib.util.find_spec("sol_attn") is not None
    return _importable


def unsupported_reason(q: torch.Tensor, kv_splits: int) -> str | None:
    """Why upstream cannot run this call, or None if it can."""
    if not importable():
        return "upstream sol_attn package is not importable"
    if q.device.type != "cuda":
        return f"upstream needs CUDA tensors, got device {q.device.type}"
    major, minor = torch.cuda.get_device_capability(q.device)
    if major < 8:
        return f"upstream needs compute capability >= 8.0, got {major}.{minor}"
    if q.dtype != torch.bfloat16:
        return f"upstream supports bf16 only, got {q.dtype}"
    if q.shape[-1] != 128:
        return f"upstream supports head dim 128 only, got {q.shape[-1]}"
    if not q.is_contiguous():
        return "upstream needs contiguous inputs"
    if kv_splits > 1 and (major, minor) != (9, 0):
        return f"upstream kv_splits > 1 needs SM90, got {major}.{minor}"
    return None


def record_fallback(reason: str) -> None:
    """Count a fallback, remember its reason, warn once per distinct reason."""
    global last_fallback_reason
    fallback_counts[reason] += 1
    last_fallback_reason = reason
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"sol_attn impl='upstream' falls back to our implementation: {reason}", RuntimeWarning, stacklevel=3)


def call(q, k, v, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start) -> torch.Tensor:
    """Run the upstream kernel on [B, T, H, 128] bf16 CUDA tensors."""
    import sol_attn as upstream_sol_attn  # noqa: PLC0415  (optional dependency)

    return upstream_sol_attn.sol_attn(
        q, k, v, scale=scale, tau=tau, thresh_type=thresh_type, kv_splits=kv_splits,
        sink_tokens=sink_tokens, sink_start=sink_start,
    )
