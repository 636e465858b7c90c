"""What :func:`accelpatch.validate` measures per seed: the digests that decide bit identity (:func:`video_sha256`,
:func:`audio_sha256`), the per-frame (and audio) scores of one run against the reference's (:class:`SeedScores`,
:func:`score_seed`), the worst value over seeds (:func:`worst_audio_value`) and the reference's own noise floor
(:class:`NoiseFloor`, :func:`noise_floor_of`).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from accelpatch.eval.audio_metrics import AudioQuality, compare_audio
from accelpatch.eval.candidates import CallResult
from accelpatch.eval.metrics import compare_videos

__all__ = ["SeedScores", "NoiseFloor", "video_sha256", "audio_sha256", "score_seed", "noise_floor_of",
           "worst_audio_value", "finite_or_none", "psnr_text"]


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
                "psnr": [finite_or_none(p) for p in self.psnr]}  # JSON has no inf: identical frames are null
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


def score_seed(seed: int, reference: CallResult, candidate: CallResult) -> SeedScores:
    """One seed's run of a candidate against the reference's: per-frame SSIM/PSNR, the digests, and the audio's
    scores (or why the audio cannot be compared)."""
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
            audio = f", audio min SNR {psnr_text(self.audio_min_snr)} dB and correlation {corr}"
        return (f"reference does NOT reproduce itself: min SSIM {self.min_ssim:.4f}, min PSNR {self.min_psnr:.2f} dB"
                f"{audio} between two identical runs; bit identity is not checked, the floors apply to every "
                "candidate")

    def to_dict(self) -> dict:
        data = {"identical": self.identical, "min_ssim": self.min_ssim, "min_psnr": finite_or_none(self.min_psnr)}
        if self.audio_identical is not None:
            data.update(audio_identical=self.audio_identical, audio_min_snr_db=finite_or_none(self.audio_min_snr),
                        audio_min_corr=self.audio_min_corr)
        return data


def noise_floor_of(scores: list[SeedScores]) -> NoiseFloor:
    has_audio = any(s.has_audio for s in scores)
    return NoiseFloor(identical=all(s.identical for s in scores), min_ssim=min(min(s.ssim) for s in scores),
                      min_psnr=min(min(s.psnr) for s in scores),
                      audio_identical=all(s.audio_identical for s in scores) if has_audio else None,
                      audio_min_snr=worst_audio_value(scores, lambda q: min(q.min_window_snr_db, q.snr_db), -math.inf),
                      audio_min_corr=worst_audio_value(scores, lambda q: q.min_corr, -1.0))


def psnr_text(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "inf" if value == math.inf else f"{value:.2f}"

