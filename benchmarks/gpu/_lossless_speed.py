"""Section ``lossless_speed``: what the default tier saves at release layer shapes, bit for bit.

Per model (random weights, bf16, release widths, a few layers so that the section fits its budget): a forward of
the unpatched transformer against the same transformer after ``accelpatch.apply`` at the default tier
(``lossless``: the bit-exact fused kernels, verified against the eager chains on first sight), timed side by side.
Each row records the SHA-256 of the output; the patched row is ``required``: it must be bit-identical to the
unpatched one (a mismatch makes the run exit 1), and it lists the fused ops that ran and any signature declined.

- SANA-Video: 2 blocks of the 2B model (20 heads × 112) at 480p, 81 frames (32,760 tokens), CFG batch 2.
- SANA-Video 2.0: the 5B width (2560), 4 blocks (three linear-attention layers and one anchor) at 720p, 193 frames
  (23,000 tokens).
- MiniMax-H3: 2 release-shaped layers (56 heads × 128, hidden 5376) over a 38,000-row packed sequence.

On a dry run the same code runs on CPU at tiny shapes, with the default tier's size floor off (those shapes are under
it; the release shapes are far above it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

import accelpatch
from _accel import build_on, patched
from _runner import Context
from _sol import H3_DRY_LAYER, H3_RELEASE_LAYER
from _timing import sha256_hex, timed
from accelpatch.testing import (SANA_VIDEO2_5B_CONFIG, SANA_VIDEO2_MEDIUM_CONFIG, SANA_VIDEO_RELEASE_CONFIG,
                                SANA_VIDEO_RELEASE_LIKE_CONFIG, minimax_h3_transformer_inputs,
                                sana_video2_transformer_inputs, sana_video_transformer_inputs,
                                tiny_minimax_h3_transformer, tiny_sana_video2_transformer, tiny_sana_video_transformer)

DTYPE = torch.bfloat16


@dataclass(frozen=True)
class SpeedCase:
    name: str
    shape: str
    build: Callable[[str], torch.nn.Module]
    inputs: Callable[[torch.nn.Module], dict]


def _cases(dry_run: bool) -> tuple[SpeedCase, ...]:
    if dry_run:
        return (
            SpeedCase("SANA-Video", "3×8×8 latents, batch 2", lambda d: build_on(
                d, tiny_sana_video_transformer, SANA_VIDEO_RELEASE_LIKE_CONFIG, dtype=DTYPE),
                lambda m: sana_video_transformer_inputs(m, batch_size=2)),
            SpeedCase("SANA-Video 2.0", "2×8×8 latents, batch 2", lambda d: build_on(
                d, tiny_sana_video2_transformer, SANA_VIDEO2_MEDIUM_CONFIG, dtype=DTYPE),
                lambda m: sana_video2_transformer_inputs(m, frames=2, height=8, width=8)),
            SpeedCase("MiniMax-H3", "600 video + 14 text/audio rows", lambda d: build_on(
                d, tiny_minimax_h3_transformer, dict(H3_DRY_LAYER, num_layers=2), dtype=DTYPE),
                lambda m: minimax_h3_transformer_inputs(m, num_video=600, num_text=6, num_audio=8)),
        )
    return (
        SpeedCase("SANA-Video", "480p 81 frames: 21×30×52 = 32,760 tokens, CFG batch 2", lambda d: build_on(
            d, tiny_sana_video_transformer, SANA_VIDEO_RELEASE_CONFIG, num_layers=2, dtype=DTYPE),
            lambda m: sana_video_transformer_inputs(m, batch_size=2, num_frames=21, height=60, width=104,
                                                    text_len=300)),
        SpeedCase("SANA-Video 2.0", "720p 193 frames: 25×23×40 = 23,000 tokens, CFG batch 2", lambda d: build_on(
            d, tiny_sana_video2_transformer, SANA_VIDEO2_5B_CONFIG, depth=4, dtype=DTYPE),
            lambda m: sana_video2_transformer_inputs(m, frames=25, height=23, width=40)),
        SpeedCase("MiniMax-H3", "38,000 video + 2,304 text/audio rows", lambda d: build_on(
            d, tiny_minimax_h3_transformer, dict(H3_RELEASE_LAYER, num_layers=2), dtype=DTYPE),
            lambda m: minimax_h3_transformer_inputs(m, num_video=38000, num_text=256, num_audio=2048)),
    )


def _fusion_summary(model: torch.nn.Module) -> tuple[str, list[str]]:
    fusions = accelpatch.report(model).models[0].fusions
    ran = ", ".join(f"{f.op}×{f.fused_calls}" for f in fusions if f.fused_calls)
    declined = sorted({f"{f.op}: {reason}" for f in fusions for _, reason, _ in f.declined})
    return ran or "none", declined


def _build(ctx: Context, case: SpeedCase):
    model = case.build(ctx.device)
    return model, case.inputs(model)


def lossless_speed_builds(ctx: Context):
    """(model name, build of the model and its inputs) for every case at the run's sizes."""
    return [(case.name, lambda case=case: _build(ctx, case)) for case in _cases(ctx.dry_run)]


def lossless_speed(ctx: Context) -> None:
    """Every model: unpatched, then the default tier, timed; SHA-256 of both outputs."""
    from accelpatch.core import sites

    ctx.describe(dtype="bf16", what="forward of the transformer, unpatched vs accelpatch.apply() at the default "
                                    "tier (lossless fused kernels); outputs compared bit for bit")
    floor = sites.MIN_ELEMENTS
    if ctx.dry_run:  # tiny shapes, under the size floor: the rehearsal runs the fused code all the same
        sites.MIN_ELEMENTS = 0
    try:
        _speed_rows(ctx)
    finally:
        sites.MIN_ELEMENTS = floor


def _speed_rows(ctx: Context) -> None:
    for case in ctx.sweep(_cases(ctx.dry_run), "models"):
        model, inputs = _build(ctx, case)

        def forward():
            with torch.no_grad():
                return model(**inputs).sample

        reference = timed(forward, ctx.repeats, ctx.device)
        ctx.add(model=case.name, shape=case.shape, check="unpatched", required=True, identical=True,
                ms=reference.ms, sha256=sha256_hex(reference.result))
        with patched(model):
            timing = timed(forward, ctx.repeats, ctx.device)
            ran, declined = _fusion_summary(model)
        identical = torch.equal(timing.result, reference.result)
        ctx.add(model=case.name, shape=case.shape, check="default tier (lossless fusions)", required=True,
                identical=identical, ms=timing.ms, speedup=reference.seconds / timing.seconds,
                sha256=sha256_hex(timing.result), fused=ran, declined="; ".join(declined) or None)
        del model, inputs, reference, timing
