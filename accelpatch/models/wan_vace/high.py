"""Wan VACE's own ``high``-tier site kind: with the ``sol_attn`` backend the attentions of the VACE control branch
(``vace_blocks.N.attn1`` and ``attn2``) stay dense, counted with their reason. The main blocks' self- and
cross-attention take Wan's paths (:mod:`accelpatch.models.wan.high`).
"""
from __future__ import annotations

from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.tiers import Tier
from accelpatch.sol_attn.sites import AlwaysDense

CONTROL_FUSION = QualityGatedFusion.named("wan_vace_control_attention", Tier.HIGH)

CONTROL_DENSE = ("the VACE control branch's attention stays dense: sol_attn's dense_layers and tau are set for the "
                 "main blocks, and a sparse control branch (whose hints every main block at a VACE layer adds) is "
                 "unmeasured")

CONTROL_DENSE_PATH = AlwaysDense(CONTROL_FUSION, "Wan VACE control-branch attention (always dense)", CONTROL_DENSE)
