"""``accelpatch.validate``: is a faster setting still good enough, and did it actually run?

The same call (same seeds) runs under the reference tier and under each candidate. For every candidate the report
gives per-frame PSNR/SSIM against the reference, SHA-256 equality of the frames, which fast paths ran and which
fell back (from the counters) and a pass/fail verdict: ``exact``/``lossless`` candidates must be bit-identical;
approximate ones must keep every frame at or above the SSIM and PSNR floors. A pipeline that returns audio
(MiniMax-H3) has its audio scored too (:mod:`accelpatch.eval.audio_metrics`: SNR, correlation, nMSE, log-spectral
distance per second) and gated by default: bit identity then covers the audio (its SHA-256), and an approximate
candidate fails when either the video floors or the audio gates fail. Audio gates asked for explicitly on a
pipeline without audio are refused. The reference runs twice, so the report also shows its own noise floor (GPU
kernels are not always deterministic), video and audio: when the reference does not reproduce itself, bit identity
cannot be asked of anyone, and the floors apply to every candidate.
Speed is left to ``bench``: one run per seed, candidate after candidate, cannot tell a speed-up from drift (identical
code read 0.5x to 3.4x), so validate prints no ratio; the raw timings are in the JSON. Every argument, and every
candidate's patch, is checked before the first call (:mod:`accelpatch.eval.preflight`). The pipeline is left in
the patch state it came in, also when a call fails.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from accelpatch.recipes import CandidateSpec, Gates
from accelpatch.core.tiers import Tier, parse_tier
from accelpatch.core.reporting import merge_counts
from accelpatch.eval.candidates import (CandidateLike, CallResult, PatchSwitcher, describe_pipeline, mean_by_key,
                                       parse_candidates, run_call)
from accelpatch.eval.audio_metrics import AudioQuality, compare_audio
from accelpatch.eval.metrics import compare_videos
from accelpatch.eval.preflight import (check_audio_request, check_call_arguments, check_candidates, check_seeds, parse_gates,
                        refuse_audio_request, require_pipeline)
from accelpatch.eval._report_text import TextReport, format_table
from accelpatch.eval.machine import TimingConditions, timing_conditions

__all__ = ["validate", "ValidationReport", "ReferenceRuns", "CandidateResult", "SeedScores", "NoiseFloor", "video_sha256",
           "audio_sha256"]


def video_sha256(frames: torch.Tensor) -> str:
    """SHA-256 of a video's values (float32, contiguous, on the CPU): equal digests mean bit-identical frames."""
    return hashlib.sha256(frames.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()


def audio_sha256(waveform: torch.Tensor, sample_rate: int) -> str:
    """SHA-256 of a waveform's values (float32, contiguous, on the CPU), its shape and sample rate: equal digests
    mean bit-identical audio."""
    digest = hashlib.sha256(f"{tuple(waveform.shape)}@{int(sample_rate)}Hz;".encode())
    digest.update(waveform.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _finite_or_none(value: float) -> Optional[float]:
    return value if math.isfinite(value) else None


@dataclass
class SeedScores:
    """Per-frame scores of one seed's video against the reference's (frame lists run over batch then frames), and
    its audio's scores when the pipeline returned audio."""

    seed: int
    ssim: list[float]
    psnr: list[float]
    sha256: str
    reference_sha256: str
    #: the audio against the reference's (None without audio, or when only one of the two returned audio)
    audio: Optional[AudioQuality] = None
    audio_sha256: Optional[str] = None
    reference_audio_sha256: Optional[str] = None
    #: why the audio could not be compared (one run returned audio and the other not, or another sample rate)
    audio_mismatch: Optional[str] = None

    @property
    def frames_identical(self) -> bool:
        return self.sha256 == self.reference_sha256

    @property
    def audio_identical(self) -> bool:
        """Bit-identical audio, or no audio on either side."""
        return self.audio_sha256 == self.reference_audio_sha256

    @property
    def identical(self) -> bool:
        return self.frames_identical and self.audio_identical

    @property
    def has_audio(self) -> bool:
        return self.audio is not None or self.audio_mismatch is not None

    def to_dict(self) -> dict:
        data = {"seed": self.seed, "identical": self.identical, "sha256": self.sha256,
                "reference_sha256": self.reference_sha256, "ssim": self.ssim,
                "psnr": [_finite_or_none(p) for p in self.psnr]}  # JSON has no inf: identical frames are null
        if self.has_audio:
            data.update(audio_identical=self.audio_identical, audio_sha256=self.audio_sha256,
                        reference_audio_sha256=self.reference_audio_sha256, audio_mismatch=self.audio_mismatch,
                        audio=None if self.audio is None else self.audio.to_dict())
        return data


def _audio_mismatch(reference: CallResult, candidate: CallResult) -> Optional[str]:
    if (reference.audio is None) != (candidate.audio is None):
        which = "the reference returned audio and the candidate none" if candidate.audio is None else \
            "the candidate returned audio and the reference none"
        return which
    if reference.audio is not None and reference.sample_rate != candidate.sample_rate:
        return (f"the audio sample rates differ: reference {reference.sample_rate} Hz, candidate "
                f"{candidate.sample_rate} Hz")
    return None


def _score(seed: int, reference: CallResult, candidate: CallResult) -> SeedScores:
    quality = compare_videos(reference.frames, candidate.frames)
    scores = SeedScores(seed=seed, ssim=quality.ssim, psnr=quality.psnr, sha256=video_sha256(candidate.frames),
                        reference_sha256=video_sha256(reference.frames))
    if reference.audio is not None:
        scores.reference_audio_sha256 = audio_sha256(reference.audio, reference.sample_rate)
    if candidate.audio is not None:
        scores.audio_sha256 = audio_sha256(candidate.audio, candidate.sample_rate)
    scores.audio_mismatch = _audio_mismatch(reference, candidate)
    if scores.audio_mismatch is None and reference.audio is not None:
        scores.audio = compare_audio(reference.audio, candidate.audio, reference.sample_rate)
    return scores


def _audio_values(scores: Iterable[SeedScores], value, mismatch: float) -> Optional[float]:
    """The worst of ``value(audio)`` over seeds (``mismatch`` for a seed whose audio could not be compared); None
    without audio, or where no seed has the value."""
    values = []
    for s in scores:
        if s.audio is not None:
            v = value(s.audio)
            if v is not None:
                values.append(v)
        elif s.audio_mismatch is not None:
            values.append(mismatch)
    return min(values) if values else None


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
        return _audio_values(self.scores, lambda q: min(q.min_window_snr_db, q.snr_db), -math.inf)

    @property
    def min_audio_corr(self) -> Optional[float]:
        """The worst audio correlation over seeds, tracks, the whole clip and the windows with sound; -1 when a
        seed's audio could not be compared; None without audio (or where the reference is silent throughout)."""
        return _audio_values(self.scores, lambda q: q.min_corr, -1.0)

    @property
    def max_audio_lsd(self) -> Optional[float]:
        """The worst (largest) log-spectral distance (dB) over seeds and windows; None without audio."""
        worst = _audio_values(self.scores, lambda q: -q.max_window_lsd_db, -math.inf)
        return None if worst is None else -worst

    def worst_audio(self) -> Optional[tuple[int, AudioQuality]]:
        """(seed, scores) of the seed with the lowest audio SNR in a window, or None."""
        scored = [(s.seed, s.audio) for s in self.scores if s.audio is not None]
        return min(scored, key=lambda item: item[1].min_window_snr_db) if scored else None

    def to_dict(self) -> dict:
        data = {"label": self.label, "spec": self.spec.model_dump(), "gate": self.gate, "passed": self.passed,
                "reasons": self.reasons, "identical": self.identical, "min_ssim": self.min_ssim,
                "min_psnr": _finite_or_none(self.min_psnr), "fast_calls": self.fast_calls,
                "fast_by_kind": self.fast_by_kind, "fast_by_tier": self.fast_by_tier, "fallbacks": self.fallbacks,
                "stats": self.stats, "seconds_per_step": self.seconds_per_step,
                "seeds": [s.to_dict() for s in self.scores]}
        if self.has_audio:
            data.update(min_audio_snr_db=_finite_or_none(self.min_audio_snr), min_audio_corr=self.min_audio_corr,
                        max_audio_lsd_db=_finite_or_none(self.max_audio_lsd))
        return data


@dataclass
class NoiseFloor:
    """The reference against its own second run: how far apart two identical runs are on this device."""

    identical: bool
    min_ssim: float
    min_psnr: float
    #: the reference's audio against its second run (None without audio)
    audio_identical: Optional[bool] = None
    audio_min_snr: Optional[float] = None
    audio_min_corr: Optional[float] = None

    def describe(self) -> str:
        if self.identical:
            return "reference reproduces itself bit for bit (noise floor: none)"
        audio = ""
        if self.audio_identical is not None:
            corr = "n/a" if self.audio_min_corr is None else f"{self.audio_min_corr:.4f}"
            audio = f", audio min SNR {_psnr_text(self.audio_min_snr)} dB and correlation {corr}"
        return (f"reference does NOT reproduce itself: min SSIM {self.min_ssim:.4f}, min PSNR {self.min_psnr:.2f} dB"
                f"{audio} between two identical runs; bit identity is not checked, the floors apply to every "
                "candidate")

    def to_dict(self) -> dict:
        data = {"identical": self.identical, "min_ssim": self.min_ssim, "min_psnr": _finite_or_none(self.min_psnr)}
        if self.audio_identical is not None:
            data.update(audio_identical=self.audio_identical, audio_min_snr_db=_finite_or_none(self.audio_min_snr),
                        audio_min_corr=self.audio_min_corr)
        return data


def _noise_floor(scores: list[SeedScores]) -> NoiseFloor:
    has_audio = any(s.has_audio for s in scores)
    return NoiseFloor(identical=all(s.identical for s in scores), min_ssim=min(min(s.ssim) for s in scores),
                      min_psnr=min(min(s.psnr) for s in scores),
                      audio_identical=all(s.audio_identical for s in scores) if has_audio else None,
                      audio_min_snr=_audio_values(scores, lambda q: min(q.min_window_snr_db, q.snr_db), -math.inf),
                      audio_min_corr=_audio_values(scores, lambda q: q.min_corr, -1.0))


def _psnr_text(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "inf" if value == math.inf else f"{value:.2f}"


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
                         f"{c.min_ssim:.4f}", _psnr_text(c.min_psnr))
                        + ((_psnr_text(c.min_audio_snr), _corr_text(c.min_audio_corr, c.has_audio)) if audio else ())
                        + (str(c.fast_calls), str(fallbacks)))
        lines = [head] + ([] if self.conditions is None else [f"  timed with {self.conditions.describe()}"]
                          + self.conditions.header_lines()) + ["  " + self.noise_floor.describe()]
        lines += format_table(rows)
        lines.append("  speed: not compared here (one run per seed cannot tell a speed-up from noise): use bench")
        for c in self.candidates:
            ran = ", ".join(f"{kind} x{n}" for kind, n in sorted(c.fast_by_kind.items())) or "no fast path ran"
            stats = "".join(f"; {k} {v:.3f}" for k, v in sorted(c.stats.items()))
            lines.append(f"  {c.label}: {ran}{stats}")
            worst = c.worst_audio()
            if worst is not None and not worst[1].identical:
                seed, q = worst
                i, (start, stop) = q.worst_window, q.worst_window_seconds
                corr = "n/a" if q.window_corr[i] is None else f"{q.window_corr[i]:.4f}"
                lines.append(f"    worst audio second: seed {seed}, {start:.2f}-{stop:.2f} s: SNR "
                             f"{_psnr_text(q.window_snr_db[i])} dB, correlation {corr}, nMSE "
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


def _judge(result: CandidateResult, gates: Gates, noise_floor: NoiseFloor) -> None:
    """Fill in the gate, verdict and reasons of ``result``."""
    tier = parse_tier(result.spec.tier)
    if tier <= Tier.LOSSLESS and noise_floor.identical:  # an unpatched candidate runs at exact
        result.gate = "bit-identical"
        result.passed = result.identical
        if not result.passed:
            bad = [s.seed for s in result.scores if not s.frames_identical]
            if bad:
                result.reasons.append(f"frames differ from the reference for seeds {bad} (a {tier} candidate must "
                                      "be bit-identical)")
            bad = [s.seed for s in result.scores if not s.audio_identical]
            if bad:
                result.reasons.append(f"audio differs from the reference for seeds {bad} (a {tier} candidate must "
                                      "be bit-identical, its audio too)")
        return
    result.gate = "floors"
    failing = [(s.seed, i, s.ssim[i], s.psnr[i]) for s in result.scores for i in range(len(s.ssim))
               if s.ssim[i] < gates.ssim_floor or s.psnr[i] < gates.psnr_floor]
    result.reasons += [f"seed {seed} frame {i}: SSIM {ssim:.4f}, PSNR {_psnr_text(psnr)} dB below the floors"
                       for seed, i, ssim, psnr in failing[:5]]
    if len(failing) > 5:
        result.reasons.append(f"... and {len(failing) - 5} more frames below the floors")
    audio_failing = _audio_failures(result.scores, gates) if gates.gates_audio else []
    result.reasons += audio_failing[:5]
    if len(audio_failing) > 5:
        result.reasons.append(f"... and {len(audio_failing) - 5} more audio windows below the audio gates")
    result.passed = not failing and not audio_failing
    if tier is Tier.HIGH and result.fast_by_tier.get("high", 0) == 0:
        lossless = result.fast_by_tier.get("lossless", 0)
        message = ("no fast path ran (every call took the reference path)" if not lossless else
                   f"no fast path ran at tier high (every high site took the reference path; the {lossless} "
                   "lossless fused call(s) are bit-exact)")
        if gates.require_fast_path:
            result.passed = False
            result.reasons.append(message + "; gates.require_fast_path is set")
        else:
            result.reasons.append(message + ": the verdict says nothing about the fast path")


def _audio_failures(scores: list[SeedScores], gates: Gates) -> list[str]:
    """One line per seed and audio window (or track) that misses an audio gate, naming the gate."""
    lines = []
    for s in scores:
        if s.audio_mismatch is not None:
            lines.append(f"seed {s.seed}: audio cannot be compared ({s.audio_mismatch}); the audio gates fail")
        elif s.audio is not None:
            lines += [f"seed {s.seed} {line}" for line in s.audio.gate_failures(
                snr_floor=gates.audio_snr_floor, corr_floor=gates.audio_corr_floor,
                lsd_ceiling=gates.audio_lsd_ceiling)]
    return lines


def _worst(reference: torch.Tensor, candidate: torch.Tensor, scores: SeedScores, previous):
    index = min(range(len(scores.ssim)), key=scores.ssim.__getitem__)
    if previous is not None and previous[4] <= scores.ssim[index]:
        return previous
    flat_ref = reference.reshape(-1, *reference.shape[-3:])
    flat_cand = candidate.reshape(-1, *candidate.shape[-3:])
    return (flat_ref[index].clone(), flat_cand[index].clone(), index, scores.seed, scores.ssim[index])


def validate(pipe: Any, call_kwargs: Mapping[str, Any], candidates: Iterable[CandidateLike] = ("high",), *,
             reference: str = "exact", seeds: Sequence[int] = (0,), gates: Optional[Gates | Mapping] = None,
             progress: bool = True, description: str = "",
             references: Optional[ReferenceRuns] = None) -> ValidationReport:
    """Run ``pipe(**call_kwargs)`` under ``reference`` (twice) and each candidate, for each seed, and judge them.

    ``candidates``: tier names (``"high"``), ``"unpatched"``, mappings or :class:`accelpatch.eval.Candidate` objects
    (tier plus ``backend``/``options``). ``gates``: :class:`accelpatch.recipes.Gates` or a mapping of its fields
    (default: every frame SSIM >= 0.92 and PSNR >= 24 dB; with audio, every second's SNR >= 10 dB and correlation
    >= 0.95). ``call_kwargs`` must not hold a generator (each run gets one seeded from ``seeds``); the output must be
    readable as frames (``output_type="pt"``), and its audio, if any, is read with
    :func:`~accelpatch.eval.candidates.audio_of`. Audio gates asked for explicitly (an ``audio_*`` threshold
    given, or ``audio="required"``) on a pipeline that returns no audio raise ValueError, before the candidates
    run (at the latest after the first reference call). The pipeline ends in
    the patch state it started in. Everything is checked before the first call: the pipeline (not a transformer),
    the seeds (a list of integers), the call arguments (against the pipeline's ``__call__``), the gates, and that
    every candidate's patch applies. No speed is compared here: see :func:`accelpatch.bench`.
    ``references``: a previous report's :attr:`ValidationReport.references` (same pipeline, call arguments and
    reference tier): the seeds it ran are not run again.
    """
    from tqdm import tqdm  # plain text bar: tqdm.auto needs ipywidgets in a notebook

    require_pipeline(pipe, "validate")
    specs = parse_candidates(candidates)
    reference_spec = CandidateSpec(name=f"reference ({reference})", tier=str(parse_tier(reference)))
    gates = parse_gates(gates)
    check_audio_request(pipe, gates)
    seeds = check_seeds(seeds)
    check_call_arguments(pipe, call_kwargs, "validate")
    switcher = PatchSwitcher(pipe)
    check_candidates(pipe, specs, switcher)
    if references is not None and references.reference != reference_spec.tier:
        raise ValueError(f"the references given were run at {references.reference!r}, this validate's reference is "
                         f"{reference_spec.tier!r}: pass reference={references.reference!r} or no references")
    kept = ReferenceRuns(reference=reference_spec.tier)
    if references is not None:  # every seed it holds is kept: one object can serve a whole search
        kept.runs.update(references.runs)
        kept.floor_scores.update(references.floor_scores)
        kept.seconds_per_step.update(references.seconds_per_step)
    calls = 2 * sum(seed not in kept.runs for seed in seeds) + len(seeds) * len(specs)
    conditions = timing_conditions("validate")
    bar = tqdm(total=calls, desc="accelpatch validate", unit="call", disable=not progress)
    try:
        if any(seed not in kept.runs for seed in seeds):
            switcher.enter(reference_spec)
        for seed in seeds:
            if seed in kept.runs:
                first = kept.runs[seed]
            else:
                first = run_call(pipe, call_kwargs, reference_spec, seed)
                bar.update(1)
            if gates.audio_required and first.audio is None:
                refuse_audio_request(pipe, gates, "on the first reference call")
            if seed not in kept.runs:
                second = run_call(pipe, call_kwargs, reference_spec, seed)
                bar.update(1)
                kept.runs[seed] = first
                kept.seconds_per_step[seed] = second.seconds_per_step  # the first run includes warm-up
                kept.floor_scores[seed] = _score(seed, first, second)
        references = {seed: kept.runs[seed] for seed in seeds}
        reference_times = [kept.seconds_per_step[seed] for seed in seeds]
        floor_scores = [kept.floor_scores[seed] for seed in seeds]
        noise = _noise_floor(floor_scores)
        results = []
        for spec in specs:
            bar.set_postfix_str(spec.label)
            switcher.enter(spec)
            runs: list[CallResult] = []
            scores, worst = [], None
            for seed in seeds:
                run = run_call(pipe, call_kwargs, spec, seed)
                runs.append(run)
                scores.append(_score(seed, references[seed], run))
                worst = _worst(references[seed].frames, run.frames, scores[-1], worst)
                bar.update(1)
            result = CandidateResult(
                label=spec.label, spec=spec, scores=scores, seconds_per_step=[r.seconds_per_step for r in runs],
                fast_calls=sum(r.fast_calls for r in runs),
                fast_by_kind=merge_counts(r.fast_by_kind for r in runs),
                fast_by_tier=merge_counts(r.fast_by_tier for r in runs),
                fallbacks=merge_counts(r.fallbacks for r in runs), stats=mean_by_key(r.stats for r in runs),
                worst=worst)
            _judge(result, gates, noise)
            results.append(result)
    finally:
        bar.close()
        switcher.restore()
    return ValidationReport(reference=str(parse_tier(reference)), seeds=seeds, gates=gates, noise_floor=noise,
                            reference_seconds_per_step=reference_times, candidates=results,
                            description=description or describe_pipeline(pipe), conditions=conditions, references=kept)
