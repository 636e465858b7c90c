"""Section ``wan_step``: one denoising step of a Wan2.1-T2V-1.3B-shaped transformer (12 heads × 128, 30 layers,
random bf16 weights) at 480p, 81 frames (21 × 30 × 52 = 32,760 tokens), dense against ``backend="sol_attn"`` with
the adapter's defaults (dense layers 0 and 1, tau over the sweep; ``dense_steps=0``: a lone forward has no
scheduler step, and a dense step would time the dense path twice): step time, speed-up, mean exact fraction of the
sparse layers and PSNR of the step's output against dense.

Random weights say nothing about Wan's quality under Sol-Attn (the prior art got PSNR 8.2 dB on real Wan with H3's
settings); the rows show the speed at the released shape and that the sparse path ran. The recipe
``wan2.1-t2v-sol-attn`` stays "measured: no" until a real-weights run fills it.
"""
from __future__ import annotations

import torch

from _accel import build_on, patched, timed_at_tier
from _runner import Context
from _timing import psnr, rel_l2, timed
from accelpatch.testing import WAN_SOL_CONFIG, tiny_wan_transformer, wan_transformer_inputs
from accelpatch.testing.wan import WAN_1_3B_CONFIG

#: latent frames, height, width (VAE stride 4 × 8 × 8) and text tokens of a 480p 81-frame clip; the dry run's
#: tiny shape (1,024 tokens) on the tiny head-dim-128 config
RELEASE_INPUTS = dict(num_frames=21, height=60, width=104, text_len=512)
DRY_INPUTS = dict(num_frames=4, height=32, width=32, text_len=8)
TAUS = (1.0, 1.5)


def _setup(ctx: Context):
    # the CPU rehearsal: three tiny layers, so that one runs sparse beside the default dense layers 0 and 1
    config, shape = ((dict(WAN_SOL_CONFIG, num_layers=3), DRY_INPUTS) if ctx.dry_run
                     else (WAN_1_3B_CONFIG, RELEASE_INPUTS))
    return config, shape, torch.float32 if ctx.dry_run else torch.bfloat16


def _build(ctx: Context):
    """(Wan 1.3B-shaped model, its 480p inputs)."""
    config, shape, dtype = _setup(ctx)
    model = build_on(ctx.device, tiny_wan_transformer, config, dtype=dtype)
    return model, wan_transformer_inputs(model, **shape)


def wan_step_builds(ctx: Context):
    return [("Wan 1.3B", lambda: _build(ctx))]


def wan_step(ctx: Context) -> None:
    """Dense, then sol_attn per tau, on one release-shaped Wan 1.3B step."""
    config, shape, dtype = _setup(ctx)
    model, inputs = _build(ctx)
    tokens = shape["num_frames"] * (shape["height"] // 2) * (shape["width"] // 2)
    ctx.describe(model=f"Wan, {config['num_layers']} layers of {config['num_attention_heads']} heads × "
                       f"{config['attention_head_dim']}, {str(dtype).replace('torch.', '')} random weights",
                 shape=f"{tokens} video tokens, {shape['text_len']} text tokens")
    step = lambda: model(**inputs).sample  # noqa: E731
    with torch.no_grad():
        dense = timed(step, ctx.repeats, ctx.device)
        ctx.add(setting="dense", ms=dense.ms)
        for tau in ctx.sweep(ctx.taus(TAUS), "taus"):
            with patched(model, backend="sol_attn", tau=tau, dense_steps=0, min_tokens=0):
                timing, counts = timed_at_tier(model, "high", step, ctx.repeats, ctx.device)
            ctx.add(setting=f"sol_attn tau={tau:g}", ms=timing.ms, speedup=dense.seconds / timing.seconds,
                    psnr_db=psnr(dense.result, timing.result), rel_l2=rel_l2(dense.result, timing.result), **counts)
