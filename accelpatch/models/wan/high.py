"""Wan's ``high``-tier fast paths (see :mod:`.adapter` for where they sit and why): the Sol-Attn sparse path on the
self-attention (:class:`WanSolAttention`) and the always-dense cross-attention sites of the ``sol_attn`` backend.
"""
from __future__ import annotations

import torch

from accelpatch.core.gate import QualityGatedFusion
from accelpatch.sol_attn.sites import AlwaysDense, DispatchSelfAttention
from accelpatch.core.tiers import Tier
from accelpatch.models.wan.lossless import ATTENTION_RESTATES

SOL_FUSION = QualityGatedFusion.named("wan_sol_attn", Tier.HIGH)
CROSS_FUSION = QualityGatedFusion.named("wan_cross_attention", Tier.HIGH)

CROSS_DENSE = "cross-attention (text, and image for I2V) stays dense: Sol-Attn covers self-attention only"


def _wan():
    from diffusers.models.transformers import transformer_wan

    return transformer_wan


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's RoPE as ``WanAttnProcessor`` applies it (interleaved pairs; its tables carry each angle twice)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class WanSolAttention(DispatchSelfAttention):
    """Sol-Attn on Wan's self-attention: q/k/v as ``WanAttnProcessor`` hands them to the dispatcher (diffusers' own
    projection helper, the q/k RMSNorm across heads, the RoPE), then diffusers' ``to_out``."""

    fusion = SOL_FUSION
    description = "block-sparse Sol-Attn with rank-1 correction on Wan's self-attention"
    call_names = ("hidden_states", "encoder_hidden_states", "attention_mask", "rotary_emb")
    restates = ATTENTION_RESTATES

    def diffusers_module(self):
        """The diffusers module whose ``WanAttnProcessor`` this path restates and whose helper it calls (Wan
        Animate's path: ``transformer_wan_animate``, which has its own copies)."""
        return _wan()

    def processor_class(self) -> type:
        return self.diffusers_module().WanAttnProcessor

    def project(self, attn, call):
        query, key, value = self.diffusers_module()._get_qkv_projections(attn, call["hidden_states"], None)
        query = attn.norm_q(query)  # one statement each: the unnormed query is freed before norm_k
        key = attn.norm_k(key)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
        if call["rotary_emb"] is not None:
            query, key = _rotate(query, *call["rotary_emb"]), _rotate(key, *call["rotary_emb"])
        return query, key, value


SOL_ATTENTION = WanSolAttention()
CROSS_DENSE_PATH = AlwaysDense(CROSS_FUSION, "Wan cross-attention (always dense)", CROSS_DENSE)
