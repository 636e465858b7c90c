"""Step cache (``cache="first_block"``, tier ``high``) on CPU: what a threshold buys, and what it costs.

Per model (a SANA-Video and a MiniMax-H3 pipeline with 6 random-weight transformer blocks each, sized so a call
takes about a second), a threshold sweep at the default guards (warm-up 2, max 2 reuses in a row, final 1) plus a
guard variant: the fraction of transformer calls that reused the cache (``accelpatch.report``), the end-to-end
call time against ``exact`` (interleaved rounds, median of per-round ratios, ``compare_timings`` says when it is
noise) and per-frame SSIM/PSNR (min/mean) against the ``exact`` frames of the same seed. The cache must beat the
obvious alternative: for each point, ``exact`` with fewer steps at equal block compute, round(F * f) transformer
forwards where F is the full run's and f = (computed + reused / blocks) / calls (a reuse still runs the first
block; the rest of a forward, embeddings and MiniMax-H3's token refiner, is not counted). A point "beats" that
baseline when its worst frame is better on both PSNR and SSIM. The recommended threshold per model is the largest
one that passes the high gate (every frame SSIM >= 0.92, PSNR >= 24 dB) AND beats its baseline.

Random tiny weights make the quality numbers an illustration of the method, not a calibration: a trained model's
first-block residual moves differently from step to step, so re-measure thresholds on real weights.

    python benchmarks/bench_step_cache.py                       # both models, ~3 min on one CPU thread
    python benchmarks/bench_step_cache.py --quick               # smaller models, fewer points: < 60 s
    python benchmarks/bench_step_cache.py --model sana-video --steps 30 --thresholds 0,0.1,1e9 --rounds 8 \\
        --json step_cache.json --plot step_cache.png
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: tiny models are fastest and least noisy on one thread

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import torch  # noqa: E402

import accelpatch  # noqa: E402
from accelpatch import testing  # noqa: E402
from accelpatch.recipes import Gates  # noqa: E402
from accelpatch.eval._report_text import format_table  # noqa: E402
from accelpatch.eval.candidates import CallTimer, frames_of  # noqa: E402
from accelpatch.eval.metrics import compare_videos  # noqa: E402
from accelpatch.eval.stats import compare_timings  # noqa: E402

SCHEMA = "accelpatch.bench_step_cache"
VERSION = 1
#: thresholds of the default sweep; 1e9 reuses whenever the guards allow it (the guards' own bound)
DEFAULT_THRESHOLDS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.4, 1e9)
QUICK_THRESHOLDS = (0.0, 0.1, 1e9)
DEFAULT_GUARDS = {"warmup_steps": 2, "max_reuse": 2, "final_steps": 1}
#: guard variants (name -> guards that differ from the default) and the thresholds each is run at
DEFAULT_VARIANTS = {"max_reuse=4": {"max_reuse": 4}}
DEFAULT_VARIANT_THRESHOLDS = (0.1, 1e9)
#: bit-identical frames (PSNR +inf) are drawn at this or 10 dB above the best finite PSNR, whichever is higher
PSNR_CEILING = 60.0


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSpec:
    """One model of the benchmark: how its pipeline is built and called, and its sizes (full and ``--quick``)."""

    name: str
    title: str
    config: dict
    quick_config: dict
    default_steps: int
    quick_steps: int
    call_size: dict
    #: transformer forwards of a call with ``steps`` denoising steps, and the inverse
    forwards: Callable[[int], int]
    steps_for: Callable[[int], int]
    note: str

    def build(self, quick: bool, layers: Optional[int], seed: int):
        config = dict(self.quick_config if quick else self.config)
        if layers is not None:
            config["num_layers"] = layers
        if self.name == "sana-video":
            return testing.tiny_sana_video_pipeline(transformer_config=config, seed=seed)
        transformer = testing.tiny_minimax_h3_transformer(config, seed=seed)
        return testing.tiny_minimax_h3_pipeline(transformer=transformer, seed=seed)

    def call_kwargs(self, pipe, steps: int, seed: int) -> dict:
        if self.name == "sana-video":
            return testing.sana_video_pipeline_call_kwargs(num_inference_steps=steps, seed=seed, **self.call_size)
        return {**testing.minimax_h3_pipeline_call_kwargs(num_inference_steps=steps, pipeline=pipe, seed=seed,
                                                          **self.call_size), "output": "videos"}


MODELS: dict[str, ModelSpec] = {
    "sana-video": ModelSpec(
        name="sana-video", title="SANA-Video",
        config={**testing.SANA_VIDEO_MEDIUM_CONFIG, "num_layers": 6},
        quick_config={**testing.SANA_VIDEO_MEDIUM_CONFIG, "num_layers": 4},
        default_steps=20, quick_steps=8, call_size={"height": 32, "width": 32, "frames": 9},
        forwards=lambda steps: steps, steps_for=lambda forwards: forwards,
        note="CFG batched (batch 2): one transformer forward per step; DPM-Solver++ scheduler"),
    "minimax-h3": ModelSpec(
        name="minimax-h3", title="MiniMax-H3",
        config={**testing.MINIMAX_H3_MEDIUM_CONFIG, "num_layers": 6, "num_attention_heads": 2},
        quick_config={**testing.MINIMAX_H3_MEDIUM_CONFIG, "num_layers": 4, "num_attention_heads": 2},
        default_steps=12, quick_steps=7, call_size={"height": 64, "width": 64, "num_frames": 124},
        forwards=lambda steps: steps - 1, steps_for=lambda forwards: forwards + 1,
        note="guidance-distilled t2va: num_inference_steps=N runs N-1 forwards; the token refiner always runs"),
}


# ----------------------------------------------------------------------------------------------------------------
# Points
# ----------------------------------------------------------------------------------------------------------------

def _finite(value: float) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


def threshold_text(threshold: float) -> str:
    return "always" if threshold >= 1e8 else f"{threshold:g}"


@dataclass
class Point:
    """One configuration of the pipeline: ``exact`` at some step count (no cache), or a cache setting."""

    label: str
    kind: str  # "exact" (the N-step reference), "fewer_steps" (exact, fewer steps), "cache"
    steps: int
    forwards: int
    threshold: Optional[float] = None
    guards: Optional[dict] = None
    variant: str = "default"
    frames: Optional[torch.Tensor] = field(default=None, repr=False)
    seconds: list[float] = field(default_factory=list)  # end-to-end, one per timed round
    transformer_seconds: list[float] = field(default_factory=list)
    reproducible: bool = True
    computed: int = 0
    reused: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    quality: Any = None
    baseline: Optional["Point"] = None

    @property
    def calls(self) -> int:
        return self.computed + self.reused

    @property
    def reuse_fraction(self) -> float:
        return self.reused / self.calls if self.calls else 0.0

    def compute_fraction(self, blocks: int, full_forwards: int) -> float:
        """Transformer-block passes over those of the full N-step ``exact`` run."""
        if self.kind != "cache":
            return self.forwards / full_forwards
        return (self.computed + self.reused / blocks) / self.calls if self.calls else 1.0

    def min_ssim(self) -> float:
        return self.quality.min_ssim

    def min_psnr(self) -> float:
        return self.quality.min_psnr

    def passes(self, gates: Gates) -> bool:
        return self.min_ssim() >= gates.ssim_floor and self.min_psnr() >= gates.psnr_floor

    def beats(self) -> Optional[dict]:
        """Against its fewer-steps baseline: better worst frame on PSNR, on SSIM, and both (None: no baseline)."""
        if self.baseline is None:
            return None
        b = self.baseline
        if b.kind == "exact":  # the cache saves less than one forward: the baseline is exact itself
            return {"psnr": False, "ssim": False, "both": False, "note": "saves less than one step: baseline is exact"}
        psnr = self.min_psnr() > b.min_psnr()
        ssim = self.min_ssim() > b.min_ssim()
        return {"psnr": psnr, "ssim": ssim, "both": psnr and ssim, "note": ""}


def apply_point(pipe, point: Point) -> None:
    """Put the pipeline in ``point``'s patch state: unpatched for exact runs, else the cache at tier high."""
    if point.kind != "cache":
        accelpatch.remove(pipe)
        return
    guards = point.guards
    accelpatch.apply(pipe, tier="high", cache="first_block", cache_threshold=point.threshold,
                     cache_warmup_steps=guards["warmup_steps"], cache_max_reuse=guards["max_reuse"],
                     cache_final_steps=guards["final_steps"])


