"""Sections on the SANA-Video family (random weights at release layer shapes, bf16, no downloads).

* ``sana_video_linear_attention``: SANA-Video's linear-attention site (``transformer_blocks.0.attn1``) at 480p,
  unpatched against ``exact`` and ``high`` (the BF16-operand GEMM), as the site alone (its real inputs, captured
  from a forward) and as the one-block transformer forward around it.
* ``sana_video2_anchor``: one SANA-Video 2.0 anchor attention module at the 720p shape: the release's FP32
  attention against BF16 anchors and ``backend="sol_attn"`` over a tau sweep.
* ``sana_video2_step``: one 5B SANA-Video 2.0 denoising step at 480p, ``exact`` against the ``high`` settings
  (formerly a script of its own).

On a dry run the same code runs on CPU at tiny shapes with the release head dims; the CUDA-only fast paths run
their exact CPU emulations there (see ``run_all.py``).
"""
from __future__ import annotations

import math

import torch

import accelpatch
from _accel import build_on, capture_call, patched, seeded_generator, timed_at_tier
from _runner import Context
from _timing import Timing, psnr, rel_l2, timed
from accelpatch.testing import (SANA_VIDEO2_5B_CONFIG, SANA_VIDEO2_MEDIUM_CONFIG, SANA_VIDEO_RELEASE_CONFIG,
                                SANA_VIDEO_RELEASE_LIKE_CONFIG, sana_video2_transformer_inputs,
                                sana_video_transformer_inputs, tiny_sana_video_transformer)

DTYPE = torch.bfloat16
#: SANA-Video's VAE (Wan 2.1) compresses time by 4 and space by 8 (SanaVideoPipeline's vae_scale_factor_*)
WAN_VAE_STRIDE = (4, 8, 8)
#: the 480p SANA-Video clip: frames, height, width in pixels
SANA_VIDEO_480P = (81, 480, 832)
#: SANA-Video 2.0 latent grids (LTX-2 VAE, stride 8 × 32 × 32, patch 1): the prior art's 720p / 193-frame anchor
#: measurement (23,000 tokens) and the 480p step of the folded-in script (4,290 tokens)
SANA2_720P_GRID = (25, 23, 40)
SANA2_480P_GRID = (11, 15, 26)
#: dry-run grids: 8 blocks of 64 tokens for the anchor (so that Sol-Attn routes), 128 tokens for the step
SANA2_DRY_ANCHOR_GRID = (4, 8, 16)
SANA2_DRY_GRID = (2, 8, 8)
SANA2_ANCHOR_TAUS = (0.5, 1.0, 1.5)


def latent_grid(pixels: tuple[int, int, int], stride: tuple[int, int, int]) -> tuple[int, int, int]:
    """Latent frames, height, width of a ``(frames, height, width)`` clip under a causal video VAE's stride."""
    frames, height, width = pixels
    return (frames - 1) // stride[0] + 1, height // stride[1], width // stride[2]


def dims(shape) -> str:
    return "x".join(map(str, shape))


def _compare(reference: Timing, timing: Timing) -> dict:
    """Time and distance of ``timing`` against the reference row's."""
    return {"ms": timing.ms, "speedup": reference.seconds / timing.seconds,
            "rel_l2": rel_l2(reference.result, timing.result), "psnr_db": psnr(reference.result, timing.result)}


# -- SANA-Video linear attention ---------------------------------------------------------------------------------


def _sana_video_setup(ctx: Context):
    """(config, latent grid, caption tokens): release width and a 480p clip, or tiny shapes on a dry run."""
    if ctx.dry_run:
        return SANA_VIDEO_RELEASE_LIKE_CONFIG, (3, 8, 8), 6
    return SANA_VIDEO_RELEASE_CONFIG, latent_grid(SANA_VIDEO_480P, WAN_VAE_STRIDE), 300


