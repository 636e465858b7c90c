"""Wan 2.x (diffusers ``WanTransformer3DModel``: Wan 2.1 T2V/I2V, Wan 2.2's ``transformer`` and ``transformer_2``):
its lossless block fusion, and the ``sol_attn`` backend.

At every tier from ``lossless`` (the default without a backend), ``blocks.N`` carry the block fusion of
:mod:`.lossless` (the float32 AdaLN modulations and gated residual adds as verified fused ops) and ``blocks.N.attn1``
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
* **dense_steps = 0.2** (the first 20 % of a call's steps: SGLang's 10 of 50 in proportion, so a 4-step Lightning
  call runs 1 dense step) and **dense_layers = 0, 1**: SGLang's ``sol_attn`` policy defaults (the backend's, and
  MiniMax-H3's); ``min_tokens`` = 12,288 (the backend's floor) keeps short previews dense. With its H3 settings on Wan's self-attention the serving engine reached only PSNR 8.2 dB and
  dropped it (SGLang PR #33702); its sparse path then merged the batch rows into one sequence, so CFG rows attended
  across each other, which may explain it (our inference, unmeasured).
So the defaults are unmeasured on Wan: ``accelpatch validate``/``tune`` (and the recipe ``wan2.1-t2v-sol-attn``,
"measured: no") must confirm them before they are trusted.

The site table is :data:`SITES` below; the ``high`` fast paths are in :mod:`.high`, the lossless ones in
:mod:`.lossless`.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.core.adapter import CacheSupport, SiteRule
from accelpatch.lossless.gelu import IN_PLACE_GELU
from accelpatch.low_memory.chunked import chunked_rule
from accelpatch.models.wan.high import CROSS_DENSE_PATH, SOL_ATTENTION, _wan
from accelpatch.models.wan.lossless import FUSED_ATTENTION, FUSED_BLOCK
from accelpatch.sol_attn.adapter import SolAttnAdapter

#: which module carries which fast path: the block fusion on every ``blocks.N`` and the RoPE fusion on every
#: ``blocks.N.attn1`` (lossless, any backend or none); with ``sol_attn`` the Sol-Attn path on ``blocks.N.attn1``
#: (high, stacked above the RoPE fusion by tier) and the always-dense cross-attention ``blocks.N.attn2`` (high);
#: with ``memory="low"`` the feed-forward and the q/k norms run in chunks of tokens (lossless, checked on first sight)
SITES = (
    SiteRule(r"blocks\.(\d+)", FUSED_BLOCK),
    SiteRule(r"blocks\.(\d+)\.attn1", FUSED_ATTENTION),
    SiteRule(r"blocks\.(\d+)\.ffn\.net\.0", IN_PLACE_GELU),
    chunked_rule(r"blocks\.(\d+)\.(?:ffn|attn[12]\.norm_[qk])"),
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
        return wan_layout_mismatch(model)


def wan_layout_mismatch(model: torch.nn.Module, wan=None, block_list: str = "blocks") -> Optional[str]:
    """:meth:`WanAdapter.layout_mismatch` for the ModuleList ``block_list`` of ``model``, whose classes are those of
    the diffusers module ``wan`` (None: ``transformer_wan``; Wan Animate's copies are ``transformer_wan_animate``'s):
    shared with the Wan VACE and Wan Animate adapters, whose blocks are Wan's."""
    wan = _wan() if wan is None else wan
    blocks = getattr(model, block_list, None)
    if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
        return f"it has no non-empty ModuleList `{block_list}`"
    if not isinstance(getattr(model, "rope", None), wan.WanRotaryPosEmbed):
        return f"`rope` is {type(getattr(model, 'rope', None)).__name__}, expected WanRotaryPosEmbed"
    for i, block in enumerate(blocks):
        for name in ("attn1", "attn2"):
            attn = getattr(block, name, None)
            where = f"{block_list}.{i}.{name}"
            if not isinstance(attn, wan.WanAttention):
                return f"{where} is {type(attn).__name__}, expected WanAttention"
            if type(attn.processor) is not wan.WanAttnProcessor:
                return f"{where}.processor is {_named(type(attn.processor))}, expected {_named(wan.WanAttnProcessor)}"
        if block.attn1.add_k_proj is not None or block.attn1.is_cross_attention:
            return f"{block_list}.{i}.attn1 is a cross-attention (added image k/v or is_cross_attention)"
    return None


def _named(cls: type) -> str:
    """A class's name, with its module where diffusers has a same-named copy (Wan Animate's ``WanAttnProcessor``)."""
    if cls.__module__.startswith("diffusers.models.transformers.transformer_wan_"):
        return f"{cls.__module__}.{cls.__qualname__}"
    return cls.__name__
