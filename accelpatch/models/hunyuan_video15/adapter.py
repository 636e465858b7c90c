"""HunyuanVideo 1.5 (diffusers ``HunyuanVideo15Transformer3DModel``): its lossless block fusion, and the ``sol_attn``
backend.

At every tier from ``lossless`` (the default without a backend), ``transformer_blocks.N`` carry the block fusion
of :mod:`.lossless` (both streams' AdaLN modulations and gated residual adds as verified fused ops) and
``transformer_blocks.N.attn`` the joint attention with the video q/k RoPE as one verified fused op
(``rope_pair_per_channel``); the Sol-Attn site, where there is one, sits above that RoPE fusion on the same module
(its own q/k/v take diffusers' ``apply_rotary_emb``, the same bits), and the attention sites are the same with or
without the block fusion around them.

Every dual-stream block's ``transformer_blocks.N.attn`` is one joint attention: the video tokens (3-D RoPE on q
and k) followed by the text/image tokens, which the model orders valid first, then padding, under a mask that lets
valid tokens attend to valid tokens only. With ``sol_attn`` the Sol-Attn sparse path (``high``) runs on the valid
prefix (video + valid text rows) without a mask, which is that mask exactly: the valid text keys are the exact
sink, and with ``dense_rows="text_audio"`` (default) the valid text query rows are recomputed by the model's own
masked dense attention (diffusers' bits for those rows), as MiniMax-H3's text rows, so only video query rows are
sparse. The padding rows (attending to nothing) run the model's masked dense attention over the padding keys.
A mask that is not that layout (valid tokens not first, or a different count per batch row) declines with a
counted reason. ``context_embedder.token_refiner.refiner_blocks.N.attn``
(text-only, masked) are sites that always stay dense, counted. Dense steps, dense layers and every call that does
not fit run diffusers' ``HunyuanVideo15AttnProcessor2_0`` unchanged. ``cache=`` puts the guarded step cache
(FirstBlockCache or MagCache) on ``transformer_blocks``, registered as blocks returning (video, text):
FirstBlockCache decides on the video residual and reuses both streams' cached residuals; MagCache passes the text
stream through a skipped step unchanged, which the model never reads after its blocks (only the video goes on to
``norm_out``).

The sparse path slices the sequence at the valid-text count, which depends on the mask's values: inside a
``torch.compile`` graph that is a graph break (regional compile works; ``fullgraph=True`` does not on ``high``).

Defaults, and where each comes from: nothing published that we found gives HunyuanVideo-specific dense guards.
* **tau = 1.0** (the backend's default): the Sol-Attn paper (Li et al., arXiv:2607.24027, via a secondary summary)
  reports "HunyuanVideo" at 2.12x end to end and 85.8 % sparsity, without the settings or the model version (1.0
  or 1.5) in our sources; 85.8 % is close to the Gaussian estimate 1 - Phi(tau) ~ 16 % exact blocks at tau = 1.
* **dense_steps = 0.2** (SGLang's 10 of 50, as a fraction of each call's steps) and **dense_layers = 0, 1**:
  SGLang's ``sol_attn`` policy defaults (the backend's, and MiniMax-H3's and Wan's), not HunyuanVideo measurements.
So the defaults are unmeasured on HunyuanVideo 1.5: ``accelpatch validate``/``tune`` must confirm them.

The site table is :data:`SITES` below; the ``high`` fast paths are in :mod:`.high`, the lossless ones in
:mod:`.lossless`.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.core.adapter import CacheSupport, SiteRule
from accelpatch.lossless.gelu import IN_PLACE_GELU
from accelpatch.low_memory.chunked import chunked_rule
from accelpatch.sol_attn.adapter import SolAttnAdapter
from accelpatch.models.hunyuan_video15.lossless import FUSED_ATTENTION, FUSED_BLOCK, capture_masks
from accelpatch.models.hunyuan_video15.high import REFINER_DENSE_PATH, SOL_ATTENTION, _hy

#: which module carries which fast path: the block fusion on every ``transformer_blocks.N`` and the RoPE fusion on
#: every ``transformer_blocks.N.attn`` (lossless, any backend or none); with ``sol_attn`` the Sol-Attn path on the
#: joint attention (high, stacked above the RoPE fusion by tier) and the always-dense text refiner attention (high)
SITES = (
    SiteRule(r"transformer_blocks\.(\d+)", FUSED_BLOCK),
    SiteRule(r"transformer_blocks\.(\d+)\.attn", FUSED_ATTENTION),
    SiteRule(r"transformer_blocks\.(\d+)\.ff(?:_context)?\.net\.0", IN_PLACE_GELU),
    chunked_rule(r"transformer_blocks\.(\d+)\.(?:ff(?:_context)?|attn\.norm_(?:added_)?[qk])"),
    SiteRule(r"transformer_blocks\.(\d+)\.attn", SOL_ATTENTION, backend="sol_attn"),
    SiteRule(r"context_embedder\.token_refiner\.refiner_blocks\.(\d+)\.attn", REFINER_DENSE_PATH, backend="sol_attn"),
)


class HunyuanVideo15Adapter(SolAttnAdapter):
    family = "HunyuanVideo 1.5"
    model_classes = (("diffusers", "HunyuanVideo15Transformer3DModel"),)
    sites = SITES
    block_list = "transformer_blocks"
    block_noun = "dual-stream transformer blocks"
    # (video, text), the second stream entering as encoder_hidden_states
    cache = CacheSupport(methods=("first_block", "mag"), blocks="transformer_blocks", block_outputs=(0, 1))

    def capture_for(self, backend_config):
        """Each forward's :class:`~.lossless.ForwardMasks`: the joint attention's valid mask and padded rows, read
        once per forward instead of once per block (each read of which rows are padded is a host sync on a GPU)."""
        return capture_masks

    def layout_mismatch(self, model: torch.nn.Module) -> Optional[str]:
        """Every dual-stream block has one joint ``attn`` (an ``Attention`` with added q/k/v projections and
        ``to_add_out``) with diffusers' ``HunyuanVideo15AttnProcessor2_0``; the model computes the RoPE in
        ``rope``; the text refiner's blocks each have an ``attn``."""
        hy = _hy()
        from diffusers.models.attention_processor import Attention

        blocks = getattr(model, self.block_list, None)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
            return f"it has no non-empty ModuleList `{self.block_list}`"
        if not isinstance(getattr(model, "rope", None), hy.HunyuanVideo15RotaryPosEmbed):
            return f"`rope` is {type(getattr(model, 'rope', None)).__name__}, expected HunyuanVideo15RotaryPosEmbed"
        for i, block in enumerate(blocks):
            attn, where = getattr(block, "attn", None), f"{self.block_list}.{i}.attn"
            if not isinstance(attn, Attention):
                return f"{where} is {type(attn).__name__}, expected Attention"
            if type(attn.processor) is not hy.HunyuanVideo15AttnProcessor2_0:
                return f"{where}.processor is {type(attn.processor).__name__}, expected HunyuanVideo15AttnProcessor2_0"
            if attn.add_q_proj is None or getattr(attn, "to_add_out", None) is None or attn.to_out is None:
                return f"{where} is not a joint attention (no add_q_proj/to_add_out/to_out)"
        refiner = getattr(getattr(getattr(model, "context_embedder", None), "token_refiner", None),
                          "refiner_blocks", None)
        if not isinstance(refiner, torch.nn.ModuleList):
            return "it has no ModuleList `context_embedder.token_refiner.refiner_blocks`"
        return None
