"""``python -m accelpatch demo``: tiny random pipelines, unpatched next to patched, measured so that it tells the truth.

Six sections, one per family. By default two run: SANA-Video under every tier (its fast path needs CUDA, so on a
CPU its ``high`` row falls back, and the row says so and why), then MiniMax-H3 with ``backend="sol_attn"``
(block-sparse attention, the fast path that does run on a CPU). ``--model`` picks others (one name, a comma list,
or ``all``): SANA-Video 2.0 through the tiers, and Wan 2.x, HunyuanVideo 1.5 and LTX-2 with ``sol_attn`` like
MiniMax-H3 (tier high sparse, ``quality("lossless")`` bit-identical with the fused kernels, ``remove()``).

Everything is built offline with random weights under a fixed seed. Rows are timed in interleaved rounds (every row
once per round, each round starting one row later, so that drift of a shared machine hits all rows alike). The
"vs unpatched" column is :func:`accelpatch.eval.stats.compare_timings` of the per-round samples: a ratio appears
only when its 95% interval excludes 1; otherwise the row reads "noise (low–high×)". A row that asked for a fast
path that could not mount reads "fell back: <reason>" (the reason comes from ``accelpatch.report``).

Output streams: the header prints before the first section is built and each section as soon as it is done, closed
by how long it took (wall and CPU seconds), so a slow machine shows progress and the times in docs/cli.md can be
checked.

Importing this module is cheap (no torch, no diffusers): ``add_arguments`` declares the command line, so that
``--help`` answers at once; torch is imported by the functions that run.
"""
from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from accelpatch.eval.recipe_cli import at_least
from accelpatch.models.families import families

if TYPE_CHECKING:  # pragma: no cover
    from accelpatch.core.reporting import Report
    from accelpatch.eval.stats import TimingComparison

DTYPE_NAMES = ("auto", "bf16", "fp32")

#: Fewer paired rounds than this give no 95% interval for the median ratio (accelpatch.eval.stats.median_interval:
#: order statistics with binomial coverage need n >= 6); below it the demo shows no verdict rather than a false one.
#: The default rounds are 6 (MiniMax-H3) and 12 (SANA-Video).
MIN_ROUNDS = 6
#: PSNR/SSIM are scored on at most this many evenly spaced frames: SSIM (float64 convolutions) costs ~0.14 s per
#: 256x256 frame on one CPU thread, 17 s for all 124 frames of the MiniMax-H3 clip.
QUALITY_FRAMES = 16


@dataclass(frozen=True)
class DemoModel:
    """One section of the demo: its title, how its tiny pipeline is built and called (names in
    :mod:`accelpatch.testing`; ``transformer_config`` None is the builder's default), the family (``"sana"``: a
    diffusers pipeline run through every tier; ``"minimax-h3"``: the modular pipeline with the ``sol_attn``
    backend; ``"sol"``: a diffusers pipeline with the ``sol_attn`` backend), its defaults (denoising steps per call,
    interleaved timing rounds: cheap calls get more), ``outputs``: the attributes of a diffusers pipeline's output
    that must stay bit-identical (LTX-2's audio too), and ``call_size``: call arguments over the call-kwargs
    builder's defaults (None: the builder's size, 1,024 video tokens per forward for Wan, HunyuanVideo 1.5, LTX-2)."""

    title: str
    family: str
    pipeline: str
    call_kwargs: str
    transformer_config: Optional[str]
    default_steps: int
    default_rounds: int
    outputs: tuple[str, ...] = ("frames",)
    call_size: Optional[dict] = field(default=None, hash=False)


#: ``--model`` choices, one per registered family (accelpatch.models.families: each family's package says how its
#: section runs), in the order ``all`` runs them. The transformer configs keep the released head dims, so
#: head-dim-gated fast paths apply (Wan, HunyuanVideo 1.5, LTX-2: their builders' default Sol configs, head dim 128,
#: 1,024 video tokens per forward at the default call size).
MODELS: dict[str, DemoModel] = {
    family.cli: DemoModel(family.name, family.demo.kind, f"tiny_{family.key}_pipeline",
                          f"{family.key}_pipeline_call_kwargs", family.demo.transformer_config, family.demo.steps,
                          family.demo.rounds, family.demo.outputs)
    for family in families()}
