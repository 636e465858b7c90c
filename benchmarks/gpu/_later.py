"""The last two sections, cheapest evidence first lost when time runs out.

* ``step_cache``: accelpatch's step cache (``cache="first_block"``, tier ``high``) on a SANA-Video pipeline with
  random weights (tiny VAE and text encoder, 6 transformer blocks at the medium width with the release head dim
  112): one seeded call unpatched against the cache over a threshold sweep: time, speed-up, the fraction of
  transformer calls that reused the cache, PSNR of the frames against unpatched. Random weights make the quality
  an illustration; the speed and the reuse counts are what a GPU adds.
* ``compile``: ``torch.compile`` of one SANA-Video block at release width, unpatched and patched at the default
  tier: compile time (the first call) and the per-forward time against eager. A compile that fails is a row with
  its error (torch 2.11's Dynamo refuses some patched graphs: issue #31), not a failed section.

On ``--cpu`` the same code runs at tiny sizes, and compile uses the ``eager`` backend (graph capture only).
"""
from __future__ import annotations

import contextlib
import time

import torch

import accelpatch
from _accel import build_on, patched
from _runner import Context
from _timing import psnr, timed
from accelpatch.testing import (SANA_VIDEO_MEDIUM_CONFIG, SANA_VIDEO_RELEASE_CONFIG, SANA_VIDEO_RELEASE_LIKE_CONFIG,
                                sana_video_pipeline_call_kwargs, sana_video_transformer_inputs,
                                tiny_sana_video_pipeline, tiny_sana_video_transformer)

CACHE_THRESHOLDS = (0.05, 0.1, 0.2)
#: (transformer blocks, steps, pixels height x width x frames) of the step-cache call
CACHE_SIZE = (6, 20, dict(height=256, width=256, frames=33))
CPU_CACHE_SIZE = (4, 8, dict(height=32, width=32, frames=9))


def _cache_build(ctx: Context):
    """(pipeline, call kwargs without the generator) on the run's device."""
    layers, steps, size = CPU_CACHE_SIZE if ctx.dry_run else CACHE_SIZE
    dtype = torch.float32 if ctx.dry_run else torch.bfloat16
    pipe = tiny_sana_video_pipeline(transformer_config={**SANA_VIDEO_MEDIUM_CONFIG, "num_layers": layers},
                                    dtype=dtype, device=ctx.device)
    return pipe, dict(num_inference_steps=steps, **size)


def step_cache_builds(ctx: Context):
    return [("SANA-Video pipeline", lambda: _cache_build(ctx)[0].transformer)]


def _frames(pipe, call: dict) -> tuple[torch.Tensor, float]:
    kwargs = sana_video_pipeline_call_kwargs(**call)
    start = time.perf_counter()
    with torch.no_grad():
        frames = pipe(**kwargs).frames
    if torch.cuda.is_available() and pipe.device.type == "cuda":
        torch.cuda.synchronize()
    return frames, time.perf_counter() - start


def step_cache(ctx: Context) -> None:
    """Unpatched (warm-up, then timed), then the cache at each threshold of the sweep."""
    pipe, call = _cache_build(ctx)
    ctx.describe(model=f"SANA-Video pipeline, {len(pipe.transformer.transformer_blocks)} blocks of 4 heads × 112, "
                       "random weights, tiny VAE and text encoder", call=call)
    _frames(pipe, call)  # warm-up
    reference, seconds = _frames(pipe, call)
    ctx.add(setting="unpatched", s=seconds)
    for threshold in ctx.sweep(ctx.taus(CACHE_THRESHOLDS), "thresholds"):
        with patched(pipe, tier="high", cache="first_block", cache_threshold=threshold):
            accelpatch.report(pipe, reset=True)
            with accelpatch.quality("high"):
                frames, cached = _frames(pipe, call)
            cache = accelpatch.report(pipe).models[0].cache
        calls = cache["computed"] + cache["reused"]
        ctx.add(setting=f"cache threshold={threshold:g}", s=cached, speedup=seconds / cached,
                reuse_fraction=cache["reused"] / max(1, calls), psnr_db=psnr(reference.float(), frames.float()))


def _compile_build(ctx: Context):
    config = SANA_VIDEO_RELEASE_LIKE_CONFIG if ctx.dry_run else SANA_VIDEO_RELEASE_CONFIG
    model = build_on(ctx.device, tiny_sana_video_transformer, config, num_layers=1, dtype=torch.bfloat16)
    size = dict(num_frames=3, height=8, width=8) if ctx.dry_run else dict(num_frames=21, height=60, width=104,
                                                                           text_len=300)
    return model, sana_video_transformer_inputs(model, batch_size=2, **size)


def compile_builds(ctx: Context):
    return [("SANA-Video 1 block", lambda: _compile_build(ctx))]


def compile_section(ctx: Context) -> None:
    """Eager, then ``torch.compile`` unpatched and patched: compile seconds and per-forward time."""
    model, inputs = _compile_build(ctx)
    backend = "eager" if ctx.dry_run else "inductor"
    ctx.describe(model="SanaVideoTransformer3DModel, 1 block, bf16 random weights", backend=backend,
                 torch=torch.__version__)
    forward = lambda: model(**inputs).sample  # noqa: E731
    eager = timed(forward, ctx.repeats, ctx.device)
    ctx.add(setting="eager, unpatched", ms=eager.ms)
    for label, patch in ctx.sweep((("compiled, unpatched", False), ("compiled, default tier", True)), "variants"):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend)
        run = lambda: compiled(**inputs).sample  # noqa: E731
        try:
            with patched(model) if patch else contextlib.nullcontext():
                start = time.perf_counter()
                with torch.no_grad():
                    run()
                if ctx.device == "cuda":
                    torch.cuda.synchronize()
                compile_s = time.perf_counter() - start
                timing = timed(run, ctx.repeats, ctx.device, warmup=0)
        except Exception as error:  # noqa: BLE001 - a compile failure is a result of this section, not its end
            ctx.add(setting=label, error=f"{type(error).__name__}: {str(error)[:200]}")
            continue
        ctx.add(setting=label, compile_s=compile_s, ms=timing.ms, speedup=eager.seconds / timing.seconds,
                max_abs_diff=(timing.result.double() - eager.result.double()).abs().max().item())
    torch._dynamo.reset()

