"""What :func:`accelpatch.validate` returns: one :class:`CandidateResult` per candidate (its scores per seed, its
temporal scores' worst over seeds, what ran, the verdict), the :class:`ReferenceRuns` a later call may reuse, and
the :class:`ValidationReport` around them (the table, JSON, the plots: :mod:`accelpatch.eval.plots`, which takes the
report it draws).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from accelpatch.recipes import CandidateSpec, Gates
from accelpatch.eval._report_text import TextReport, format_table
from accelpatch.eval.audio_metrics import AudioQuality
from accelpatch.eval.candidates import CallResult
from accelpatch.eval.machine import TimingConditions
from accelpatch.eval.validate_scores import (NoiseFloor, SeedScores, TemporalSummary, finite_or_none, psnr_text,
                                            temporal_summary, worst_audio_value)

__all__ = ["ValidationReport", "ReferenceRuns", "CandidateResult"]


@dataclass
class CandidateResult:
    """How one candidate did: scores per seed, what ran, its raw timings (not a speed comparison: see bench), and
    the verdict."""

    label: str
    spec: CandidateSpec
    scores: list[SeedScores]
    seconds_per_step: list[float]
    fast_calls: int
    fast_by_kind: dict[str, int]
    fallbacks: dict[str, int]
    stats: dict[str, float]
    gate: str = ""
    passed: bool = False
    reasons: list[str] = field(default_factory=list)
    #: fast calls by the tier of the site that ran them: a high candidate's own fast path is its "high" count (the
    #: lossless fused sites also run under quality("high"), and their calls say nothing about the high path)
    fast_by_tier: dict[str, int] = field(default_factory=dict)
    #: (reference frame, candidate frame, frame index, seed, SSIM) of the lowest-SSIM frame, for the frame strip
    worst: Optional[tuple[torch.Tensor, torch.Tensor, int, int, float]] = field(default=None, repr=False)

    @property
    def identical(self) -> bool:
        return all(s.identical for s in self.scores)

    @property
    def min_ssim(self) -> float:
        return min(min(s.ssim) for s in self.scores)

    @property
    def min_psnr(self) -> float:
        return min(min(s.psnr) for s in self.scores)

    @property
    def has_audio(self) -> bool:
        return any(s.has_audio for s in self.scores)

    @property
    def min_audio_snr(self) -> Optional[float]:
        """The worst audio SNR (dB) over seeds, 1-second windows and tracks (and the whole clip); +inf when the
        audio is identical, -inf when a seed's audio could not be compared; None without audio."""
        return worst_audio_value(self.scores, lambda q: min(q.min_window_snr_db, q.snr_db), -math.inf)

    @property
    def min_audio_corr(self) -> Optional[float]:
        """The worst audio correlation over seeds, tracks, the whole clip and the windows with sound; -1 when a
        seed's audio could not be compared; None without audio (or where the reference is silent throughout)."""
        return worst_audio_value(self.scores, lambda q: q.min_corr, -1.0)

    @property
    def max_audio_lsd(self) -> Optional[float]:
        """The worst (largest) log-spectral distance (dB) over seeds and windows; None without audio."""
        worst = worst_audio_value(self.scores, lambda q: -q.max_window_lsd_db, -math.inf)
        return None if worst is None else -worst

    @property
    def temporal(self) -> Optional[TemporalSummary]:
        """The temporal scores' worst over seeds (motion ratio, flicker delta, PSNR drift, degenerate frames, frame 0
        vs the conditioning image); None when no seed has them."""
        return temporal_summary(self.scores)

    def worst_audio(self) -> Optional[tuple[int, AudioQuality]]:
        """(seed, scores) of the seed with the lowest audio SNR in a window, or None."""
        scored = [(s.seed, s.audio) for s in self.scores if s.audio is not None]
        return min(scored, key=lambda item: item[1].min_window_snr_db) if scored else None

    def to_dict(self) -> dict:
        data = {"label": self.label, "spec": self.spec.model_dump(), "gate": self.gate, "passed": self.passed,
                "reasons": self.reasons, "identical": self.identical, "min_ssim": finite_or_none(self.min_ssim),
                "min_psnr": finite_or_none(self.min_psnr), "fast_calls": self.fast_calls,
                "fast_by_kind": self.fast_by_kind, "fast_by_tier": self.fast_by_tier, "fallbacks": self.fallbacks,
                "stats": self.stats, "seconds_per_step": self.seconds_per_step,
                "seeds": [s.to_dict() for s in self.scores]}
        if self.has_audio:
            data.update(min_audio_snr_db=finite_or_none(self.min_audio_snr), min_audio_corr=self.min_audio_corr,
                        max_audio_lsd_db=finite_or_none(self.max_audio_lsd))
        temporal = self.temporal
        if temporal is not None:
            data["temporal"] = temporal.to_dict()
        return data



