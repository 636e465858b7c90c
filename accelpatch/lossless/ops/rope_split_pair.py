"""``rope_split_pair``: LTX-2.3's split (rotate-half) RoPE of query and key in one pass, one float32 table entry per
pair for both halves, float32 chain.

What the kernels take: [B, T, C] query and key; [B, H, T, D/2] tables (rotated per head, C = H * D) or [B, T, C/2]
ones broadcastable to that (rotated over the whole of C, as one head); eager's outputs contiguous [B, T, C] (checked
on meta). Both kernels are the rotate-half kernels with a split policy, walking the (B, T, H, D) strides of
:func:`_strides`; the second product is added as this device's eager ``addcmul_`` adds it (probed by
:mod:`~accelpatch.lossless.kernels.addcmul`: rounded then added, or an fma).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.addcmul import FMA, addcmul_form
from accelpatch.lossless.kernels.layout import eager_layouts, empty_like_eager
from accelpatch.lossless.verify import FusedOp, one_at_a_time, register

_ACTIVATIONS = (torch.bfloat16, torch.float16, torch.float32)
_TABLES = (torch.float32, torch.bfloat16)


def rope_split_pair(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """LTX-2.3's split RoPE of query and key (diffusers ``transformer_ltx2.apply_split_rotary_emb`` on each, the
    processors' ``rope_type == "split"``): the last dim in two halves (x1, x2), ``x.float() * cos`` then
    ``first.addcmul_(-sin, x2)`` and ``second.addcmul_(sin, x1)`` in float32 (a product rounded, then the sum), one
    table entry per pair shared by both halves, cast back to x's dtype. 3-D ``[B, T, C]`` x with ``[B, H, T, D/2]``
    tables is rotated per head (x viewed as [B, H, T, D] and back to [B, T, C]); any other x with tables of its
    rank, over its whole last dim. Restated op for op, layouts included (tests compare it with diffusers')."""
    return _rotate(query, cos, sin), _rotate(key, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One of :func:`rope_split_pair`'s pair."""
    x_dtype = x.dtype
    needs_reshape = False
    if x.ndim != 4 and cos.ndim == 4:
        b, h, t, _ = cos.shape
        x = x.reshape(b, t, h, -1).swapaxes(1, 2)
        needs_reshape = True
    last = x.shape[-1]
    if last % 2 != 0:
        raise ValueError(f"Expected x.shape[-1] to be even for split rotary, got {last}.")
    r = last // 2
    split_x = x.reshape(*x.shape[:-1], 2, r).float()
    first_x = split_x[..., :1, :]
    second_x = split_x[..., 1:, :]
    cos_u = cos.unsqueeze(-2)
    sin_u = sin.unsqueeze(-2)
    out = split_x * cos_u
    first_out = out[..., :1, :]
    second_out = out[..., 1:, :]
    first_out.addcmul_(-sin_u, second_x)
    second_out.addcmul_(sin_u, first_x)
    out = out.reshape(*out.shape[:-2], last)
    if needs_reshape:
        out = out.swapaxes(1, 2).reshape(b, t, -1)
    return out.to(dtype=x_dtype)


SPLIT_ROPE_PAIR = register(FusedOp(
    "rope_split_pair", rope_split_pair,
    "split (rotate-half) RoPE of query and key in one pass, one float32 table entry per pair for both halves, "
    "float32 chain (LTX-2.3's default rope_type)", parts=one_at_a_time(_rotate)))


def _mismatch(query, key, cos, sin) -> Optional[str]:
    """Why the split RoPE kernels (CPU and Triton) cannot take these arguments (None when they can)."""
    if query.dtype not in _ACTIVATIONS or key.dtype != query.dtype:
        return ("rope_split_pair takes bf16, fp16 or float32 query and key of one dtype, "
                f"not {query.dtype}/{key.dtype}")
    if cos.dtype not in _TABLES or sin.dtype != cos.dtype or (
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
    for shape, strides, _ in eager_layouts(rope_split_pair, (query, key, cos, sin)):
        if tuple(shape) != (b, t, c) or any(size > 1 and stride != want
                                            for size, stride, want in zip(shape, strides, (t * c, c, 1))):
            return f"rope_split_pair: eager's outputs are not contiguous [B, T, C] here ({shape}, {strides})"
    return None


def _heads(query: torch.Tensor, cos: torch.Tensor) -> tuple[int, int]:
    """(H, D) the split RoPE rotates by: per head with [B, H, T, D/2] tables, the whole last dim with 3-D ones."""
    if cos.dim() == 4:
        return cos.shape[1], 2 * cos.shape[3]
    return 1, query.shape[-1]


def _strides(query, key, cos, sin) -> list[list[int]]:
    """Element strides along (B, T, H, D) of query and key (as [B, T, H, D] views), along (B, T, H, entry) of cos
    and sin (0 where broadcast), and of the contiguous outputs."""
    b, t, c = query.shape
    _, d = _heads(query, cos)
    xs = [[x.stride(0), x.stride(1), d * x.stride(2), x.stride(2)] for x in (query, key)]
    if cos.dim() == 4:
        tables = [[w.stride(0), w.stride(2), w.stride(1), w.stride(3)] for w in (cos, sin)]
    else:
        tables = [[e.stride(0), e.stride(1), 0, e.stride(2)] for e in (w.expand(b, t, c // 2) for w in (cos, sin))]
    return xs + tables + [[t * c, c, d, 1]] * 2


# ---- CPU -------------------------------------------------------------------------------------------------------

def _cpu_plan(args):
    """rotate_half's plan: size (B, T, H, D, R = D, no table rows) and :func:`_strides`."""
    def make():
        h, d = _heads(args[0], args[2])
        return [*args[0].shape[:2], h, d, d, 0], _strides(*args)
    return cpu.cached_plan("rope_split_pair", args, make)


def _why_cpu(query, key, cos, sin) -> Optional[str]:
    return _mismatch(query, key, cos, sin) or addcmul_form(cpu.CPU)[1]


def _split_policy() -> int:
    return cpu.SPLIT_FMA if addcmul_form(cpu.CPU)[0] == FMA else cpu.SPLIT_MUL_ADD


@SPLIT_ROPE_PAIR.kernel(cpu.LIBRARY, unsupported=_why_cpu)
def rope_split_pair_cpu(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The chain of [B, T, C] query and key in one pass: rotate_half_pair's loops with a split policy (one float32
    table entry per pair for both halves, the product rounded to float, the second one added as this CPU's eager
    ``addcmul_`` adds it, probed: an fma here), stored in the query's dtype."""
    return cpu.rotate_half_call(SPLIT_ROPE_PAIR, _cpu_plan, _split_policy, (query, key, cos, sin))


def _split_reference(fused: bool) -> Callable:
    """rope_split_pair's chain with the second product added in a stated form (the self-check runs both kernels,
    whichever form this CPU's eager addcmul_ has): rounded then added by two eager float32 ops, or an fma (in
    float64: the product exact, the sum rounded to double then to float, which differs from one rounding with a
    probability ~2^-29 per element; the self-check's fixed inputs are not such a case)."""
    def rotate(x, cos, sin):
        b, h, t, r = cos.shape
        x = x.reshape(b, t, h, 2, r).float()
        c, s = cos.transpose(1, 2).unsqueeze(-2), sin.transpose(1, 2).unsqueeze(-2)
        x1, x2 = x[..., :1, :], x[..., 1:, :]
        if fused:
            first = ((x1 * c).double() + (-s).double() * x2.double()).float()
            second = ((x2 * c).double() + s.double() * x1.double()).float()
        else:
            first, second = x1 * c + (-s) * x2, x2 * c + s * x1
        return torch.cat([first, second], dim=-2).reshape(b, t, -1)

    def reference(query, key, cos, sin):
        return tuple(rotate(x, cos, sin).to(x.dtype) for x in (query, key))
    return reference


@cpu.known_answers
def _known_answers(inputs: dict) -> list:
    flat, cos, sin = inputs["flat"], inputs["split_cos"], inputs["split_sin"]

    def call(policy):
        return lambda lib, a, o, size, st: lib.rotate_half(*a, *o, size, st, policy)
    return [(_split_reference(False), (flat, flat.flip(1), cos, sin), _cpu_plan, call(cpu.SPLIT_MUL_ADD)),
            (_split_reference(True), (flat, flat.flip(1), cos, sin), _cpu_plan, call(cpu.SPLIT_FMA)),
            (_split_reference(True), (flat.bfloat16(), flat.flip(1).bfloat16(), cos, sin), _cpu_plan,
             call(cpu.SPLIT_FMA))]


# ---- CUDA ------------------------------------------------------------------------------------------------------

def _why_cuda(query, key, cos, sin) -> Optional[str]:
    return _mismatch(query, key, cos, sin) or addcmul_form(query.device)[1]


@SPLIT_ROPE_PAIR.kernel(triton.LIBRARY, unsupported=_why_cuda)
def rope_split_pair_cuda(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """LTX-2.3's split RoPE of [B, T, C] query and key in one launch, contiguous outputs: the rotate-half kernel
    with SPLIT (one float32 table entry per pair), the second product added as this device's eager addcmul_ adds
    it (FMA as probed)."""
    outs = empty_like_eager(rope_split_pair, (query, key, cos, sin), query.device)
    b, n, _ = query.shape
    if query.numel() == 0:
        return outs
    h, d = _heads(query, cos)
    size = triton.block(h * d)
    grid = (b * n, -(-(h * d) // size))
    strides = [s for per in _strides(query, key, cos, sin) for s in per]
    triton.jit()._rotate_half_pair_kernel[grid](query, key, cos, sin, *outs, n, *strides, H=h, D=d, R=d, BLOCK=size,
                                                SPLIT=True, FMA=addcmul_form(query.device)[0] == FMA,
                                                **triton.LAUNCH)
    return outs
