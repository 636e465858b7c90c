"""LTX-2 (diffusers ``LTX2VideoTransformer3DModel``: LTX-2 and LTX-2.3, a video and an audio stream in every
block): its lossless block fusion, and the ``sol_attn`` backend.

At every tier from ``lossless`` (the default without a backend), ``transformer_blocks.N`` carry the block fusion
of :mod:`.lossless` (both streams' AdaLN modulations, the a2v/v2a modulations, LTX-2.3's cross-attention AdaLN and
every gated residual add as verified fused ops), and ``transformer_blocks.N.attn1`` the video self-attention with
its q/k RoPE as one verified fused op (interleaved, diffusers' class default: rope_pair_per_channel; split, the
releases': rope_split_pair); the attention sites below are the same with or without the block fusion.
With ``sol_attn``, ``transformer_blocks.N.attn1`` (self-attention over the video tokens, LTX-2's RoPE applied to
q and k) also carry the Sol-Attn sparse path (``high``, above the RoPE fusion, its q/k/v from the same projection
function with diffusers' RoPE functions). Every other attention of a block is a site that always stays
dense, counted with its reason: ``audio_attn1`` (audio self-attention: never measured sparse; short, 25 latents
a second, and head dim 64 in the release where the upstream kernels take 128),
``attn2``/``audio_attn2`` (text cross-attention) and ``audio_to_video_attn``/``video_to_audio_attn`` (the a2v/v2a
cross-attention between the streams). Dense steps, dense layers, masked calls (``video_self_attention_mask``),
STG-perturbed calls (LTX-2.3's ``spatio_temporal_guidance_blocks``) and every call that does not fit the sparse
path run diffusers' processor unchanged. The sparse path calls diffusers' own RoPE functions (interleaved or
split, as ``attn.rope_type`` says) and applies LTX-2.3's per-head gates as the processor does.
``cache="first_block"`` puts the guarded FirstBlockCache on ``transformer_blocks``, registered as blocks
returning (video, audio) with the audio entering as ``audio_hidden_states`` (diffusers' hooks ask for
``encoder_hidden_states``, here the text: accelpatch's block metadata maps that name to the audio stream); it
decides on the video residual and reuses both streams' cached residuals. MagCache is refused: diffusers' MagCache
hooks pass the second stream through a skipped step without any residual, and here it is the audio output.

Defaults, and where each comes from (nothing published that we found gives LTX-2-specific settings):
* **tau = 1.0** (the backend's default): the Sol-Attn paper (Li et al., arXiv:2607.24027, via a secondary summary)
  reports LTX-2.3 at 89.8 % sparsity, 1.9x end to end, without the settings in our sources; the Gaussian estimate
  1 - Phi(tau) gives ~16 % exact blocks at tau = 1 before the always-exact neighbours (~10 % would be tau ~ 1.3).
* **dense_steps = 0.2** and **dense_layers = 0, 1**: SGLang's ``sol_attn`` policy defaults (the backend's, and
  MiniMax-H3's, Wan's), its 10 of 50 steps as a fraction of the call. ``LTX2Pipeline``'s default 30 steps then run
  24 sparse; diffusers' distilled schedule (``pipelines/ltx2/utils.py`` ``DISTILLED_SIGMA_VALUES``: 8 steps, 3 in
  stage 2) runs 2 of 8 dense and 6 sparse.
* audio self-attention dense: the issue's rule ("LTX-2's audio stream too, unless measured safe"); unmeasured.
So the defaults are unmeasured on LTX-2: ``accelpatch validate``/``tune`` must confirm them before they are trusted.

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
from accelpatch.models.ltx2.lossless import FUSED_ATTENTION, FUSED_BLOCK
from accelpatch.models.ltx2.high import ATTENTIONS, AUDIO_DENSE_PATH, CROSS_DENSE_PATH, SOL_ATTENTION, _ltx2

#: which module carries which fast path: the block fusion on every ``transformer_blocks.N`` and the RoPE fusion on
#: every video self-attention ``transformer_blocks.N.attn1`` (lossless, any backend or none); with ``sol_attn`` the
#: Sol-Attn path on ``attn1`` (high, stacked above the RoPE fusion by tier), and the audio self-attention and every
#: cross-attention always dense (high), each with its reason
SITES = (
    SiteRule(r"transformer_blocks\.(\d+)", FUSED_BLOCK),
    SiteRule(r"transformer_blocks\.(\d+)\.attn1", FUSED_ATTENTION),
    SiteRule(r"transformer_blocks\.(\d+)\.(?:audio_)?ff\.net\.0", IN_PLACE_GELU),
    chunked_rule(r"transformer_blocks\.(\d+)\.(?:(?:audio_)?(?:ff|norm[123])|(?:audio_)?attn[12]\.norm_[qk]"
                 r"|(?:audio_to_video|video_to_audio)_(?:norm|attn\.norm_[qk]))"),
    SiteRule(r"transformer_blocks\.(\d+)\.attn1", SOL_ATTENTION, backend="sol_attn"),
    SiteRule(r"transformer_blocks\.(\d+)\.audio_attn1", AUDIO_DENSE_PATH, backend="sol_attn"),
    SiteRule(r"transformer_blocks\.(\d+)\.(?:attn2|audio_attn2|audio_to_video_attn|video_to_audio_attn)",
             CROSS_DENSE_PATH, backend="sol_attn"),
)


class LTX2Adapter(SolAttnAdapter):
    family = "LTX-2"
    model_classes = (("diffusers", "LTX2VideoTransformer3DModel"),)
    sites = SITES
    block_list = "transformer_blocks"
    # (video, audio), the audio entering as audio_hidden_states
    cache = CacheSupport(methods=("first_block",), blocks="transformer_blocks", block_outputs=(0, 1),
                         second_stream="audio_hidden_states",
                         why_not=("diffusers' MagCache hooks pass a block's second stream through a skipped step "
                                  "without its residual, and LTX-2's second stream is the audio output"))

    def layout_mismatch(self, model: torch.nn.Module) -> Optional[str]:
        """Every block has its six attentions as ``LTX2Attention``; the video self-attention ``attn1`` is a
        self-attention (k/v from the hidden states) with diffusers' LTX-2 processor and a RoPE type the processor
        knows; the model computes the video RoPE in ``rope``."""
        ltx2 = _ltx2()
        blocks = getattr(model, "transformer_blocks", None)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
            return "it has no non-empty ModuleList `transformer_blocks`"
        if not isinstance(getattr(model, "rope", None), ltx2.LTX2AudioVideoRotaryPosEmbed):
            return f"`rope` is {type(getattr(model, 'rope', None)).__name__}, expected LTX2AudioVideoRotaryPosEmbed"
        for i, block in enumerate(blocks):
            for name in ATTENTIONS:
                attn = getattr(block, name, None)
                if not isinstance(attn, ltx2.LTX2Attention):
                    return f"transformer_blocks.{i}.{name} is {type(attn).__name__}, expected LTX2Attention"
            attn1 = block.attn1
            mismatch = SOL_ATTENTION.processor_mismatch(attn1)
            if mismatch is not None:
                return f"transformer_blocks.{i}.attn1.{mismatch}"
            if attn1.cross_attention_dim != attn1.query_dim:
                return f"transformer_blocks.{i}.attn1 is a cross-attention (cross_attention_dim != query_dim)"
            if attn1.rope_type not in ("interleaved", "split"):
                return f"transformer_blocks.{i}.attn1.rope_type is {attn1.rope_type!r}, expected interleaved or split"
        return None
