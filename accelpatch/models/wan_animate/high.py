"""Wan Animate's ``high``-tier paths of the ``sol_attn`` backend: Wan's Sol-Attn path on the copies' self-attention
(:class:`WanAnimateSolAttention`), Wan's always-dense cross-attention sites, and the face adapter's attention,
always dense (:data:`FACE_DENSE_PATH`).
"""
from __future__ import annotations

from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.tiers import Tier
from accelpatch.models.wan.high import WanSolAttention
from accelpatch.models.wan_animate.lossless import ATTENTION_RESTATES, _animate
from accelpatch.sol_attn.sites import AlwaysDense

FACE_FUSION = QualityGatedFusion.named("wan_animate_face_attention", Tier.HIGH)

FACE_DENSE = ("the face adapter's attention stays dense: it is a cross-attention of each frame's video tokens to "
              "that frame's motion tokens, and Sol-Attn covers self-attention only")


class WanAnimateSolAttention(WanSolAttention):
    """Wan's Sol-Attn path (site kind ``wan_sol_attn``) on ``transformer_wan_animate``'s copy of ``WanAttnProcessor``:
    q/k/v as the copy hands them to the dispatcher (its own projection helper, the q/k RMSNorm across heads, Wan's
    RoPE)."""

    restates = ATTENTION_RESTATES

    def diffusers_module(self):
        return _animate()


SOL_ATTENTION = WanAnimateSolAttention()
FACE_DENSE_PATH = AlwaysDense(FACE_FUSION, "Wan Animate face-adapter attention (always dense)", FACE_DENSE)
