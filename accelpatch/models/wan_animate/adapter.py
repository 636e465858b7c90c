"""Wan Animate (diffusers ``WanAnimateTransformer3DModel``, Wan2.2-Animate): Wan's fast paths on diffusers' copies of
Wan's code.

The model is Wan 2.1's transformer (its ``blocks`` are ``WanTransformerBlock``, its attentions ``WanAttention`` with
``WanAttnProcessor``: diffusers' ``# Copied from`` copies in ``transformer_wan_animate``) plus a pose embedding, a
motion encoder, a face encoder and a face adapter injected after every ``inject_face_latents_blocks``-th block. So:

* ``blocks.N``: Wan's lossless block fusion, ``blocks.N.attn1``: Wan's self-attention with the fused q/k RoPE, both
  pointed at the copies (:mod:`.lossless`); with ``sol_attn``, Wan's Sol-Attn path on ``blocks.N.attn1`` (:mod:`.high`)
  and Wan's always-dense sites on ``blocks.N.attn2`` (cross-attention to the text and the reference image's CLIP
  tokens).
* ``face_adapter.N`` (``WanAnimateFaceBlockCrossAttention`` with its own processor) is **not fused**: its processor is
  not Wan's (pre-norms, a per-frame cross-attention to the motion tokens, a multiplicative mask), and it has none of
  the chains Wan's fusions cover (no AdaLN, no RoPE); with ``sol_attn`` it is an always-dense site, counted.
* The motion and face encoders, the patch and pose embeddings and the output head stay diffusers' (no attention, and
  no chain a fused op restates).
* The step cache is not offered: the model adds the face adapter's output between ``blocks``, outside the blocks
  diffusers' cache hooks would skip.

Sol-Attn defaults are Wan's (:mod:`accelpatch.models.wan.adapter` says where each comes from); unmeasured on Animate.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.core.adapter import CacheSupport, SiteRule
from accelpatch.low_memory.chunked import chunked_rule
from accelpatch.models.wan.adapter import wan_layout_mismatch
from accelpatch.models.wan.high import CROSS_DENSE_PATH
from accelpatch.models.wan_animate.high import FACE_DENSE_PATH, SOL_ATTENTION
from accelpatch.models.wan_animate.lossless import FUSED_ATTENTION, FUSED_BLOCK, _animate
from accelpatch.sol_attn.adapter import SolAttnAdapter

#: Wan's rows, on the copies; with ``sol_attn`` the face adapter's attention is always dense (high)
SITES = (
    SiteRule(r"blocks\.(\d+)", FUSED_BLOCK),
    SiteRule(r"blocks\.(\d+)\.attn1", FUSED_ATTENTION),
    chunked_rule(r"blocks\.(\d+)\.(?:ffn|attn[12]\.norm_[qk])"),
    SiteRule(r"blocks\.(\d+)\.attn1", SOL_ATTENTION, backend="sol_attn"),
    SiteRule(r"blocks\.(\d+)\.attn2", CROSS_DENSE_PATH, backend="sol_attn"),
    SiteRule(r"face_adapter\.\d+", FACE_DENSE_PATH, backend="sol_attn"),
)

NO_CACHE = ("Wan Animate adds its face adapter's output between the transformer blocks, outside the blocks the "
            "cache would skip; the step cache is not checked against that")


class WanAnimateAdapter(SolAttnAdapter):
    family = "Wan Animate"
    model_classes = (("diffusers", "WanAnimateTransformer3DModel"),)
    sites = SITES
    block_list = "blocks"
    cache = CacheSupport(why_not=NO_CACHE)

    def layout_mismatch(self, model: torch.nn.Module) -> Optional[str]:
        """Wan's layout (:func:`~accelpatch.models.wan.adapter.wan_layout_mismatch`) with the classes of
        ``transformer_wan_animate``."""
        return wan_layout_mismatch(model, _animate())
