"""``python -m accelpatch demo``: a tiny SANA-Video pipeline, unpatched and under every tier, side by side.

Everything is built offline with random weights under a fixed seed. The table shows, per run: seconds per
denoising step, whether the frames are bit-identical to the unpatched pipeline, PSNR/SSIM against the ``exact``
run, and how many attention calls took a fast path. The sites (mounted or rejected, with reasons) follow.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Optional

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Run:
    label: str
    tier: Optional[str]
    seconds_per_step: float
    frames: torch.Tensor
    fast_calls: int
    fallback_calls: int


def _timed_call(pipe, call_kwargs, steps) -> tuple[torch.Tensor, float]:
    stamps: list[float] = []

    def on_step_end(pipeline, step, timestep, callback_kwargs):
        stamps.append(time.perf_counter())
        return callback_kwargs

    start = time.perf_counter()
    frames = pipe(**call_kwargs, callback_on_step_end=on_step_end).frames
    intervals = [b - a for a, b in zip([start] + stamps[:-1], stamps)]
    return frames, sum(intervals) / max(len(intervals), 1)


def run_demo(*, steps: int = 4, dtype: str = "bf16", device: str = "cpu", seed: int = 0, repeats: int = 3,
             progress: bool = True) -> str:
    """Run the demo and return its report as text."""
    from tqdm.auto import tqdm

    import accelpatch
    from accelpatch.testing import (SANA_VIDEO_RELEASE_LIKE_CONFIG, sana_video_pipeline_call_kwargs,
                                    tiny_sana_video_pipeline)
    from accelpatch.tools.metrics import compare_videos

    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    plan = [("unpatched", None), ("patched, default", None), ("patched, exact", "exact"),
            ("patched, lossless", "lossless"), ("patched, high", "high")]
    bar = tqdm(total=len(plan) * repeats + 1, desc="accelpatch demo", disable=not progress, unit="call")
    bar.set_postfix_str("building the tiny pipeline")
    pipe = tiny_sana_video_pipeline(dtype=DTYPES[dtype], seed=seed, device=device,
                                    transformer_config=SANA_VIDEO_RELEASE_LIKE_CONFIG)
    kwargs = lambda: sana_video_pipeline_call_kwargs(num_inference_steps=steps, seed=seed)  # noqa: E731
    pipe(**kwargs())  # warm-up, not timed
    bar.update(1)

    runs: list[Run] = []
    for label, tier in plan:
        bar.set_postfix_str(label)
        if label == "patched, default":
            accelpatch.apply(pipe)
        best = float("inf")
        for _ in range(repeats):
            accelpatch.report(pipe, reset=True)
            if tier is None:
                frames, per_step = _timed_call(pipe, kwargs(), steps)
            else:
                with accelpatch.quality(tier):
                    frames, per_step = _timed_call(pipe, kwargs(), steps)
            best = min(best, per_step)
            bar.update(1)
        rep = accelpatch.report(pipe)
        runs.append(Run(label, tier, best, frames, rep.fast_calls, sum(rep.fallback_calls.values())))
    bar.close()

    reference = runs[0].frames
    exact = next(r for r in runs if r.tier == "exact").frames
    lines = [f"SANA-Video demo: tiny random pipeline, {dtype}, {device}, {steps} steps, CFG (batch 2), "
             f"frames {tuple(reference.shape)}; fastest of {repeats} calls",
             f"{'run':<20}{'s/step':>9}{'vs unpatched':>14}{'bit-identical':>15}{'PSNR vs exact':>15}"
             f"{'SSIM vs exact':>15}{'fast calls':>12}{'fallbacks':>11}"]
    for r in runs:
        q = compare_videos(exact, r.frames)
        psnr = "inf" if q.min_psnr == float("inf") else f"{q.min_psnr:.2f} dB"
        lines.append(f"{r.label:<20}{r.seconds_per_step:>9.4f}{r.seconds_per_step / runs[0].seconds_per_step:>13.3f}×"
                     f"{'yes' if torch.equal(r.frames, reference) else 'no':>15}{psnr:>15}{q.min_ssim:>15.4f}"
                     f"{r.fast_calls:>12}{r.fallback_calls:>11}")
    lines.append("")
    lines.append(str(accelpatch.report(pipe)))
    accelpatch.remove(pipe)
    lines.append("")
    lines.append("after accelpatch.remove(pipe): bit-identical to unpatched: "
                 + ("yes" if torch.equal(pipe(**kwargs()).frames, reference) else "NO"))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=4, help="denoising steps per call (default 4)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="model dtype (default bf16)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; the high tier needs cuda)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="calls per run; the fastest is reported")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(1) if args.device == "cpu" else None
    print(run_demo(steps=args.steps, dtype=args.dtype, device=args.device, seed=args.seed, repeats=args.repeats,
                   progress=not args.no_progress))
    return 0
