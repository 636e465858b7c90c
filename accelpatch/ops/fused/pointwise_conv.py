"""bf16 1x1 convolution on CPU, bit for bit eager's where oneDNN emulates bf16 (AVX-512 without bf16 instructions).

There eager's convolution (oneDNN ``jit_bf16_1x1:avx512_core``) is several times slower than float32: each bf16
pair-product instruction is emulated by shifts and two float FMAs. Its result is fixed by its summation order alone,
since a bf16 x bf16 product is exact in float: per output element, the input channels in pairs (odd one first), in
blocks summed from +0 and then added in order, the bias last, one rounding to bf16 (cpu_kernels.cpp replays it).
The block length is oneDNN's choice per layout and shape (measured on torch 2.13's oneDNN 3.12: the whole
reduction for channels-last input, 512 channels for NCHW), so it is not assumed: the first call with a new
signature runs :func:`probe_order` — eager and the kernel on inputs built so that any other pairing, blocking or
bias position changes most outputs — and the op is refused, with that reason, where no candidate reproduces eager.
The first-sight check of :mod:`accelpatch.verify` then compares the real call bit for bit as for every op.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Optional

import torch
import torch.nn.functional as F

from . import cpu_build

#: the reduction blocks tried after the one the layout suggests (0 = the whole reduction)
OTHER_BLOCKS = (0, 512, 256, 1024)
_LOCK = threading.Lock()
_BLOCKS: dict[tuple, tuple[Optional[int], Optional[str]]] = {}


def _key(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> tuple:
    return (x.shape, x.stride(), weight.shape, bias is None, torch.get_num_threads())


def _channels_last(x: torch.Tensor) -> bool:
    return x.stride(1) == 1


def candidate_blocks(x: torch.Tensor) -> tuple[int, ...]:
    """The reduction blocks :func:`probe_order` tries, in order: first the one measured for the layout (torch 2.13's
    oneDNN: the whole reduction for channels-last input, 512 channels for NCHW)."""
    return (0 if _channels_last(x) else 512, *OTHER_BLOCKS)


def _out_format(x: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The layout aten's oneDNN convolution gives its output (channels-last where the input or the weight suggests
    it; meta's convolution does not follow that rule, so it is stated here and checked on first sight)."""
    last = torch.channels_last
    suggests = any(t.is_contiguous(memory_format=last) and not t.is_contiguous() for t in (x, weight))
    return last if suggests else torch.contiguous_format


