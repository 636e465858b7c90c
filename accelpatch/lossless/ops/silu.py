"""``silu``: bf16 SiLU by an exact table of the device's own eager SiLU."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.layout import empty_like_eager
from accelpatch.lossless.kernels.tables import unary_table
from accelpatch.lossless.verify import FusedOp, register


def silu(x: torch.Tensor) -> torch.Tensor:
    """``F.silu`` (``nn.SiLU``)."""
    return F.silu(x)


SILU = register(FusedOp("silu", silu, "bf16 SiLU by an exact table of the device's own SiLU",
                        dtypes=(torch.bfloat16,)))


def _why_cpu(x):
    return cpu.why_elementwise("silu", silu, (x,), (torch.bfloat16,), "silu")


@SILU.kernel(cpu.LIBRARY, unsupported=_why_cpu)
def silu_cpu(x: torch.Tensor) -> torch.Tensor:
    """bf16 SiLU by eager's own table."""
    return cpu.elementwise(SILU, (x,), lambda lib: lib.table_bf16.default, "silu")


@SILU.kernel(triton.LIBRARY, unsupported=triton.why_bf16)
def silu_cuda(x: torch.Tensor) -> torch.Tensor:
    """bf16 ``F.silu`` by a gather from the device's eager table."""
    table, _ = unary_table("silu", F.silu, x.device)
    (out,) = empty_like_eager(silu, (x,), x.device)
    return triton.elementwise(triton.jit()._silu_kernel, out, (x,), (table,))
