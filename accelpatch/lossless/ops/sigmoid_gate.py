"""``sigmoid_gate``: ``x * sigmoid(gate)`` of bf16 in one pass, the sigmoid by eager's table (SANA-Video 2.0's
output gate and its linear attention's key gate)."""
from __future__ import annotations

import torch

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.layout import empty_like_eager
from accelpatch.lossless.kernels.tables import unary_table
from accelpatch.lossless.verify import FusedOp, register


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """A sigmoid gate: ``x * sigmoid(gate)`` (the sigmoid rounded, then the product); SANA-Video 2.0's output gate
    and its linear attention's key gate ``β``, where ``gate`` broadcasts over the head dim."""
    return x * torch.sigmoid(gate)


SIGMOID_GATE = register(FusedOp("sigmoid_gate", sigmoid_gate,
                                "x * sigmoid(gate) in one pass, the sigmoid by a bf16 table (SANA-Video 2.0's gates)",
                                dtypes=(torch.bfloat16,)))


def _why_cpu(x, gate):
    return cpu.why_elementwise("sigmoid_gate", sigmoid_gate, (x, gate), (torch.bfloat16,), "sigmoid")


@SIGMOID_GATE.kernel(cpu.LIBRARY, unsupported=_why_cpu, keeps=cpu.keeps_table("sigmoid"))
def sigmoid_gate_cpu(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """bf16 ``x * sigmoid(gate)`` in one pass, by glu_gate's kernel with eager's sigmoid table in place of the SiLU
    one (the kernel only gathers ``table[bits(gate)]`` and rounds the product)."""
    return cpu.elementwise(SIGMOID_GATE, (x, gate), lambda lib: lib.glu_gate_bf16.default, "sigmoid")


def _why_cuda(x, gate):
    return triton.why_bf16(x, gate, table=("sigmoid", torch.sigmoid))


@SIGMOID_GATE.kernel(triton.LIBRARY, unsupported=_why_cuda,
                     keeps=triton.keeps_table("sigmoid", torch.sigmoid))
def sigmoid_gate_cuda(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """bf16 ``x * sigmoid(gate)``: glu_gate's kernel gathering from the device's eager sigmoid table."""
    table, _ = unary_table("sigmoid", torch.sigmoid, x.device)
    (out,) = empty_like_eager(sigmoid_gate, (x, gate), x.device)
    return triton.elementwise(triton.jit()._glu_gate_kernel, out, (x, gate), (table,))
