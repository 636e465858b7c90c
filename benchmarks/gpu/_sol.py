"""Sections on Sol-Attn (block-sparse attention with rank-1 corrections).

* ``sol_attn_vs_flash``: the op alone, Triton kernel against SDPA flash attention (bf16), at the MiniMax-H3
  shape (38,016 packed rows, 56 heads × 128) and the SANA-Video 2.0 anchor shape (23,000 tokens, 10 heads × 256),
  over a tau sweep: exact fraction, time, speed-up, relative L2 error against dense, and the project's target
  (≥ 4× wherever ≥ 85 % of the blocks are skipped). Formerly a script of its own.
* ``minimax_h3_layers``: a MiniMax-H3 transformer with release-shaped layers (6 of them) over a release-sized
  packed sequence, dense against ``backend="sol_attn"`` (dense layers 0 and 1, as by default): step time, mean
  exact fraction, PSNR against dense; the issue's target is ≥ 1.3× at PSNR 31–33 dB (prior art 1.15–1.23×).
  Formerly a script of its own.

Inputs of the op vary smoothly along the sequence (random walk + sinusoids + noise), like video tokens, so the
exact fraction moves with tau. Random-weight PSNRs say nothing about quality on real weights; they show that the
sparse path ran and how far it moved.
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from _accel import build_on, patched, seeded_generator, timed_at_tier
from _runner import Context
from _timing import psnr, rel_l2, timed
from accelpatch.testing import minimax_h3_transformer_inputs, tiny_minimax_h3_transformer

#: B, T, H, D of the op comparison
OP_SHAPES = {"minimax_h3": (1, 38016, 56, 128), "sana_video2_anchor": (1, 23000, 10, 256)}
DRY_OP_SHAPES = {"minimax_h3": (1, 256, 2, 128), "sana_video2_anchor": (1, 192, 1, 256)}
OP_TAUS = (-1e9, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
DRY_OP_TAUS = (-1e9, 1.0)
SKIPPED_FOR_TARGET, SPEEDUP_TARGET = 0.85, 4.0

#: MiniMax-H3's released layer shape; the dry run keeps head dim 128 at a tiny width
H3_RELEASE_LAYER = dict(num_attention_heads=56, attention_head_dim=128, hidden_size=5376, ffn_dim=14336,
                        num_refiner_layers=2, in_channels=24, audio_in_channels=32, text_dim=5120, rope_freq_dim=16,
                        patch_size=(1, 2, 2), freq_dim=256, time_embed_hidden_dim=256, time_embed_dim=256)
H3_DRY_LAYER = dict(num_attention_heads=2, attention_head_dim=128, hidden_size=64, ffn_dim=128,
                    num_refiner_layers=1, in_channels=4, audio_in_channels=8, text_dim=8, rope_freq_dim=16,
                    patch_size=(1, 2, 2), freq_dim=256, time_embed_hidden_dim=256, time_embed_dim=64)
#: (layers, video rows, text rows, audio rows) of the packed sequence
H3_RELEASE_SEQUENCE = (6, 38000, 256, 2048)
H3_DRY_SEQUENCE = (3, 600, 6, 8)
H3_TAUS = (0.5, 1.0, 1.5)


def smooth_tokens(shape: tuple[int, ...], device: str, dtype: torch.dtype, generator: torch.Generator):
    """[B, T, H, D] tokens that vary smoothly along T: a normalised random walk, sinusoids and noise."""
    b, t, h, d = shape
    walk = torch.randn(b, t, h, d, generator=generator, device=device).cumsum(1)
    walk = (walk - walk.mean(1, keepdim=True)) / walk.std(1, keepdim=True)
    pos = torch.arange(t, dtype=torch.float32, device=device)[None, :, None, None] / t
    freq = torch.randint(1, 8, (1, 1, h, d), generator=generator, device=device).float()
    phase = torch.rand(1, 1, h, d, generator=generator, device=device) * 2 * math.pi
    noise = torch.randn(b, t, h, d, generator=generator, device=device)
    return (1.5 * walk + torch.sin(2 * math.pi * freq * pos + phase) + 0.5 * noise).to(dtype)


def _op_setup(ctx: Context):
    """(shapes, dtype, Sol-Attn impl): bf16 Triton on CUDA; on a dry run fp32 (the Triton interpreter cannot
    multiply bf16 tiles) through the interpreter when TRITON_INTERPRET=1, else the PyTorch implementation."""
    if not ctx.dry_run:
        return OP_SHAPES, torch.bfloat16, "triton"
    return DRY_OP_SHAPES, torch.float32, "triton" if os.environ.get("TRITON_INTERPRET") == "1" else "torch"


def _flash(q4, k4, v4, cuda: bool):
    """Dense attention on [B, H, T, D]: SDPA restricted to the flash kernel on CUDA, plain SDPA on CPU."""
    if not cuda:
        return lambda: F.scaled_dot_product_attention(q4, k4, v4)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q4, k4, v4)
    return run


def _target(skipped: float, speedup: float) -> str:
    if skipped < SKIPPED_FOR_TARGET:
        return "-"
    return "ok (>= 4x)" if speedup >= SPEEDUP_TARGET else "MISS (< 4x)"


def _tiles(q: torch.Tensor, impl: str) -> str:
    """The Triton kernel's tiles on this GPU (accelpatch/sol_attn/op/resources.py), or why it runs PyTorch."""
    if impl != "triton" or q.device.type != "cuda":
        return "-"
    from accelpatch.sol_attn.op import resources

    reason = resources.unfit_reason(q)
    if reason is not None:
        return f"PyTorch: {reason}"
    t = resources.choose_tiles(q.dtype, q.shape[-1], resources.device_arch(q.device))
    return f"BLOCK_N={t.block_n} stages={t.num_stages} GROUP={t.group} warps={t.num_warps}"


