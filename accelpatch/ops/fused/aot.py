"""The fused kernels' launches, captured ahead of time for a GPU target on a machine without one.

Each case runs a wrapper of triton_kernels (which picks BLOCK and the strides Triton specialises on) under
accelpatch.ops.triton_aot's stand-in driver, on CPU tensors of the models' widths (SANA-Video: hidden 2240, 20 heads
x 112, GLUMB 11,200 channels) with a small token count of the same divisibility as the release ones (24 and 32,760
are both 8 mod 16): an element-wise kernel's compiled code depends on the widths and on which strides are 1 or
multiples of 16, not on how many tokens there are — except where the output is N-minor (a transposed residual,
scale_to_tokens): there a row runs over the tokens and its BLOCK depends on their count, so those cases take 8,200
tokens (batch 1), which gets the release shapes' BLOCK of 1024. The tensors are left uninitialised (nothing runs).
TRITON_INTERPRET must be unset.
"""
from __future__ import annotations

from typing import Callable

import torch

from .. import triton_aot

TOKENS = 24
N_MINOR_TOKENS = 8200
BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


def _rope(q_dtype, table_dtype):
    def args():
        q = torch.empty(2, TOKENS, 20, 112, dtype=q_dtype)
        table = torch.empty(1, TOKENS, 1, 112, dtype=table_dtype)
        return q, q.clone(), table, table.clone()
    return "relu_rope_pair", args


def _modulate(dtype):
    def args():
        rows = torch.empty(2, 1, 6, 2240, dtype=dtype)  # unbind(2) of the modulation table: token stride 6C
        return torch.empty(2, TOKENS, 2240, dtype=dtype), rows[:, :, 1], rows[:, :, 0]
    return "modulate", args


def _residual(dtype, transposed=False):
    def args():
        batch, tokens = (1, N_MINOR_TOKENS) if transposed else (2, TOKENS)
        rows = torch.empty(batch, 1, 6, 2240, dtype=dtype)
        x = torch.empty(batch, tokens, 2240, dtype=dtype)
        residual = torch.empty(batch, 2240, tokens, dtype=dtype).transpose(1, 2) if transposed else x.clone()
        return residual, rows[:, :, 2], x
    return "gated_residual", args


def _conv_out(channels):
    return torch.empty(2, channels, 3, 8, dtype=BF16, memory_format=torch.channels_last)


def _silu():
    return "silu", lambda: (_conv_out(11200),)


def _glu():
    def args():
        x, gate = _conv_out(2 * 5600).chunk(2, dim=1)
        return x, gate
    return "glu_gate", args


def _scale_to_tokens(dtype):
    return "scale_to_tokens", lambda: (torch.empty(1, 20, 112, N_MINOR_TOKENS),
                                       torch.empty(1, 20, 1, N_MINOR_TOKENS, dtype=BF16), dtype)


# label -> (op, argument builder): one launch per op x dtype combination the wrappers accept
CASES: dict[str, tuple[str, Callable]] = {
    "relu_rope_pair bf16 q, fp32 tables": _rope(BF16, FP32),
    "relu_rope_pair bf16 q, bf16 tables": _rope(BF16, BF16),
    "relu_rope_pair bf16 q, fp64 tables": _rope(BF16, FP64),
    "relu_rope_pair fp32 q, fp32 tables": _rope(FP32, FP32),
    "modulate bf16": _modulate(BF16),
    "modulate fp16": _modulate(FP16),
    "modulate fp32": _modulate(FP32),
    "gated_residual bf16": _residual(BF16),
    "gated_residual bf16, transposed residual": _residual(BF16, transposed=True),
    "gated_residual fp16": _residual(FP16),
    "gated_residual fp32": _residual(FP32),
    "silu bf16 channels_last": _silu(),
    "glu_gate bf16 channels_last chunks": _glu(),
    "scale_to_tokens fp32 -> bf16": _scale_to_tokens(BF16),
    "scale_to_tokens fp32 -> fp16": _scale_to_tokens(FP16),
}


def capture_case(arch: int, label: str) -> triton_aot.Capture:
    """The one launch the wrapper of `label`'s op makes for its arguments on target `arch`."""
    from . import triton_jit, triton_kernels  # noqa: PLC0415

    op, build = CASES[label]
    args = build()
    reason = triton_kernels.unsupported(op, *args)
    if reason is not None and "CUDA" not in reason:  # CPU tensors stand in for CUDA ones here
        raise ValueError(f"{label}: {reason}")
    captured = triton_aot.capture(arch, triton_jit.KERNELS, lambda: getattr(triton_kernels, op)(*args))
    assert len(captured) == 1, (label, len(captured))
    return captured[0]
