"""MiniMax-H3 (diffusers ``MiniMaxH3Transformer3DModel``) with the ``sol_attn`` backend.

Sites at every tier: the lossless fused paths of :mod:`.lossless` — each block (AdaLN modulations, gated residual
adds), its attention (the q/k RoPE) and its SwiGLU gate. With ``sol_attn``, ``transformer_blocks.N.attn`` (full
self-attention over the packed text/audio/video sequence) also carry the Sol-Attn sparse path (``high``), stacked
above the lossless one; ``token_refiner.refiner_blocks.N.attn`` (text only) are sites that always stay dense, so
the report counts them too.

Per call, the model's pre-forward hook (accelpatch.core.model_hooks) captures the packed layout (the hull of the
text/audio rows becomes the always-exact key sink, and with ``dense_rows="text_audio"``, the default, their query
rows are recomputed with dense attention over every key, as in the prior art for such models: only video query rows
are sparse; text/audio rows that are not one contiguous range are gathered, counted as a note) and the step
(accelpatch.core.steps: the pipeline's scheduler, else the ``timestep`` argument, where 1 means clean). Dense steps and
dense layers, and every call that does not fit the sparse path, run the original processor unchanged. The op has a
backward, so training through the sparse path works (gradients of the sparse function).

The site table is :data:`SITES` below; the ``high`` fast paths are in :mod:`.high`, the lossless ones in
:mod:`.lossless`.
"""
from __future__ import annotations

from typing import Any

from accelpatch.core.adapter import CacheSupport, SiteRule, TimestepScale
from accelpatch.sol_attn.adapter import SolAttnAdapter
from accelpatch.lossless.swiglu import FUSED_SWIGLU
from accelpatch.low_memory.chunked import chunked_rule
from accelpatch.models.minimax_h3.lossless import FUSED_ATTENTION, FUSED_BLOCK
from accelpatch.models.minimax_h3.high import REFINER_DENSE_PATH, SOL_ATTENTION, capture_layout

#: which module carries which fast path: every block's AdaLN/residual fusion, its attention's RoPE fusion and its
#: SwiGLU gate (lossless, any backend or none); with ``sol_attn`` the Sol-Attn path on ``transformer_blocks.N.attn``
#: (high, stacked above the RoPE fusion by tier) and the always-dense text refiner attention (high; no layer index)
SITES = (
    SiteRule(r"transformer_blocks\.(\d+)", FUSED_BLOCK),
    SiteRule(r"transformer_blocks\.(\d+)\.attn", FUSED_ATTENTION),
    SiteRule(r"transformer_blocks\.(\d+)\.ff\.net\.0", FUSED_SWIGLU),
    chunked_rule(r"transformer_blocks\.(\d+)\.(?:ff|norm[12]|attn\.norm_[qk])"),
    SiteRule(r"transformer_blocks\.(\d+)\.attn", SOL_ATTENTION, backend="sol_attn"),
    SiteRule(r"token_refiner\.refiner_blocks\.\d+\.attn", REFINER_DENSE_PATH, backend="sol_attn"),
)


class MiniMaxH3Adapter(SolAttnAdapter):
    family = "MiniMax-H3"
    model_classes = (("diffusers", "MiniMaxH3Transformer3DModel"),)
    sites = SITES
    block_list = "transformer_blocks"
    cache = CacheSupport(methods=("first_block", "mag"), blocks="transformer_blocks")
    #: H3 timesteps run from 0 (noise) to 1 (clean); the noisiest rows count
    timesteps = TimestepScale(clean_is_high=True)

    def capture_for(self, backend_config: Any):
        """With a backend, the packed layout of each forward's ``token_tags`` (read by the Sol-Attn sites)."""
        return capture_layout if backend_config is not None else None
