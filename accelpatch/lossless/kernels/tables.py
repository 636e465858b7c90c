"""Exact lookup tables of bf16 unary ops, computed by the device's own eager kernel.

A bf16 input has only 65,536 values, so ``table[bits(x)]`` reproduces an eager bf16 unary op (SiLU, ReLU) bit for
bit by construction, NaN payloads and signed zeros included, whatever the device's exp or max instructions do.
One caveat is checked, not assumed: eager CPU kernels run a vectorised body and a scalar loop (for tails and
strided inputs), and the two may round differently. The table is built through both (a contiguous and a strided
input) and refused, with the count of inputs they disagree on, when they differ: then no table can stand for eager
at every position. NaN payloads are the exception: eager itself stores different NaN bits in its two loops (measured
on CPU: every NaN input of SiLU and ReLU), so a NaN is compared as "some NaN", here and in the first-sight check.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

import torch

_LOCK = threading.Lock()
_TABLES: dict[tuple[str, str, bool], tuple[Optional[torch.Tensor], Optional[str]]] = {}


def all_bf16_values(device: torch.device) -> torch.Tensor:
    """Every bf16 bit pattern, in the order of its unsigned 16-bit code (index i holds the value with bits i)."""
    codes = torch.arange(65536, dtype=torch.int32, device=device)
    return codes.to(torch.int16).view(torch.bfloat16)  # wraps 32768.. to negative int16: the same bits


def unary_table(name: str, fn: Callable[[torch.Tensor], torch.Tensor],
                device: torch.device) -> tuple[Optional[torch.Tensor], Optional[str]]:
    """``(table, None)``: ``fn`` on every bf16 value as a 65,536-entry bf16 tensor on ``device``, indexed by the
    input's unsigned bits; or ``(None, reason)`` when the device's eager kernel gives position-dependent results.
    Built once per (name, device, whether the CPU flushes subnormals: eager's results on them change with it) and
    kept."""
    key = (name, str(device), device.type == "cpu" and 5e-324 * 1.0 == 0.0)  # subnormals flushed (FTZ/DAZ)?
    with _LOCK:
        known = _TABLES.get(key)
    if known is not None:
        return known
    values = all_bf16_values(device)
    with torch.no_grad():
        vectorised = fn(values)
        spread = torch.empty(2 * values.numel(), dtype=values.dtype, device=device)
        spread[0::2] = values
        scalar = fn(spread[0::2])  # a strided input takes the element-by-element loop on CPU
    both_nan = vectorised.isnan() & scalar.isnan()
    differ = int(((vectorised.view(torch.int16) != scalar.view(torch.int16)) & ~both_nan).sum())
    if differ:
        result = (None, f"eager {name} rounds {differ} of 65536 bf16 inputs differently in its vectorised and "
                        "scalar loops on this device, so no table reproduces it everywhere")
    else:
        result = (vectorised.contiguous(), None)
    with _LOCK:
        _TABLES.setdefault(key, result)
        return _TABLES[key]
