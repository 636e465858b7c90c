"""The fused ops' Triton launches, captured ahead of time for a GPU target on a machine without one.

Each case runs an op's registered CUDA kernel (which picks BLOCK and the strides Triton specialises on) under
accelpatch.core.triton_aot's stand-in driver, on CPU tensors of the models' widths (SANA-Video: hidden 2240, 20 heads
x 112, GLUMB 11,200 channels; MiniMax-H3: 56 heads x 128, rotary dim 96; SANA-Video 2.0: 20 x 128 and 10 x 256)
with a small token count of the same divisibility as the release ones (24 and 32,760 or 23,000 are 8 mod 16; 32
and H3's 37,760 are 0 mod 16): an element-wise kernel's compiled code depends on the widths and on which strides
and sizes are 1 or multiples of 16, not on how many tokens there are — except where the output is N-minor (a
transposed residual, scale_to_tokens, the linear attention's sigmoid output gate): there a row runs over the tokens
and its BLOCK depends on their count, so those cases take 8,200 tokens (batch 1), which gets the release shapes'
BLOCK of 1024. The tensors are left uninitialised (nothing runs). TRITON_INTERPRET must be unset.
"""
from __future__ import annotations

from typing import Callable

import torch

from accelpatch.core import triton_aot

TOKENS = 24
H3_TOKENS = 32
N_MINOR_TOKENS = 8200
BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


def _rope(q_dtype, table_dtype):
    def args():
        q = torch.empty(2, TOKENS, 20, 112, dtype=q_dtype)
        table = torch.empty(1, TOKENS, 1, 112, dtype=table_dtype)
        return q, q.clone(), table, table.clone()
    return "relu_rope_pair", args


def _plain_rope(q_dtype, table_dtype):
    def args():  # Wan2.1: 12 heads x 128 (1.3B), [1, N, 1, D] tables (float64 as WanRotaryPosEmbed builds them)
        q = torch.empty(2, TOKENS, 12, 128, dtype=q_dtype)
        table = torch.empty(1, TOKENS, 1, 128, dtype=table_dtype)
        return q, q.clone(), table, table.clone()
    return "rope_pair", args


def _per_channel_rope(q_dtype, table_dtype):
    def args():  # HunyuanVideo 1.5 (8.3B): 16 heads x 128, [1, N, 1, D] tables (float32 as its rotary embedding)
        q = torch.empty(2, TOKENS, 16, 128, dtype=q_dtype)
        table = torch.empty(1, TOKENS, 1, 128, dtype=table_dtype)
        return q, q.clone(), table, table.clone()
    return "rope_pair_per_channel", args


def _modulate(dtype):
    def args():
        rows = torch.empty(2, 1, 6, 2240, dtype=dtype)  # unbind(2) of the modulation table: token stride 6C
        return torch.empty(2, TOKENS, 2240, dtype=dtype), rows[:, :, 1], rows[:, :, 0]
    return "modulate", args


def _residual(dtype, transposed=False):
    def args():
        batch, tokens = (1, N_MINOR_TOKENS) if transposed else (2, TOKENS)
        rows = torch.empty(batch, 1, 6, 2240, dtype=dtype)
        x = torch.empty(batch, tokens, 2240, dtype=dtype)
        residual = torch.empty(batch, 2240, tokens, dtype=dtype).transpose(1, 2) if transposed else x.clone()
        return residual, rows[:, :, 2], x
    return "gated_residual", args


def _conv_out(channels):
    return torch.empty(2, channels, 3, 8, dtype=BF16, memory_format=torch.channels_last)


def _silu():
    return "silu", lambda: (_conv_out(11200),)


def _glu():
    def args():
        x, gate = _conv_out(2 * 5600).chunk(2, dim=1)
        return x, gate
    return "glu_gate", args


