"""``python -m accelpatch demo``: a tiny SANA-Video (default) or SANA-Video 2.0 (``--model sana-video2``) pipeline,
unpatched and under every tier, side by side.

Everything is built offline with random weights under a fixed seed. The table shows, per run: seconds per
denoising step, whether the frames are bit-identical to the unpatched pipeline, PSNR/SSIM against the ``exact``
run, and how many attention calls took a fast path. The sites (mounted or rejected, with reasons) follow.

Importing this module is cheap (no torch, no diffusers): ``add_arguments`` declares the command line, so that
``--help`` answers at once; torch is imported by the functions that run.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    import torch

DTYPE_NAMES = ("bf16", "fp32")


@dataclass(frozen=True)
class DemoModel:
    """One model the demo can run: its title and the names (in :mod:`accelpatch.testing`) of its tiny pipeline
    builder, call-kwargs builder and transformer config (None: the builder's default)."""

    title: str
    pipeline: str
    call_kwargs: str
    transformer_config: Optional[str]


#: ``--model`` choices. The transformer configs keep the released head dims, so head-dim-gated fast paths apply.
MODELS: dict[str, DemoModel] = {
    "sana-video": DemoModel("SANA-Video", "tiny_sana_video_pipeline", "sana_video_pipeline_call_kwargs",
                            "SANA_VIDEO_RELEASE_LIKE_CONFIG"),
    "sana-video2": DemoModel("SANA-Video 2.0", "tiny_sana_video2_pipeline", "sana_video2_pipeline_call_kwargs",
                             "SANA_VIDEO2_MEDIUM_CONFIG"),
}
DEFAULT_MODEL = "sana-video"


def _torch_dtypes() -> dict:
    import torch  # noqa: PLC0415  (heavy: only when the demo runs)

    return {"fp32": torch.float32, "bf16": torch.bfloat16}


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
             progress: bool = True, model: str = DEFAULT_MODEL) -> str:
    """Run the demo on ``model`` (a key of :data:`MODELS`) and return its report as text."""
    import torch
    from tqdm.auto import tqdm

    import accelpatch
    import accelpatch.testing as testing
    from accelpatch.tools.metrics import compare_videos

    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    DTYPES = _torch_dtypes()  # noqa: N806
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    spec = MODELS[model]
    build_pipeline, call_kwargs = getattr(testing, spec.pipeline), getattr(testing, spec.call_kwargs)
    config = None if spec.transformer_config is None else getattr(testing, spec.transformer_config)
    plan = [("unpatched", None), ("patched, default", None), ("patched, exact", "exact"),
            ("patched, lossless", "lossless"), ("patched, high", "high")]
    bar = tqdm(total=len(plan) * repeats + 1, desc="accelpatch demo", disable=not progress, unit="call")
    bar.set_postfix_str("building the tiny pipeline")
    pipe = build_pipeline(dtype=DTYPES[dtype], seed=seed, device=device, transformer_config=config)
    kwargs = lambda: call_kwargs(num_inference_steps=steps, seed=seed)  # noqa: E731
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
    lines = [f"{spec.title} demo: tiny random pipeline, {dtype}, {device}, {steps} steps, CFG (batch 2), "
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


def _int_at_least(minimum: int):
    """argparse type: an int >= minimum; anything else is a one-line usage error naming the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the demo's options (no heavy import: ``--help`` stays fast)."""
    parser.add_argument("--model", choices=tuple(MODELS), default=DEFAULT_MODEL,
                        help=f"which tiny pipeline to run (default {DEFAULT_MODEL})")
    parser.add_argument("--steps", type=positive_int, default=4, help="denoising steps per call, >= 1 (default 4)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="bf16", help="model dtype (default bf16)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; the high tier needs cuda)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed, >= 0 (default 0)")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="calls per run, >= 1; the fastest is reported (default 3)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def device_error(text: str) -> Optional[str]:
    """Why ``--device text`` cannot run the demo on this machine, or None if it can."""
    import torch  # noqa: PLC0415

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        return f"not a torch device string (e.g. cpu, cuda, cuda:0); valid here: {', '.join(_usable_devices())}"
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            if torch.version.cuda is None:
                why = f"CUDA is not available in this torch build ({torch.__version__})"
            else:
                why = f"CUDA is not available (torch {torch.__version__} sees no usable GPU)"
            return f"{why}; valid here: {', '.join(_usable_devices())}"
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            return f"CUDA device index must be in [0, {count - 1}], got {device.index}"
        return None
    if device.type in _usable_devices():
        return None
    return f"device type {device.type!r} is not available here; valid here: {', '.join(_usable_devices())}"


def _usable_devices() -> list[str]:
    import torch  # noqa: PLC0415

    names = ["cpu"]
    if torch.cuda.is_available():
        names.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        names.append("xpu")
    return names


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Checks that need torch, run after parsing and before anything is built: ``parser.error`` (exit 2) if bad."""
    reason = device_error(args.device)
    if reason is not None:
        parser.error(f"--device {args.device}: {reason}")


def main(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415

    torch.set_num_threads(1) if args.device == "cpu" else None
    print(run_demo(steps=args.steps, dtype=args.dtype, device=args.device, seed=args.seed, repeats=args.repeats,
                   progress=not args.no_progress, model=args.model))
    return 0
