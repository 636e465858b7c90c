"""bf16 1x1 convolutions and linear layers on CPU, bit for bit eager's where oneDNN emulates bf16 (AVX-512 without
bf16 instructions).

There eager's convolution (oneDNN ``jit_bf16_1x1:avx512_core``) and matmul (``gemm:jit:bf16``) are several times
slower than float32: each bf16 pair-product instruction is emulated by shifts and two float FMAs. Their results
are fixed by the summation order alone, since a bf16 x bf16 product is exact in float: per output element, the
input channels in pairs (odd one first), in blocks summed from +0 and then added in order, the bias last (for
some GEMM layouts first, or added in bf16 after the rounding), one rounding to bf16; cpu_kernels.cpp replays that
order over float copies. The block
length is oneDNN's choice per layout and shape (measured with torch 2.13's oneDNN 3.12: the whole reduction for
channels-last convolution input, 512 channels for NCHW; two halves for a 448..1120-feature linear layer, blocks of
768 at 2240), so it is not assumed: the first call with a new signature runs :func:`probe_order` — eager and the
kernel on inputs built so that any other pairing, blocking or bias position changes most outputs — over a few
candidates, and the op is refused, with that reason, where none reproduces eager. The first-sight check of
:mod:`accelpatch.lossless.verify` then compares the real call bit for bit, as for every op.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu_build
from accelpatch.lossless.kernels.operands import foreign_operand

_LOCK = threading.Lock()
_ORDERS: dict[tuple, tuple] = {}

#: what oneDNN's ``avx512_core`` kernels need; with one of NATIVE_BF16 too, oneDNN multiplies bf16 in hardware
AVX512_CORE = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})


def why_not_this_cpu(features: Optional[frozenset] = None) -> Optional[str]:
    """Why eager's bf16 convolutions and GEMMs on this CPU are not the oneDNN emulated-bf16 kernels these ops
    replay (None where they may be: AVX-512 without bf16 instructions; the probe then has the last word). On any
    other CPU the ops are not applicable: the reference runs, counted, which is expected there, not a fault."""
    features = cpu_build.cpu_features() if features is None else features
    if not features:
        return ("its features cannot be read (no /proc/cpuinfo); the ops replay oneDNN's emulated-bf16 kernels of "
                "AVX-512 CPUs without bf16 instructions")
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN, whose emulated-bf16 kernels the ops replay"
    native = sorted(features & NATIVE_BF16)
    if native:
        return (f"it has {' and '.join(native)}: oneDNN multiplies bf16 in hardware here, an order the ops do not "
                "replay (they replay its emulated-bf16 kernels of AVX-512 CPUs without bf16 instructions)")
    missing = sorted(AVX512_CORE - features)
    if missing:
        kind = ("an AVX2 CPU" if "avx2" in features else "a CPU without AVX2") + (
            " without AVX-512" if len(missing) == len(AVX512_CORE) else f" without {'/'.join(missing)}")
        return (f"{kind}, whose eager bf16 convolutions and GEMMs are not the oneDNN emulated-bf16 kernels these ops "
                "replay (AVX-512 without bf16 instructions)")
    return None


# ---- the two ops as one kernel problem: pixels (n, h, w) x channels k -> outputs o ---------------------------

def _conv_view(x: torch.Tensor, out: torch.Tensor):
    return tuple(x.shape), tuple(x.stride()), tuple(out.stride())


def _linear_view(x: torch.Tensor, out: torch.Tensor):
    """[B, S, K] (or [S, K]) tokens as B images of S x 1 pixels with K channels."""
    if x.dim() == 2:
        return (1, x.shape[1], x.shape[0], 1), (0, x.stride(1), x.stride(0), 0), (0, out.stride(1), out.stride(0), 0)
    return ((x.shape[0], x.shape[2], x.shape[1], 1), (x.stride(0), x.stride(2), x.stride(1), 0),
            (out.stride(0), out.stride(2), out.stride(1), 0))


def _out_format(x: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The layout aten's oneDNN convolution gives its output (channels-last where the input or the weight suggests
    it; meta's convolution does not follow that rule, so it is stated here and checked on first sight)."""
    last = torch.channels_last
    suggests = any(t.is_contiguous(memory_format=last) and not t.is_contiguous() for t in (x, weight))
    return last if suggests else torch.contiguous_format