def _sigmoid_gate(kind):
    def args():  # SANA-Video 2.0, 20 heads x 128: the key gate sigmoid(beta) [B, N, H, 1] over D; the output gate
        if kind == "key":  # [B, N, C] on the attention output (N-minor after the linear attention)
            return torch.empty(2, TOKENS, 20, 128, dtype=BF16), torch.empty(2, TOKENS, 20, 1, dtype=BF16)
        if kind == "n-minor":
            return (torch.empty(1, 2560, N_MINOR_TOKENS, dtype=BF16).transpose(1, 2),
                    torch.empty(1, N_MINOR_TOKENS, 2560, dtype=BF16))
        return torch.empty(2, TOKENS, 2560, dtype=BF16), torch.empty(2, TOKENS, 2560, dtype=BF16)
    return "sigmoid_gate", args


def _scale_to_tokens(dtype, z_dtype=BF16):
    return "scale_to_tokens", lambda: (torch.empty(1, 20, 112, N_MINOR_TOKENS),
                                       torch.empty(1, 20, 1, N_MINOR_TOKENS, dtype=z_dtype), dtype)


def _rotate_half(dtype):
    def args():  # MiniMax-H3: 56 heads x 128, the leading 96 channels rotated by fp32 [S, 96] tables
        q = torch.empty(1, H3_TOKENS, 56, 128, dtype=dtype)
        table = torch.empty(H3_TOKENS, 96)
        return q, q.clone(), table, table.clone()
    return "rotate_half_pair", args


def _split_rope(dtype, table_dtype=FP32):
    def args():  # LTX-2.3 (22B): 32 heads x 128 on [B, T, 4096] q/k, [B, H, T, 64] tables (swapaxes of [B, T, H, 64])
        q = torch.empty(2, TOKENS, 32 * 128, dtype=dtype)
        table = torch.empty(2, TOKENS, 32, 64, dtype=table_dtype).transpose(1, 2)
        return q, q.clone(), table, torch.empty_like(table.transpose(1, 2)).transpose(1, 2)
    return "rope_split_pair", args


