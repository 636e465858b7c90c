"""sol_attn's ``dense_rows`` on the tiny MiniMax-H3 ``t2va`` pipeline: audio and video quality against the exact
reference, and speed, with every query row sparse (``dense_rows="none"``) and with the text/audio rows dense
(``"text_audio"``, the default).

Quality, per seed, against the unpatched pipeline: audio through ``accelpatch.eval.audio_metrics.compare_audio``
(whole-clip SNR, worst per-track correlation, nMSE, the worst 1-second window, and the final second on its own, as
the prior art reported it) and video through ``compare_videos`` (worst-frame SSIM / PSNR); worst over seeds. The
routing is also read back from the kernel's own inputs (the exact-block fraction of the query blocks that hold
video rows only), so the table shows that the video rows really ran sparse. Speed: ``accelpatch.bench`` (transformer
seconds per denoising step, interleaved rounds, noise-aware ratios), dense (``exact``) as the baseline.

Defaults: 128x128 (592 video rows after 419 text/audio rows: 16 blocks of 64), 6 steps (5 transformer forwards),
the first step dense, no dense layers (the tiny model has 2), tau 1; 3 seeds, 9 timing rounds: one to two minutes
on one CPU thread.

    python benchmarks/bench_sol_attn_dense_rows.py [--seeds 0 1 2] [--size 128] [--steps 6] [--tau 1.0]
"""
from __future__ import annotations

import argparse
import contextlib
import warnings

import torch

import accelpatch
import accelpatch.sol_attn.op as ops
from accelpatch.sol_attn.op.options import BLOCK
from accelpatch.sol_attn.op.torch_impl import route
from accelpatch.testing import minimax_h3_layout, minimax_h3_pipeline_call_kwargs, tiny_minimax_h3_pipeline
from accelpatch.eval.audio_metrics import compare_audio
from accelpatch.eval.bench import bench
from accelpatch.eval.metrics import compare_videos
from accelpatch.eval.stats import compare_timings

VARIANTS = ("none", "text_audio")


