"""The lossless fused ops the models' fast paths call, each verified on first sight (accelpatch.lossless.verify).

The ops know no model; the adapters' restated forwards say where each chain sits in their model.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.kernels import onednn_bf16, reference
from accelpatch.lossless.verify import MODULE_RUNS, FusedOp, register

RELU_ROPE_PAIR = register(FusedOp(
    "relu_rope_pair", reference.relu_rope_pair,
    "ReLU, interleaved RoPE and the float32 upcast of query and key in one pass (SANA-Video linear attention)"))
MODULATE = register(FusedOp(
    "modulate", reference.modulate, "x * (1 + scale) + shift after a norm, rounded as eager rounds"))
GATED_RESIDUAL = register(FusedOp(
    "gated_residual", reference.gated_residual, "residual + gate * x, rounded as eager rounds"))
SILU = register(FusedOp("silu", reference.silu, "bf16 SiLU by an exact table of the device's own SiLU",
                        dtypes=(torch.bfloat16,)))
GLU_GATE = register(FusedOp("glu_gate", reference.glu_gate, "x * silu(gate) in one pass, SiLU by the bf16 table",
                            dtypes=(torch.bfloat16,)))
SCALE_TO_TOKENS = register(FusedOp(
    "scale_to_tokens", reference.scale_to_tokens,
    "the linear-attention normaliser product, transposed to tokens and cast, in one pass"))
ROTATE_HALF_PAIR = register(FusedOp(
    "rotate_half_pair", reference.rotate_half_pair,
    "partial rotate-half RoPE of query and key with pass-through channels in one pass (MiniMax-H3)"))
ROTARY_COMPLEX_PAIR = register(FusedOp(
    "rotary_complex_pair", reference.rotary_complex_pair,
    "complex128 RoPE of query and key, rounded float64 → float32 → dtype, in one pass (SANA-Video 2.0)"))
SIGMOID_GATE = register(FusedOp("sigmoid_gate", reference.sigmoid_gate,
                                "x * sigmoid(gate) in one pass, the sigmoid by a bf16 table (SANA-Video 2.0's gates)",
                                dtypes=(torch.bfloat16,)))
ROPE_PAIR = register(FusedOp(
    "rope_pair", reference.rope_pair,
    "interleaved RoPE of query and key in one pass, in their dtype (Wan's self-attention)"))
ROPE_PAIR_PER_CHANNEL = register(FusedOp(
    "rope_pair_per_channel", reference.rope_pair_per_channel,
    "interleaved RoPE of query and key in one pass, each channel its own cos/sin entry, float32 products "
    "(HunyuanVideo 1.5's joint attention, LTX-2's interleaved RoPE)"))
SPLIT_ROPE_PAIR = register(FusedOp(
    "rope_split_pair", reference.rope_split_pair,
    "split (rotate-half) RoPE of query and key in one pass, one float32 table entry per pair for both halves, "
    "float32 chain (LTX-2.3's default rope_type)"))
POINTWISE_CONV = register(FusedOp(
    "pointwise_conv", reference.pointwise_conv,
    "bf16 1x1 convolution summed in the order of oneDNN's emulated-bf16 kernel over float operands (CPUs with "
    "AVX-512 and no bf16 instructions)", dtypes=(torch.bfloat16,), devices=("cpu",), single_threaded=True,
    host=onednn_bf16.why_not_this_cpu))
LINEAR = register(FusedOp(
    "linear", reference.linear,
    "bf16 linear layer summed in the order of oneDNN's emulated-bf16 GEMM over float operands (CPUs with AVX-512 "
    "and no bf16 instructions)", dtypes=(torch.bfloat16,), devices=("cpu",), single_threaded=True,
    host=onednn_bf16.why_not_this_cpu))


def _unhooked(module: torch.nn.Module) -> bool:
    """No hooks on ``module`` or on every module, and no instance forward (accelerate's offloading hooks set one):
    its call is its class's forward."""
    hooks = torch.nn.modules.module
    return not (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or "forward" in module.__dict__ or hooks._global_forward_hooks
                or hooks._global_forward_pre_hooks or hooks._global_backward_hooks
                or hooks._global_backward_pre_hooks)


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _why_module_runs(module: torch.nn.Module, base: type) -> Optional[str]:
    """Why ``module``'s call is not ``base``'s plain forward on plain weights (None when it is), naming its class:
    a subclass or wrapper (PEFT's LoRA layers, quanto's QLinear, diffusers' GGUF layers) runs a forward the op does
    not restate; a weight that is a tensor subclass (torchao) holds values only its own operations read; hooks or
    an instance forward (accelerate's offloading, a user's hook) must run."""
    if type(module) is not base:
        return (f"reference: {_qualified(type(module))} runs itself (not torch's {base.__name__}: a wrapper or "
                "subclass, such as a LoRA or quantized layer, whose forward the op does not restate)")
    for name in ("weight", "bias"):
        tensor = getattr(module, name, None)
        if tensor is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            return (f"reference: {base.__name__} with a {_qualified(type(tensor))} {name} runs itself (a tensor "
                    "subclass: quantized or wrapped values that only its own operations read)")
    if not _unhooked(module):
        return MODULE_RUNS
    return None


def conv1x1(site, conv: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` of a 1x1 convolution module, through POINTWISE_CONV where the call restates as
    ``F.conv2d(x, weight, bias)`` (torch's Conv2d, 1x1, stride 1, no padding, dilation 1, one group, plain
    weights, unhooked); else the module itself runs, counted with the reason."""
    why = _why_module_runs(conv, torch.nn.Conv2d)
    if why is None and not (conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.padding == (0, 0)
                            and conv.dilation == (1, 1) and conv.groups == 1 and conv.padding_mode == "zeros"):
        why = MODULE_RUNS
    if why is not None:
        return POINTWISE_CONV.module_call(site, conv, x, reason=why)
    return POINTWISE_CONV(site, x, conv.weight, conv.bias)


def linear(site, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` of a linear layer, through LINEAR where it is torch's unhooked ``nn.Linear`` with plain weights
    (else the module itself runs, counted with the reason); with no site (the exact tier's split processor), the
    module."""
    if site is None:
        return layer(x)
    why = _why_module_runs(layer, torch.nn.Linear)
    if why is not None:
        return LINEAR.module_call(site, layer, x, reason=why)
    return LINEAR(site, x, layer.weight, layer.bias)
