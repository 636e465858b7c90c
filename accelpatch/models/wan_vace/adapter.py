"""Wan VACE (diffusers ``WanVACETransformer3DModel``): Wan's fast paths on the code it shares with Wan.

diffusers builds the VACE model from Wan's own classes (``transformer_wan_vace`` imports ``WanTransformerBlock``,
``WanAttention``, ``WanAttnProcessor`` and ``WanRotaryPosEmbed`` from ``transformer_wan``), plus one block class of
its own, ``WanVACETransformerBlock``, in the control branch ``vace_blocks``. So:

* ``blocks.N`` (``WanTransformerBlock``, Wan's class): Wan's lossless block fusion, the same object as Wan's table
  has (:data:`accelpatch.models.wan.lossless.FUSED_BLOCK`), and on ``blocks.N.attn1`` Wan's self-attention with the
  fused q/k RoPE; with ``sol_attn``, Wan's Sol-Attn path on ``blocks.N.attn1`` and Wan's always-dense cross-attention
  sites on ``blocks.N.attn2``. Wan's tests of these paths are this family's too; the restated functions are Wan's, so
  their recorded fingerprints cover this model.
* ``vace_blocks.N.attn1`` (``WanAttention`` with ``WanAttnProcessor``, Wan's classes, called as Wan's block calls
  its ``attn1``): Wan's self-attention with the fused RoPE (lossless). With ``sol_attn`` the control branch's
  ``attn1`` and ``attn2`` are always-dense sites (:mod:`.high`): ``dense_layers`` counts the main blocks, and a
  sparse control branch is unmeasured. Their rows carry no layer index (they are not layers of ``blocks``).
* ``vace_blocks.N`` itself (``WanVACETransformerBlock``) is **not patched**: its forward is not Wan's (it projects the
  control stream in with ``proj_in``, runs on ``control_hidden_states``, returns ``(proj_out(...), stream)``), so
  Wan's block fusion does not restate it; covering it means restating that forward, with its own fingerprint.
* The step cache is not offered: the model adds the control hints between ``blocks``, outside the blocks diffusers'
  cache hooks would skip.

Sol-Attn defaults are Wan's (:mod:`accelpatch.models.wan.adapter` says where each comes from); unmeasured on VACE.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.core.adapter import CacheSupport, SiteRule
from accelpatch.low_memory.chunked import chunked_rule
from accelpatch.models.wan.adapter import wan_layout_mismatch
from accelpatch.models.wan.high import CROSS_DENSE_PATH, SOL_ATTENTION
from accelpatch.models.wan.lossless import FUSED_ATTENTION, FUSED_BLOCK
from accelpatch.models.wan_vace.high import CONTROL_DENSE_PATH
from accelpatch.sol_attn.adapter import SolAttnAdapter

#: Wan's rows on the main blocks, Wan's RoPE fusion on the control branch's self-attention; with ``sol_attn`` the
#: control branch's attentions are always dense (high, above the RoPE fusion on ``attn1``)
SITES = (
    SiteRule(r"blocks\.(\d+)", FUSED_BLOCK),
    SiteRule(r"blocks\.(\d+)\.attn1", FUSED_ATTENTION),
    SiteRule(r"vace_blocks\.\d+\.attn1", FUSED_ATTENTION),
    chunked_rule(r"(?:vace_)?blocks\.(\d+)\.(?:ffn|attn[12]\.norm_[qk])"),
    SiteRule(r"blocks\.(\d+)\.attn1", SOL_ATTENTION, backend="sol_attn"),
    SiteRule(r"blocks\.(\d+)\.attn2", CROSS_DENSE_PATH, backend="sol_attn"),
    SiteRule(r"vace_blocks\.\d+\.attn[12]", CONTROL_DENSE_PATH, backend="sol_attn"),
)

NO_CACHE = ("Wan VACE adds its control hints between the transformer blocks, outside the blocks the cache would "
            "skip; the step cache is not checked against that")


class WanVACEAdapter(SolAttnAdapter):
    family = "Wan VACE"
    model_classes = (("diffusers", "WanVACETransformer3DModel"),)
    sites = SITES
    block_list = "blocks"
    cache = CacheSupport(why_not=NO_CACHE)

    def layout_mismatch(self, model: torch.nn.Module) -> Optional[str]:
        """Wan's layout (:func:`~accelpatch.models.wan.adapter.wan_layout_mismatch`) in ``blocks`` and in the
        control branch ``vace_blocks``."""
        return wan_layout_mismatch(model) or wan_layout_mismatch(model, block_list="vace_blocks")
