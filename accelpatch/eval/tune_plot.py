"""The picture of a tune: speed-up against worst-case quality of every setting tried, with the Pareto front.

One panel for the worst SSIM, one more for the worst audio SNR when validate measured audio. Passing settings are
filled, failing ones hollow, the winner is starred (labelled "kept" when no setting was measurably faster and tune
kept the safest passing one); the speed-up's interval is drawn as a horizontal bar where bench
had enough rounds for one. The front joins the passing settings no other passing setting beats on both speed and
quality. One legend for every panel, below them, so that it hides neither a point nor an axis label. matplotlib is
optional, as for :mod:`accelpatch.eval.plots`.
"""
from __future__ import annotations

from typing import Optional


__all__ = ["plot_tune", "pareto_front"]


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (speed, quality) points no other point beats on both (higher is better on each), by speed."""
    front = []
    for s, q in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not front or q > front[-1][1]:
            front.append((s, q))
    return sorted(front)


def _panel(axis, trials: list, winner, metric: str, floor: Optional[float],
           title: str, ylabel: str, crowned: str = "winner", floor_name: str = "floor") -> None:
    shown = [t for t in trials if t.speedup is not None and getattr(t, metric) is not None]
    for passed, style in ((True, dict(color="tab:green", label="passes")),
                          (False, dict(facecolors="none", edgecolors="tab:red", label="fails"))):
        group = [t for t in shown if t.passed is passed]
        if group:
            axis.scatter([t.speedup for t in group], [getattr(t, metric) for t in group], **style)
    for t in shown:
        if t.speed_low is not None and t.speed_high is not None:
            axis.plot([t.speed_low, t.speed_high], [getattr(t, metric)] * 2, color="grey", alpha=0.4, linewidth=1)
    front = pareto_front([(t.speedup, getattr(t, metric)) for t in shown if t.passed])
    if len(front) > 1:
        axis.plot(*zip(*front), color="tab:green", alpha=0.6, linestyle="-", label="Pareto front (passing)")
    if winner is not None and winner in shown:
        axis.scatter([winner.speedup], [getattr(winner, metric)], marker="*", s=220, color="gold",
                     edgecolors="black", zorder=5, label=f"{crowned}: {winner.label}")
    if floor is not None:
        axis.axhline(floor, color="red", linestyle="--", label=f"{floor_name} {floor}")
    axis.axvline(1.0, color="black", linewidth=0.8, alpha=0.5)
    axis.set(title=title, xlabel="speed-up vs reference (x)", ylabel=ylabel)
    axis.grid(True, alpha=0.3)


def plot_tune(result, path: Optional[str] = None):
    """Speed-up (x) against worst SSIM, and against worst audio SNR when any setting has one (matplotlib Figure;
    saved as PNG when ``path``), from ``result``, a :class:`~accelpatch.eval.tune_result.TuneResult`."""
    from accelpatch.eval.plots import _new_figure

    audio = any(t.min_audio_snr is not None for t in result.trials)
    figure = _new_figure(figsize=(11 if audio else 6.5, 4.5), constrained_layout=True)
    axes = figure.subplots(1, 2 if audio else 1, squeeze=False)[0]
    crowned = "winner" if result.faster else "kept (none measurably faster)"
    _panel(axes[0], result.trials, result.winner, "min_ssim", result.gates.ssim_floor,
           f"tune: {len(result.trials)} settings tried", "worst SSIM (over frames and seeds)", crowned, "SSIM floor")
    if audio:
        floor = getattr(result.gates, "audio_snr_floor", None)
        _panel(axes[1], result.trials, result.winner, "min_audio_snr", floor, "audio", "worst audio SNR (dB)", crowned,
               "audio SNR floor")
    entries = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:  # outside every panel (constrained layout makes room below them)
        figure.legend(list(entries.values()), list(entries), loc="outside lower center", fontsize="small",
                      ncols=min(3, len(entries)))
    if path is not None:
        figure.savefig(path, dpi=100)
    return figure
