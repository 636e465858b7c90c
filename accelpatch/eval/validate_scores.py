"""What :func:`accelpatch.validate` measures per seed: the digests that decide bit identity (:func:`video_sha256`,
:func:`audio_sha256`), the per-frame (and audio) scores of one run against the reference's (:class:`SeedScores`,
:func:`score_seed`), the worst value over seeds (:func:`worst_audio_value`) and the reference's own noise floor
(:class:`NoiseFloor`, :func:`noise_floor_of`). Each seed's scores include the temporal ones
(:mod:`accelpatch.eval.temporal_metrics`: motion ratio, flicker delta, PSNR drift, degenerate frames, and frame 0
against the conditioning image of an image-to-video call), worst over seeds in :class:`TemporalSummary`.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch

from accelpatch.eval.audio_metrics import AudioQuality, compare_audio
from accelpatch.eval.candidates import CallResult
from accelpatch.eval.metrics import compare_videos
from accelpatch.eval.temporal_metrics import Frame0Image, TemporalQuality, compare_temporal

__all__ = ["SeedScores", "NoiseFloor", "TemporalSummary", "video_sha256", "audio_sha256", "score_seed",
           "noise_floor_of", "worst_audio_value", "finite_or_none", "psnr_text", "temporal_summary"]


def video_sha256(frames: torch.Tensor) -> str:
    """SHA-256 of a video's values (float32, contiguous, on the CPU): equal digests mean bit-identical frames."""
    return hashlib.sha256(frames.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()


def audio_sha256(waveform: torch.Tensor, sample_rate: int) -> str:
    """SHA-256 of a waveform's values (float32, contiguous, on the CPU), its shape and sample rate: equal digests
    mean bit-identical audio."""
    digest = hashlib.sha256(f"{tuple(waveform.shape)}@{int(sample_rate)}Hz;".encode())
    digest.update(waveform.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def finite_or_none(value: float) -> Optional[float]:
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
    #: motion ratio, flicker delta, PSNR drift, degenerate frames, frame 0 vs the conditioning image
    temporal: Optional[TemporalQuality] = None

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
                "reference_sha256": self.reference_sha256, "ssim": [finite_or_none(v) for v in self.ssim],
                "psnr": [finite_or_none(p) for p in self.psnr]}  # JSON has no inf: identical frames are null
        if self.has_audio:
            data.update(audio_identical=self.audio_identical, audio_sha256=self.audio_sha256,
                        reference_audio_sha256=self.reference_audio_sha256, audio_mismatch=self.audio_mismatch,
                        audio=None if self.audio is None else self.audio.to_dict())
        if self.temporal is not None:
            data["temporal"] = self.temporal.to_dict()
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


def score_seed(seed: int, reference: CallResult, candidate: CallResult,
               images: Optional[list[torch.Tensor]] = None) -> SeedScores:
    """One seed's run of a candidate against the reference's: per-frame SSIM/PSNR, the temporal scores (with
    ``images``, the conditioning images of an image-to-video call as
    :func:`~accelpatch.eval.temporal_metrics.conditioning_images` reads them, frame 0 against them), the digests,
    and the audio's scores (or why the audio cannot be compared)."""
    quality = compare_videos(reference.frames, candidate.frames)
    scores = SeedScores(seed=seed, ssim=quality.ssim, psnr=quality.psnr, sha256=video_sha256(candidate.frames),
                        reference_sha256=video_sha256(reference.frames),
                        temporal=compare_temporal(reference.frames, candidate.frames, psnr=quality.psnr,
                                                  images=images))
    if reference.audio is not None:
        scores.reference_audio_sha256 = audio_sha256(reference.audio, reference.sample_rate)
    if candidate.audio is not None:
        scores.audio_sha256 = audio_sha256(candidate.audio, candidate.sample_rate)
    scores.audio_mismatch = _audio_mismatch(reference, candidate)
    if scores.audio_mismatch is None and reference.audio is not None:
        scores.audio = compare_audio(reference.audio, candidate.audio, reference.sample_rate)
    return scores


def worst_audio_value(scores: Iterable[SeedScores], value, mismatch: float) -> Optional[float]:
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


def _log_distance(ratio: float) -> float:
    return abs(math.log(ratio)) if ratio > 0 else math.inf


@dataclass
class TemporalSummary:
    """The temporal scores' worst over seeds and videos (:mod:`accelpatch.eval.temporal_metrics`): what the report
    shows per candidate, and for the reference against its second run (the noise floor)."""

    one_frame: bool
    #: the motion ratio furthest from 1 (in log); None for one-frame videos
    motion_ratio: Optional[float] = None
    #: the lowest flicker delta (candidate's VBench flicker score minus the reference's)
    flicker_delta: Optional[float] = None
    #: the largest PSNR drop (dB) from the first quarter of the clip to the last, and that video's slope (dB/frame)
    psnr_drop_db: Optional[float] = None
    psnr_slope_db: Optional[float] = None
    #: (seed, video, frame, why) of the degenerate frames
    degenerate: list[tuple[int, int, int, str]] = field(default_factory=list)
    #: image-to-video: (seed, scores) of the lowest frame-0-vs-image PSNR; None without an image
    frame0: Optional[tuple[int, Frame0Image]] = None

    def describe(self) -> str:
        """``motion ratio 1.000, flicker delta +0.0000, PSNR drift 0.00 dB (...), degenerate frames none``."""
        if self.one_frame:
            text = "n/a (one frame)"
        else:
            text = (f"motion ratio {_num(self.motion_ratio, '.3f')}, flicker delta {_num(self.flicker_delta, '+.4f')}, "
                    f"PSNR drift {_num(self.psnr_drop_db, '.2f')} dB first to last quarter "
                    f"({_num(self.psnr_slope_db, '+.3f')} dB/frame)")
        if self.degenerate:
            seed, video, frame, why = self.degenerate[0]
            more = f" and {len(self.degenerate) - 1} more" if len(self.degenerate) > 1 else ""
            where = f"seed {seed} " + (f"video {video} " if video else "") + f"frame {frame}"
            return text + f", degenerate frames {len(self.degenerate)} ({where}: {why}{more})"
        return text + ", degenerate frames none"

    def describe_frame0(self) -> Optional[str]:
        """Frame 0 against the conditioning image, candidate and reference, and against the reference's frame 0;
        None without an image."""
        if self.frame0 is None:
            return None
        seed, f0 = self.frame0
        return (f"frame 0 vs the conditioning image: PSNR {psnr_text(f0.candidate_psnr)} dB, SSIM "
                f"{f0.candidate_ssim:.4f} (reference {psnr_text(f0.reference_psnr)} dB, {f0.reference_ssim:.4f}); vs "
                f"the reference's frame 0: PSNR {psnr_text(f0.vs_reference_psnr)} dB, SSIM "
                f"{f0.vs_reference_ssim:.4f} (seed {seed})")

    def to_dict(self) -> dict:
        f = finite_or_none
        return {"one_frame": self.one_frame, "motion_ratio": None if self.motion_ratio is None else
                f(self.motion_ratio), "flicker_delta": None if self.flicker_delta is None else f(self.flicker_delta),
                "psnr_drop_db": None if self.psnr_drop_db is None else f(self.psnr_drop_db),
                "psnr_slope_db_per_frame": None if self.psnr_slope_db is None else f(self.psnr_slope_db),
                "degenerate": [{"seed": s, "video": v, "frame": i, "why": w} for s, v, i, w in self.degenerate],
                "frame0_image": None if self.frame0 is None else {"seed": self.frame0[0], **self.frame0[1].to_dict()}}


def _num(value: Optional[float], spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def temporal_summary(scores: Iterable[SeedScores]) -> Optional[TemporalSummary]:
    """The worst temporal values over ``scores``' seeds; None when none has temporal scores."""
    scored = [s for s in scores if s.temporal is not None]
    if not scored:
        return None
    ratios = [(s.temporal.worst_motion_ratio, s) for s in scored if s.temporal.worst_motion_ratio is not None]
    deltas = [s.temporal.worst_flicker_delta for s in scored if s.temporal.worst_flicker_delta is not None]
    drops = [(s.temporal.worst_psnr_drop, s.temporal.worst_psnr_slope) for s in scored
             if s.temporal.worst_psnr_drop is not None]
    frame0 = [(s.seed, f0) for s in scored for f0 in s.temporal.frame0]
    worst_drop = max(drops, key=lambda item: item[0], default=(None, None))
    return TemporalSummary(
        one_frame=all(s.temporal.one_frame for s in scored),
        motion_ratio=max((r for r, _ in ratios), key=_log_distance, default=None),
        flicker_delta=min(deltas, default=None), psnr_drop_db=worst_drop[0], psnr_slope_db=worst_drop[1],
        degenerate=[(s.seed, v, i, why) for s in scored for v, i, why in s.temporal.degenerate],
        frame0=min(frame0, key=lambda item: item[1].candidate_psnr, default=None))


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
    #: the reference's second run against its first: motion ratio, flicker delta, PSNR drift, degenerate frames
    temporal: Optional[TemporalSummary] = None

    def describe(self) -> str:
        if self.identical:
            return "reference reproduces itself bit for bit (noise floor: none)"
        audio = ""
        if self.audio_identical is not None:
            corr = "n/a" if self.audio_min_corr is None else f"{self.audio_min_corr:.4f}"
            audio = f", audio min SNR {psnr_text(self.audio_min_snr)} dB and correlation {corr}"
        return (f"reference does NOT reproduce itself: min SSIM {self.min_ssim:.4f}, min PSNR {self.min_psnr:.2f} dB"
                f"{audio} between two identical runs; bit identity is not checked, the floors apply to every "
                "candidate")

    def to_dict(self) -> dict:
        data = {"identical": self.identical, "min_ssim": self.min_ssim, "min_psnr": finite_or_none(self.min_psnr)}
        if self.audio_identical is not None:
            data.update(audio_identical=self.audio_identical, audio_min_snr_db=finite_or_none(self.audio_min_snr),
                        audio_min_corr=self.audio_min_corr)
        if self.temporal is not None:
            data["temporal"] = self.temporal.to_dict()
        return data


def noise_floor_of(scores: list[SeedScores]) -> NoiseFloor:
    has_audio = any(s.has_audio for s in scores)
    return NoiseFloor(identical=all(s.identical for s in scores), min_ssim=min(min(s.ssim) for s in scores),
                      min_psnr=min(min(s.psnr) for s in scores),
                      audio_identical=all(s.audio_identical for s in scores) if has_audio else None,
                      audio_min_snr=worst_audio_value(scores, lambda q: min(q.min_window_snr_db, q.snr_db), -math.inf),
                      audio_min_corr=worst_audio_value(scores, lambda q: q.min_corr, -1.0),
                      temporal=temporal_summary(scores))


def psnr_text(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "inf" if value == math.inf else f"{value:.2f}"

