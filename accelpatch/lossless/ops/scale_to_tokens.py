"""``scale_to_tokens``: SANA-Video's linear-attention epilogue, the normaliser product transposed to tokens and cast,
in one pass."""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.layout import eager_layouts, empty_like_eager
from accelpatch.lossless.verify import FusedOp, register


def scale_to_tokens(x: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SANA-Video's linear-attention epilogue: ``[B, H, D, N]`` float32 ``x`` times the normaliser ``z``
    (``[B, H, 1, N]``), as ``[B, N, H*D]`` tokens in ``dtype``. The result is the transposed (N-minor) view the
    reference hands to ``to_out[0]``; its layout matters there (a biased Linear rounds differently on it)."""
    return (x * z).flatten(1, 2).transpose(1, 2).to(dtype)


SCALE_TO_TOKENS = register(FusedOp(
    "scale_to_tokens", scale_to_tokens,
    "the linear-attention normaliser product, transposed to tokens and cast, in one pass"))


def _tokens_view(out: torch.Tensor, h: int, d: int) -> torch.Tensor:
    """The [B, H, D, N] view of scale_to_tokens' [B, N, H*D] output."""
    return out.transpose(1, 2).unflatten(1, (h, d))


def _cpu_plan(x, z, dtype):
    """The element-wise plan over x's [B, H, D, N] space, writing eager's [B, N, H*D] output through its view."""
    def make():
        (shape, strides, _), = eager_layouts(scale_to_tokens, (x, z, dtype))
        try:
            view = _tokens_view(torch.empty_strided(shape, strides, device="meta"), x.shape[1], x.shape[2])
        except RuntimeError:
            return None
        if tuple(view.shape) != tuple(x.shape):
            return None
        return cpu.elementwise_plan(tuple(view.shape), view.stride(), [x, z])
    return cpu.cached_plan("scale_to_tokens", (x, z, dtype), make)


def _why_cpu(x, z, dtype) -> Optional[str]:
    if dtype == torch.float32:
        return "scale_to_tokens to float32 has nothing to fuse (the product is the output)"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"scale_to_tokens casts to bf16 or fp16, not {dtype}"
    if x.dtype != torch.float32 or z.dtype not in cpu.ELEMENTWISE_DTYPES or x.dim() != 4:
        return ("scale_to_tokens takes a float32 [B, H, D, N] x and a bf16, fp16 or float32 z, "
                f"not {x.dtype} {tuple(x.shape)} / {z.dtype}")
    if _cpu_plan(x, z, dtype) is None:
        return "scale_to_tokens: this layout of x and z does not reduce to 4 strided dims"
    return None


@SCALE_TO_TOKENS.kernel(cpu.LIBRARY, unsupported=_why_cpu)
def scale_to_tokens_cpu(x: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x * z`` (z widened exactly to float32, as eager promotes) rounded once to ``dtype``, written straight into
    eager's N-minor ``[B, N, H*D]`` layout."""
    args = (x, z, dtype)
    prep = cpu.prepared(SCALE_TO_TOKENS, args, lambda lib: lib.scale_to.default, lambda: _cpu_plan(x, z, dtype))
    out = cpu.output(prep)
    if prep.nonempty:
        prep.op(out, x, z, prep.size, prep.strides)
    return out


def _why_cuda(x, z, dtype) -> Optional[str]:
    if x.dtype != torch.float32 or z.dtype not in triton.FLOATS:
        return f"x {x.dtype}, z {z.dtype} (float32 x, floating z)"
    if dtype not in triton.FLOATS:
        return f"output dtype {dtype}"
    if x.dim() != 4 or triton.broadcast(x, z) != x.shape:
        return "x must be [B, H, D, N] with z broadcasting to it"
    return None


@SCALE_TO_TOKENS.kernel(triton.LIBRARY, unsupported=_why_cuda, values=1)  # the last argument is a dtype
def scale_to_tokens_cuda(x: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(x * z).flatten(1, 2).transpose(1, 2).to(dtype)`` in one launch, into eager's (N-minor) layout."""
    (out,) = empty_like_eager(scale_to_tokens, (x, z, dtype), x.device)
    b, h, d, n = x.shape
    sb, sn, sc = out.stride()
    as_bhdn = out.as_strided((b, h, d, n), (sb, d * sc, sc, sn))  # token (b, n), channel h*D + d
    triton.elementwise(triton.jit()._scale_cast_kernel, as_bhdn, (x, z))
    return out
