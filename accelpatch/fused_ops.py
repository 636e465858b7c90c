"""The lossless fused ops the models' fast paths call, each verified on first sight (accelpatch.verify).

The ops know no model; the adapters' restated forwards say where each chain sits in their model.
"""
from __future__ import annotations

import torch

from .ops.fused import reference
from .verify import FusedOp, register

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