#: What a plain ``python -m accelpatch demo`` runs: the SANA-Video tiers next to the MiniMax-H3 sol_attn path (one
#: family whose fast path needs CUDA, one whose fast path runs here); the other four are a ``--model`` away.
DEFAULT_MODELS = ("sana-video", "minimax-h3")
#: What ``--help`` says of the default and of the rest: times measured on a 2-core AVX2 EPYC, idle (docs/cli.md's;
#: each section prints its own, and a busy machine stretches them).
DEFAULT_HELP = ("sana-video ~8 s, the SANA-Video tiers, and minimax-h3 ~35 s, the MiniMax-H3 sol_attn path, which "
                "runs on CPU; ~45 s with start-up. The others run only when named: sana-video2 ~11 s, wan ~25 s, "
                "hunyuan-video15 ~6 s, ltx2 ~6 s; all ~1 min 40 s. Measured on a 2-core AVX2 EPYC, one thread; "
                "each section prints its own time")

#: The MiniMax-H3 section's transformer: MINIMAX_H3_MEDIUM_CONFIG (4 layers, head dim 128, hidden 128) with 2 heads,
#: which halves the cost of a forward and leaves room for a longer sequence.
H3_CONFIG_OVERRIDES: dict[str, Any] = {"num_attention_heads": 2}
#: 256x384, 124 frames (the shortest clip the pipeline takes): 3,552 video rows after 5 text and 414 audio rows. At
#: this length block sparsity pays on one CPU thread (Sol-Attn computes ~25% of the key blocks exactly); the sparse
#: attention's advantage grows with the sequence (about 1.4x per layer at 2.8k rows, 1.7x at 4k, 2.2x at 5.7k, one
#: thread). The section runs one denoising step per call (its default): ~0.9 s of transformer and ~1.4 s of VAE
#: decode per call on a 2-core AVX2 EPYC, 14 calls; at the former 2 steps it took 48 s idle, 2:44 under load.
H3_CALL_SIZE: dict[str, int] = {"height": 256, "width": 384, "num_frames": 124}
#: Options of ``apply(pipe, backend="sol_attn", ...)`` in the sol_attn sections; tau (1.0) and the thresholds stay
#: at their defaults. The default dense_steps=10 is meant for ~50-step runs: it would keep every step of a few-step
#: demo dense (0 fast calls). The default dense layers (0 and 1) are 2 of a released model's 30-60 layers but half
#: or all of these 2-4-layer toys, so the toys run every layer sparse, closer to the release's ~96% sparse layers.
SOL_OPTIONS: dict[str, Any] = {"dense_steps": 0, "dense_layers": ""}


def _sol_option_reasons(layers: int) -> str:
    """Why each of :data:`SOL_OPTIONS` differs from its default, for a section header."""
    return ("dense_steps=0: the default 10 would keep every step of a few-step run dense; dense_layers='': the "
            f"default 0,1 is 2 of a release's 30-60 layers but {'all' if layers <= 2 else 'half' if layers == 4 else 2}"
            f" of this {layers}-layer toy")


