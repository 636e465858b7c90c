"""Few-step calls on CPU (#42): what the ``high`` tier does at 4, 8 and 50 steps, per family, with the defaults.

For each family's tiny pipeline (random weights, fp32, one thread) and each step count, side by side in one run:
``exact`` (the reference), ``backend="sol_attn"`` at its defaults (the first 20 % of the call's steps dense) and the
step cache ``cache="first_block"`` at its defaults (threshold 0.05, warm-up 2, final 1). Per setting: the share of
Sol-Attn calls that ran the sparse op (fast calls, and calls whose blocks were all exact, over every Sol-Attn call),
the share of transformer calls that reused the step cache, the worst frame's SSIM and PSNR against ``exact`` of the
same seed, and the call-time ratio against ``exact`` (median of interleaved rounds; noise on tiny models).

Two toy settings differ from the defaults and are printed: ``min_tokens=0`` (the default floor, 12,288 tokens, is
above every toy sequence: it would keep them dense) and ``dense_layers=""`` (the default layers 0 and 1 are every
layer of a 2-layer toy). MiniMax-H3's scheduler counts the final sigma 0 as a step, so its n steps run n-1
transformer calls: the rows ask for n+1 so that every family runs n denoising calls. Guidance stays at each tiny
pipeline's default. Random weights make the quality columns an illustration of the policy, not a calibration.

    OMP_NUM_THREADS=1 python benchmarks/bench_few_step.py                 # six families, 4/8/50 steps, ~10 min
    python benchmarks/bench_few_step.py --families wan ltx2 --steps 4 8 --rounds 3 --json few_step.json
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: tiny models are fastest and least noisy on one thread

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import accelpatch  # noqa: E402
from accelpatch.eval.candidates import frames_of  # noqa: E402
from accelpatch.eval.metrics import compare_videos  # noqa: E402
from accelpatch.eval.pipelines import load_pipeline  # noqa: E402
from accelpatch.recipes import load_recipe  # noqa: E402
from accelpatch.sol_attn.config import sol_attn_runs  # noqa: E402

FAMILIES = ("sana-video", "sana-video2", "minimax-h3", "wan", "hunyuan-video15", "ltx2")
#: families whose transformer takes backend="sol_attn" (SANA-Video's linear attention has no softmax to sparsify)
SOL_FAMILIES = {"sana-video2", "minimax-h3", "wan", "hunyuan-video15", "ltx2"}
#: the toy settings (see the module docstring)
SOL_TOY = {"min_tokens": 0, "dense_layers": ""}
#: families whose scheduler counts the final sigma 0 as a step (n steps run n-1 transformer calls)
EXTRA_STEP = {"minimax-h3": 1}


def settings(family: str) -> dict[str, dict]:
    """The settings compared against exact: name -> apply() arguments."""
    found = {"cache": {"cache": "first_block"}}
    if family in SOL_FAMILIES:
        found = {"sol_attn": {"backend": "sol_attn", **SOL_TOY}, **found}
    return found


def sol_share(report) -> float | None:
    """Sparse Sol-Attn calls over every Sol-Attn call (None: no Sol-Attn site)."""
    sites = [s for s in report.sites if s.kind.endswith("sol_attn")]
    total = sum(s.fast_calls + sum(s.reference_calls.values()) + sum(s.fallback_calls.values()) for s in sites)
    ran = sum(sol_attn_runs(s) for s in sites)
    return ran / total if total else None


def cache_share(report) -> float | None:
    """Transformer calls that reused the step cache over every call the cache saw (None: no cache)."""
    seen = [m.cache for m in report.models if m.cache]
    computed, reused = sum(c["computed"] for c in seen), sum(c["reused"] for c in seen)
    return reused / (computed + reused) if computed + reused else None


def timed_call(pipe, kwargs: dict, seed: int):
    generator = torch.Generator("cpu").manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
        result = pipe(**kwargs, generator=generator)
    return frames_of(result), time.perf_counter() - start


def bench_family(family: str, steps: int, rounds: int, seed: int) -> list[dict]:
    recipe = load_recipe({"name": f"few-step-{family}", "model": f"tiny:{family}", "dtype": "fp32", "device": "cpu"})
    loaded = load_pipeline(recipe)
    pipe = loaded.pipe
    kwargs = {**loaded.call_kwargs, "num_inference_steps": steps + EXTRA_STEP.get(family, 0)}
    reference, _ = timed_call(pipe, kwargs, seed)
    rows = []
    for name, options in settings(family).items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CUDA is unavailable" for CUDA-only sites: the report counts them
            accelpatch.apply(pipe, tier="high", **options)
        frames, _ = timed_call(pipe, kwargs, seed)
        report = accelpatch.report(pipe)
        quality = compare_videos(reference, frames)
        times = {"exact": [], name: []}
        for r in range(rounds):  # interleaved, the order alternating (0 rounds: no time column)
            for label in (("exact", name) if r % 2 == 0 else (name, "exact")):
                with accelpatch.quality("exact" if label == "exact" else "high"):
                    times[label].append(timed_call(pipe, kwargs, seed)[1])
        accelpatch.remove(pipe)
        rows.append({"family": family, "steps": steps, "setting": name, "options": options,
                     "sparse_share": sol_share(report), "cache_reuse_share": cache_share(report),
                     "worst_ssim": min(quality.ssim), "worst_psnr_db": min(quality.psnr),
                     "time_ratio": statistics.median(c / e for c, e in zip(times[name], times["exact"]))
                     if rounds else None})
    return rows


def _share(value) -> str:
    return "—" if value is None else f"{100 * value:.0f} %"


def _ratio(value) -> str:
    return "not timed" if value is None else f"{value:.2f}×"


def table(rows: list[dict]) -> str:
    lines = ["| family | steps | setting | Sol-Attn calls sparse | step-cache reuse | worst SSIM | worst PSNR dB "
             "| time / exact |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        psnr = "∞" if r["worst_psnr_db"] == float("inf") else f"{r['worst_psnr_db']:.1f}"
        lines.append(f"| {r['family']} | {r['steps']} | {r['setting']} | {_share(r['sparse_share'])} | "
                     f"{_share(r['cache_reuse_share'])} | {r['worst_ssim']:.4f} | {psnr} | {_ratio(r['time_ratio'])} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--steps", type=int, nargs="+", default=[4, 8, 50], help="denoising steps per call")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved timed rounds per setting (median; 0: no timing, the shares and quality only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    if args.rounds < 0:
        parser.error(f"--rounds {args.rounds}: must be 0 (no timing) or more")
    torch.set_num_threads(1)
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, one thread, fp32, "
          f"toy settings for sol_attn: {SOL_TOY}")
    rows = []
    for family, steps in tqdm([(f, s) for f in args.families for s in args.steps], desc="family x steps"):
        rows.extend(bench_family(family, steps, args.rounds, args.seed))
    print(table(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return rows


if __name__ == "__main__":
    main()
