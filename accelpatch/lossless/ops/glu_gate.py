"""``glu_gate``: GLUMB's and SwiGLU's gate ``x * silu(gate)`` of bf16 in one pass, the SiLU by eager's table."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.layout import empty_like_eager
from accelpatch.lossless.kernels.tables import unary_table
from accelpatch.lossless.verify import FusedOp, register


def glu_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """GLUMB's gate: ``x * silu(gate)`` (the SiLU rounded, then the product)."""
    return x * F.silu(gate)


GLU_GATE = register(FusedOp("glu_gate", glu_gate, "x * silu(gate) in one pass, SiLU by the bf16 table",
                            dtypes=(torch.bfloat16,)))


def _why_cpu(x, gate):
    return cpu.why_elementwise("glu_gate", glu_gate, (x, gate), (torch.bfloat16,), "silu")


@GLU_GATE.kernel(cpu.LIBRARY, unsupported=_why_cpu, keeps=cpu.keeps_table("silu"))
def glu_gate_cpu(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """bf16 ``x * silu(gate)``, the SiLU from eager's table, in one pass."""
    return cpu.elementwise(GLU_GATE, (x, gate), lambda lib: lib.glu_gate_bf16.default, "silu")


@GLU_GATE.kernel(triton.LIBRARY, unsupported=triton.why_bf16, keeps=triton.keeps_table("silu", F.silu))
def glu_gate_cuda(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """bf16 ``x * silu(gate)`` in one launch, the SiLU gathered from the device's eager table."""
    table, _ = unary_table("silu", F.silu, x.device)
    (out,) = empty_like_eager(glu_gate, (x, gate), x.device)
    return triton.elementwise(triton.jit()._glu_gate_kernel, out, (x, gate), (table,))
