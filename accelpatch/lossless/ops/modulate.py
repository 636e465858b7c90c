"""``modulate``: AdaLN modulation of a normalised ``x``, ``x * (1 + scale) + shift``, in one pass."""
from __future__ import annotations

import torch

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.layout import empty_like_eager
from accelpatch.lossless.verify import FusedOp, register


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """AdaLN modulation of a normalised ``x``: ``x * (1 + scale) + shift`` (three ops, each rounded)."""
    return x * (1 + scale) + shift


MODULATE = register(FusedOp(
    "modulate", modulate, "x * (1 + scale) + shift after a norm, rounded as eager rounds"))


def _why_cpu(x, scale, shift):
    return cpu.why_elementwise("modulate", modulate, (x, scale, shift), cpu.ELEMENTWISE_DTYPES)


@MODULATE.kernel(cpu.LIBRARY, unsupported=_why_cpu)
def modulate_cpu(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``x * (1 + scale) + shift`` in one pass, rounded after each op."""
    return cpu.elementwise(MODULATE, (x, scale, shift), lambda lib: lib.modulate.default)


@MODULATE.kernel(triton.LIBRARY, unsupported=triton.why_same_dtype)
def modulate_cuda(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``x * (1 + scale) + shift`` as eager rounds it, in one launch."""
    (out,) = empty_like_eager(modulate, (x, scale, shift), x.device)
    return triton.elementwise(triton.jit()._modulate_kernel, out, (x, scale, shift))


@cpu.known_answers
def _known_answers(inputs: dict) -> list:
    args = (inputs["x"], inputs["scale"], inputs["shift"])
    return [(modulate, args, lambda a: cpu.plan_for("modulate", modulate, a),
             lambda lib, a, o, size, st: lib.modulate(*o, *a, size, st))]
