"""The layout eager gives a chain's outputs, so a fused kernel can write its results into the same strides.

Eager's output strides come from TensorIterator's rules (the first operand's layout for a sum, ``preserve_format``
for casts, contiguous for non-dense inputs, ...). Rather than restating those rules, the reference chain runs once
on meta tensors with the inputs' shapes, strides and dtypes: meta kernels share the stride logic of the real ones.
The answer is cached per input signature (a few microseconds the first time, a dict lookup after).
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence

import torch

_LOCK = threading.Lock()
_CACHE: dict[tuple, tuple] = {}


def _describe(value):
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), tuple(value.stride()), value.dtype, value.storage_offset() != 0)
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v) for v in value)
    return ("V", value)


def _to_meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


def eager_layouts(reference: Callable, args: Sequence) -> tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype], ...]:
    """``(shape, strides, dtype)`` of each tensor ``reference(*args)`` returns when run eagerly on ``args``."""
    key = (reference, tuple(_describe(a) for a in args))
    with _LOCK:
        known = _CACHE.get(key)
    if known is not None:
        return known
    with torch.no_grad():
        out = reference(*(_to_meta(a) for a in args))
    outs = out if isinstance(out, tuple) else (out,)
    layouts = tuple((tuple(o.shape), tuple(o.stride()), o.dtype) for o in outs)
    with _LOCK:
        _CACHE[key] = layouts
    return layouts


def empty_like_eager(reference: Callable, args: Sequence, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Uninitialised outputs with the shapes, strides and dtypes eager would give ``reference(*args)``."""
    return tuple(torch.empty_strided(shape, strides, dtype=dtype, device=device)
                 for shape, strides, dtype in eager_layouts(reference, args))


