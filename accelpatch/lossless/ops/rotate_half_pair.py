"""``rotate_half_pair``: MiniMax-H3's partial rotate-half RoPE of query and key, with pass-through channels, in one
pass."""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.layout import eager_layouts, empty_like_eager
from accelpatch.lossless.kernels.reference import rotate_half
from accelpatch.lossless.verify import FusedOp, one_at_a_time, register


def rotate_half_pair(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """:func:`~accelpatch.lossless.kernels.reference.rotate_half` of ``[B, S, H, D]`` query and key with one pair of
    ``[S, R]`` tables."""
    return rotate_half(query, cos, sin), rotate_half(key, cos, sin)


ROTATE_HALF_PAIR = register(FusedOp(
    "rotate_half_pair", rotate_half_pair,
    "partial rotate-half RoPE of query and key with pass-through channels in one pass (MiniMax-H3)",
    parts=one_at_a_time(rotate_half)))


def _cpu_plan(args):
    """size (B, S, H, D, R, table rows), strides (4 each) of query, key, cos, sin (along B, S, H, entry: 0 along B
    and H, and along S for one row), outputs."""
    query, key, cos, sin = args

    def make():
        layouts = eager_layouts(rotate_half_pair, args)
        rows, rotary = cos.shape
        tables = [[0, 0 if rows == 1 else t.stride(0), 0, t.stride(1)] for t in (cos, sin)]
        strides = [list(query.stride()), list(key.stride())] + tables + [list(lay[1]) for lay in layouts]
        return [*query.shape, rotary, rows], strides
    return cpu.cached_plan("rotate_half_pair", args, make)


def _why_cpu(query, key, cos, sin) -> Optional[str]:
    if query.dtype not in cpu.ELEMENTWISE_DTYPES or key.dtype != query.dtype:
        return ("rotate_half_pair takes bf16, fp16 or float32 query and key of one dtype, "
                f"not {query.dtype}/{key.dtype}")
    if cos.dtype not in (torch.float32, torch.bfloat16) or sin.dtype != cos.dtype:
        return f"rotate_half_pair takes float32 or bf16 tables of one dtype, not {cos.dtype}/{sin.dtype}"
    if query.dim() != 4 or tuple(key.shape) != tuple(query.shape):
        return ("rotate_half_pair takes [B, S, H, D] query and key of one shape, "
                f"not {tuple(query.shape)}/{tuple(key.shape)}")
    if cos.dim() != 2 or tuple(sin.shape) != tuple(cos.shape):
        return f"rotate_half_pair takes [S, R] tables of one shape, not {tuple(cos.shape)}/{tuple(sin.shape)}"
    rows, rotary = cos.shape
    if rotary == 0 or rotary % 2 or rotary > query.shape[-1]:
        return f"rotate_half_pair needs an even rotary dim R with 0 < R <= D = {query.shape[-1]}, not {rotary}"
    if rows not in (1, query.shape[1]):
        return f"tables of {rows} rows do not broadcast to {query.shape[1]} positions"
    if not cpu.unit_inner_outputs(rotate_half_pair, (query, key, cos, sin)):
        return "rotate_half_pair: eager's outputs are not unit-stride along the head dim here"
    return None


@ROTATE_HALF_PAIR.kernel(cpu.LIBRARY, unsupported=_why_cpu)
def rotate_half_pair_cpu(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The chain in one pass over query and key: the tables rounded to the queries' dtype once per call, each
    product and the sum rounded as eager's ops do, channels past R copied."""
    return cpu.rotate_half_call(ROTATE_HALF_PAIR, _cpu_plan, lambda: cpu.ROTATE_HALF_IN_Q, (query, key, cos, sin))


def _why_cuda(query, key, cos, sin) -> Optional[str]:
    why = triton.why_pair(query, key, triton.FLOATS)
    if why:
        return why
    floats = triton.FLOATS + (torch.float64,)
    if cos.dtype not in floats or sin.dtype not in floats:
        return f"RoPE table dtypes {cos.dtype}/{sin.dtype} (floating)"
    _, n, _, d = query.shape
    rotary = cos.shape[-1]
    if cos.dim() != 2 or sin.shape != cos.shape or cos.shape[0] not in (1, n):
        return f"tables must be one [N, R] shape with N = {n} or 1 (got {tuple(cos.shape)}, {tuple(sin.shape)})"
    if rotary % 2 or not 0 < rotary <= d:
        return f"rotary dim {rotary} (an even number from 2 to the head dim {d})"
    return None


@ROTATE_HALF_PAIR.kernel(triton.LIBRARY, unsupported=_why_cuda)
def rotate_half_pair_cuda(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """MiniMax-H3's partial rotate-half RoPE of query and key in one launch, contiguous outputs."""
    outs = empty_like_eager(rotate_half_pair, (query, key, cos, sin), query.device)
    b, n, h, d = query.shape
    if query.numel() == 0:
        return outs
    rotary = cos.shape[-1]
    cos, sin = cos.expand(n, rotary), sin.expand(n, rotary)
    size = triton.block(h * d)
    grid = (b * n, -(-(h * d) // size))
    tables = [[0, t.stride(0), 0, t.stride(1)] for t in (cos, sin)]  # along (b, n, h, entry)
    strides = [s for per in [query.stride(), key.stride(), *tables, *(o.stride() for o in outs)] for s in per]
    triton.jit()._rotate_half_pair_kernel[grid](query, key, cos, sin, *outs, n, *strides, H=h, D=d, R=rotary,
                                                BLOCK=size, **triton.LAUNCH)
    return outs


@cpu.known_answers
def _known_answers(inputs: dict) -> list:
    q = inputs["q"]
    return [(rotate_half_pair, (q, q.flip(1), inputs["half_cos"], inputs["half_sin"]), _cpu_plan,
             lambda lib, a, o, size, st: lib.rotate_half(*a, *o, size, st, cpu.ROTATE_HALF_IN_Q))]