def run_point(spec: ModelSpec, pipe, point: Point, seed: int, timer: CallTimer) -> tuple[torch.Tensor, float, float]:
    """One seeded call in ``point``'s state: (frames, end-to-end seconds, transformer seconds); cache counts added."""
    apply_point(pipe, point)
    kwargs = spec.call_kwargs(pipe, point.steps, seed)
    timer.reset()
    with timer, accelpatch.quality("high" if point.kind == "cache" else "exact"):
        start = time.perf_counter()
        output = pipe(**kwargs)
        seconds = time.perf_counter() - start
    if timer.forwards != point.forwards:
        raise RuntimeError(f"{point.label}: expected {point.forwards} transformer forwards, saw {timer.forwards}")
    if point.kind == "cache":
        cache = accelpatch.report(pipe, reset=True).models[0].cache
        point.computed += cache["computed"]
        point.reused += cache["reused"]
        for reason, n in cache["reasons"].items():
            point.reasons[reason] = point.reasons.get(reason, 0) + n
    return frames_of(output), seconds, timer.transformer_seconds()


# ----------------------------------------------------------------------------------------------------------------
# One model
# ----------------------------------------------------------------------------------------------------------------

def _parse_guards(text: str) -> dict:
    """``"max_reuse=4,warmup_steps=3"`` -> guards over the defaults (also ``warmup``/``final`` short names)."""
    aliases = {"warmup": "warmup_steps", "final": "final_steps", "max": "max_reuse"}
    guards = dict(DEFAULT_GUARDS)
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        key = aliases.get(key.strip(), key.strip())
        if key not in DEFAULT_GUARDS or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"bad guard {part!r}: give {', '.join(DEFAULT_GUARDS)} as key=integer")
        guards[key] = int(value)
    return guards


