"""Tiny, randomly initialised diffusers models and pipelines, built offline from config dicts.

Tests, the demo, notebooks and benchmarks all need real diffusers modules (so that patching
hits the real attention code paths) without downloading weights. Everything here is built
under a fixed seed, so two calls with the same arguments give bit-identical models.

Nothing here touches the network. ``import accelpatch`` does not import this package; diffusers
and transformers are imported lazily inside the functions (``import diffusers`` takes seconds).

Layout: one file per model, all re-exported here (import from ``accelpatch.testing``)
-------------------------------------------------------------------------------------
* ``sana_video``: config dicts ``SANA_VIDEO_*_CONFIG``, :func:`tiny_sana_video_transformer`,
  :func:`sana_video_transformer_inputs`, :func:`sana_video_transformer_on_meta`,
  :func:`tiny_sana_video_pipeline`, :func:`sana_video_pipeline_call_kwargs`.
* ``minimax_h3``: config dicts ``MINIMAX_H3_*_CONFIG``, :func:`tiny_minimax_h3_transformer`,
  :func:`minimax_h3_transformer_inputs`, :class:`MiniMaxH3Layout`, :func:`minimax_h3_layout`,
  :func:`tiny_minimax_h3_pipeline`, :func:`minimax_h3_pipeline_call_kwargs`.
* ``sana_video2``: config dicts ``SANA_VIDEO2_*_CONFIG`` (``SANA_VIDEO2_TINY_VAE_CONFIG``: the tiny LTX-2
  VAE), :func:`tiny_sana_video2_transformer`, :func:`sana_video2_transformer_inputs`,
  :func:`sana_video2_transformer_on_meta`, :func:`tiny_sana_video2_pipeline`,
  :func:`sana_video2_pipeline_call_kwargs`.
* ``wan``: config dicts ``WAN_*_CONFIG``, :func:`tiny_wan_transformer`, :func:`wan_transformer_inputs`,
  :func:`wan_transformer_on_meta`,
  :func:`tiny_wan_pipeline` (Wan 2.1, or Wan 2.2 with ``two_transformers=True``), :func:`wan_pipeline_call_kwargs`.
* ``wan_vace``: ``WAN_VACE_TINY_CONFIG``, ``WAN_VACE_SOL_CONFIG``, :func:`tiny_wan_vace_transformer`,
  :func:`wan_vace_transformer_inputs` (with control latents), :func:`tiny_wan_vace_pipeline`,
  :func:`wan_vace_pipeline_call_kwargs` (a seeded control video and mask).
* ``wan_animate``: ``WAN_ANIMATE_TINY_CONFIG``, ``WAN_ANIMATE_SOL_CONFIG``, :func:`tiny_wan_animate_transformer`,
  :func:`wan_animate_transformer_inputs` (pose latents, face video, CLIP image embeddings),
  :func:`tiny_wan_animate_pipeline` (a tiny CLIP vision encoder too), :func:`wan_animate_pipeline_call_kwargs`.
* ``ltx2``: ``LTX2_TINY_CONFIG``, ``LTX2_3_TINY_CONFIG``, ``LTX2_TINY_{VIDEO_VAE,AUDIO_VAE,VOCODER}_CONFIG``,
  :func:`tiny_ltx2_transformer`, :func:`ltx2_transformer_inputs`, :func:`tiny_ltx2_pipeline` (Gemma 3 text
  encoder, connectors, both VAEs and the vocoder, all tiny), :func:`ltx2_pipeline_call_kwargs`.
* ``hunyuan_video15``: ``HUNYUAN_VIDEO15_SOL_CONFIG``, ``HUNYUAN_VIDEO15_PIPELINE_CONFIG``,
  ``HUNYUAN_VIDEO15_TINY_VAE_CONFIG``, :func:`tiny_hunyuan_video15_transformer`,
  :func:`hunyuan_video15_transformer_inputs`, :func:`tiny_hunyuan_video15_pipeline` (Qwen2.5-VL and ByT5 text
  encoders with in-memory tokenizers, all tiny), :func:`hunyuan_video15_pipeline_call_kwargs`.
* ``_common``: helpers the model files share (config lookup, seeded building, dtype casts,
  input dtype/device defaults).

A new model family gets its own file next to these, and its public names are added here.

Run tiny models on one thread (``torch.set_num_threads(1)``): with more threads, timings of
such small models get slower and much noisier.
"""
from __future__ import annotations

