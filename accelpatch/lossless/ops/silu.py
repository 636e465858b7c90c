"""``silu``: bf16 SiLU by an exact table of the device's own eager SiLU; ``silu_inplace``: the same written over its
input where nothing reads that input again (one tensor less at the peak, issue #44)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.layout import eager_layouts, empty_like_eager
from accelpatch.lossless.kernels.tables import unary_table
from accelpatch.lossless.verify import FusedOp, register


def silu(x: torch.Tensor) -> torch.Tensor:
    """``F.silu`` (``nn.SiLU``)."""
    return F.silu(x)


SILU = register(FusedOp("silu", silu, "bf16 SiLU by an exact table of the device's own SiLU",
                        dtypes=(torch.bfloat16,)))


def _why_cpu(x):
    return cpu.why_elementwise("silu", silu, (x,), (torch.bfloat16,), "silu")


@SILU.kernel(cpu.LIBRARY, unsupported=_why_cpu, keeps=cpu.keeps_table("silu"))
def silu_cpu(x: torch.Tensor) -> torch.Tensor:
    """bf16 SiLU by eager's own table."""
    return cpu.elementwise(SILU, (x,), lambda lib: lib.table_bf16.default, "silu")


@SILU.kernel(triton.LIBRARY, unsupported=triton.why_bf16,
             keeps=triton.keeps_table("silu", F.silu))
def silu_cuda(x: torch.Tensor) -> torch.Tensor:
    """bf16 ``F.silu`` by a gather from the device's eager table."""
    table, _ = unary_table("silu", F.silu, x.device)
    (out,) = empty_like_eager(silu, (x,), x.device)
    return triton.elementwise(triton.jit()._silu_kernel, out, (x,), (table,))


SILU_INPLACE = register(FusedOp("silu_inplace", silu, "bf16 SiLU by the table, written over its input",
                                dtypes=(torch.bfloat16,), inplace=True))


def _same_layout(x) -> str | None:
    """Eager's out-of-place SiLU must have the input's strides, so the result written over it is laid out as
    eager's (a dense input: contiguous or channels-last)."""
    (shape, strides, _), = eager_layouts(silu, (x,))
    if tuple(strides) != tuple(x.stride()):
        return f"eager's SiLU gives strides {tuple(strides)} to an input of strides {tuple(x.stride())}"
    return None


def _why_cpu_inplace(x):
    return _same_layout(x) or _why_cpu(x)


def _why_cuda_inplace(x):
    return _same_layout(x) or triton.why_bf16(x)


@SILU_INPLACE.kernel(cpu.LIBRARY, unsupported=_why_cpu_inplace, keeps=cpu.keeps_table("silu"))
def silu_inplace_cpu(x: torch.Tensor) -> torch.Tensor:
    """bf16 SiLU by eager's own table, over ``x``."""
    return cpu.elementwise(SILU_INPLACE, (x,), lambda lib: lib.table_bf16.default, "silu", out=x)


@SILU_INPLACE.kernel(triton.LIBRARY, unsupported=_why_cuda_inplace,
                     keeps=triton.keeps_table("silu", F.silu))
def silu_inplace_cuda(x: torch.Tensor) -> torch.Tensor:
    """bf16 ``F.silu`` by a gather from the device's eager table, over ``x`` (each element read before written)."""
    table, _ = unary_table("silu", F.silu, x.device)
    return triton.elementwise(triton.jit()._silu_kernel, x, (x,), (table,))
