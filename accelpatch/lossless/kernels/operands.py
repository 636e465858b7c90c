"""The one check every native op (the CPU kernels and the Triton kernels) makes first: only plain dense tensors on the
op's device reach native code.

A tensor accelpatch does not understand is declined with a reason before any kernel runs: a subclass (torchao's
quantized weights, GGUF or quanto tensors, DTensor, a wrapper whose ``data_ptr()`` is 0 or not its values), a
quantized or sparse tensor, a fake one (a memory trace), a meta tensor, one on another device. The module or chain
then runs itself, as in diffusers.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch

#: why a fake operand (a memory trace: accelpatch.memory) never reaches native code; the fused ops plan such calls
#: as their kernels would run them (accelpatch.lossless.verify.FusedOp._traced)
FAKE_OPERAND = ("an operand is fake (a memory trace: shapes without values), so nothing can be checked or computed "
                "natively")
#: the tensor types whose storage is their values (a Parameter of a plain tensor is one)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def describe_type(t: torch.Tensor) -> str:
    """A tensor's class as a reader finds it: ``torchao...Int8Tensor``."""
    kind = type(t)
    return f"{kind.__module__}.{kind.__qualname__}"


def foreign_operand(tensors: Iterable[torch.Tensor], device_type: str) -> Optional[str]:
    """Why one of ``tensors`` must not reach a native kernel on ``device_type`` (None when none is)."""
    from torch._subclasses.fake_tensor import is_fake

    for t in tensors:
        if is_fake(t):
            return FAKE_OPERAND
        if type(t) not in _PLAIN:
            return (f"an operand is a {describe_type(t)} (a tensor subclass: quantized or wrapped values that only "
                    "its own operations read)")
        if t.is_quantized:
            return f"an operand is a quantized {t.dtype} tensor"
        if t.layout != torch.strided:
            return f"an operand is a {t.layout} tensor, not a dense strided one"
        if t.device.type != device_type:
            kind = "CUDA" if device_type == "cuda" else device_type.upper()
            return f"the {kind} kernels take {kind} tensors, not one on {t.device}"
    return None