def bench_model(spec: ModelSpec, args, log) -> dict:
    gates = Gates()
    steps = args.steps or (spec.quick_steps if args.quick else spec.default_steps)
    full_forwards = spec.forwards(steps)
    if full_forwards < 2:
        raise SystemExit(f"{spec.title}: {steps} steps is {full_forwards} forward(s); the cache needs more")
    build_start = time.perf_counter()
    pipe = spec.build(args.quick, args.layers, args.seed)
    blocks = len(pipe.transformer.transformer_blocks)
    timer = CallTimer([pipe.transformer], torch.device("cpu"))
    log(f"{spec.title}: built in {time.perf_counter() - build_start:.1f} s ({blocks} blocks, {steps} steps)")

    exact = Point(label=f"exact ({steps} steps)", kind="exact", steps=steps, forwards=full_forwards)
    cache_points = [Point(label=f"fbc t={threshold_text(t)}", kind="cache", steps=steps, forwards=full_forwards,
                          threshold=t, guards=dict(DEFAULT_GUARDS)) for t in args.thresholds]
    for name, guards in args.variants.items():
        cache_points += [Point(label=f"fbc t={threshold_text(t)} [{name}]", kind="cache", steps=steps,
                               forwards=full_forwards, threshold=t, guards=guards, variant=name)
                         for t in args.variant_thresholds]
    notes: set[str] = set()

    def first_call(point: Point) -> None:  # warm-up, the frames, and the cache counts of one call
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            point.frames, _, _ = run_point(spec, pipe, point, args.seed, timer)
        notes.update(str(w.message).split(". Calls")[0] for w in caught)

    phase = time.perf_counter()
    for point in [exact] + cache_points:
        first_call(point)
    # fewer-steps baselines at each cache point's block compute (deduplicated by step count)
    by_forwards: dict[int, Point] = {full_forwards: exact}
    for point in cache_points:
        # round half up: on a tie the baseline gets the extra forward (the conservative side for the cache)
        k = max(1, min(full_forwards, math.floor(full_forwards * point.compute_fraction(blocks, full_forwards) + 0.5)))
        if k not in by_forwards:
            by_forwards[k] = Point(label=f"exact {spec.steps_for(k)} steps", kind="fewer_steps",
                                   steps=spec.steps_for(k), forwards=k)
            first_call(by_forwards[k])
        point.baseline = by_forwards[k]
    baselines = sorted((p for p in by_forwards.values() if p.kind == "fewer_steps"), key=lambda p: p.forwards)
    points = [exact] + cache_points + baselines
    for point in points:
        point.quality = compare_videos(exact.frames, point.frames, ssim_floor=gates.ssim_floor,
                                       psnr_floor=gates.psnr_floor)
    log(f"{spec.title}: {len(points)} points, first calls and scores in {time.perf_counter() - phase:.1f} s; "
        f"{args.rounds} timed rounds next")

    phase = time.perf_counter()
    for r in range(args.rounds):
        start = r % len(points)
        for point in points[start:] + points[:start]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # already recorded in the first calls
                frames, seconds, transformer_seconds = run_point(spec, pipe, point, args.seed, timer)
            point.seconds.append(seconds)
            point.transformer_seconds.append(transformer_seconds)
            point.reproducible &= torch.equal(frames, point.frames)
    accelpatch.remove(pipe)
    log(f"{spec.title}: timed rounds in {time.perf_counter() - phase:.1f} s")
    return summarize_model(spec, pipe, steps, full_forwards, blocks, exact, cache_points, baselines, gates, args,
                           sorted(notes))


