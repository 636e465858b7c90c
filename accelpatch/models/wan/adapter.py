"""Wan 2.x (diffusers ``WanTransformer3DModel``: Wan 2.1 T2V/I2V, Wan 2.2's ``transformer`` and ``transformer_2``):
its lossless block fusion, and the ``sol_attn`` backend.

At every tier from ``lossless`` (the default without a backend), ``blocks.N`` carry the block fusion of
:mod:`.fused` (the float32 AdaLN modulations and gated residual adds as verified fused ops) and ``blocks.N.attn1``
its self-attention with the q/k RoPE as one verified fused op. With ``sol_attn``,
``blocks.N.attn1`` (self-attention over the video tokens, Wan's 3-D RoPE applied to q and k) also carry the
Sol-Attn sparse path (``high``); ``blocks.N.attn2`` (cross-attention to the text, and for I2V to the image
tokens) are sites that always stay dense, counted. Dense steps, dense layers, masked calls and every call that does
not fit the sparse path run diffusers' ``WanAttnProcessor`` unchanged (the attention sites are the same with or
without the block fusion around them; the RoPE fusion sits below the Sol-Attn path on ``attn1``, whose own q/k/v
take the unfused ``_rotate``, the same bits); ``cache=`` puts the guarded step cache on ``blocks``.

Defaults, and where each comes from: nothing published that we found gives Wan-specific dense guards.
* **tau = 1.0** (the backend's default): the Sol-Attn paper (Li et al., arXiv:2607.24027, via a secondary summary)
  reports Wan2.1-14B at 85.1 % sparsity, 2.02x end to end, VBench 76.13 vs 75.90 dense, without the settings in our
  sources; 85 % matches the Gaussian estimate 1 - Phi(tau) ~ 16 % exact blocks at tau = 1.
* **dense_steps = 10** and **dense_layers = 0, 1**: SGLang's ``sol_attn`` policy defaults (the backend's, and
  MiniMax-H3's). With its H3 settings on Wan's self-attention the serving engine reached only PSNR 8.2 dB and
  dropped it (SGLang PR #33702); its sparse path then merged the batch rows into one sequence, so CFG rows attended
  across each other, which may explain it (our inference, unmeasured).
So the defaults are unmeasured on Wan: ``accelpatch validate``/``tune`` (and the recipe ``wan2.1-t2v-sol-attn``,
"measured: no") must confirm them before they are trusted.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.core.adapter import CacheSupport, SiteRule
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.sol_attn.sites import AlwaysDense, DispatchSelfAttention
from accelpatch.core.tiers import Tier
from accelpatch.sol_attn.adapter import SolAttnAdapter
from accelpatch.models.wan.lossless import ATTENTION_RESTATES, FUSED_ATTENTION, FUSED_BLOCK

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

    def processor_class(self) -> type:
        return _wan().WanAttnProcessor

    def project(self, attn, call):
        query, key, value = _wan()._get_qkv_projections(attn, call["hidden_states"], None)
        query, key = attn.norm_q(query), attn.norm_k(key)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
        if call["rotary_emb"] is not None:
            query, key = _rotate(query, *call["rotary_emb"]), _rotate(key, *call["rotary_emb"])
        return query, key, value


SOL_ATTENTION = WanSolAttention()
CROSS_DENSE_PATH = AlwaysDense(CROSS_FUSION, "Wan cross-attention (always dense)", CROSS_DENSE)

#: which module carries which fast path: the block fusion on every ``blocks.N`` and the RoPE fusion on every
#: ``blocks.N.attn1`` (lossless, any backend or none); with ``sol_attn`` the Sol-Attn path on ``blocks.N.attn1``
#: (high, stacked above the RoPE fusion by tier) and the always-dense cross-attention ``blocks.N.attn2`` (high)
SITES = (
    SiteRule(r"blocks\.(\d+)", FUSED_BLOCK),
    SiteRule(r"blocks\.(\d+)\.attn1", FUSED_ATTENTION),
    SiteRule(r"blocks\.(\d+)\.attn1", SOL_ATTENTION, backend="sol_attn"),
    SiteRule(r"blocks\.(\d+)\.attn2", CROSS_DENSE_PATH, backend="sol_attn"),
)


class WanAdapter(SolAttnAdapter):
    family = "Wan"
    model_classes = (("diffusers", "WanTransformer3DModel"),)
    sites = SITES
    block_list = "blocks"
    cache = CacheSupport(methods=("first_block", "mag"), blocks="blocks")

    def layout_mismatch(self, model: torch.nn.Module) -> Optional[str]:
        """Every block has a self-attention ``attn1`` (no added image k/v) and a cross-attention ``attn2``, both
        ``WanAttention`` with diffusers' ``WanAttnProcessor``; the model computes the RoPE in ``rope``."""
        wan = _wan()
        blocks = getattr(model, "blocks", None)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
            return "it has no non-empty ModuleList `blocks`"
        if not isinstance(getattr(model, "rope", None), wan.WanRotaryPosEmbed):
            return f"`rope` is {type(getattr(model, 'rope', None)).__name__}, expected WanRotaryPosEmbed"
        for i, block in enumerate(blocks):
            for name in ("attn1", "attn2"):
                attn = getattr(block, name, None)
                where = f"blocks.{i}.{name}"
                if not isinstance(attn, wan.WanAttention):
                    return f"{where} is {type(attn).__name__}, expected WanAttention"
                if type(attn.processor) is not wan.WanAttnProcessor:
                    return f"{where}.processor is {type(attn.processor).__name__}, expected WanAttnProcessor"
            if block.attn1.add_k_proj is not None or block.attn1.is_cross_attention:
                return f"blocks.{i}.attn1 is a cross-attention (added image k/v or is_cross_attention)"
        return None