def _linear_attention_build(ctx: Context):
    """(model, inputs): one SANA-Video block at release width and the 480p clip's latents."""
    config, grid, text_len = _sana_video_setup(ctx)
    model = build_on(ctx.device, tiny_sana_video_transformer, config, num_layers=1, dtype=DTYPE)
    return model, sana_video_transformer_inputs(model, batch_size=2, num_frames=grid[0], height=grid[1],
                                                width=grid[2], text_len=text_len)


def sana_video_linear_attention_builds(ctx: Context):
    return [("SANA-Video 1 block", lambda: _linear_attention_build(ctx))]


def sana_video_linear_attention(ctx: Context) -> None:
    """One-block SANA-Video at release width: the attn1 site and the block forward, unpatched / exact / high."""
    config, grid, text_len = _sana_video_setup(ctx)
    model, inputs = _linear_attention_build(ctx)
    site = model.transformer_blocks[0].attn1
    args, kwargs = capture_call(site, lambda: model(**inputs))
    patch = tuple(config["patch_size"])
    tokens = math.prod(g // p for g, p in zip(grid, patch))
    ctx.describe(model=f"SanaVideoTransformer3DModel, 1 block, {config['num_attention_heads']} heads × "
                       f"{config['attention_head_dim']}, bf16 random weights",
                 shape=f"latents {dims(grid)}, patch {dims(patch)} -> {tokens} tokens, "
                       f"CFG batch 2, {text_len} caption tokens"
                       + ("" if ctx.dry_run else " (832x480, 81 frames; Wan VAE stride 4x8x8)"))
    scopes = {"site attn1": lambda: site(*args, **kwargs), "one-block forward": lambda: model(**inputs).sample}
    reference = {scope: timed(fn, ctx.repeats, ctx.device) for scope, fn in scopes.items()}
    for scope, timing in reference.items():
        ctx.add(scope=scope, setting="unpatched", ms=timing.ms)
    with patched(model):
        for tier in ctx.sweep(("exact", "high"), "tiers"):
            for scope, fn in scopes.items():
                timing, counts = timed_at_tier(model, tier, fn, ctx.repeats, ctx.device)
                ctx.add(scope=scope, setting=f"quality('{tier}')", **_compare(reference[scope], timing), **counts)


# -- SANA-Video 2.0 --------------------------------------------------------------------------------------------


def _sana_video2_model(config: dict, *, device: str):
    """A SANA-Video 2.0 transformer with random weights, built on ``device`` and cast to bf16."""
    from accelpatch.models.sana_video2.modeling import SanaVideo2Transformer3DModel

    torch.manual_seed(0)
    model = SanaVideo2Transformer3DModel(**config)
    # torch's own ``to``: the model keeps no module in FP32 (``_keep_in_fp32_modules`` is empty), so ModelMixin's
    # warning about casting with ``to()`` does not apply
    return torch.nn.Module.to(model, device=device, dtype=DTYPE).eval()


def _anchor_settings(ctx: Context):
    """(label, apply options) of the anchor comparison: BF16 anchors, then Sol-Attn over the tau sweep."""
    yield "BF16 anchors", dict(anchor_fp32_steps=0)
    for tau in ctx.sweep(ctx.taus(SANA2_ANCHOR_TAUS), "taus"):
        yield f"Sol-Attn tau={tau:g}", dict(backend="sol_attn", tau=tau, dense_steps=0, dense_layers="", min_tokens=0)


def _anchor_build(ctx: Context):
    """(one-anchor model, its 720p tokens, their RoPE)."""
    base = SANA_VIDEO2_MEDIUM_CONFIG if ctx.dry_run else SANA_VIDEO2_5B_CONFIG
    model = build_on(ctx.device, _sana_video2_model, {**base, "depth": 1, "softmax_ratio": 1.0,
                                                      "attn_res_block_size": 1})
    grid = SANA2_DRY_ANCHOR_GRID if ctx.dry_run else SANA2_720P_GRID
    x = torch.randn(1, math.prod(grid), model.config.hidden_size, generator=seeded_generator(ctx.device, 1),
                    device=ctx.device, dtype=DTYPE)
    return model, x, model.rope_softmax(*grid, torch.device(ctx.device))


def sana_video2_anchor_builds(ctx: Context):
    return [("SANA-Video 2.0 anchor", lambda: _anchor_build(ctx))]


def sana_video2_anchor(ctx: Context) -> None:
    """One anchor attention module at 720p: the release's FP32 core against BF16 anchors and Sol-Attn over tau."""
    model, x, rope = _anchor_build(ctx)
    grid = SANA2_DRY_ANCHOR_GRID if ctx.dry_run else SANA2_720P_GRID
    attn = model.blocks[model.softmax_layer_indices[0]].attn
    ctx.describe(model=f"one SANA-Video 2.0 anchor attention module, hidden {model.config.hidden_size}, "
                       f"{attn.heads} heads × {attn.head_dim}, bf16 random weights",
                 shape=f"latents {dims(grid)} = {math.prod(grid)} tokens, batch 1"
                       + ("" if ctx.dry_run else " (720p, 193 frames)"))
    call = lambda: attn(x, rotary_emb=rope)  # noqa: E731
    fp32 = timed(call, ctx.repeats, ctx.device)
    ctx.add(setting="FP32 attention (release)", ms=fp32.ms)
    bf16_seconds = None
    for label, options in _anchor_settings(ctx):
        with patched(model, **options):
            timing, counts = timed_at_tier(model, "high", call, ctx.repeats, ctx.device)
        row = _compare(fp32, timing)
        if bf16_seconds is None:
            bf16_seconds = timing.seconds
        else:
            row["speedup_vs_bf16"] = bf16_seconds / timing.seconds
        ctx.add(setting=label, **row, **counts)


def _step_settings(anchors: list[int]):
    """(label, tier, apply options) of the one-step comparison; the step is past the FP32 steps of the default."""
    return [
        ("exact", "exact", {}),
        ("high: BF16 anchors", "high", dict(anchor_fp32_steps=0)),
        ("high: half the anchors FP32", "high",
         dict(anchor_fp32_steps=0, anchor_fp32_layers=anchors[: len(anchors) // 2])),
        ("high: linear GEMM only", "high", dict(anchor_fp32_layers=anchors)),  # every anchor keeps FP32
        ("high: sol_attn tau=1", "high",
         dict(backend="sol_attn", tau=1.0, dense_steps=0, dense_layers="", min_tokens=0)),
    ]


def _step_build(ctx: Context):
    """(5B model, CFG-batch inputs at 480p)."""
    config = SANA_VIDEO2_MEDIUM_CONFIG if ctx.dry_run else SANA_VIDEO2_5B_CONFIG
    model = build_on(ctx.device, _sana_video2_model, config)
    grid = SANA2_DRY_GRID if ctx.dry_run else SANA2_480P_GRID
    return model, sana_video2_transformer_inputs(model, batch_size=2, frames=grid[0], height=grid[1], width=grid[2])


def sana_video2_step_builds(ctx: Context):
    return [("SANA-Video 2.0 5B", lambda: _step_build(ctx))]


def sana_video2_step(ctx: Context) -> None:
    """One 5B denoising step at 480p under each setting of :func:`_step_settings`."""
    model, inputs = _step_build(ctx)
    grid = SANA2_DRY_GRID if ctx.dry_run else SANA2_480P_GRID
    params = sum(p.numel() for p in model.parameters())
    ctx.describe(model=f"SANA-Video 2.0, {params / 1e9:.2f}B parameters, bf16 random weights, anchors "
                       f"{model.softmax_layer_indices}",
                 shape=f"latents {dims(grid)} = {math.prod(grid)} tokens, CFG batch 2, "
                       f"{model.config.model_max_length} caption tokens, denoising step 20")
    step = lambda: model(**inputs).sample  # noqa: E731
    exact = None
    for label, tier, options in ctx.sweep(_step_settings(model.softmax_layer_indices), "settings"):
        with patched(model, **options), accelpatch.denoising_step(20):
            timing, counts = timed_at_tier(model, tier, step, ctx.repeats, ctx.device)
        if exact is None:
            exact = timing
        ctx.add(setting=label, **_compare(exact, timing), **counts)