def _timing(point: Point, exact: Point) -> dict:
    """End-to-end and transformer time against exact: median per-round ratio, speed-up with interval, verdict."""
    out = {}
    for key, mine, ref in (("e2e", point.seconds, exact.seconds),
                           ("transformer", point.transformer_seconds, exact.transformer_seconds)):
        ratio = statistics.median(m / e for m, e in zip(mine, ref))
        comparison = compare_timings(ref, mine) if point is not exact else None
        out[key] = {"time_ratio": ratio, "median_seconds": statistics.median(mine), "seconds": mine,
                    "speedup": None if comparison is None else comparison.to_dict(),
                    "verdict": "reference" if comparison is None else comparison.brief()}
    return out


def _quality_dict(point: Point, gates: Gates, reference: torch.Tensor) -> dict:
    q = point.quality
    return {"min_ssim": q.min_ssim, "mean_ssim": q.mean_ssim, "min_psnr": _finite(q.min_psnr),
            "mean_psnr": _finite(q.mean_psnr), "identical": bool(torch.equal(point.frames, reference)),
            "passes_gate": point.passes(gates), "ssim": q.ssim, "psnr": [_finite(p) for p in q.psnr]}


def summarize_model(spec, pipe, steps, full_forwards, blocks, exact, cache_points, baselines, gates, args,
                    notes) -> dict:
    cfg = pipe.transformer.config
    rows = []
    for point in cache_points:
        b = point.baseline
        rows.append({
            "label": point.label, "threshold": point.threshold, "variant": point.variant, "guards": point.guards,
            "calls": point.calls, "computed": point.computed, "reused": point.reused,
            "reuse_fraction": point.reuse_fraction, "reasons": point.reasons,
            "compute_fraction": point.compute_fraction(blocks, full_forwards),
            "timing": _timing(point, exact), "quality": _quality_dict(point, gates, exact.frames),
            "reproducible": point.reproducible,
            "baseline": {"label": b.label, "steps": b.steps, "forwards": b.forwards,
                         "compute_fraction": b.compute_fraction(blocks, full_forwards)},
            "beats_baseline": point.beats(),
        })
    baseline_rows = [{"label": b.label, "steps": b.steps, "forwards": b.forwards,
                      "compute_fraction": b.compute_fraction(blocks, full_forwards), "timing": _timing(b, exact),
                      "quality": _quality_dict(b, gates, exact.frames), "reproducible": b.reproducible} for b in baselines]
    eligible = [r for r in rows if r["variant"] == "default" and r["reused"] > 0 and r["quality"]["passes_gate"]
                and r["beats_baseline"]["both"]]
    recommended = None
    if eligible:
        best = max(eligible, key=lambda r: r["threshold"])
        recommended = {"threshold": best["threshold"], "guards": best["guards"], "label": best["label"],
                       "reuse_fraction": best["reuse_fraction"], "compute_fraction": best["compute_fraction"],
                       "time_ratio": best["timing"]["e2e"]["time_ratio"],
                       "min_ssim": best["quality"]["min_ssim"], "min_psnr": best["quality"]["min_psnr"]}
    # the smallest default-guard threshold that reuses as much as the largest one: above it the guards alone decide
    default_rows = sorted((r for r in rows if r["variant"] == "default"), key=lambda r: r["threshold"])
    guard_bound = next((r["threshold"] for r in default_rows if r["reused"] > 0
                        and r["reuse_fraction"] == default_rows[-1]["reuse_fraction"]), None)
    if default_rows and guard_bound == default_rows[-1]["threshold"]:
        guard_bound = None  # only the largest threshold reaches its own reuse: no plateau
    variant_ok = [r["label"] for r in rows if r["variant"] != "default" and r["reused"] > 0
                  and r["quality"]["passes_gate"] and r["beats_baseline"]["both"]]
    config = {k: cfg[k] for k in ("num_layers", "num_attention_heads", "attention_head_dim") if k in cfg}
    return {
        "model": spec.name, "title": spec.title, "note": spec.note, "transformer": type(pipe.transformer).__name__,
        "config": config, "blocks": blocks, "call": dict(spec.call_size), "steps": steps, "forwards": full_forwards,
        "rounds": args.rounds, "seed": args.seed, "gates": {"ssim_floor": gates.ssim_floor,
                                                             "psnr_floor": gates.psnr_floor},
        "exact": {"label": exact.label, "steps": steps, "forwards": full_forwards, "timing": _timing(exact, exact),
                  "reproducible": exact.reproducible, "frames_shape": list(exact.frames.shape)},
        "points": rows, "baselines": baseline_rows, "recommended": recommended, "guard_bound_threshold": guard_bound,
        "variants_passing_and_beating": variant_ok, "warnings": notes,
    }