@contextlib.contextmanager
def video_row_routing(prefix_rows: int, fractions: list):
    """Wrap the op the site calls: for each call, the exact fraction of the (query block, key block) pairs whose
    query block holds video rows only (rows >= ``prefix_rows``), from the routing of the same q, k, v."""
    original = ops.sol_attn

    def wrapped(q, k, v, **kwargs):
        exact = route(q, k, v, q.shape[-1] ** -0.5, kwargs["tau"], kwargs["thresh_type"], kwargs["sink_tokens"],
                      kwargs["sink_start"])[0]
        first = -(-prefix_rows // BLOCK)  # the first query block with no text/audio row
        fractions.append(float(exact[:, :, first:].float().mean()))
        return original(q, k, v, **kwargs)

    ops.sol_attn = wrapped
    try:
        yield
    finally:
        ops.sol_attn = original


def generate(pipe, kwargs, seed, layouts=None):
    """(videos, audio) of one seeded call; ``layouts`` collects each transformer call's packed layout."""
    hook = None
    if layouts is not None:
        hook = pipe.transformer.register_forward_pre_hook(
            lambda m, a, kw: layouts.append(minimax_h3_layout(kw)), with_kwargs=True)
    try:
        state = pipe(**{**kwargs, "generator": torch.Generator().manual_seed(seed)})
    finally:
        if hook is not None:
            hook.remove()
    return state.get("videos"), state.get("audio")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--size", type=int, default=128, help="height = width in pixels (16 per latent row)")
    parser.add_argument("--steps", type=int, default=6, help="num_inference_steps (N - 1 transformer forwards)")
    parser.add_argument("--tau", type=float, default=1.0)
    parser.add_argument("--dense-steps", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds (>= 6 for a 95%% interval)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")

    pipe = tiny_minimax_h3_pipeline()
    kwargs = minimax_h3_pipeline_call_kwargs(num_inference_steps=args.steps, height=args.size, width=args.size,
                                             pipeline=pipe)
    options = dict(tau=args.tau, dense_steps=args.dense_steps, dense_layers="", min_tokens=0)
    sample_rate = int(pipe.audio_vae.config.sampling_rate)

    scores = {v: [] for v in VARIANTS}
    routing = {v: [] for v in VARIANTS}
    stats = {v: {} for v in VARIANTS}
    layouts = []
    for seed in args.seeds:
        video_ref, audio_ref = generate(pipe, kwargs, seed, layouts)
        layout = layouts[0]
        if layout.prefix_rows is None or {lay for lay in layouts} != {layout}:
            raise SystemExit(f"expected one [text | audio | video] layout, got {set(layouts)}")
        prefix = layout.prefix_rows
        for variant in VARIANTS:
            accelpatch.apply(pipe, backend="sol_attn", dense_rows=variant, **options)
            with video_row_routing(prefix, routing[variant]):
                video, audio = generate(pipe, kwargs, seed)
            report = accelpatch.report(pipe)
            for s in report.sites:
                if s.kind == "sol_attn" and s.stats:
                    stats[variant].setdefault(s.path, []).append(dict(s.stats))
            accelpatch.remove(pipe)
            whole = compare_audio(audio_ref, audio, sample_rate)
            last = compare_audio(audio_ref[..., -sample_rate:], audio[..., -sample_rate:], sample_rate)
            frames = compare_videos(video_ref, video)
            scores[variant].append(dict(
                snr=whole.snr_db, corr=min(c for c in whole.corr if c is not None), nmse=whole.nmse,
                min_window_snr=whole.min_window_snr_db, max_window_nmse=whole.max_window_nmse,
                last_nmse=last.nmse, last_corr=min(c for c in last.corr if c is not None),
                ssim=min(frames.ssim), psnr=min(frames.psnr)))

    seq = layout.sequence_length
    print(f"tiny MiniMax-H3 t2va, {args.size}x{args.size}, {args.steps} steps ({args.steps - 1} forwards), "
          f"packed sequence {seq} rows ({prefix} text/audio, {seq - prefix} video), audio {sample_rate} Hz; "
          f"sol_attn {options}; seeds {args.seeds}; worst over seeds")
    worst = {"snr": min, "corr": min, "nmse": max, "min_window_snr": min, "max_window_nmse": max, "last_nmse": max,
             "last_corr": min, "ssim": min, "psnr": min}
    header = ("dense_rows", "audio SNR dB", "corr", "nMSE", "worst-1s SNR", "worst-1s nMSE", "final-1s nMSE",
              "final-1s corr", "video SSIM", "PSNR dB", "sparse rows", "video-row exact")
    print(" | ".join(header))
    for variant in VARIANTS:
        w = {k: f(s[k] for s in scores[variant]) for k, f in worst.items()}
        sparse_rows = sum(d["sparse_row_fraction"] for runs in stats[variant].values() for d in runs) / sum(
            len(runs) for runs in stats[variant].values())
        print(" | ".join([variant, f"{w['snr']:.2f}", f"{w['corr']:.5f}", f"{w['nmse']:.3e}",
                          f"{w['min_window_snr']:.2f}", f"{w['max_window_nmse']:.3e}", f"{w['last_nmse']:.3e}",
                          f"{w['last_corr']:.5f}", f"{w['ssim']:.5f}", f"{w['psnr']:.2f}", f"{sparse_rows:.3f}",
                          f"{sum(routing[variant]) / len(routing[variant]):.3f}"]))
    for seed_index, seed in enumerate(args.seeds):
        a, b = scores["none"][seed_index], scores["text_audio"][seed_index]
        print(f"seed {seed}: final-second nMSE {a['last_nmse']:.3e} -> {b['last_nmse']:.3e} "
              f"({100 * (1 - b['last_nmse'] / a['last_nmse']):.3f} % lower, {a['last_nmse'] / b['last_nmse']:.0f}x), "
              f"whole-clip corr {a['corr']:.5f} -> {b['corr']:.5f}")

    candidates = ["exact"] + [dict(name=f"sol_attn dense_rows={v}", tier="high", backend="sol_attn",
                                   options=dict(dense_rows=v, **options)) for v in VARIANTS]
    timing_kwargs = {k: v for k, v in kwargs.items() if k != "generator"}  # bench seeds each run itself
    timing = bench(pipe, timing_kwargs, candidates, rounds=args.rounds, warmup=1, progress=False,
                   description="tiny MiniMax-H3, dense vs sol_attn with and without dense text/audio rows")
    print(timing)
    sparse, with_rows = (timing.candidates[i].seconds_per_step for i in (1, 2))
    print(f"dense_rows=text_audio vs dense_rows=none (paired rounds): {compare_timings(sparse, with_rows).describe()}")


if __name__ == "__main__":
    main()
