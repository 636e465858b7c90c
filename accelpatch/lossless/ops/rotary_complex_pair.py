"""``rotary_complex_pair``: SANA-Video 2.0's complex128 RoPE of query and key, rounded float64 → float32 → dtype,
in one pass."""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.complex_mul import complex_mul_modes
from accelpatch.lossless.kernels.layout import eager_layouts, empty_like_eager
from accelpatch.lossless.kernels.reference import rotary_complex
from accelpatch.lossless.verify import FusedOp, one_at_a_time, register


def rotary_complex_pair(query: torch.Tensor, key: torch.Tensor, freqs: torch.Tensor):
    """:func:`~accelpatch.lossless.kernels.reference.rotary_complex` of query and key with one table."""
    return rotary_complex(query, freqs), rotary_complex(key, freqs)


ROTARY_COMPLEX_PAIR = register(FusedOp(
    "rotary_complex_pair", rotary_complex_pair,
    "complex128 RoPE of query and key, rounded float64 → float32 → dtype, in one pass (SANA-Video 2.0)",
    parts=one_at_a_time(rotary_complex)))


# ---- CPU -------------------------------------------------------------------------------------------------------

def _why_cpu(query, key, freqs) -> Optional[str]:
    if query.dtype == torch.float64:
        return ("rotary_complex_pair does not take float64 query and key: eager's float64 product gives other bits "
                "in its scalar loop (vector tails, strided tables) than in its vector loop (measured), so no single "
                "kernel reproduces it")
    if query.dtype not in (torch.bfloat16, torch.float32) or key.dtype != query.dtype:
        return ("rotary_complex_pair takes bf16 or float32 query and key of one dtype, "
                f"not {query.dtype}/{key.dtype}")
    if freqs.dtype != torch.complex128:
        return f"rotary_complex_pair takes a complex128 table, not {freqs.dtype}"
    if freqs.is_conj():
        return "rotary_complex_pair reads the table's storage as it is: a lazily conjugated view is not"
    if query.dim() != 4 or tuple(key.shape) != tuple(query.shape) or query.shape[-1] % 2:
        return ("rotary_complex_pair takes [B, N, H, D] query and key of one shape with an even D, "
                f"not {tuple(query.shape)}/{tuple(key.shape)}")
    if freqs.dim() != 2:
        return f"rotary_complex_pair takes a [N, D/2] table, not {tuple(freqs.shape)}"
    # Eager's complex multiply rounds each product in its vector loop but contracts them (an FMA) in its scalar
    # loop, which runs on row tails, strided rows, and partial rows where several threads split the work; the
    # difference reaches a float32 result rarely (one double ulp), so a first-sight check would seldom see it.
    # Take only what runs the vector loop everywhere.
    if torch.get_num_threads() != 1:
        return (f"rotary_complex_pair runs with one CPU thread only: with {torch.get_num_threads()} threads eager "
                "splits rows, and its scalar loop rounds the complex product differently (an FMA)")
    if query.shape[-1] // 2 % 8 or query.stride(-1) != 1 or key.stride(-1) != 1 or freqs.stride(-1) != 1:
        return ("rotary_complex_pair takes unit-stride pairs in rows of a multiple of 8 (eager's vector loop; its "
                f"scalar loop rounds the complex product differently), not D={query.shape[-1]} with strides "
                f"{query.stride()}/{freqs.stride()}")
    try:
        freqs[None, :, None, :].expand(*query.shape[:-1], query.shape[-1] // 2)
    except RuntimeError:
        return f"a table of shape {tuple(freqs.shape)} does not broadcast to {tuple(query.shape[:-1])} pairs"
    eager_layouts(rotary_complex_pair, (query, key, freqs))  # raises where eager raises (a float64 x strided
    return None                                               # along D cannot be viewed as complex)


def _cpu_plan(args):
    """The rope-style plan (outer dims in the outputs' memory order, D/2 pairs) with the complex table's strides in
    doubles (its last one per pair, the imaginary part at +1)."""
    query, key, freqs = args

    def make():
        layouts = eager_layouts(rotary_complex_pair, args)
        table = freqs[None, :, None, :].expand(*query.shape[:-1], query.shape[-1] // 2)
        tensors = [query.stride(), key.stride(), tuple(2 * s for s in table.stride())] + [lay[1] for lay in layouts]
        out_strides = layouts[0][1]
        order = sorted(range(3), key=lambda d: -out_strides[d])
        sizes = [query.shape[d] for d in order] + [query.shape[3] // 2]
        return sizes, [[st[d] for d in order] + [st[3]] for st in tensors]
    return cpu.cached_plan("rotary_complex_pair", args, make)


@ROTARY_COMPLEX_PAIR.kernel(cpu.LIBRARY, unsupported=_why_cpu, complex_ok=(False, False, True))
def rotary_complex_pair_cpu(query: torch.Tensor, key: torch.Tensor, freqs: torch.Tensor):
    """The chain of bf16 or float32 query and key in one pass (any strides): the complex128 product as eager's
    vector loop computes it (four double products, the difference and the sum each rounded), then double -> float (-> bf16) as ``type_as`` converts. Eager's scalar loop (vector tails, strided
    tables) differs from its vector loop by a double ulp (a contracted multiply-add, it seems), which the rounding
    to float hides unless the exact result lies within that ulp of a float rounding boundary (the first-sight check
    is the guard there)."""
    args = (query, key, freqs)
    prep = cpu.prepared(ROTARY_COMPLEX_PAIR, args, lambda lib: lib.rotary_complex.default, lambda: _cpu_plan(args))
    outs = cpu.outputs(prep)
    if prep.nonempty:
        prep.op(*args, *outs, prep.size, prep.strides)
    return outs


@cpu.known_answers
def _known_answers(inputs: dict) -> list:
    q, freqs = inputs["q"], inputs["freqs"]
    call = lambda lib, a, o, size, st: lib.rotary_complex(*a, *o, size, st)  # noqa: E731
    return [(rotary_complex_pair, (q.double(), q.flip(1).double(), freqs), _cpu_plan, call),
            (rotary_complex_pair, (q, q.flip(1), freqs), _cpu_plan, call)]


# ---- CUDA ------------------------------------------------------------------------------------------------------

def _why_cuda(query, key, freqs) -> Optional[str]:
    why = triton.why_pair(query, key, (torch.bfloat16, torch.float16, torch.float32, torch.float64))
    if why:
        return why
    _, n, _, d = query.shape
    if d % 2:
        return f"odd head dim {d}"
    if freqs.dtype != torch.complex128:
        return f"freqs dtype {freqs.dtype} (complex128)"
    if freqs.dim() != 2 or freqs.shape[0] not in (1, n) or freqs.shape[1] != d // 2:
        return f"freqs of shape {tuple(freqs.shape)} (must be [N, D/2] = {[n, d // 2]}, or [1, D/2])"
    try:
        eager_layouts(rotary_complex_pair, (query, key, freqs))
    except RuntimeError as error:  # e.g. float64 channels that view_as_complex cannot pair (stride of D not 1)
        return f"the reference chain itself refuses these inputs ({str(error).splitlines()[0]})"
    return complex_mul_modes(query.device)[1]


@ROTARY_COMPLEX_PAIR.kernel(triton.LIBRARY, unsupported=_why_cuda)
def rotary_complex_pair_cuda(query: torch.Tensor, key: torch.Tensor, freqs: torch.Tensor):
    """SANA-Video 2.0's complex128 RoPE of query and key (any strides) in one launch, into eager's output
    layouts."""
    outs = empty_like_eager(rotary_complex_pair, (query, key, freqs), query.device)
    b, n, h, d = query.shape
    if query.numel() == 0:
        return outs
    (re_mode, im_mode), _ = complex_mul_modes(query.device)
    table = torch.view_as_real(freqs.expand(n, d // 2))  # [N, D/2, 2] float64
    size = triton.block(h * d // 2)
    grid = (b * n, -(-(h * d // 2) // size))
    strides = [s for t in (query, key, table, *outs) for s in t.stride()]
    triton.jit()._rotary_complex_pair_kernel[grid](query, key, table, *outs, n, *strides, H=h, P=d // 2,
                                                   RE_MODE=re_mode, IM_MODE=im_mode, BLOCK=size, **triton.LAUNCH)
    return outs