def parse_models(text: str) -> tuple[str, ...]:
    """argparse type for ``--model``: one name of :data:`MODELS`, a comma list of them (in the order given), or
    ``all`` (every section, in :data:`MODELS`' order)."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if "all" in names:
        names = tuple(dict.fromkeys([*(n for n in names if n != "all"), *MODELS]))
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"invalid choice: {', '.join(map(repr, unknown)) or repr(text)} "
                                         f"(choose from {', '.join(MODELS)}, all, or a comma list of them)")
    return names


def _torch_dtype(name: str, device: str):
    import torch  # noqa: PLC0415  (heavy: only when the demo runs)

    if name == "auto":  # a CPU without bf16 matrix units runs bf16 far slower than fp32; GPUs run bf16
        return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if name not in dtypes:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_NAMES)}")
    return dtypes[name]


# ----------------------------------------------------------------------------------------------------------------
# Timing and formatting
# ----------------------------------------------------------------------------------------------------------------

def format_timing(comparison: Optional["TimingComparison"], rounds: int) -> str:
    """The "vs unpatched" cell: a speed ratio with its 95% interval only when the interval excludes 1, otherwise
    "noise (low–high×)"; with fewer than :data:`MIN_ROUNDS` rounds no verdict at all. None: the baseline row."""
    if comparison is None:
        return "baseline"
    if rounds < MIN_ROUNDS:
        return f"no verdict ({rounds} < {MIN_ROUNDS} rounds)"
    return comparison.brief()


def fast_path_text(report: Optional["Report"]) -> str:
    """The "fast path" cell for one call's report (None: the unpatched pipeline): the approximate (high) sites' fast
    calls (with Sol-Attn's mean exact-block fraction), or why there were none: "fell back: <reason>" when a fast path
    the tier asked for could not run (the site's mount reason from the report), else the reason the reference path
    ran by design; then the lossless sites' bit-exact fused calls, counted apart so that they never pass for the
    high path (which at the default tier does not run)."""
    if report is None:
        return "- (original diffusers code)"
    high = [s for s in report.sites if s.tier != "lossless"]
    lossless = sum(s.fast_calls for s in report.sites if s.tier == "lossless")
    # with no lossless call either, every site's reason says why nothing ran (quality("exact") names both tiers)
    parts = [_high_text(high, report.sites if not lossless else high)] if high or not lossless else []
    if lossless:
        parts.append(f"{lossless} lossless fused calls")
    return "; ".join(parts)


def _high_text(sites, why) -> str:
    fractions = [s.stats["exact_fraction"] for s in sites if "exact_fraction" in s.stats]
    fast = sum(s.fast_calls for s in sites)
    if fast:
        text = f"{fast} fast calls"
        if fractions:
            text += f", mean exact-block fraction {sum(fractions) / len(fractions):.2f}"
        return text
    fell_back = [s for s in sites if s.fallback_calls]
    if fell_back:
        reasons = dict.fromkeys(s.reason if not s.mounted and s.reason else key
                                for s in fell_back for key in s.fallback_calls)
        return f"0, fell back: {'; '.join(reasons)}"
    reasons = dict.fromkeys(r for s in why for r in s.reference_calls)
    return f"0, by design: {'; '.join(reasons)}" if reasons else "0"


@dataclass
class Row:
    """One row of a section: its label, whether the pipeline is patched, the ``quality()`` tier around the call
    (None: the patched model's default tier), whether it is timed in every round (False: one call, in the first
    round, for its bit identity), and what the calls measured."""

    label: str
    patched: bool
    tier: Optional[str] = None
    timed: bool = True
    seconds: list[float] = field(default_factory=list)  # per call: transformer seconds per denoising step
    identical: bool = True  # every call's frames equal the never-patched reference
    frames: Any = None  # the last call's output: frames, or a tuple of frames and audio (see _video)
    report: Any = None  # accelpatch.report of the last call
    quality: Any = None  # VideoQuality of the last frames against the reference, once scored


def _timed(timer, run: Callable[[], Any]) -> tuple[Any, float]:
    """``run()`` under ``timer`` (:class:`accelpatch.eval.candidates.CallTimer`, hooks only around this call, so
    that ``apply``/``remove`` never see them): its output and the transformer's seconds per denoising step."""
    timer.reset()
    with timer:
        out = run()
    if timer.forwards == 0:
        raise RuntimeError("the pipeline call ran no transformer forward; nothing to time")
    return out, timer.transformer_seconds() / timer.steps


def _quiet_apply(pipe, **options) -> None:
    """``accelpatch.apply`` without its not-mounted warnings: the demo applies once per round, and its table says
    what did not mount, and why."""
    import accelpatch  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="accelpatch: ", category=RuntimeWarning)
        accelpatch.apply(pipe, **options)


@dataclass
class _Rounds:
    """What :func:`_run_rounds` saw besides the rows: unpatched calls made after a ``remove()`` and whether all of
    them were bit-identical to the reference, and ``accelpatch.report`` after a call at the default tier."""

    after_remove: int
    after_remove_identical: bool
    site_report: Optional[str]


def _run_rounds(pipe, rows: list[Row], call: Callable[[], Any], reference, *, rounds: int, apply_options: dict,
                bar) -> _Rounds:
    """Run every timed row once per round (untimed rows in the first round only), applying and removing
    accelpatch as the rows need. Each round starts one row later (a cyclic shift): every row takes every place in
    the round equally often, and no row runs twice in a row across a round boundary, where one burst of load from
    another process would slow two of its samples at once."""
    import accelpatch  # noqa: PLC0415

    from accelpatch.eval.candidates import CallTimer, device_of  # noqa: PLC0415

    timer = CallTimer([pipe.transformer], device_of(pipe, [pipe.transformer]))
    patched, removed = False, False
    seen = _Rounds(0, True, None)
    for index in range(rounds):
        order = [r for r in rows if r.timed or index == 0]
        shift = index % len(order)
        for row in order[shift:] + order[:shift]:
            bar.set_postfix_str(f"round {index + 1}/{rounds}: {row.label}")
            if row.patched and not patched:
                _quiet_apply(pipe, **apply_options)
            elif not row.patched and patched:
                accelpatch.remove(pipe)
                removed = True
            patched = row.patched
            with accelpatch.quality(row.tier) if row.tier else contextlib.nullcontext():
                frames, seconds = _timed(timer, call)
            row.seconds.append(seconds)
            row.identical &= _same(frames, reference)
            row.frames = frames
            if patched:
                row.report = accelpatch.report(pipe, reset=True)
                if row.tier is None:
                    seen.site_report = str(row.report)
            elif removed:
                seen.after_remove += 1
                seen.after_remove_identical &= _same(frames, reference)
            bar.update(1)
    if patched:
        accelpatch.remove(pipe)
    if not seen.after_remove:  # a single round never reaches an unpatched call after remove(): make one
        bar.set_postfix_str("after remove()")
        seen.after_remove, seen.after_remove_identical = 1, _same(call(), reference)
    return seen


def _same(output, reference) -> bool:
    """Bit identity of a call's output with the reference: ``torch.equal`` of the frames, and of every other output
    (LTX-2's audio) when the call returns a tuple."""
    import torch  # noqa: PLC0415

    if isinstance(reference, tuple):
        return len(output) == len(reference) and all(torch.equal(a, b) for a, b in zip(output, reference))
    return torch.equal(output, reference)


def _video(output):
    """The frames of a call's output (the first of a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def _calls(rows: list[Row], rounds: int) -> int:
    return sum(rounds if r.timed else 1 for r in rows)


def _frame_subset(video):
    """At most :data:`QUALITY_FRAMES` evenly spaced frames of a (B, F, C, H, W) video."""
    import torch  # noqa: PLC0415

    frames = video.shape[1]
    if frames <= QUALITY_FRAMES:
        return video
    index = torch.linspace(0, frames - 1, QUALITY_FRAMES).round().long().unique().to(video.device)
    return video.index_select(1, index)


def _quality(row: Row, reference):
    """compare_videos of the row's last frames against the reference, on the same evenly spaced frames of both
    (see :data:`QUALITY_FRAMES`); computed once per row."""
    from accelpatch.eval.metrics import compare_videos  # noqa: PLC0415

    if row.quality is None:
        row.quality = compare_videos(_frame_subset(_video(reference)), _frame_subset(_video(row.frames)))
    return row.quality


def _table(rows: list[Row], reference, rounds: int) -> list[str]:
    """The section's table: s/step (median of the calls), vs unpatched, bit identity, worst-frame PSNR/SSIM
    against the unpatched frames, and the fast-path cell."""
    from accelpatch.eval.stats import compare_timings  # noqa: PLC0415

    width = max(len(r.label) for r in rows) + 2
    lines = [f"{'run':<{width}}{'s/step':>8}  {'vs unpatched':<28}{'bit-identical':>13}{'PSNR':>10}{'SSIM':>8}  "
             "fast path (per call)"]
    for r in rows:
        if r is rows[0]:
            timing = format_timing(None, rounds)
        elif r.timed:
            timing = format_timing(compare_timings(rows[0].seconds, r.seconds), rounds)
        else:
            timing = "not timed (1 call)"
        if r.identical:
            psnr, ssim = "inf", 1.0
        else:
            quality = _quality(r, reference)
            psnr, ssim = f"{quality.min_psnr:.1f} dB", quality.min_ssim
        lines.append(f"{r.label:<{width}}{_median(r.seconds):>8.4f}  {timing:<28}"
                     f"{'yes' if r.identical else 'no':>13}{psnr:>10}{ssim:>8.4f}  "
                     f"{fast_path_text(r.report if r.patched else None)}")
    return lines


def _median(values: Sequence[float]) -> float:
    import statistics  # noqa: PLC0415

    return statistics.median(values)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _removal_line(calls: int, ok: bool) -> str:
    return (f"after accelpatch.remove(pipe): bit-identical to unpatched: {'yes' if ok else 'NO'} "
            f"({_plural(calls, 'call')} after remove())")


# ----------------------------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------------------------

def _sana_section(spec: DemoModel, *, steps: int, dtype, device: str, seed: int, rounds: int, progress: bool
                  ) -> list[str]:
    """A diffusers SANA pipeline unpatched and under every tier (default, exact, lossless, high)."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    import accelpatch.testing as testing  # noqa: PLC0415

    build_pipeline, call_kwargs = getattr(testing, spec.pipeline), getattr(testing, spec.call_kwargs)
    config = None if spec.transformer_config is None else getattr(testing, spec.transformer_config)
    rows = [Row("unpatched", False), Row("patched, default", True), Row("patched, exact", True, "exact"),
            Row("patched, lossless", True, "lossless"), Row("patched, high", True, "high")]
    bar = tqdm(total=2 + _calls(rows, rounds), desc=spec.title, disable=not progress, unit="call")
    bar.set_postfix_str("building the tiny pipeline")
    pipe = build_pipeline(dtype=dtype, seed=seed, device=device, transformer_config=config)
    bar.update(1)
    call = lambda: pipe(**call_kwargs(num_inference_steps=steps, seed=seed)).frames  # noqa: E731
    bar.set_postfix_str("warm-up (the reference frames)")
    reference = call()
    bar.update(1)
    seen = _run_rounds(pipe, rows, call, reference, rounds=rounds, apply_options={}, bar=bar)
    bar.close()
    lines = [f"== {spec.title}: tiny random pipeline, {steps} steps, CFG (batch 2), frames {tuple(reference.shape)}, "
             f"{_plural(rounds, 'interleaved round')}",
             "   accelpatch.apply(pipe), then each tier by `with accelpatch.quality(tier)`", ""]
    lines += _table(rows, reference, rounds)
    lines += ["", "accelpatch.report(pipe) after one call at the default tier:", seen.site_report or "-", "",
              _removal_line(seen.after_remove, seen.after_remove_identical)]
    return lines


def _build_h3(spec: DemoModel, *, steps: int, dtype, device: str, seed: int):
    """The MiniMax-H3 modular t2va pipeline at :data:`H3_CALL_SIZE` and a call returning its video."""
    import torch  # noqa: PLC0415

    import accelpatch.testing as testing  # noqa: PLC0415

    config = {**getattr(testing, spec.transformer_config), **H3_CONFIG_OVERRIDES}
    transformer = testing.tiny_minimax_h3_transformer(config, dtype=dtype, seed=seed, device=device)
    pipe = getattr(testing, spec.pipeline)(transformer=transformer, seed=seed)
    if torch.device(device).type != "cpu":
        pipe.to(device)

    def call():
        kwargs = getattr(testing, spec.call_kwargs)(num_inference_steps=steps + 1, pipeline=pipe, seed=seed,
                                                    **H3_CALL_SIZE)
        kwargs["prompt_embeds"] = kwargs["prompt_embeds"].to(device)
        return pipe(**kwargs, output="videos")

    return pipe, call


def _build_diffusers(spec: DemoModel, *, steps: int, dtype, device: str, seed: int):
    """A tiny diffusers pipeline (Wan, HunyuanVideo 1.5, LTX-2) at its call-kwargs builder's default size and a call
    returning its frames, or a tuple of :attr:`DemoModel.outputs` (LTX-2: frames and audio)."""
    import accelpatch.testing as testing  # noqa: PLC0415

    config = None if spec.transformer_config is None else getattr(testing, spec.transformer_config)
    pipe = getattr(testing, spec.pipeline)(dtype=dtype, seed=seed, device=device, transformer_config=config)
    call_kwargs = getattr(testing, spec.call_kwargs)

    def call():
        out = pipe(**call_kwargs(num_inference_steps=steps, seed=seed, **(spec.call_size or {})))
        values = tuple(getattr(out, name) for name in spec.outputs)
        return values if len(values) > 1 else values[0]

    return pipe, call


def _video_tokens(hidden_states, config) -> int:
    """Video tokens per forward from the transformer's ``hidden_states``: patchified (B, S, C) as LTX-2 takes them,
    or latents (B, C, F, H, W) cut into ``patch_size`` (Wan's (1, 2, 2); HunyuanVideo 1.5's ``patch_size_t`` x
    ``patch_size``²)."""
    if hidden_states.ndim == 3:
        return int(hidden_states.shape[1])
    patch = config.patch_size
    if isinstance(patch, (tuple, list)):
        pt, ph, pw = patch
    else:
        pt, ph, pw = getattr(config, "patch_size_t", 1), patch, patch
    frames, height, width = hidden_states.shape[2:]
    return (frames // pt) * (height // ph) * (width // pw)


def _shape(output) -> str:
    """The call output's shape(s): frames, and ``audio (…)`` for a tuple."""
    if isinstance(output, tuple):
        return f"frames {tuple(output[0].shape)}, audio {tuple(output[1].shape)}"
    return f"frames {tuple(output.shape)}"


def _sol_attn_section(spec: DemoModel, *, steps: int, dtype, device: str, seed: int, rounds: int, progress: bool
                      ) -> list[str]:
    """A pipeline unpatched and with ``backend="sol_attn"`` (tier high, its default), timed, plus one
    ``quality("lossless")`` call; closes with the Sol-Attn verdict (speed-up with its interval, or noise) and the
    bit-identity checks. MiniMax-H3 (the modular pipeline) and the diffusers pipelines Wan, HunyuanVideo 1.5 and LTX-2
    differ only in how they are built and called and in the header's sequence line."""
    from tqdm.auto import tqdm  # noqa: PLC0415

    import accelpatch.testing as testing  # noqa: PLC0415
    from accelpatch.eval.stats import compare_timings  # noqa: PLC0415

    h3 = spec.family == "minimax-h3"
    rows = [Row("unpatched", False), Row("sol_attn (high)", True), Row("sol_attn, lossless", True, "lossless", False)]
    bar = tqdm(total=2 + _calls(rows, rounds), desc=spec.title, disable=not progress, unit="call")
    bar.set_postfix_str("building the tiny pipeline")
    pipe, call = (_build_h3 if h3 else _build_diffusers)(spec, steps=steps, dtype=dtype, device=device, seed=seed)
    bar.update(1)
    captured: dict = {}
    hook = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: captured.update(kw), with_kwargs=True)
    bar.set_postfix_str("warm-up (the reference frames)")
    try:
        reference = call()
    finally:
        hook.remove()
    bar.update(1)
    seen = _run_rounds(pipe, rows, call, reference, rounds=rounds, apply_options={"backend": "sol_attn", **SOL_OPTIONS},
                       bar=bar)
    bar.close()

    cfg = pipe.transformer.config
    unpatched, sol, lossless = rows
    model = f"{cfg.num_layers} layers, {cfg.num_attention_heads} heads × {cfg.attention_head_dim}"
    if h3:
        layout = testing.minimax_h3_layout(captured)
        lines = [f"== {spec.title}: tiny random t2va pipeline ({model}), {H3_CALL_SIZE['height']}×"
                 f"{H3_CALL_SIZE['width']}, {H3_CALL_SIZE['num_frames']} frames, {_plural(steps, 'denoising step')} "
                 f"(num_inference_steps={steps + 1}: the distilled pipeline runs one forward per step), "
                 f"{_plural(rounds, 'interleaved round')}",
                 f"   packed sequence {layout.sequence_length:,} rows: {layout.num_text} text + {layout.num_audio} "
                 f"audio (the always-exact sink) + {layout.num_video:,} video"]
    else:
        lines = [f"== {spec.title}: tiny random {type(pipe).__name__} ({model}), {_shape(reference)}, "
                 f"{_plural(steps, 'denoising step')} with classifier-free guidance, "
                 f"{_plural(rounds, 'interleaved round')}",
                 f"   {_video_tokens(captured['hidden_states'], cfg):,} video tokens per forward in the sparse "
                 "self-attention; cross-attention and other streams stay dense (the report says which)"]
    options = ", ".join(f"{k}={v!r}" for k, v in SOL_OPTIONS.items())
    lines += [f"   accelpatch.apply(pipe, backend=\"sol_attn\", {options}); tau=1.0 (default)",
              f"   ({_sol_option_reasons(int(cfg.num_layers))})", ""]
    lines += _table(rows, reference, rounds)
    lines += ["", "accelpatch.report(pipe) after one sol_attn call:", seen.site_report or "-", ""]
    verdict = compare_timings(unpatched.seconds, sol.seconds)
    bench = "benchmarks/bench_minimax_h3_sol_attn.py" if h3 else "benchmarks/bench_video_sol_attn.py"
    if rounds < MIN_ROUNDS:
        lines.append(f"Sol-Attn speed: no verdict from {rounds} round(s); it takes --repeats {MIN_ROUNDS} or more")
    elif verdict.distinguishable and verdict.speedup > 1.0:
        lines.append(f"Sol-Attn speed: {verdict.describe()} per transformer forward, "
                     f"{_median(unpatched.seconds):.3f} s → {_median(sol.seconds):.3f} s per step on {device}")
    else:
        lines.append(f"Sol-Attn speed: {verdict.describe()}: no speed-up that this run can tell apart from the "
                     f"machine's noise (a short sequence, or a busy machine widening the interval; {bench} "
                     "measures longer sequences)")
    if not sol.identical:
        quality = _quality(sol, reference)
        lines.append(f"Sol-Attn quality (approximate, tier high): worst-frame PSNR {quality.min_psnr:.1f} dB, "
                     f"SSIM {quality.min_ssim:.4f} against unpatched (random weights: an illustration, not a gate)")
    what = " (frames and audio)" if isinstance(reference, tuple) else ""
    lines.append(f"quality(\"lossless\") under sol_attn: bit-identical to unpatched{what}: "
                 f"{'yes' if lossless.identical else 'NO'}")
    lines.append(_removal_line(seen.after_remove, seen.after_remove_identical))
    return lines


def _section_time(title: str, wall: float, cpu: float) -> str:
    """The closing line of a section: its wall-clock and CPU seconds (building, calls and scoring included)."""
    return f"-- {title}: {wall:.1f} s wall, {cpu:.1f} s CPU (build, calls and scoring)"


def run_demo(*, steps: Optional[int] = None, dtype: str = "auto", device: str = "cpu", seed: int = 0,
             repeats: Optional[int] = None, progress: bool = True,
             model: Union[str, Sequence[str]] = DEFAULT_MODELS, emit: Optional[Callable[[str], None]] = None) -> str:
    """Run the demo's sections (``model``: a key of :data:`MODELS`, a comma list, ``all``, or a sequence of keys)
    and return the report as text. ``steps`` and ``repeats`` (interleaved timing rounds) None: each model's default.
    ``emit`` (e.g. a flushing print) gets the text as it is ready: the header before the first section is built,
    then each section with its time, so a long run shows progress instead of all of it at the end."""
    import torch  # noqa: PLC0415

    from diffusers.utils import logging as diffusers_logging  # noqa: PLC0415

    names = parse_models(model) if isinstance(model, str) else tuple(model)
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise ValueError(f"unknown model {', '.join(map(repr, unknown)) or repr(model)}; choose one of "
                         f"{', '.join(MODELS)}")
    torch_dtype = _torch_dtype(dtype, device)
    diffusers_logging.set_verbosity_error()
    dtype_name = {torch.float32: "fp32", torch.bfloat16: "bf16"}[torch_dtype]
    chunks: list[str] = []

    def put(text: str) -> None:
        chunks.append(text)
        if emit is not None:
            emit(text)

    put("\n".join([
        f"accelpatch demo: tiny random-weight pipelines built offline; {device}, {dtype_name}"
        f"{' (auto)' if dtype == 'auto' else ''}, {torch.get_num_threads()} thread(s), seed {seed}; "
        f"{_plural(len(names), 'section')}: {', '.join(MODELS[n].title for n in names)}",
        "Rounds run every row once, each starting one row later. s/step: median of the transformer's seconds per "
        "denoising step (VAE decode not included). vs unpatched: median of the per-round ratios with its 95% "
        "interval (order statistics); \"noise\" when the interval contains 1 (a difference this machine cannot tell "
        f"apart). PSNR/SSIM: worst frame against the unpatched frames (at most {QUALITY_FRAMES}, evenly "
        "spaced)."]))
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    for name in names:
        spec = MODELS[name]
        wall, cpu = time.perf_counter(), time.process_time()
        section = _sana_section if spec.family == "sana" else _sol_attn_section
        lines = section(spec, steps=steps or spec.default_steps, dtype=torch_dtype, device=device, seed=seed,
                        rounds=repeats or spec.default_rounds, progress=progress)
        lines.append(_section_time(spec.title, time.perf_counter() - wall, time.process_time() - cpu))
        put("\n".join(["", *lines]))
    if len(names) > 1:
        put("\n" + _section_time(f"all {len(names)} sections", time.perf_counter() - start_wall,
                                 time.process_time() - start_cpu))
    return "\n".join(chunks)


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------

positive_int = at_least(1)
non_negative_int = at_least(0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the demo's options (no heavy import: ``--help`` stays fast)."""
    parser.add_argument("--model", type=parse_models, default=DEFAULT_MODELS, metavar="MODEL[,MODEL]",
                        help=f"which tiny pipelines to run, in order: {', '.join(MODELS)}, a comma list, or all "
                             f"(default {','.join(DEFAULT_MODELS)}: {DEFAULT_HELP})")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="denoising steps per call, >= 1 (default: "
                             + ", ".join(f"{n} {m.default_steps}" for n, m in MODELS.items()) + ")")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",
                        help="model dtype (default auto: fp32 on cpu, where bf16 matmuls are slow without bf16 units; "
                             "bf16 on a GPU)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; SANA's high tier needs cuda)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="random seed, >= 0 (default 0)")
    parser.add_argument("--repeats", type=positive_int, default=None,
                        help=f"interleaved timing rounds (every row once per round), >= 1; a speed verdict needs "
                             f">= {MIN_ROUNDS} (default: " + ", ".join(f"{n} {m.default_rounds}" for n, m in
                                                                       MODELS.items()) + ")")
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
    run_demo(steps=args.steps, dtype=args.dtype, device=args.device, seed=args.seed, repeats=args.repeats,
             progress=not args.no_progress, model=args.model, emit=lambda text: print(text, flush=True))
    return 0