def why(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[str]:
    """Why the kernel cannot stand in for ``F.conv2d(x, weight, bias)`` here (None when it can): dtypes, shapes,
    layouts, then the probe of eager's summation order (cached per signature)."""
    tensors = [t for t in (x, weight, bias) if t is not None]
    if any(t.dtype != torch.bfloat16 for t in tensors):
        return "pointwise_conv takes bfloat16 input, weight and bias (eager's float32 convolution is not emulated)"
    if x.dim() != 4 or weight.dim() != 4 or weight.shape[2:] != (1, 1) or weight.shape[1] != x.shape[1]:
        return (f"pointwise_conv takes a 1x1 convolution of [N, C, H, W] input, not input {tuple(x.shape)} with "
                f"weight {tuple(weight.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0] or bias.stride(0) != 1):
        return f"pointwise_conv takes a contiguous [{weight.shape[0]}] bias, not {tuple(bias.shape)}"
    if not weight.is_contiguous():
        return "pointwise_conv takes a contiguous weight"
    if x.numel() == 0 or weight.numel() == 0:
        return "pointwise_conv: an empty convolution (eager's is as fast)"
    return reduce_block(x, weight, bias)[1]


def reduce_block(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """``(block, None)``: the reduction block eager's convolution sums in for this signature (probed once), or
    ``(None, reason)`` where no candidate reproduces it."""
    key = _key(x, weight, bias)
    known = _BLOCKS.get(key)  # a dict read is atomic; the probe below runs once per signature
    if known is not None:
        return known
    with _LOCK:
        known = _BLOCKS.get(key)
        if known is None:
            known = _BLOCKS[key] = probe_order(x, weight, bias)
    return known


def _probe_inputs(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """Inputs of the call's shapes and strides on which summation orders differ: every weight row holds small
    terms and a cancelling pair ±2^16 at random channels (or -2^16 with a +2^16 bias), so the small terms added
    while the large one is in the partial sum lose bits that depend on the order; the input is 1 or 0 per pixel and
    channel (each pixel sums a different subset)."""
    g = torch.Generator().manual_seed(20261202)
    out_c, in_c = weight.shape[:2]
    small = torch.rand(out_c, in_c, generator=g) * 2 - 1
    w = (small * 2.0 ** -6).bfloat16().float()
    big = 2.0 ** 16
    rows = torch.arange(out_c)
    first = torch.randint(0, in_c, (out_c,), generator=g)
    w[rows, first] = big
    probe_bias = None
    if bias is not None:
        probe_bias = (torch.rand(out_c, generator=g) * 2 - 1) * 2.0 ** -6
        biased = torch.rand(out_c, generator=g) < 0.5  # these rows cancel their large weight with the bias
        probe_bias[biased] = -big
        probe_bias = probe_bias.bfloat16()
    if in_c > 1:
        second = (first + 1 + torch.randint(0, in_c - 1, (out_c,), generator=g)) % in_c
        keep = torch.ones(out_c, dtype=torch.bool) if bias is None else ~biased
        w[rows[keep], second[keep]] = -big
    ones = (torch.rand(x.shape, generator=g) < 0.9).bfloat16()
    px = torch.empty_strided(x.shape, x.stride(), dtype=torch.bfloat16)
    px.copy_(ones)
    # a pixel whose mask drops one of a row's large terms leaves that row large (uninformative, not wrong)
    return px, w.bfloat16().reshape(weight.shape).contiguous(), probe_bias


def probe_order(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """``(block, None)`` for the first candidate reduction block whose kernel output equals eager's
    ``F.conv2d`` bit for bit on :func:`_probe_inputs`, else ``(None, reason)``."""
    library, reason = cpu_build.load()
    if reason:
        return None, reason
    px, pw, pb = _probe_inputs(x, weight, bias)
    with torch.no_grad():
        expected = F.conv2d(px, pw, pb)
    padded = x.shape[1] + (x.shape[1] & 1)
    for block in dict.fromkeys(0 if b >= padded else b for b in candidate_blocks(x)):
        got = _run(library, px, pw, pb, block)
        if torch.equal(got, expected):
            return block, None
    return None, ("eager's bf16 1x1 convolution on this CPU sums in an order pointwise_conv's kernel does not replay "
                  "(it replays oneDNN's emulated-bf16 order: AVX-512 without bf16 instructions)")


_FN: list = []


def _kernel(library):
    if not _FN:
        address = ctypes.cast(library.ap_pointwise_conv_bf16, ctypes.c_void_p).value
        _FN.append(ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 7))(address))
    return _FN[0]


def _run(library, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], block: int) -> torch.Tensor:
    n, c, h, w = x.shape
    out = torch.empty((n, weight.shape[0], h, w), dtype=torch.bfloat16, memory_format=_out_format(x, weight))
    sizes = (ctypes.c_int64 * 6)(n, c, weight.shape[0], h, w, block or c + (c & 1))
    x_strides = (ctypes.c_int64 * 4)(*x.stride())
    out_strides = (ctypes.c_int64 * 4)(*out.stride())
    _kernel(library)(x.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else 0, out.data_ptr(),
                     ctypes.addressof(sizes), ctypes.addressof(x_strides), ctypes.addressof(out_strides))
    return out


def pointwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.conv2d(x, weight, bias)`` of a bf16 1x1 convolution, summed in eager's (probed) order."""
    block, reason = reduce_block(x, weight, bias)
    if reason:
        raise ValueError(reason)
    library, _ = cpu_build.load()
    return _run(library, x, weight, bias, block)
