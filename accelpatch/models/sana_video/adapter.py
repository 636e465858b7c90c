"""SANA-Video (diffusers ``SanaVideoTransformer3DModel``): the whole story of what accelpatch does to it.

Sites, per block ``transformer_blocks.N``:

- the block itself: AdaLN modulations and gated residual adds fused (``lossless``, :mod:`.block`);
- ``attn1`` (ReLU linear attention): two stacked fast paths (:mod:`.linear_attention`): the BF16-input first GEMM
  (``high``) over the restatement with its prologue and epilogue fused (``lossless``);
- ``ff`` (GLUMB): its SiLU and GLU gate fused (``lossless``, bf16).

The cross-attention ``attn2`` goes through diffusers' dispatcher and is left alone. Every lossless path is
bit-identical to diffusers: its fused ops are verified against the eager chain on first sight (accelpatch.lossless.verify).

Sequence parallelism through diffusers' ``enable_parallelism`` (after ``apply``): the plan (``cp_plan``) and the
split-aware layers (``split_layers``) of :mod:`.sequence_parallel`, idle until the model is split.

The site table is :data:`SITES` below. SANA-Video keeps its own modules rather than one ``lossless.py`` and one
``high.py``; by tier: :mod:`.block` is ``lossless`` (block, GLUMB); :mod:`.linear_attention` holds both attention
paths (``lossless`` restatement, ``high`` BF16 first GEMM over it); :mod:`.gemm` is the ``high`` path's BF16 GEMM;
:mod:`.restated_attention` is the restated math both paths and the ``exact`` split processor share;
:mod:`.split_processors` and :mod:`.sequence_parallel` are ``exact``-tier context parallelism.
"""
from __future__ import annotations

from accelpatch.core.adapter import CacheSupport, ModelAdapter, ParallelSupport, SiteRule
from accelpatch.models.sana_video.block import FUSED_BLOCK, FUSED_GLUMB
from accelpatch.models.sana_video.linear_attention import BF16_LINEAR_ATTENTION, FUSED_LINEAR_ATTENTION
from accelpatch.models.sana_video.sequence_parallel import cp_plan, split_layers

#: which module carries which fast path (SANA-Video has no backend: every row mounts with or without one)
SITES = (
    SiteRule(r"transformer_blocks\.(\d+)", FUSED_BLOCK),                       # lossless
    SiteRule(r"transformer_blocks\.(\d+)\.attn1", BF16_LINEAR_ATTENTION),     # high, stacked above
    SiteRule(r"transformer_blocks\.(\d+)\.attn1", FUSED_LINEAR_ATTENTION),    # lossless
    SiteRule(r"transformer_blocks\.(\d+)\.ff", FUSED_GLUMB),                  # lossless
)


class SanaVideoAdapter(ModelAdapter):
    family = "SANA-Video"
    model_classes = (("diffusers", "SanaVideoTransformer3DModel"),)
    backends = ()
    sites = SITES
    cache = CacheSupport(methods=("first_block", "mag"), blocks="transformer_blocks")
    parallel = ParallelSupport(cp_plan, split_layers)