def _empty_out(op: str, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if op == "linear":
        return torch.empty((*x.shape[:-1], weight.shape[0]), dtype=torch.bfloat16)
    n, _, h, w = x.shape
    return torch.empty((n, weight.shape[0], h, w), dtype=torch.bfloat16, memory_format=_out_format(x, weight))


#: where the bias enters the sum: after the blocks, before the first, or (aten's addmm on a transposed input) as a
#: bf16 add after the product is rounded
BIAS_LAST, BIAS_FIRST, BIAS_ROUNDED = 0, 1, 2


def _run(library, op: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
         order: tuple[int, int]) -> torch.Tensor:
    """The kernel's result for ``order`` = (reduction block, 0 for the whole reduction; where the bias enters), by
    ``library``'s ``gemm_bf16`` op."""
    out = _empty_out(op, x, weight)
    (n, k, h, w), x_strides, out_strides = (_linear_view if op == "linear" else _conv_view)(x, out)
    block, bias_mode = order
    rounded_bias, bias = (bias, None) if bias_mode == BIAS_ROUNDED else (None, bias)
    library.gemm_bf16.default(x, weight, bias, out, [n, k, weight.shape[0], h, w], list(x_strides),
                              list(out_strides), block or k + (k & 1), bias_mode == BIAS_FIRST)
    if rounded_bias is not None:
        out += rounded_bias  # eager's own bf16 add, as aten adds it
    return out


# ---- which order eager sums in --------------------------------------------------------------------------------

def candidate_orders(op: str, x: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """The (block, bias position) orders :func:`probe_order` tries, the ones measured for the layout first."""
    if op == "pointwise_conv":
        return tuple((block, BIAS_LAST) for block in (0 if x.stride(1) == 1 else 512, 0, 512, 256, 1024))
    k = x.shape[-1] + (x.shape[-1] & 1)
    half = (k // 2 + 1) // 2 * 2
    return tuple((block, bias) for block in (half, 0, 768, 512, 256) for bias in (BIAS_LAST, BIAS_ROUNDED, BIAS_FIRST))


def _probe_inputs(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """Inputs of the call's shapes and strides on which summation orders differ: every weight row holds small
    terms and a cancelling pair ±2^16 at random channels (or -2^16 with a +2^16 bias), so the small terms added
    while the large one is in the partial sum lose bits that depend on the order; the input is 1 or 0 per pixel and
    channel (each pixel sums another subset; one that drops a large term leaves its row large: uninformative, not
    wrong)."""
    g = torch.Generator().manual_seed(20261202)
    out_c, in_c = weight.shape[0], weight.shape[1]
    w = ((torch.rand(out_c, in_c, generator=g) * 2 - 1) * 2.0 ** -6).bfloat16().float()
    big = 2.0 ** 16
    rows = torch.arange(out_c)
    first = torch.randint(0, in_c, (out_c,), generator=g)
    w[rows, first] = big
    probe_bias, biased = None, torch.zeros(out_c, dtype=torch.bool)
    if bias is not None:
        probe_bias = (torch.rand(out_c, generator=g) * 2 - 1) * 2.0 ** -6
        biased = torch.rand(out_c, generator=g) < 0.5  # these rows cancel their large weight with the bias
        probe_bias[biased] = -big
        probe_bias = probe_bias.bfloat16()
    if in_c > 1:
        second = (first + 1 + torch.randint(0, in_c - 1, (out_c,), generator=g)) % in_c
        w[rows[~biased], second[~biased]] = -big
    px = torch.empty_strided(x.shape, x.stride(), dtype=torch.bfloat16)
    px.copy_((torch.rand(x.shape, generator=g) < 0.9).bfloat16())
    return px, w.bfloat16().reshape(weight.shape).contiguous(), probe_bias


def _reference(op: str):
    return F.linear if op == "linear" else F.conv2d


def probe_order(op: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """``(order, None)`` for the first of :func:`candidate_orders` whose kernel output equals eager's bit for bit on
    :func:`_probe_inputs`, else ``(None, reason)``."""
    library, reason = cpu_build.load()
    if reason:
        return None, reason
    px, pw, pb = _probe_inputs(x, weight, bias)
    with torch.no_grad():
        expected = _reference(op)(px, pw, pb)
    k = x.shape[1] if op == "pointwise_conv" else x.shape[-1]
    padded = k + (k & 1)
    orders = dict.fromkeys((0 if block >= padded else block, mode if bias is not None else BIAS_LAST)
                           for block, mode in candidate_orders(op, x))
    for order in orders:
        if torch.equal(_run(library, op, px, pw, pb, order), expected):
            return order, None
    what = "1x1 convolution" if op == "pointwise_conv" else "linear layer"
    return None, (f"eager's bf16 {what} on this CPU sums in an order {op}'s kernel does not replay (it replays "
                  "oneDNN's emulated-bf16 order: AVX-512 without bf16 instructions)")


def summation_order(op: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """``(order, None)``: the order eager sums in for this signature (probed once), or ``(None, reason)``."""
    key = (op, x.shape, x.stride(), weight.shape, bias is None, torch.get_num_threads())
    known = _ORDERS.get(key)  # a dict read is atomic; the probe below runs once per signature
    if known is not None:
        return known
    with _LOCK:
        known = _ORDERS.get(key)
        if known is None:
            known = _ORDERS[key] = probe_order(op, x, weight, bias)
    return known


# ---- the ops --------------------------------------------------------------------------------------------------

def _why_common(op: str, x, weight, bias) -> Optional[str]:
    tensors = [t for t in (x, weight, bias) if t is not None]
    foreign = foreign_operand(tensors, "cpu")
    if foreign:
        return f"{op}: {foreign}"
    if any(t.dtype != torch.bfloat16 for t in tensors):
        return f"{op} takes bfloat16 input, weight and bias (eager's float32 kernels are not emulated)"
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0] or bias.stride(0) != 1):
        return f"{op} takes a contiguous [{weight.shape[0]}] bias, not {tuple(bias.shape)}"
    if not weight.is_contiguous():
        return f"{op} takes a contiguous weight"
    if x.numel() == 0 or weight.numel() == 0:
        return f"{op}: an empty product (eager's is as fast)"
    return None


def why_pointwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[str]:
    """Why the kernel cannot stand in for ``F.conv2d(x, weight, bias)`` here (None when it can): dtypes, shapes,
    layouts, then the probe of eager's summation order (cached per signature)."""
    if x.dim() != 4 or weight.dim() != 4 or weight.shape[2:] != (1, 1) or weight.shape[1] != x.shape[1]:
        return (f"pointwise_conv takes a 1x1 convolution of [N, C, H, W] input, not input {tuple(x.shape)} with "
                f"weight {tuple(weight.shape)}")
    return _why_common("pointwise_conv", x, weight, bias) or summation_order("pointwise_conv", x, weight, bias)[1]


def why_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[str]:
    """Why the kernel cannot stand in for ``F.linear(x, weight, bias)`` here (None when it can)."""
    if x.dim() not in (2, 3) or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        return (f"linear takes [S, K] or [B, S, K] input and a [O, K] weight, not input {tuple(x.shape)} with "
                f"weight {tuple(weight.shape)}")
    return _why_common("linear", x, weight, bias) or summation_order("linear", x, weight, bias)[1]


def _call(op: str, x, weight, bias) -> torch.Tensor:
    order, reason = summation_order(op, x, weight, bias)
    if reason:
        raise ValueError(reason)
    library, _ = cpu_build.load()
    return _run(library, op, x, weight, bias, order)


def pointwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.conv2d(x, weight, bias)`` of a bf16 1x1 convolution, summed in eager's (probed) order."""
    return _call("pointwise_conv", x, weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` of bf16 operands, summed in eager's (probed) order."""
    return _call("linear", x, weight, bias)
