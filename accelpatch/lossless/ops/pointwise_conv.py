"""``pointwise_conv``: a bf16 1x1 convolution summed in the order of oneDNN's emulated-bf16 kernel over float
operands (CPUs with AVX-512 and no bf16 instructions; GLUMB's ``conv_inverted`` and ``conv_point``), and
:func:`conv1x1`, a 1x1 convolution module's call through it."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from accelpatch.lossless.kernels import cpu, onednn_bf16
from accelpatch.lossless.ops._module_calls import why_module_runs
from accelpatch.lossless.verify import MODULE_RUNS, FusedOp, register


def pointwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """A 1x1 convolution as ``nn.Conv2d`` with stride 1, no padding, dilation 1 and one group runs it (GLUMB's
    ``conv_inverted`` and ``conv_point``)."""
    return F.conv2d(x, weight, bias)


POINTWISE_CONV = register(FusedOp(
    "pointwise_conv", pointwise_conv,
    "bf16 1x1 convolution summed in the order of oneDNN's emulated-bf16 kernel over float operands (CPUs with "
    "AVX-512 and no bf16 instructions)", dtypes=(torch.bfloat16,), devices=("cpu",), single_threaded=True,
    host=onednn_bf16.why_not_this_cpu))

# the kernel replays oneDNN's summation order (kernels/onednn_bf16.py, shared with LINEAR); no CUDA kernel
POINTWISE_CONV.kernel(cpu.LIBRARY, unsupported=onednn_bf16.why_pointwise_conv)(onednn_bf16.pointwise_conv)


def conv1x1(site, conv: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` of a 1x1 convolution module, through POINTWISE_CONV where the call restates as
    ``F.conv2d(x, weight, bias)`` (torch's Conv2d, 1x1, stride 1, no padding, dilation 1, one group, plain
    weights, unhooked); else the module itself runs, counted with the reason."""
    why = why_module_runs(conv, torch.nn.Conv2d)
    if why is None and not (conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.padding == (0, 0)
                            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding_mode == "zeros"):
        why = MODULE_RUNS
    if why is not None:
        return POINTWISE_CONV.module_call(site, conv, x, reason=why)
    return POINTWISE_CONV(site, x, conv.weight, conv.bias)
