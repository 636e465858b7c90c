"""Wan 2.x, HunyuanVideo 1.5 and LTX-2 with ``backend="sol_attn"`` on CPU (one thread): attention time dense
against sparse, side by side, and worst-frame quality (and LTX-2's audio) against ``tau`` and ``dense_steps`` on
the tiny pipelines.

1. The model's tiny Sol config at its longest cheap sequence (default 8 latent frames of 64 x 64 latents: 8,192
   video tokens for Wan's 2 x 2 patches, 32,768 for the patch-1 models unless ``--size`` is lowered; 32 x 32 gives
   them 8,192): forward hooks time each sparse-capable self-attention (Wan ``blocks.N.attn1``, HunyuanVideo 1.5
   ``transformer_blocks.N.attn``, LTX-2 ``transformer_blocks.N.attn1``) dense and with Sol-Attn
   (``dense_steps=0``, ``dense_layers=''``), interleaved; the ratio and the exact-block fraction per layer.
2. The model's tiny pipeline (``--steps`` steps, the pipeline's own CFG): worst-frame SSIM and PSNR against the
   dense pipeline for a grid of tau and dense_steps, plus LTX-2's audio (SNR, correlation: the worst 1-second
   window). Random weights: these numbers say whether the guards and tau move quality in the expected direction,
   not what a released model gives.

    python benchmarks/bench_video_sol_attn.py --model wan|hunyuan_video15|ltx2 [--frames 8] [--size 64]
        [--repeats 2] [--steps 4] [--taus 0.5,1.0,2.0] [--dense-steps 0,2] [--skip timing,quality]
"""
from __future__ import annotations

import argparse
import re
import statistics
import time
import warnings
from collections import defaultdict
from typing import Any, Callable, NamedTuple

import torch
from tqdm import tqdm

import accelpatch
from accelpatch import testing as t
from accelpatch.eval.metrics import psnr_per_frame, ssim_per_frame


class VideoModel(NamedTuple):
    transformer: Callable[[], torch.nn.Module]
    inputs: Callable[..., dict]  # (model, frames, size) -> forward kwargs
    self_attention: str  # regex of the sparse-capable module paths
    patch: int  # latent pixels per token along each spatial axis
    pipeline: str  # accelpatch.testing function names: the pipeline and its call kwargs
    call_kwargs: str


MODELS = {
    "wan": VideoModel(lambda: t.tiny_wan_transformer(),
                      lambda m, f, s: t.wan_transformer_inputs(m, num_frames=f, height=s, width=s),
                      r"blocks\.\d+\.attn1", 2, "tiny_wan_pipeline", "wan_pipeline_call_kwargs"),
    "hunyuan_video15": VideoModel(lambda: t.tiny_hunyuan_video15_transformer(),
                                  lambda m, f, s: t.hunyuan_video15_transformer_inputs(m, num_frames=f, height=s,
                                                                                       width=s),
                                  r"transformer_blocks\.\d+\.attn", 1, "tiny_hunyuan_video15_pipeline",
                                  "hunyuan_video15_pipeline_call_kwargs"),
    "ltx2": VideoModel(lambda: t.tiny_ltx2_transformer(),
                       lambda m, f, s: t.ltx2_transformer_inputs(m, num_frames=f, height=s, width=s),
                       r"transformer_blocks\.\d+\.attn1", 1, "tiny_ltx2_pipeline", "ltx2_pipeline_call_kwargs"),
}


def timed_attention(model, inputs, pattern: str) -> dict[str, float]:
    """Seconds spent in each module whose path matches ``pattern`` during one forward."""
    spent: dict[str, float] = defaultdict(float)
    starts: dict[str, float] = {}
    handles = []
    for name, module in model.named_modules():
        if re.fullmatch(pattern, name):
            handles.append(module.register_forward_pre_hook(
                lambda m, a, n=name: starts.__setitem__(n, time.perf_counter())))
            handles.append(module.register_forward_hook(
                lambda m, a, o, n=name: spent.__setitem__(n, spent[n] + time.perf_counter() - starts[n])))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for h in handles:
            h.remove()
    return dict(spent)


