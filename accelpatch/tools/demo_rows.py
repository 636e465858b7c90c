"""The demo's rows and their table: each row is one way of calling a section's pipeline (unpatched, or patched at a
tier), run in interleaved rounds (:func:`run_rounds`: every row once per round, each round starting one row later),
timed per transformer step and checked for bit identity against the unpatched frames; :func:`table_lines` prints
them with the "vs unpatched" verdict (:func:`format_timing`), worst-frame PSNR/SSIM and what ran
(:func:`fast_path_text`). Importing this module imports neither torch nor diffusers.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from accelpatch.core.reporting import Report
    from accelpatch.eval.stats import TimingComparison

#: Fewer paired rounds than this give no 95% interval for the median ratio (accelpatch.eval.stats.median_interval:
#: order statistics with binomial coverage need n >= 6); below it the demo shows no verdict rather than a false one.
#: The default rounds are 6 (MiniMax-H3) and 12 (SANA-Video).
MIN_ROUNDS = 6
#: PSNR/SSIM are scored on at most this many evenly spaced frames: SSIM (float64 convolutions) costs ~0.14 s per
#: 256x256 frame on one CPU thread, 17 s for all 124 frames of the MiniMax-H3 clip.
QUALITY_FRAMES = 16


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
    """What :func:`run_rounds` saw besides the rows: unpatched calls made after a ``remove()`` and whether all of
    them were bit-identical to the reference, and ``accelpatch.report`` after a call at the default tier."""

    after_remove: int
    after_remove_identical: bool
    site_report: Optional[str]


def run_rounds(pipe, rows: list[Row], call: Callable[[], Any], reference, *, rounds: int, apply_options: dict,
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


def count_calls(rows: list[Row], rounds: int) -> int:
    """The pipeline calls :func:`run_rounds` makes for ``rows`` (the progress bar's total)."""
    return sum(rounds if r.timed else 1 for r in rows)


def _frame_subset(video):
    """At most :data:`QUALITY_FRAMES` evenly spaced frames of a (B, F, C, H, W) video."""
    import torch  # noqa: PLC0415

    frames = video.shape[1]
    if frames <= QUALITY_FRAMES:
        return video
    index = torch.linspace(0, frames - 1, QUALITY_FRAMES).round().long().unique().to(video.device)
    return video.index_select(1, index)


def row_quality(row: Row, reference):
    """compare_videos of the row's last frames against the reference, on the same evenly spaced frames of both
    (see :data:`QUALITY_FRAMES`); computed once per row."""
    from accelpatch.eval.metrics import compare_videos  # noqa: PLC0415

    if row.quality is None:
        row.quality = compare_videos(_frame_subset(_video(reference)), _frame_subset(_video(row.frames)))
    return row.quality


def table_lines(rows: list[Row], reference, rounds: int) -> list[str]:
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
            quality = row_quality(r, reference)
            psnr, ssim = f"{quality.min_psnr:.1f} dB", quality.min_ssim
        lines.append(f"{r.label:<{width}}{median(r.seconds):>8.4f}  {timing:<28}"
                     f"{'yes' if r.identical else 'no':>13}{psnr:>10}{ssim:>8.4f}  "
                     f"{fast_path_text(r.report if r.patched else None)}")
    return lines


def median(values: Sequence[float]) -> float:
    import statistics  # noqa: PLC0415

    return statistics.median(values)


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def removal_line(calls: int, ok: bool) -> str:
    return (f"after accelpatch.remove(pipe): bit-identical to unpatched: {'yes' if ok else 'NO'} "
            f"({plural(calls, 'call')} after remove())")
