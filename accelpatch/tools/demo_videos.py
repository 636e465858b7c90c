"""The demo's videos: each trained tiny model under ``exact``, ``lossless`` and ``high``, side by side, to look at.

Why: tables of SSIM say little to a person judging a video model; a strip and an animation of the three tiers, with
the per-frame and temporal metrics under them, show what the fast paths change. Random-weight models make noise, so
this uses the shipped trained tiny models (issue #43).

What: per family that ships trained, one call per tier on ``accelpatch.apply(pipe, **options)`` (the options its
package registers: ``TrainingSettings.demo_options``), written by
:func:`accelpatch.eval.plots.side_by_side` as ``FAMILY-trained.png`` and ``.gif``; the section's lines name both
paths.
"""
from __future__ import annotations

from pathlib import Path

#: What the trained models are asked for: a prompt whose colour they learned (docs/tiny-models.md).
PROMPT = "a blue square moves left"
TIERS = ("exact", "lossless", "high")


def video_section(out_dir: str | Path, *, steps: int = 8, seed: int = 8) -> list[str]:
    """:func:`family_videos` for every family that ships trained, in the registry's order, one block of lines
    each."""
    from accelpatch.models.families import families  # noqa: PLC0415
    from accelpatch.tiny_models.shipped import shipped_families  # noqa: PLC0415

    shipped = shipped_families()
    lines: list[str] = []
    for family in (f.cli for f in families() if f.training is not None and f.cli in shipped):
        lines += family_videos(family, out_dir, steps=steps, seed=seed)
    return lines


def family_videos(family: str, out_dir: str | Path, *, steps: int = 8, seed: int = 8) -> list[str]:
    """Run the trained tiny ``family`` under each of :data:`TIERS` and write the side-by-side PNG and GIF into
    ``out_dir`` (created); returns the block's lines: what ran, the metrics against ``exact``, the two paths."""
    import torch  # noqa: PLC0415

    import accelpatch  # noqa: PLC0415
    from accelpatch.eval.metrics import compare_videos  # noqa: PLC0415
    from accelpatch.eval.plots import side_by_side  # noqa: PLC0415
    from accelpatch.eval.temporal_metrics import compare_temporal  # noqa: PLC0415
    from accelpatch.models.families import by_cli  # noqa: PLC0415
    from accelpatch.tiny_models import trained_call_kwargs, trained_pipeline  # noqa: PLC0415

    record = by_cli(family)
    name, options = record.name, dict(record.training.demo_options)
    pipe = trained_pipeline(family)
    accelpatch.apply(pipe, **options)
    videos = {}
    try:
        for tier in TIERS:
            with torch.no_grad(), accelpatch.quality(tier):
                kwargs = trained_call_kwargs(family, PROMPT, num_inference_steps=steps, seed=seed)
                videos[tier] = pipe(**kwargs).frames[0]  # (F, 3, H, W) in [0, 1]
    finally:
        accelpatch.remove(pipe)
    reference = videos["exact"]
    settings = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "the defaults"
    notes = [f"trained tiny {name}, \"{PROMPT}\", {steps} steps, seed {seed}; apply({settings}); against exact:"]
    for tier in TIERS[1:]:
        video = videos[tier]
        quality = compare_videos(reference, video, data_range=1.0)
        temporal = compare_temporal(reference, video, psnr=quality.psnr)  # validate's motion ratio and flicker delta
        same = "bit-identical" if torch.equal(video, reference) else (
            f"worst frame SSIM {min(quality.ssim):.4f}, PSNR {min(quality.psnr):.1f} dB")
        notes.append(f"{tier}: {same}; motion ratio {temporal.motion_ratio[0]:.3f}, "
                     f"flicker delta {temporal.flicker_delta[0]:+.4f}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png, gif = side_by_side({f"{tier}": videos[tier] for tier in TIERS}, str(out / f"{family}-trained"), notes=notes)
    return [f"== Videos: the trained tiny {name} under exact | lossless | high, side by side",
            *(f"   {n}" for n in notes), f"   strip (one row per tier): {png}",
            f"   animation (the tiers side by side): {gif}"]