from accelpatch.testing.ltx2 import (
    LTX2_3_TINY_CONFIG,
    LTX2_TINY_AUDIO_VAE_CONFIG,
    LTX2_TINY_CONFIG,
    LTX2_TINY_VIDEO_VAE_CONFIG,
    LTX2_TINY_VOCODER_CONFIG,
    ltx2_pipeline_call_kwargs,
    ltx2_transformer_inputs,
    tiny_ltx2_pipeline,
    tiny_ltx2_transformer,
)
from accelpatch.testing.hunyuan_video15 import (
    HUNYUAN_VIDEO15_PIPELINE_CONFIG,
    HUNYUAN_VIDEO15_SOL_CONFIG,
    HUNYUAN_VIDEO15_TINY_VAE_CONFIG,
    hunyuan_video15_pipeline_call_kwargs,
    hunyuan_video15_transformer_inputs,
    tiny_hunyuan_video15_pipeline,
    tiny_hunyuan_video15_transformer,
)
from accelpatch.testing.minimax_h3 import (
    MINIMAX_H3_MEDIUM_CONFIG,
    MINIMAX_H3_SOL_CONFIG,
    MINIMAX_H3_TINY_CONFIG,
    MiniMaxH3Layout,
    minimax_h3_layout,
    minimax_h3_pipeline_call_kwargs,
    minimax_h3_transformer_inputs,
    tiny_minimax_h3_pipeline,
    tiny_minimax_h3_transformer,
)
from accelpatch.testing.sana_video import (
    SANA_VIDEO_MEDIUM_CONFIG,
    SANA_VIDEO_RELEASE_CONFIG,
    SANA_VIDEO_RELEASE_LIKE_CONFIG,
    SANA_VIDEO_TINY_CONFIG,
    sana_video_pipeline_call_kwargs,
    sana_video_transformer_inputs,
    sana_video_transformer_on_meta,
    tiny_sana_video_pipeline,
    tiny_sana_video_transformer,
)
from accelpatch.testing.sana_video2 import (
    SANA_VIDEO2_5B_CONFIG,
    SANA_VIDEO2_14B_CONFIG,
    SANA_VIDEO2_MEDIUM_CONFIG,
    SANA_VIDEO2_TINY_CONFIG,
    SANA_VIDEO2_TINY_VAE_8X_CONFIG,
    SANA_VIDEO2_TINY_VAE_CONFIG,
    sana_video2_pipeline_call_kwargs,
    sana_video2_transformer_inputs,
    sana_video2_transformer_on_meta,
    tiny_sana_video2_pipeline,
    tiny_sana_video2_transformer,
)
from accelpatch.testing.wan import (
    WAN_1_3B_CONFIG,
    WAN_SOL_CONFIG,
    WAN_TINY_CONFIG,
    tiny_wan_pipeline,
    tiny_wan_transformer,
    wan_pipeline_call_kwargs,
    wan_transformer_inputs,
    wan_transformer_on_meta,
)
from accelpatch.testing.wan_animate import (
    WAN_ANIMATE_SOL_CONFIG,
    WAN_ANIMATE_TINY_CONFIG,
    tiny_wan_animate_pipeline,
    tiny_wan_animate_transformer,
    wan_animate_pipeline_call_kwargs,
    wan_animate_transformer_inputs,
)
from accelpatch.testing.wan_vace import (
    WAN_VACE_SOL_CONFIG,
    WAN_VACE_TINY_CONFIG,
    tiny_wan_vace_pipeline,
    tiny_wan_vace_transformer,
    wan_vace_pipeline_call_kwargs,
    wan_vace_transformer_inputs,
)

__all__ = [
    "LTX2_TINY_CONFIG", "LTX2_3_TINY_CONFIG", "tiny_ltx2_transformer", "ltx2_transformer_inputs",
    "LTX2_TINY_VIDEO_VAE_CONFIG", "LTX2_TINY_AUDIO_VAE_CONFIG", "LTX2_TINY_VOCODER_CONFIG", "tiny_ltx2_pipeline",
    "ltx2_pipeline_call_kwargs",
    "HUNYUAN_VIDEO15_SOL_CONFIG", "tiny_hunyuan_video15_transformer", "hunyuan_video15_transformer_inputs",
    "HUNYUAN_VIDEO15_PIPELINE_CONFIG", "HUNYUAN_VIDEO15_TINY_VAE_CONFIG", "tiny_hunyuan_video15_pipeline",
    "hunyuan_video15_pipeline_call_kwargs",
    "SANA_VIDEO_TINY_CONFIG",
    "SANA_VIDEO_RELEASE_LIKE_CONFIG",
    "SANA_VIDEO_MEDIUM_CONFIG",
    "SANA_VIDEO_RELEASE_CONFIG",
    "MINIMAX_H3_TINY_CONFIG",
    "MINIMAX_H3_SOL_CONFIG",
    "MINIMAX_H3_MEDIUM_CONFIG",
    "MiniMaxH3Layout",
    "tiny_sana_video_transformer",
    "sana_video_transformer_inputs",
    "sana_video_transformer_on_meta",
    "tiny_sana_video_pipeline",
    "sana_video_pipeline_call_kwargs",
    "tiny_minimax_h3_transformer",
    "minimax_h3_transformer_inputs",
    "minimax_h3_layout",
    "tiny_minimax_h3_pipeline",
    "minimax_h3_pipeline_call_kwargs",
    "SANA_VIDEO2_TINY_CONFIG",
    "SANA_VIDEO2_MEDIUM_CONFIG",
    "SANA_VIDEO2_5B_CONFIG",
    "SANA_VIDEO2_14B_CONFIG",
    "tiny_sana_video2_transformer",
    "sana_video2_transformer_inputs",
    "sana_video2_transformer_on_meta",
    "SANA_VIDEO2_TINY_VAE_CONFIG",
    "SANA_VIDEO2_TINY_VAE_8X_CONFIG",
    "tiny_sana_video2_pipeline",
    "sana_video2_pipeline_call_kwargs",
    "WAN_TINY_CONFIG",
    "WAN_SOL_CONFIG",
    "WAN_1_3B_CONFIG",
    "tiny_wan_transformer",
    "wan_transformer_inputs",
    "wan_transformer_on_meta",
    "tiny_wan_pipeline",
    "wan_pipeline_call_kwargs",
    "WAN_VACE_TINY_CONFIG",
    "WAN_VACE_SOL_CONFIG",
    "tiny_wan_vace_transformer",
    "wan_vace_transformer_inputs",
    "tiny_wan_vace_pipeline",
    "wan_vace_pipeline_call_kwargs",
    "WAN_ANIMATE_TINY_CONFIG",
    "WAN_ANIMATE_SOL_CONFIG",
    "tiny_wan_animate_transformer",
    "wan_animate_transformer_inputs",
    "tiny_wan_animate_pipeline",
    "wan_animate_pipeline_call_kwargs",
]
