"""``linear``: a bf16 linear layer summed in the order of oneDNN's emulated-bf16 GEMM over float operands (CPUs with
AVX-512 and no bf16 instructions; SANA-Video's attention projections), and :func:`linear`, a linear layer's call
through it. (The module is not named ``linear``: the package exports the function :func:`linear` under that
name.)"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu, onednn_bf16
from accelpatch.lossless.ops._module_calls import why_module_runs
from accelpatch.lossless.verify import FusedOp, register


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``nn.Linear``'s call: ``F.linear(x, weight, bias)`` (SANA-Video's attention projections)."""
    return F.linear(x, weight, bias)


LINEAR = register(FusedOp(
    "linear", linear_reference,
    "bf16 linear layer summed in the order of oneDNN's emulated-bf16 GEMM over float operands (CPUs with AVX-512 "
    "and no bf16 instructions)", dtypes=(torch.bfloat16,), devices=("cpu",), single_threaded=True,
    host=onednn_bf16.why_not_this_cpu))

# the kernel replays oneDNN's summation order (kernels/onednn_bf16.py, shared with POINTWISE_CONV); no CUDA kernel
LINEAR.kernel(cpu.LIBRARY, unsupported=onednn_bf16.why_linear)(onednn_bf16.linear)


def linear(site, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` of a linear layer, through LINEAR where it is torch's unhooked ``nn.Linear`` with plain weights
    (else the module itself runs, counted with the reason); with no site (the exact tier's split processor), the
    module."""
    if site is None:
        return layer(x)
    why = why_module_runs(layer, torch.nn.Linear)
    if why is not None:
        return LINEAR.module_call(site, layer, x, reason=why)
    return LINEAR(site, x, layer.weight, layer.bias)