def attention_times(spec: VideoModel, name: str, frames: int, size: int, repeats: int, tau: float) -> None:
    model = spec.transformer()
    inputs = spec.inputs(model, frames, size)
    tokens = frames * (size // spec.patch) ** 2
    config = model.config
    print(f"{name} tiny Sol config: {config.num_layers} layers, {config.num_attention_heads} heads x "
          f"{config.attention_head_dim}, {tokens} video tokens, fp32, 1 thread, tau={tau}")
    runs: dict[str, list] = {"dense": [], "sol_attn": []}
    fractions: dict[str, float] = {}
    for r in tqdm(range(repeats), desc="attention timing"):
        for state in (("dense", "sol_attn") if r % 2 == 0 else ("sol_attn", "dense")):
            if state == "sol_attn":
                accelpatch.apply(model, backend="sol_attn", tau=tau, dense_steps=0, dense_layers="", min_tokens=0)
            else:
                accelpatch.remove(model)
            runs[state].append(timed_attention(model, inputs, spec.self_attention))
            if state == "sol_attn":
                fractions = {s.path: s.stats["exact_fraction"] for s in accelpatch.report(model).sites
                             if "exact_fraction" in s.stats}
    accelpatch.remove(model)
    print(f"{'site':<26}{'dense s':>10}{'sol s':>10}{'sol/dense':>11}{'exact frac':>12}")
    for site in runs["dense"][0]:
        d = statistics.median(run[site] for run in runs["dense"])
        s = statistics.median(run[site] for run in runs["sol_attn"])
        print(f"{site:<26}{d:>10.3f}{s:>10.3f}{s / d:>11.3f}{fractions.get(site, float('nan')):>12.3f}")


def _audio(output) -> Any:
    audio = getattr(output, "audio", None)
    return audio[0] if isinstance(audio, (list, tuple)) else audio


def quality_grid(spec: VideoModel, name: str, steps: int, taus: list[float], dense_steps: list[int]) -> None:
    build, call_kwargs = getattr(t, spec.pipeline, None), getattr(t, spec.call_kwargs, None)
    if build is None or call_kwargs is None:
        print(f"\n{name}: no tiny pipeline in accelpatch.testing ({spec.pipeline}): quality grid not run")
        return
    from accelpatch.eval.audio_metrics import compare_audio

    pipe = build()
    call = lambda: call_kwargs(num_inference_steps=steps)  # noqa: E731
    reference = pipe(**call())
    ref_audio = _audio(reference)
    rate = getattr(reference, "sampling_rate", None) or getattr(getattr(pipe, "vocoder", None), "config",
                                                                 {}).get("output_sampling_rate", None)
    print(f"\n{name} tiny pipeline: {steps} steps, frames {tuple(reference.frames.shape)}, dense_layers='' "
          "(random weights)")
    audio_head = f"{'audio SNR dB':>14}{'audio corr':>12}" if ref_audio is not None else ""
    print(f"{'tau':>6}{'dense_steps':>13}{'worst SSIM':>12}{'worst PSNR dB':>15}{'exact frac':>12}{audio_head}")
    for tau, n in tqdm([(tau, n) for tau in taus for n in dense_steps], desc="quality grid"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            accelpatch.apply(pipe, backend="sol_attn", tau=tau, dense_steps=n, dense_layers="", min_tokens=0)
        out = pipe(**call())
        sites = [s for s in accelpatch.report(pipe).sites if "exact_fraction" in s.stats]
        frac = statistics.mean(s.stats["exact_fraction"] for s in sites) if sites else float("nan")
        ssim = ssim_per_frame(reference.frames, out.frames).min().item()
        psnr = psnr_per_frame(reference.frames, out.frames).min().item()
        line = f"{tau:>6.2f}{n:>13}{ssim:>12.4f}{psnr:>15.2f}{frac:>12.3f}"
        if ref_audio is not None and rate:
            audio = compare_audio(ref_audio, _audio(out), int(rate))
            corr = audio.min_window_corr
            line += f"{audio.min_window_snr_db:>14.2f}{'n/a' if corr is None else f'{corr:.4f}':>12}"
        tqdm.write(line)
        accelpatch.remove(pipe)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="wan")
    parser.add_argument("--frames", type=int, default=8, help="latent frames for the timing")
    parser.add_argument("--size", type=int, default=64, help="latent height = width for the timing")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tau", type=float, default=1.0, help="tau of the timing run")
    parser.add_argument("--steps", type=int, default=4, help="pipeline steps of the quality grid")
    parser.add_argument("--taus", default="0.5,1.0,2.0")
    parser.add_argument("--dense-steps", default="0,2")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: timing, quality")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec, skip = MODELS[args.model], set(args.skip.split(","))
    if "timing" not in skip:
        attention_times(spec, args.model, args.frames, args.size, args.repeats, args.tau)
    if "quality" not in skip:
        quality_grid(spec, args.model, args.steps, [float(x) for x in args.taus.split(",")],
                     [int(n) for n in args.dense_steps.split(",")])


if __name__ == "__main__":
    main()
