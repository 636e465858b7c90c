"""``gelu_inplace``: a feed-forward's GELU written over its input, the projection's output that nothing reads
again: torch's own in-place GELU (``aten::gelu_``), the same kernel as ``F.gelu`` with the output aliased to the
input, so the feed-forward holds one hidden-sized tensor less at its peak (issue #44) and computes the same bits
(checked on first sight per signature, as every fused op). Any dtype GELU takes; the input must be dense, so its
result has the strides eager's out-of-place GELU gives it."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.verify import FusedOp, register

#: the ``approximate`` values F.gelu takes
APPROXIMATIONS = ("none", "tanh")


def gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """``F.gelu(x, approximate=approximate)``, as diffusers' ``GELU.gelu`` calls it."""
    return F.gelu(x, approximate=approximate)


GELU_INPLACE = register(FusedOp("gelu_inplace", gelu, "GELU written over its input (torch's gelu_), one tensor less",
                                inplace=True))


def _why(x: torch.Tensor, approximate: str) -> Optional[str]:
    if approximate not in APPROXIMATIONS:
        return f"approximate={approximate!r} (F.gelu takes {', '.join(map(repr, APPROXIMATIONS))})"
    if not x.is_floating_point():
        return f"a {x.dtype} input"
    if not x.is_contiguous():
        return "a non-contiguous input (eager's out-of-place GELU would give its result other strides)"
    return None


@GELU_INPLACE.kernel(cpu.LIBRARY, unsupported=_why)
def gelu_inplace_cpu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """``x`` overwritten by its GELU (aten's CPU kernel)."""
    return torch.ops.aten.gelu_(x, approximate=approximate)


@GELU_INPLACE.kernel(triton.LIBRARY, unsupported=_why, values=1)
def gelu_inplace_cuda(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """``x`` overwritten by its GELU (aten's CUDA kernel: no Triton kernel is needed for this one)."""
    return torch.ops.aten.gelu_(x, approximate=approximate)
