"""Wan Animate's lossless fused paths: Wan's (:mod:`accelpatch.models.wan.lossless`), on diffusers' copies of Wan's
classes in ``transformer_wan_animate``.

diffusers keeps Wan Animate's ``WanTransformerBlock``, ``WanAttention``, ``WanAttnProcessor`` and
``_get_qkv_projections`` as ``# Copied from diffusers.models.transformers.transformer_wan`` copies: the same code,
other classes. The paths here are Wan's with three things changed: the class whose forward the block fusion restates
and the processor the attention fusion expects are the copies, the attention calls the copy's own projection helper
and dispatcher, and the restated functions they name (``restates``) are the copies, so that their own fingerprints
(recorded for the tested diffusers, :mod:`accelpatch.core.restated`) decline the path if diffusers ever lets a copy
drift from Wan's. The fusions (site kinds ``wan_fused_block``, ``wan_fused_attention``) and the fused ops are Wan's.
"""
from __future__ import annotations

from accelpatch.models.wan.lossless import WanFusedAttention, WanFusedBlock

_ANIMATE = "diffusers.models.transformers.transformer_wan_animate:"
#: the self-attention paths (the fused one and Sol-Attn's) restate the copy's processor and module forward
ATTENTION_RESTATES = (_ANIMATE + "WanAttnProcessor.__call__", _ANIMATE + "WanAttention.forward")


def _animate():
    from diffusers.models.transformers import transformer_wan_animate

    return transformer_wan_animate


class WanAnimateFusedBlock(WanFusedBlock):
    restates = (_ANIMATE + "WanTransformerBlock.forward",)

    def block_class(self) -> type:
        return _animate().WanTransformerBlock


class WanAnimateFusedAttention(WanFusedAttention):
    restates = ATTENTION_RESTATES

    def diffusers_module(self):
        return _animate()


FUSED_BLOCK = WanAnimateFusedBlock()
FUSED_ATTENTION = WanAnimateFusedAttention()
