"""Wan 2.x with ``backend="sol_attn"`` on CPU (one thread): attention time dense against sparse, side by side, and
worst-frame quality against ``tau`` and ``dense_steps`` on the tiny pipeline.

1. The tiny Sol config (2 heads x 128, 2 layers) at its longest cheap sequence (default 8 latent frames of 64 x 64:
   8,192 tokens; its RoPE tables allow 32 patches per axis): forward hooks time each ``attn1`` dense and with
   Sol-Attn (``dense_steps=0``, ``dense_layers=''``), interleaved; the ratio and the exact-block fraction per layer.
2. The tiny ``WanPipeline`` (13 frames of 256 x 256 = 1,024 tokens, CFG, ``--steps`` steps): worst-frame SSIM and
   PSNR against the dense pipeline for a grid of tau and dense_steps. Random weights: these numbers say whether the
   guards and tau move quality in the expected direction, not what a released Wan model gives.

    python benchmarks/bench_wan_sol_attn.py [--frames 8] [--size 64] [--repeats 2] [--steps 4] [--taus 0.5,1.0,2.0] [--dense-steps 0,2]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections import defaultdict

import torch
from tqdm import tqdm

import accelpatch
from accelpatch.testing import tiny_wan_pipeline, tiny_wan_transformer, wan_pipeline_call_kwargs, wan_transformer_inputs
from accelpatch.tools.metrics import psnr_per_frame, ssim_per_frame


def timed_attention(model, inputs):
    """Seconds spent in each ``blocks.N.attn1`` during one forward."""
    spent: dict[str, float] = defaultdict(float)
    starts: dict[str, float] = {}
    handles = []
    for name, module in model.named_modules():
        if name.endswith(".attn1"):
            handles.append(module.register_forward_pre_hook(
                lambda m, a, n=name: starts.__setitem__(n, time.perf_counter())))
            handles.append(module.register_forward_hook(
                lambda m, a, o, n=name: spent.__setitem__(n, spent[n] + time.perf_counter() - starts[n])))
    with torch.no_grad():
        model(**inputs)
    for h in handles:
        h.remove()
    return dict(spent)


def attention_times(frames: int, size: int, repeats: int, tau: float) -> None:
    model = tiny_wan_transformer()
    inputs = wan_transformer_inputs(model, num_frames=frames, height=size, width=size)
    tokens = frames * (size // 2) ** 2
    print(f"Wan tiny Sol config: {model.config.num_layers} layers, {model.config.num_attention_heads} heads x "
          f"{model.config.attention_head_dim}, {tokens} tokens, fp32, 1 thread, tau={tau}")
    runs: dict[str, list] = {"dense": [], "sol_attn": []}
    fractions: dict[str, float] = {}
    for r in tqdm(range(repeats), desc="attention timing"):
        for state in (("dense", "sol_attn") if r % 2 == 0 else ("sol_attn", "dense")):
            if state == "sol_attn":
                accelpatch.apply(model, backend="sol_attn", tau=tau, dense_steps=0, dense_layers="")
            else:
                accelpatch.remove(model)
            runs[state].append(timed_attention(model, inputs))
            if state == "sol_attn":
                fractions = {s.path: s.stats["exact_fraction"] for s in accelpatch.report(model).sites
                             if "exact_fraction" in s.stats}
    accelpatch.remove(model)
    print(f"{'site':<18}{'dense s':>10}{'sol s':>10}{'sol/dense':>11}{'exact frac':>12}")
    for name in runs["dense"][0]:
        d = statistics.median(run[name] for run in runs["dense"])
        s = statistics.median(run[name] for run in runs["sol_attn"])
        print(f"{name:<18}{d:>10.3f}{s:>10.3f}{s / d:>11.3f}{fractions.get(name, float('nan')):>12.3f}")


def quality_grid(steps: int, taus: list[float], dense_steps: list[int]) -> None:
    pipe = tiny_wan_pipeline()
    call = lambda: wan_pipeline_call_kwargs(num_inference_steps=steps)  # noqa: E731
    reference = pipe(**call()).frames
    print(f"\nWan tiny pipeline: {steps} steps, CFG 5, 13 x 256 x 256 frames (1,024 tokens), dense_layers='' "
          "(random weights)")
    print(f"{'tau':>6}{'dense_steps':>13}{'worst SSIM':>12}{'worst PSNR dB':>15}{'exact frac':>12}")
    grid = [(tau, n) for tau in taus for n in dense_steps]
    for tau, n in tqdm(grid, desc="quality grid"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            accelpatch.apply(pipe, backend="sol_attn", tau=tau, dense_steps=n, dense_layers="")
        out = pipe(**call()).frames
        sites = [s for s in accelpatch.report(pipe).sites if "exact_fraction" in s.stats]
        frac = statistics.mean(s.stats["exact_fraction"] for s in sites) if sites else float("nan")
        ssim = ssim_per_frame(reference, out).min().item()
        psnr = psnr_per_frame(reference, out).min().item()
        tqdm.write(f"{tau:>6.2f}{n:>13}{ssim:>12.4f}{psnr:>15.2f}{frac:>12.3f}")
    accelpatch.remove(pipe)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=8, help="latent frames for the timing (max 32)")
    parser.add_argument("--size", type=int, default=64, help="latent height = width for the timing (max 64)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tau", type=float, default=1.0, help="tau of the timing run")
    parser.add_argument("--steps", type=int, default=4, help="pipeline steps of the quality grid")
    parser.add_argument("--taus", default="0.5,1.0,2.0")
    parser.add_argument("--dense-steps", default="0,2")
    args = parser.parse_args()
    torch.set_num_threads(1)
    attention_times(args.frames, args.size, args.repeats, args.tau)
    quality_grid(args.steps, [float(t) for t in args.taus.split(",")], [int(n) for n in args.dense_steps.split(",")])


if __name__ == "__main__":
    main()
