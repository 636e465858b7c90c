"""``gated_residual``: the gated residual add of DiT blocks, ``residual + gate * x``, in one pass."""
from __future__ import annotations

import torch

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.layout import empty_like_eager
from accelpatch.lossless.verify import FusedOp, register


def gated_residual(residual: torch.Tensor, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The gated residual add of DiT blocks: ``residual + gate * x`` (the product rounded, then the sum)."""
    return residual + gate * x


GATED_RESIDUAL = register(FusedOp(
    "gated_residual", gated_residual, "residual + gate * x, rounded as eager rounds"))


def _why_cpu(residual, gate, x):
    return cpu.why_elementwise("gated_residual", gated_residual, (residual, gate, x), cpu.ELEMENTWISE_DTYPES)


@GATED_RESIDUAL.kernel(cpu.LIBRARY, unsupported=_why_cpu)
def gated_residual_cpu(residual: torch.Tensor, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``residual + gate * x`` in one pass, the product rounded."""
    return cpu.elementwise(GATED_RESIDUAL, (residual, gate, x), lambda lib: lib.gated_residual.default)


@GATED_RESIDUAL.kernel(triton.LIBRARY, unsupported=triton.why_same_dtype)
def gated_residual_cuda(residual: torch.Tensor, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``residual + gate * x`` as eager rounds it, in one launch."""
    (out,) = empty_like_eager(gated_residual, (residual, gate, x), x.device)
    return triton.elementwise(triton.jit()._gated_residual_kernel, out, (residual, gate, x))
