"""What the split RoPE kernels (rope_split_pair: LTX-2.3's ``apply_split_rotary_emb`` on q and k) take, and the
(B, T, H, D) strides they walk, shared by the CPU and the Triton implementations.

[B, T, C] query and key; [B, H, T, D/2] tables (rotated per head, C = H * D) or [B, T, C/2] ones broadcastable
to that (rotated over the whole of C, as one head); eager's outputs contiguous [B, T, C] (checked on meta).
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.kernels import reference
from accelpatch.lossless.kernels.layout import eager_layouts

ACTIVATIONS = (torch.bfloat16, torch.float16, torch.float32)
TABLES = (torch.float32, torch.bfloat16)


def mismatch(query, key, cos, sin) -> Optional[str]:
    """Why the split RoPE kernels cannot take these arguments (None when they can)."""
    if query.dtype not in ACTIVATIONS or key.dtype != query.dtype:
        return ("rope_split_pair takes bf16, fp16 or float32 query and key of one dtype, "
                f"not {query.dtype}/{key.dtype}")
    if cos.dtype not in TABLES or sin.dtype != cos.dtype or (
            query.dtype == torch.float16 and cos.dtype != torch.float32):
        return (f"rope_split_pair takes float32 or bf16 tables of one dtype (float32 for fp16 activations), "
                f"not {cos.dtype}/{sin.dtype}")
    if query.dim() != 3 or tuple(key.shape) != tuple(query.shape):
        return ("rope_split_pair takes [B, T, C] query and key of one shape (LTX-2's processors' layout), "
                f"not {tuple(query.shape)}/{tuple(key.shape)}")
    b, t, c = query.shape
    if cos.dim() == 4:
        if tuple(sin.shape) != tuple(cos.shape):
            return f"rope_split_pair takes 4-D tables of one shape, not {tuple(cos.shape)}/{tuple(sin.shape)}"
        tb, h, tt, r = cos.shape
        if (tb, tt, 2 * h * r) != (b, t, c) or r == 0:
            return (f"[B, H, T, D/2] tables of shape {tuple(cos.shape)} do not match [B, T, C] = {(b, t, c)} "
                    "(C = H * D)")
    elif cos.dim() == 3:
        for w in (cos, sin):
            if c % 2 or c == 0 or w.dim() != 3 or w.shape[-1] != c // 2:
                return f"3-D tables of shape {tuple(w.shape)} need the last dim C/2 of an even C = {c}"
            try:
                w.expand(b, t, c // 2)
            except RuntimeError:
                return f"tables of shape {tuple(w.shape)} do not broadcast to {(b, t, c // 2)}"
    else:
        return f"rope_split_pair takes [B, H, T, D/2] or [B, T, C/2] tables, not {tuple(cos.shape)}"
    for shape, strides, _ in eager_layouts(reference.rope_split_pair, (query, key, cos, sin)):
        if tuple(shape) != (b, t, c) or any(size > 1 and stride != want
                                            for size, stride, want in zip(shape, strides, (t * c, c, 1))):
            return f"rope_split_pair: eager's outputs are not contiguous [B, T, C] here ({shape}, {strides})"
    return None


def heads(query: torch.Tensor, cos: torch.Tensor) -> tuple[int, int]:
    """(H, D) the split RoPE rotates by: per head with [B, H, T, D/2] tables, the whole last dim with 3-D ones."""
    if cos.dim() == 4:
        return cos.shape[1], 2 * cos.shape[3]
    return 1, query.shape[-1]


def strides(query, key, cos, sin) -> list[list[int]]:
    """Element strides along (B, T, H, D) of query and key (as [B, T, H, D] views), along (B, T, H, entry) of cos
    and sin (0 where broadcast), and of the contiguous outputs."""
    b, t, c = query.shape
    _, d = heads(query, cos)
    xs = [[x.stride(0), x.stride(1), d * x.stride(2), x.stride(2)] for x in (query, key)]
    if cos.dim() == 4:
        tables = [[w.stride(0), w.stride(2), w.stride(1), w.stride(3)] for w in (cos, sin)]
    else:
        tables = [[e.stride(0), e.stride(1), 0, e.stride(2)] for e in (w.expand(b, t, c // 2) for w in (cos, sin))]
    return xs + tables + [[t * c, c, d, 1]] * 2