def _corr_text(value: Optional[float], has_audio: bool) -> str:
    if not has_audio:
        return "-"
    return "n/a" if value is None else f"{value:.4f}"


@dataclass
class ReferenceRuns:
    """The reference's runs of one :func:`validate` call (per seed: the first run, its score against the second,
    the second's time), for later calls on the same pipeline and call arguments to reuse through
    ``validate(..., references=report.references)``: ``tune`` validates many candidates against one reference."""

    reference: str
    runs: dict[int, CallResult] = field(default_factory=dict)
    floor_scores: dict[int, SeedScores] = field(default_factory=dict)
    seconds_per_step: dict[int, float] = field(default_factory=dict)


@dataclass(repr=False)  # repr is the table (TextReport)
class ValidationReport(TextReport):
    """The result of :func:`validate`: ``passed``, a table (``str()``), ``to_dict()``/``to_json()``, ``plot()``
    (PSNR/SSIM per frame per candidate) and ``save_worst_frames()`` (reference | candidate | difference)."""

    reference: str
    seeds: list[int]
    gates: Gates
    noise_floor: NoiseFloor
    reference_seconds_per_step: list[float]
    candidates: list[CandidateResult]
    description: str = ""
    #: torch's threads, the cores, the load when the calls started (accelpatch.eval.machine)
    conditions: Optional[TimingConditions] = None
    #: the reference runs, for another validate call to reuse (not part of to_dict())
    references: Optional[ReferenceRuns] = field(default=None, compare=False)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.candidates)

    @property
    def has_audio(self) -> bool:
        """Whether the pipeline returned audio (then the table, JSON and plot show the audio gates)."""
        return self.noise_floor.audio_identical is not None or any(c.has_audio for c in self.candidates)

    def audio_gate_text(self) -> str:
        g = self.gates
        text = (f"audio every second SNR >= {g.audio_snr_floor} dB and correlation >= {g.audio_corr_floor}"
                + (f" and LSD <= {g.audio_lsd_ceiling} dB" if g.audio_lsd_ceiling is not None else ""))
        return text if g.gates_audio else "audio reported, not gated (audio: off)"

    def temporal_gate_text(self) -> str:
        """The temporal gates in one line (a null threshold reads "reported, not gated")."""
        g = self.gates
        lo = "0" if g.motion_ratio_min is None else f"{g.motion_ratio_min}"
        hi = "inf" if g.motion_ratio_max is None else f"{g.motion_ratio_max}"
        motion = ("motion ratio reported, not gated" if g.motion_ratio_min is None and g.motion_ratio_max is None
                  else f"motion ratio in [{lo}, {hi}]")
        flicker = ("flicker delta reported, not gated" if g.flicker_delta_max is None else
                   f"flicker delta >= -{g.flicker_delta_max}")
        drift = ("PSNR drift reported, not gated" if g.psnr_drift_max_db is None else
                 f"PSNR drift <= {g.psnr_drift_max_db} dB first to last quarter")
        image = ("image-to-video frame 0 vs the image within the frame floors" if g.i2v_image else
                 "image-to-video frame 0 vs the image reported, not gated")
        return f"temporal gates: {motion}, {flicker}, {drift}, no degenerate frames, {image}"

    def to_dict(self) -> dict:
        # version 2: no speed ratio (validate leaves speed to bench); seconds_per_step are raw single-run timings
        return {"kind": "accelpatch.validate", "version": 2, "description": self.description,
                "reference": self.reference, "seeds": self.seeds, "gates": self.gates.model_dump(),
                "noise_floor": self.noise_floor.to_dict(),
                "reference_seconds_per_step": self.reference_seconds_per_step, "passed": self.passed,
                "conditions": None if self.conditions is None else self.conditions.to_dict(),
                "candidates": [c.to_dict() for c in self.candidates]}

    def __str__(self) -> str:
        head = (f"accelpatch validate: {self.description or 'pipeline'}; reference {self.reference}, "
                f"seeds {self.seeds}; gates: lossless/exact bit-identical, high every frame SSIM >= "
                f"{self.gates.ssim_floor} and PSNR >= {self.gates.psnr_floor} dB")
        audio = self.has_audio
        if audio:
            head += f"; {self.audio_gate_text()}"
        rows = [("candidate", "verdict", "gate", "identical", "min SSIM", "min PSNR")
                + (("min audio SNR", "min audio corr") if audio else ()) + ("fast calls", "fallbacks")]
        for c in self.candidates:
            fallbacks = sum(c.fallbacks.values())
            rows.append((c.label, "PASS" if c.passed else "FAIL", c.gate, "yes" if c.identical else "no",
                         f"{c.min_ssim:.4f}", psnr_text(c.min_psnr))
                        + ((psnr_text(c.min_audio_snr), _corr_text(c.min_audio_corr, c.has_audio)) if audio else ())
                        + (str(c.fast_calls), str(fallbacks)))
        lines = [head, "  " + self.temporal_gate_text()]
        lines += ([] if self.conditions is None else [f"  timed with {self.conditions.describe()}"]
                  + self.conditions.header_lines()) + ["  " + self.noise_floor.describe()]
        floor = self.noise_floor.temporal
        if floor is not None:
            lines.append(f"  reference noise floor over time (second run vs first): {floor.describe()}")
            if floor.describe_frame0() is not None:
                lines.append(f"    {floor.describe_frame0()}")
        lines += format_table(rows)
        lines.append("  speed: not compared here (one run per seed cannot tell a speed-up from noise): use bench")
        for c in self.candidates:
            ran = ", ".join(f"{kind} x{n}" for kind, n in sorted(c.fast_by_kind.items())) or "no fast path ran"
            stats = "".join(f"; {k} {v:.3f}" for k, v in sorted(c.stats.items()))
            lines.append(f"  {c.label}: {ran}{stats}")
            temporal = c.temporal
            if temporal is not None:
                lines.append(f"    temporal (worst over seeds): {temporal.describe()}")
                if temporal.describe_frame0() is not None:
                    lines.append(f"    {temporal.describe_frame0()}")
            worst = c.worst_audio()
            if worst is not None and not worst[1].identical:
                seed, q = worst
                i, (start, stop) = q.worst_window, q.worst_window_seconds
                corr = "n/a" if q.window_corr[i] is None else f"{q.window_corr[i]:.4f}"
                lines.append(f"    worst audio second: seed {seed}, {start:.2f}-{stop:.2f} s: SNR "
                             f"{psnr_text(q.window_snr_db[i])} dB, correlation {corr}, nMSE "
                             f"{q.window_nmse[i]:.3g}, LSD {q.window_lsd_db[i]:.2f} dB")
            lines += [f"    fell back x{n}: {reason}" for reason, n in sorted(c.fallbacks.items())]
            lines += [f"    {reason}" for reason in c.reasons]
        lines.append(f"overall: {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(lines)

    def plot(self, path: Optional[str] = None):
        """PSNR and SSIM per frame per candidate with the floors, and with audio the SNR and correlation per second
        with the audio gates (matplotlib figure; saved as PNG when ``path``)."""
        from accelpatch.eval.plots import plot_validation

        return plot_validation(self, path)

    def save_worst_frames(self, path: str) -> None:
        """A PNG strip, one row per candidate: its lowest-SSIM frame as reference | candidate | |difference|."""
        from accelpatch.eval.plots import worst_frame_strip

        worst_frame_strip(self, path)

