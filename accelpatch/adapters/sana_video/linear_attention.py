"""SANA-Video self-attention (``transformer_blocks.N.attn1``): the BF16-input linear-attention fast path.

Reference: diffusers ``SanaLinearAttnProcessor3_0``, which upcasts the rotated ``q``/``k`` and ``v`` to FP32 for
both GEMMs. The fast path changes only the first GEMM, ``S = v · k_rotᵀ``: it takes the BF16 operands with FP32
accumulation and output (:func:`accelpatch.ops.gemm.bmm_bf16_fp32`). The second GEMM stays FP32 and everything
else follows the reference. Operand precision of a GEMM drops, so the path is ``high`` tier (approximate), as in
the prior art. Unlike the prior art it runs at any batch size: the math is independent per (batch, head), and
diffusers runs classifier-free guidance as batch 2.

When the site is off the original diffusers processor object runs unchanged.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..gate import QualityGatedFusion
from ..ops.gemm import bmm_bf16_fp32_reject_reason, key_value_state_bf16
from ..tiers import Tier
from .base import Decline, FastPath, Site, bind_call, device_reject_reason, run_fast_paths_on_cpu

FUSION = QualityGatedFusion(
    name="sana_video_linear_attention",
    marker_attr="_sgl_sana_video_linear_attention_site",
    enabled_attr="_sgl_sana_video_linear_attention_enabled",
    tier=Tier.HIGH,
)

#: TEST-ONLY: the GEMM's CUDA guard is bypassed and the exact FP32 emulation runs on CPU (see sites.base).
emulate_bf16_gemm_on_cpu = run_fast_paths_on_cpu


def _reference_processor_class() -> type:
    from diffusers.models.transformers.transformer_sana_video import SanaLinearAttnProcessor3_0

    return SanaLinearAttnProcessor3_0


def _apply_rotary(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """Interleaved real Wan RoPE, as the reference processor applies it (pairs 2i, 2i+1; cast back to x's dtype)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def linear_attention_bf16_gemm(query_rotate: torch.Tensor, key_rotate: torch.Tensor, value: torch.Tensor,
                               z: torch.Tensor) -> torch.Tensor:
    """((v·k_rotᵀ)·q_rot)·z for ``[B, H, D, N]`` BF16 operands, FP32 result: the first GEMM on BF16 operands with
    FP32 accumulation, the second in FP32, as the reference does."""
    return torch.matmul(key_value_state_bf16(value, key_rotate), query_rotate.float()) * z


class SanaLinearAttentionBF16(FastPath):
    fusion = FUSION
    description = "first linear-attention GEMM (v·k_rotᵀ) on BF16 operands with FP32 accumulation"

    def expected_processor(self) -> type:
        return _reference_processor_class()

    def kernel_reject_reason(self) -> Optional[str]:
        return bmm_bf16_fp32_reject_reason()

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ("hidden_states", "encoder_hidden_states", "attention_mask"))
        hidden_states, encoder_hidden_states = call["hidden_states"], call["encoder_hidden_states"]
        mismatch = self.processor_mismatch(attn)
        if mismatch is not None:
            return Decline(mismatch)
        if encoder_hidden_states is not None:
            return Decline("encoder_hidden_states given: the fast path covers self-attention only")
        rotary_emb = call.get("rotary_emb")
        if rotary_emb is None:
            return Decline("no rotary_emb: the reference processor needs it")
        device_reason = device_reject_reason(hidden_states.device, "the BF16-input GEMM")
        if device_reason is not None:
            return Decline(device_reason)
        if hidden_states.dtype != torch.bfloat16 or attn.to_q.weight.dtype != torch.bfloat16:
            return Decline(f"activations are {hidden_states.dtype} and weights {attn.to_q.weight.dtype}: "
                           "the fast path needs bfloat16")
        return self._forward(attn, hidden_states, rotary_emb)

    @staticmethod
    def _forward(attn: torch.nn.Module, hidden_states: torch.Tensor, rotary_emb) -> torch.Tensor:
        original_dtype = hidden_states.dtype
        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        query = F.relu(query.unflatten(2, (attn.heads, -1)))
        key = F.relu(key.unflatten(2, (attn.heads, -1)))
        value = value.unflatten(2, (attn.heads, -1))
        query_rotate = _apply_rotary(query, *rotary_emb)
        key_rotate = _apply_rotary(key, *rotary_emb)

        # B, H, D, N
        query = query.permute(0, 2, 3, 1)
        key = key.permute(0, 2, 3, 1)
        query_rotate = query_rotate.permute(0, 2, 3, 1)
        key_rotate = key_rotate.permute(0, 2, 3, 1)
        value = value.permute(0, 2, 3, 1)

        z = 1 / (key.sum(dim=-1, keepdim=True).transpose(-2, -1) @ query + 1e-15)
        hidden_states = linear_attention_bf16_gemm(query_rotate, key_rotate, value, z)

        hidden_states = hidden_states.flatten(1, 2).transpose(1, 2).to(original_dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


BF16_LINEAR_ATTENTION = SanaLinearAttentionBF16()