# ----------------------------------------------------------------------------------------------------------------
# Text, JSON, plot
# ----------------------------------------------------------------------------------------------------------------

def _psnr(value: Optional[float]) -> str:
    return "inf" if value is None else f"{value:.1f}"


def _time_cell(timing: dict) -> str:
    e2e = timing["e2e"]
    return f"{e2e['time_ratio']:.3f} {e2e['verdict']}"


def model_text(m: dict) -> str:
    cfg = m["config"]
    shape = "x".join(str(v) for v in m["exact"]["frames_shape"])
    exact_s = m["exact"]["timing"]["e2e"]["median_seconds"]
    lines = [f"== {m['title']}: {cfg.get('num_layers')} blocks ({cfg.get('num_attention_heads')} heads x "
             f"{cfg.get('attention_head_dim')}), {m['steps']} steps = {m['forwards']} transformer forwards, frames "
             f"{shape}; exact {exact_s:.3f} s/call (median, end to end); {m['rounds']} interleaved rounds, seed "
             f"{m['seed']}",
             f"   {m['note']}",
             "   time = median per-round ratio of end-to-end call time to exact (< 1 is faster) with the speed-up "
             "and its 95% interval, or 'noise'",
             "   compute = transformer-block passes / those of the full exact run; baseline = exact at round(F x "
             "compute) forwards"]
    header = ("point", "reuse", "compute", "time vs exact (e2e)", "SSIM min/mean", "PSNR min/mean", "gate",
              "baseline", "base SSIM/PSNR min", "base time", "beats?")
    table = [header]
    for r in m["points"]:
        q, b = r["quality"], r["beats_baseline"]
        base = next((x for x in m["baselines"] if x["label"] == r["baseline"]["label"]), None)
        if base is None:
            base_q, base_t, beats = "(= exact)", "1", "no (saves < 1 step)"
        else:
            base_q = f"{base['quality']['min_ssim']:.4f}/{_psnr(base['quality']['min_psnr'])}"
            base_t = f"{base['timing']['e2e']['time_ratio']:.3f}"
            beats = "YES" if b["both"] else ("PSNR only" if b["psnr"] else "SSIM only" if b["ssim"] else "no")
        table.append((r["label"], f"{r['reuse_fraction']:.2f}", f"{r['compute_fraction']:.3f}",
                      _time_cell(r["timing"]), f"{q['min_ssim']:.4f}/{q['mean_ssim']:.4f}",
                      f"{_psnr(q['min_psnr'])}/{_psnr(q['mean_psnr'])}", "PASS" if q["passes_gate"] else "fail",
                      r["baseline"]["label"], base_q, base_t, beats))
    lines += format_table(table)
    lines += ["", "   fewer-steps baselines (exact, no cache) against the full exact run:"]
    table = [("baseline", "forwards", "compute", "time vs exact (e2e)", "SSIM min/mean", "PSNR min/mean", "gate")]
    for b in m["baselines"]:
        q = b["quality"]
        table.append((b["label"], str(b["forwards"]), f"{b['compute_fraction']:.3f}", _time_cell(b["timing"]),
                      f"{q['min_ssim']:.4f}/{q['mean_ssim']:.4f}", f"{_psnr(q['min_psnr'])}/{_psnr(q['mean_psnr'])}",
                      "PASS" if q["passes_gate"] else "fail"))
    lines += format_table(table)
    odd = [r["label"] for r in m["points"] + m["baselines"] if not r["reproducible"]]
    if odd or not m["exact"]["reproducible"]:
        lines.append(f"   NOT reproducible across rounds (same seed, different frames): {odd or ['exact']}")
    reasons: dict[str, int] = {}
    for r in m["points"]:
        for reason, n in r["reasons"].items():
            reasons[reason] = reasons.get(reason, 0) + n
    lines.append("   why calls computed (all cache points, all calls): "
                 + ", ".join(f"{k} x{v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])))
    for note in m["warnings"]:
        lines.append(f"   warned (apply or first calls): {note}")
    rec = m["recommended"]
    if rec is None:
        lines.append("   recommended threshold: none (no default-guard point that reuses passes the gate and beats "
                     "its fewer-steps baseline)")
    else:
        g = rec["guards"]
        lines.append(f"   recommended threshold: {threshold_text(rec['threshold'])} (guards warmup_steps="
                     f"{g['warmup_steps']}, max_reuse={g['max_reuse']}, final_steps={g['final_steps']}): reuse "
                     f"{rec['reuse_fraction']:.2f}, compute {rec['compute_fraction']:.3f}, time x"
                     f"{rec['time_ratio']:.3f}, worst frame SSIM {rec['min_ssim']:.4f} / PSNR "
                     f"{_psnr(rec['min_psnr'])} dB")
    if m["guard_bound_threshold"] is not None:
        largest = max(r["threshold"] for r in m["points"] if r["variant"] == "default")
        lines.append(f"   from threshold {threshold_text(m['guard_bound_threshold'])} up the reuse no longer grows"
                     + (": the guards (warm-up, max reuses in a row, final step) alone bound it, so a larger "
                        "threshold changes nothing here" if largest >= 1e8 else
                        f" (it equals the reuse at the largest threshold swept, {threshold_text(largest)})"))
    if m["variants_passing_and_beating"]:
        lines.append(f"   guard variants that also pass and beat their baseline: "
                     f"{', '.join(m['variants_passing_and_beating'])}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["models"]
    figure, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 8), squeeze=False,
                                constrained_layout=True)
    for column, m in enumerate(models):
        psnr_axis, ssim_axis = axes[0][column], axes[1][column]
        gates = m["gates"]
        finite = [r["quality"]["min_psnr"] for r in m["points"] + m["baselines"] if r["quality"]["min_psnr"] is not None]
        ceiling = max([PSNR_CEILING] + [10.0 * math.ceil(v / 10.0) + 10.0 for v in finite])
        for axis, key, floor, label in ((psnr_axis, "min_psnr", gates["psnr_floor"], "worst-frame PSNR (dB)"),
                                        (ssim_axis, "min_ssim", gates["ssim_floor"], "worst-frame SSIM")):
            value = lambda q: ceiling if key == "min_psnr" and q[key] is None else q[key]  # noqa: E731
            groups: dict[str, list[dict]] = {}
            for r in m["points"]:
                groups.setdefault(r["variant"], []).append(r)
            for variant, rows in groups.items():
                rows = sorted(rows, key=lambda r: r["threshold"])  # the sweep's path
                xs = [r["timing"]["e2e"]["time_ratio"] for r in rows]
                ys = [value(r["quality"]) for r in rows]
                axis.plot(xs, ys, marker="o" if variant == "default" else "^", linestyle="-",
                          label=f"cache, guards {variant}")
                for x, y, r in zip(xs, ys, rows):
                    axis.annotate(threshold_text(r["threshold"]), (x, y), textcoords="offset points", xytext=(4, 4),
                                  fontsize=7)
            base = [{"timing": m["exact"]["timing"], "quality": {"min_psnr": None, "min_ssim": 1.0},
                     "label": f"{m['steps']} steps", "forwards": m["forwards"]}] + m["baselines"]
            base = sorted(base, key=lambda r: r["timing"]["e2e"]["time_ratio"])
            xs = [r["timing"]["e2e"]["time_ratio"] for r in base]
            ys = [value(r["quality"]) for r in base]
            axis.plot(xs, ys, marker="s", linestyle="--", color="gray", label="exact, fewer steps")
            for x, y, r in zip(xs, ys, base):
                axis.annotate(f"{r['forwards']}f", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7,
                              color="gray")
            axis.axhline(floor, color="red", linestyle=":", label="high gate")
            axis.set(xlabel="end-to-end time / exact (lower is faster)", ylabel=label)
            axis.grid(True, alpha=0.3)
            if key == "min_psnr":
                axis.axhline(ceiling, color="black", linewidth=0.5, alpha=0.5)
        psnr_axis.set_title(f"{m['title']} ({m['blocks']} blocks, {m['steps']} steps; random weights; bit-identical "
                            f"drawn at {ceiling:.0f} dB)", fontsize=9)
        psnr_axis.legend(fontsize=7)
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ----------------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------------

def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"thresholds must be numbers >= 0, got {text!r}")
    return values


