"""Batched GEMM with BF16 operands and FP32 accumulation and output.

On CUDA this is ``torch.bmm(a, b, out_dtype=torch.float32)``: tensor cores take the BF16 operands directly and
the two large FP32 copies of the operands disappear. CPU torch has no such kernel; there the exact emulation is
an FP32 GEMM of the upcast operands (a product of two BF16 values is exact in FP32).

torch has no derivative for ``bmm`` with ``out_dtype`` ("derivative for aten::bmm is not implemented"), so the
CUDA product carries its own: the gradients of the FP32 result, computed as FP32 GEMMs of the upcast operands and
returned in the operands' dtype, exactly what autograd gives for the emulation.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch


def _bmm_out_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.bmm(a, b, out_dtype=torch.float32)


class _BF16InputGemm(torch.autograd.Function):
    """``_bmm_out_fp32`` with a backward (torch registers none for ``out_dtype``)."""

    @staticmethod
    def forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _bmm_out_fp32(a, b)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a, b = ctx.saved_tensors
        grad_a = torch.bmm(grad, b.float().transpose(1, 2)).to(a.dtype) if ctx.needs_input_grad[0] else None
        grad_b = torch.bmm(a.float().transpose(1, 2), grad).to(b.dtype) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def bmm_bf16_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 3-D BF16 ``a``, ``b`` with FP32 accumulation and an FP32 result (CUDA kernel), differentiable."""
    return _BF16InputGemm.apply(a, b)


def bmm_bf16_fp32_emulated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The same product computed as an IEEE FP32 GEMM of the upcast operands: runs anywhere."""
    return torch.bmm(a.float(), b.float())


def key_value_state_bf16(value: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The linear-attention state v·kᵀ (summed over tokens) per (batch, head) for [B, H, D, N] operands: BF16
    operands, FP32 accumulation, an FP32 [B, H, D, D] result (through :func:`bmm_bf16_operands`)."""
    batch, heads, dim, tokens = value.shape
    state = bmm_bf16_operands(value.reshape(batch * heads, dim, tokens),
                              key.transpose(-1, -2).reshape(batch * heads, tokens, key.shape[2]))
    return state.view(batch, heads, dim, key.shape[2])


def bmm_bf16_operands(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` on BF16 operands with an FP32 result wherever the tensors are: the CUDA kernel on CUDA, the exact
    FP32 emulation elsewhere (the fast paths' guards decide whether running off CUDA is worth it)."""
    return bmm_bf16_fp32(a, b) if a.device.type == "cuda" else bmm_bf16_fp32_emulated(a, b)


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