def _op_build(ctx: Context, shape, dtype):
    """q, k, v [B, T, H, D] of one op shape, drawn on the run's device."""
    generator = seeded_generator(ctx.device, 0)
    return tuple(smooth_tokens(shape, ctx.device, dtype, generator) for _ in range(3))


def sol_attn_vs_flash_builds(ctx: Context):
    shapes, dtype, _ = _op_setup(ctx)
    return [(f"q, k, v {name}", lambda shape=shape: _op_build(ctx, shape, dtype)) for name, shape in shapes.items()]


def _sweep_shape(ctx: Context, name: str, shape, dtype, impl: str) -> None:
    """Flash once, then Sol-Attn at every (tau, kv_splits) point of the sweep, on one input shape."""
    from accelpatch.sol_attn.op import sol_attn

    q, k, v = _op_build(ctx, shape, dtype)
    q4, k4, v4 = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    flash = timed(_flash(q4, k4, v4, ctx.device == "cuda"), ctx.repeats, ctx.device)
    reference = flash.result.transpose(1, 2)
    for tau in ctx.sweep(ctx.taus(DRY_OP_TAUS if ctx.dry_run else OP_TAUS), f"{name} taus"):
        for splits in ctx.options.kv_splits:
            out, stats = sol_attn(q, k, v, tau=tau, kv_splits=splits, impl=impl, return_stats=True)
            sol = timed(lambda: sol_attn(q, k, v, tau=tau, kv_splits=splits, impl=impl), ctx.repeats, ctx.device,
                        warmup=0)
            skipped = 1.0 - stats.exact_fraction
            speedup = flash.seconds / sol.seconds
            ctx.add(shape=name, tau=tau, kv_splits=splits, exact_fraction=stats.exact_fraction, skipped=skipped,
                    flash_ms=flash.ms, sol_ms=sol.ms, speedup=speedup, rel_l2=rel_l2(reference, out),
                    target=_target(skipped, speedup), tiles=_tiles(q, impl))


def sol_attn_vs_flash(ctx: Context) -> None:
    """The op alone against SDPA flash, per shape, over the tau sweep."""
    shapes, dtype, impl = _op_setup(ctx)
    ctx.describe(shapes={name: "B,T,H,D=" + ",".join(map(str, shape)) for name, shape in shapes.items()},
                 dtype=str(dtype).replace("torch.", ""), impl=impl, dense="SDPA flash" if ctx.device == "cuda"
                 else "SDPA (CPU)")
    for name, shape in shapes.items():
        _sweep_shape(ctx, name, shape, dtype, impl)


def _h3_target(speedup: float, psnr_db: float) -> str:
    if not 31.0 <= psnr_db <= 33.0:
        return "-"
    return "ok (>= 1.3x)" if speedup >= 1.3 else "MISS (< 1.3x)"


def _h3_setup(ctx: Context):
    layer, sequence = ((H3_DRY_LAYER, H3_DRY_SEQUENCE) if ctx.dry_run else (H3_RELEASE_LAYER, H3_RELEASE_SEQUENCE))
    return layer, sequence, torch.float32 if ctx.dry_run else torch.bfloat16


def _h3_build(ctx: Context):
    """(MiniMax-H3 with release-shaped layers, its packed inputs)."""
    layer, (layers, video, text, audio), dtype = _h3_setup(ctx)
    model = build_on(ctx.device, tiny_minimax_h3_transformer, dict(layer, num_layers=layers), dtype=dtype)
    return model, minimax_h3_transformer_inputs(model, num_video=video, num_text=text, num_audio=audio)


def minimax_h3_layers_builds(ctx: Context):
    return [("MiniMax-H3 layers", lambda: _h3_build(ctx))]


def minimax_h3_layers(ctx: Context) -> None:
    """Release-shaped MiniMax-H3 layers over a release-sized packed sequence: dense, then sol_attn per tau."""
    layer, (layers, video, text, audio), dtype = _h3_setup(ctx)
    model, inputs = _h3_build(ctx)
    ctx.describe(model=f"MiniMax-H3, {layers} layers of {layer['num_attention_heads']} heads × 128 (hidden "
                       f"{layer['hidden_size']}, FFN {layer['ffn_dim']}), {str(dtype).replace('torch.', '')} "
                       "random weights",
                 shape=f"{inputs['token_tags'].shape[0]} packed rows ({text} text, {audio} audio, {video} video)")
    step = lambda: model(**inputs).sample  # noqa: E731
    dense = timed(step, ctx.repeats, ctx.device)
    ctx.add(setting="dense", ms=dense.ms)
    for tau in ctx.sweep(ctx.taus(H3_TAUS), "taus"):
        with patched(model, backend="sol_attn", tau=tau, dense_steps=0, min_tokens=0):
            timing, counts = timed_at_tier(model, "high", step, ctx.repeats, ctx.device)
        speedup, psnr_db = dense.seconds / timing.seconds, psnr(dense.result, timing.result)
        ctx.add(setting=f"sol_attn tau={tau:g}", ms=timing.ms, speedup=speedup, psnr_db=psnr_db,
                rel_l2=rel_l2(dense.result, timing.result), **counts, target=_h3_target(speedup, psnr_db))