def _rotary_complex(dtype, heads=20, head_dim=128):
    def args():  # SANA-Video 2.0: q, k chunks of the fused qkv projection, complex128 [N, D/2] table
        qkv = torch.empty(2, TOKENS, 3 * heads * head_dim, dtype=dtype)
        q, k, _ = (t.unflatten(-1, (heads, head_dim)) for t in qkv.chunk(3, dim=-1))
        return q, k, torch.empty(TOKENS, head_dim // 2, dtype=torch.complex128)
    return "rotary_complex_pair", args


# label -> (op, argument builder): one launch per op x dtype combination the wrappers accept
CASES: dict[str, tuple[str, Callable]] = {
    "relu_rope_pair bf16 q, fp32 tables": _rope(BF16, FP32),
    "relu_rope_pair bf16 q, bf16 tables": _rope(BF16, BF16),
    "relu_rope_pair bf16 q, fp64 tables": _rope(BF16, FP64),
    "relu_rope_pair fp32 q, fp32 tables": _rope(FP32, FP32),
    "rope_pair bf16 q, fp64 tables": _plain_rope(BF16, FP64),
    "rope_pair bf16 q, fp32 tables": _plain_rope(BF16, FP32),
    "rope_pair fp32 q, fp64 tables": _plain_rope(FP32, FP64),
    "rope_pair_per_channel bf16 q, fp32 tables": _per_channel_rope(BF16, FP32),
    "rope_pair_per_channel bf16 q, bf16 tables": _per_channel_rope(BF16, BF16),
    "rope_pair_per_channel fp32 q, fp32 tables": _per_channel_rope(FP32, FP32),
    "modulate bf16": _modulate(BF16),
    "modulate fp16": _modulate(FP16),
    "modulate fp32": _modulate(FP32),
    "gated_residual bf16": _residual(BF16),
    "gated_residual bf16, transposed residual": _residual(BF16, transposed=True),
    "gated_residual fp16": _residual(FP16),
    "gated_residual fp32": _residual(FP32),
    "silu bf16 channels_last": _silu(),
    "glu_gate bf16 channels_last chunks": _glu(),
    "sigmoid_gate bf16 key gate [B, N, H, 1]": _sigmoid_gate("key"),
    "sigmoid_gate bf16 output gate": _sigmoid_gate("output"),
    "sigmoid_gate bf16 output gate, N-minor x": _sigmoid_gate("n-minor"),
    "scale_to_tokens fp32 x bf16 z -> bf16": _scale_to_tokens(BF16),
    "scale_to_tokens fp32 x bf16 z -> fp16": _scale_to_tokens(FP16),
    "scale_to_tokens fp32 x bf16 z -> fp32": _scale_to_tokens(FP32),
    "scale_to_tokens fp32 x fp16 z -> bf16": _scale_to_tokens(BF16, FP16),
    "scale_to_tokens fp32 x fp32 z -> bf16": _scale_to_tokens(BF16, FP32),
    "rotate_half_pair bf16, fp32 tables": _rotate_half(BF16),
    "rotate_half_pair fp16, fp32 tables": _rotate_half(FP16),
    "rotate_half_pair fp32, fp32 tables": _rotate_half(FP32),
    "rope_split_pair bf16, fp32 [B, H, T, D/2] tables": _split_rope(BF16),
    "rope_split_pair bf16, bf16 tables": _split_rope(BF16, BF16),
    "rope_split_pair fp32, fp32 tables": _split_rope(FP32),
    "rotary_complex_pair bf16 qkv chunks": _rotary_complex(BF16),
    "rotary_complex_pair bf16 qkv chunks, 10 heads x 256": _rotary_complex(BF16, 10, 256),
    "rotary_complex_pair fp16 qkv chunks": _rotary_complex(FP16),
    "rotary_complex_pair fp32 qkv chunks": _rotary_complex(FP32),
    "rotary_complex_pair fp64 qkv chunks": _rotary_complex(FP64),
}
# labels compiled once more with eager's complex multiply contracted (complex_mul.FMA_FIRST), as a build that
# contracts would have it: the fmas are then the intended ones (counted), the rest of the checks the same
CONTRACTED = ("rotary_complex_pair bf16 qkv chunks",)
# labels compiled once more with eager's addcmul_ contracted (addcmul.FMA, as this CPU's is): one fma per element
SPLIT_CONTRACTED = ("rope_split_pair bf16, fp32 [B, H, T, D/2] tables",)


def capture_case(arch: int, label: str, complex_modes=None, addcmul_fma: bool = False) -> triton_aot.Capture:
    """The one launch the CUDA kernel of `label`'s op makes for its arguments on target `arch` (with the complex
    multiply's forms `complex_modes` instead of the host's, when given). The split RoPE is compiled for CUDA's
    addcmul_ (the product rounded, then added: its functor, as read), or contracted with `addcmul_fma`."""
    from accelpatch.lossless.kernels import triton_jit  # noqa: PLC0415
    from accelpatch.lossless.ops import rope_split_pair, rotary_complex_pair  # noqa: PLC0415
    from accelpatch.lossless.verify import ops  # noqa: PLC0415

    name, build = CASES[label]
    kernel = ops()[name].kernels["cuda"]
    args = build()
    reason = kernel.unsupported(*args)
    if reason is not None and "CUDA" not in reason:  # CPU tensors stand in for CUDA ones here
        raise ValueError(f"{label}: {reason}")
    from accelpatch.lossless.kernels.addcmul import FMA, SEPARATE  # noqa: PLC0415

    # the probes of the device's eager arithmetic, as the two ops' kernels read them, stated for the target
    probe, addcmul_probe = rotary_complex_pair.complex_mul_modes, rope_split_pair.addcmul_form
    if complex_modes is not None:
        rotary_complex_pair.complex_mul_modes = lambda device: (complex_modes, None)
    rope_split_pair.addcmul_form = lambda device: (FMA if addcmul_fma else SEPARATE, None)
    try:
        captured = triton_aot.capture(arch, triton_jit.KERNELS, lambda: kernel.run(*args))
    finally:
        rotary_complex_pair.complex_mul_modes, rope_split_pair.addcmul_form = probe, addcmul_probe
    assert len(captured) == 1, (label, len(captured))
    return captured[0]