def _models(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown model {unknown or text!r}; choose from {', '.join(MODELS)}")
    return names


def _variants(text: str) -> dict:
    """``"max_reuse=4;warmup_steps=4,max_reuse=1"`` -> {name: guards}; ``""`` or ``none``: no variants."""
    if text.strip().lower() in ("", "none"):
        return {}
    return {part.strip(): _parse_guards(part) for part in text.split(";") if part.strip()}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", type=_models, default=tuple(MODELS),
                        help=f"comma list of {', '.join(MODELS)} (default: both)")
    parser.add_argument("--steps", type=int, default=None,
                        help="num_inference_steps for every model (default: sana-video 20, minimax-h3 12 = 11 "
                             "forwards; --quick 8 and 7)")
    parser.add_argument("--layers", type=int, default=None, help="transformer blocks (default 6; --quick 4)")
    parser.add_argument("--thresholds", type=_floats, default=None,
                        help="cache_threshold sweep at the default guards (default "
                             f"{','.join(f'{t:g}' for t in DEFAULT_THRESHOLDS)}; 1e9 = always reuse within the guards)")
    parser.add_argument("--variants", type=_variants, default=None,
                        help="guard variants, ';'-separated, each 'key=value,...' over the default guards "
                             f"{DEFAULT_GUARDS} (default 'max_reuse=4'; 'none' for none)")
    parser.add_argument("--variant-thresholds", type=_floats, default=DEFAULT_VARIANT_THRESHOLDS,
                        help="thresholds each guard variant runs at (default 0.1,1e9)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved timing rounds (default 6, the fewest with a 95%% interval; --quick 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="4 blocks, fewer steps and thresholds, no variants, 2 rounds: < 60 s")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help="quality vs time ratio per model (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    if args.thresholds is None:
        args.thresholds = QUICK_THRESHOLDS if args.quick else DEFAULT_THRESHOLDS
    if args.variants is None:
        args.variants = {} if args.quick else {k: {**DEFAULT_GUARDS, **v} for k, v in DEFAULT_VARIANTS.items()}
    if args.rounds is None:
        args.rounds = 2 if args.quick else 6
    if args.rounds < 2:
        parser.error("--rounds must be >= 2")
    if args.layers is not None and args.layers < 2:
        parser.error("--layers must be >= 2 (a first block and at least one to skip)")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    log = (lambda message: None) if args.quiet else (
        lambda message: print(f"[{time.perf_counter() - start:6.1f} s] {message}", file=sys.stderr, flush=True))
    import diffusers

    models = [bench_model(MODELS[name], args, log) for name in args.model]
    result = {"kind": SCHEMA, "version": VERSION, "quick": args.quick, "torch": torch.__version__,
              "diffusers": diffusers.__version__, "host": platform.node(), "threads": torch.get_num_threads(),
              "thresholds": list(args.thresholds), "variant_thresholds": list(args.variant_thresholds),
              "default_guards": DEFAULT_GUARDS, "variants": args.variants, "models": models,
              "elapsed_seconds": time.perf_counter() - start}
    print(f"accelpatch step cache benchmark: {', '.join(m['title'] for m in models)} on CPU "
          f"({torch.get_num_threads()} thread), torch {torch.__version__}, diffusers {diffusers.__version__}; "
          f"high gate: every frame SSIM >= {Gates().ssim_floor} and PSNR >= {Gates().psnr_floor} dB against exact")
    for m in models:
        print()
        print(model_text(m))
    print()
    print("Random tiny weights: these qualities illustrate the method, they do not calibrate it (a trained model's "
          "first-block residual changes differently from step to step). Re-measure thresholds on real weights.")
    print(f"total {result['elapsed_seconds']:.1f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2, allow_nan=False)
            handle.write("\n")
    if args.plot:
        plot(result, args.plot)
    return result


if __name__ == "__main__":
    main()
