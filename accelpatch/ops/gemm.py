"""Batched GEMM with BF16 operands and FP32 accumulation and output.

On CUDA this is ``torch.bmm(a, b, out_dtype=torch.float32)``: tensor cores take the BF16 operands directly and
the two large FP32 copies of the operands disappear. CPU torch has no such kernel; there the exact emulation is
an FP32 GEMM of the upcast operands (a product of two BF16 values is exact in FP32).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch


def bmm_bf16_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 3-D BF16 ``a``, ``b`` with FP32 accumulation and an FP32 result (CUDA kernel)."""
    return torch.bmm(a, b, out_dtype=torch.float32)


def bmm_bf16_fp32_emulated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same product computed as an IEEE FP32 GEMM of the upcast operands: runs anywhere."""
    return torch.bmm(a.float(), b.float())


@functools.lru_cache(maxsize=None)
def bmm_bf16_fp32_reject_reason() -> Optional[str]:
    """Why :func:`bmm_bf16_fp32` cannot run in this process (None when it can). Probed once on a tiny tensor."""
    if torch.version.cuda is None:
        return "CUDA is unavailable: this torch build has no CUDA"
    if not torch.cuda.is_available():
        return "CUDA is unavailable: no CUDA device is visible"
    try:
        a = torch.zeros(1, 2, 2, device="cuda", dtype=torch.bfloat16)
        out = bmm_bf16_fp32(a, a)
    except (TypeError, NotImplementedError, RuntimeError) as error:
        return f"torch {torch.__version__} has no torch.bmm(..., out_dtype=torch.float32) for bfloat16 on CUDA ({error})"
    if out.dtype != torch.float32:
        return f"torch {torch.__version__} ignored out_dtype=torch.float32 in torch.bmm"
    return None
