"""Audio quality of a candidate against the reference: SNR, correlation, nMSE and log-spectral distance, per second.

These back ``validate``'s audio gates (MiniMax-H3 makes sound): the worst second decides, not the mean, because
an approximation can spoil one passage of an otherwise clean clip. Plain torch, float64, no audio dependency.

Layout: waveforms ``(B, C, S)``, ``(C, S)`` or ``(S,)`` (batch, channels, samples); each (batch item, channel) is
one *track*, scored on its own; per-track lists run batch-major. Windows are ``WINDOW_SECONDS`` long; a tail of at
least half a window is a window of its own, a shorter one joins the window before it (every sample is scored), and
a clip shorter than one window is one window.

Definitions, per track and window (P = mean power, ``ref`` the reference, ``err = candidate - ref``):

* **level**: the track's whole-clip reference power; a silent track (all zeros) is scored at ``SILENT_LEVEL``
  (a full-scale sine's power, audio in [-1, 1]). **Quiet** = more than ``QUIET_DB`` below the level.
* **SNR** (dB) = 10 log10(max(P_ref, quiet) / P_err): noise in a quiet or silent window counts against the level
  ``QUIET_DB`` below the clip's, not against near-zero (which would fail any inaudible rounding there).
  Identical: +inf. **nMSE** = P_err / max(P_ref, quiet) (= 10^(-SNR/10)).
* **correlation**: Pearson's r of the samples; ``None`` where it means nothing: the reference quiet there, or
  constant. A candidate that is constant where the reference is not: 0.
* **LSD** (dB): Hann-windowed STFT (``torch.stft``, about 32 ms frames, hop a quarter), per-bin power normalised so
  that its mean over bins is the signal's power, floored at the quiet level (differences among inaudible bins do
  not count), then sqrt(mean over bins of (10 log10 P_ref - 10 log10 P_cand)^2), averaged over frames.
* A window whose candidate holds a NaN or infinity scores the worst value of each metric (SNR -inf, nMSE and LSD
  inf, correlation -1): it is the worst window and fails every gate. A reference with one is refused.

Whole-clip values: SNR and nMSE pooled over tracks (sum of levels over sum of errors), LSD the mean over every
frame of every track, correlation per track. Window values are the worst over tracks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

__all__ = ["WINDOW_SECONDS", "QUIET_DB", "SILENT_LEVEL", "FULL_SCALE", "STFT_SECONDS", "AudioQuality",
           "compare_audio", "window_bounds", "stft_size", "as_tracks"]

#: the window the worst-case values are taken over (seconds)
WINDOW_SECONDS = 1.0
#: a window (or STFT bin) more than this far below the track's level is quiet
QUIET_DB = 40.0
#: the level a silent reference track is scored at: the power of a full-scale sine (audio in [-1, 1])
SILENT_LEVEL = 0.5
#: samples at or beyond this magnitude count as clipped (diffusers' audio decoders clamp to [-1, 1])
FULL_SCALE = 1.0
#: STFT frame length for the log-spectral distance (seconds; rounded up to a power of two in samples)
STFT_SECONDS = 0.032


def as_tracks(audio: torch.Tensor, name: str = "audio") -> torch.Tensor:
    """``(B, C, S)``, ``(C, S)`` or ``(S,)`` → float64 ``(tracks, S)`` on the CPU."""
    if not isinstance(audio, torch.Tensor):
        raise TypeError(f"{name} must be a tensor shaped (batch, channels, samples), (channels, samples) or "
                        f"(samples,), got {type(audio).__name__}")
    if audio.dim() not in (1, 2, 3):
        raise ValueError(f"{name} must be shaped (batch, channels, samples), (channels, samples) or (samples,), "
                         f"got shape {tuple(audio.shape)}")
    if audio.shape[-1] == 0 or audio.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(audio.shape)})")
    if audio.is_complex() or audio.dtype == torch.bool:
        raise TypeError(f"{name} must hold real samples, got dtype {audio.dtype}")
    return audio.detach().to("cpu", torch.float64).reshape(-1, audio.shape[-1])


def window_bounds(num_samples: int, sample_rate: int) -> list[tuple[int, int]]:
    """(start, stop) sample bounds of the scoring windows (see the module docstring)."""
    size = max(1, int(round(sample_rate * WINDOW_SECONDS)))
    if num_samples <= size:
        return [(0, num_samples)]
    full, tail = divmod(num_samples, size)
    bounds = [(i * size, (i + 1) * size) for i in range(full)]
    if tail * 2 >= size:
        bounds.append((full * size, num_samples))
    elif tail:
        bounds[-1] = (bounds[-1][0], num_samples)
    return bounds


def stft_size(sample_rate: int, length: int) -> int:
    """The STFT frame for the LSD: the power of two at or above ``STFT_SECONDS`` (at least 16 samples), no longer
    than ``length`` (then the largest power of two that fits)."""
    n_fft = max(16, 1 << max(0, math.ceil(math.log2(max(1.0, sample_rate * STFT_SECONDS)))))
    while n_fft > length and n_fft > 1:
        n_fft //= 2
    return n_fft


def _power_spectra(tracks: torch.Tensor, n_fft: int) -> torch.Tensor:
    """(tracks, frames, bins) power per bin, normalised so its mean over bins is about the frame's mean power."""
    window = torch.hann_window(n_fft, dtype=torch.float64)
    spectrum = torch.stft(tracks, n_fft, hop_length=max(1, n_fft // 4), win_length=n_fft, window=window,
                          center=False, return_complex=True)  # (tracks, bins, frames)
    scale = float(window.pow(2).sum()) or 1.0
    return (spectrum.abs().pow(2) / scale).transpose(1, 2)


def _lsd(reference: torch.Tensor, candidate: torch.Tensor, floor: torch.Tensor, n_fft: int) -> torch.Tensor:
    """Per track: the log-spectral distance (dB) averaged over STFT frames. ``floor`` (tracks,) in power units."""
    floor = floor.view(-1, 1, 1)
    ref = 10.0 * torch.log10(torch.maximum(_power_spectra(reference, n_fft), floor))
    cand = 10.0 * torch.log10(torch.maximum(_power_spectra(candidate, n_fft), floor))
    return (ref - cand).pow(2).mean(dim=2).sqrt().mean(dim=1)


def _pearson(reference: torch.Tensor, candidate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per track: Pearson's r and whether it is defined (the reference varies)."""
    r = reference - reference.mean(dim=1, keepdim=True)
    c = candidate - candidate.mean(dim=1, keepdim=True)
    var_r, var_c = r.pow(2).sum(dim=1), c.pow(2).sum(dim=1)
    denominator = (var_r * var_c).sqrt()
    corr = torch.where(denominator > 0, (r * c).sum(dim=1) / torch.where(denominator > 0, denominator, 1.0), 0.0)
    return corr.clamp(-1.0, 1.0), var_r > 0


def _finite_or_none(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


@dataclass
class AudioQuality:
    """A candidate's audio against the reference: whole-clip values and the worst window (see the module
    docstring for the definitions). Window lists have one entry per window, the worst over tracks."""

    sample_rate: int
    num_samples: int
    num_tracks: int
    #: (start, stop) sample bounds of each window
    windows: list[tuple[int, int]]
    #: whole clip, pooled over tracks; +inf when identical
    snr_db: float
    nmse: float
    lsd_db: float
    #: Pearson's r per track (batch-major) over the whole clip; None where the reference track is silent/constant
    corr: list[Optional[float]]
    window_snr_db: list[float]
    window_nmse: list[float]
    window_lsd_db: list[float]
    #: None for a window where every track's reference is quiet (correlation means nothing there)
    window_corr: list[Optional[float]]
    min_window_snr_db: float
    max_window_nmse: float
    max_window_lsd_db: float
    #: None when no window has a correlation (the reference is quiet throughout)
    min_window_corr: Optional[float]
    #: index of the window with the lowest SNR (the first of equals)
    worst_window: int
    #: (start, stop) of the worst window in seconds
    worst_window_seconds: tuple[float, float]
    identical: bool
    #: NaN or infinite samples in the candidate (each one's window scores the worst value of every metric)
    nonfinite_samples: int = 0
    #: fractions of samples at or beyond full scale (|x| >= 1): a candidate that clips more than the reference
    reference_clipped: float = 0.0
    candidate_clipped: float = 0.0
    #: per-track SNR of every window, (tracks, windows), for plots
    track_window_snr_db: list[list[float]] = field(default_factory=list, repr=False)

    @property
    def min_corr(self) -> Optional[float]:
        """The lower of the worst track's whole-clip correlation and the worst window's; None if none is defined."""
        values = [c for c in self.corr if c is not None]
        if self.min_window_corr is not None:
            values.append(self.min_window_corr)
        return min(values) if values else None

    def gate_failures(self, *, snr_floor: Optional[float] = None, corr_floor: Optional[float] = None,
                      lsd_ceiling: Optional[float] = None) -> list[str]:
        """One line per window (and whole-clip track) below a floor or above the ceiling; empty when it passes.
        A candidate with non-finite samples always fails."""
        problems = []
        if self.nonfinite_samples:
            problems.append(f"{self.nonfinite_samples} non-finite (NaN/inf) audio samples")
        for i, (start, stop) in enumerate(self.windows):
            where = f"audio {start / self.sample_rate:.2f}-{stop / self.sample_rate:.2f} s (window {i})"
            if snr_floor is not None and self.window_snr_db[i] < snr_floor:
                problems.append(f"{where}: SNR {self.window_snr_db[i]:.2f} dB below the audio_snr_floor "
                                f"{snr_floor} dB")
            corr = self.window_corr[i]
            if corr_floor is not None and corr is not None and corr < corr_floor:
                problems.append(f"{where}: correlation {corr:.4f} below the audio_corr_floor {corr_floor}")
            if lsd_ceiling is not None and self.window_lsd_db[i] > lsd_ceiling:
                problems.append(f"{where}: LSD {self.window_lsd_db[i]:.2f} dB above the audio_lsd_ceiling "
                                f"{lsd_ceiling} dB")
        if corr_floor is not None:
            problems += [f"audio track {t} (whole clip): correlation {c:.4f} below the audio_corr_floor {corr_floor}"
                         for t, c in enumerate(self.corr) if c is not None and c < corr_floor]
        return problems

    def to_dict(self) -> dict:
        """JSON-ready: infinities (identical audio: SNR +inf; a NaN candidate: -inf) become null; ``identical``
        and ``nonfinite_samples`` tell the two apart."""
        f = _finite_or_none
        return {"sample_rate": self.sample_rate, "num_samples": self.num_samples, "num_tracks": self.num_tracks,
                "identical": self.identical, "nonfinite_samples": self.nonfinite_samples,
                "snr_db": f(self.snr_db), "nmse": f(self.nmse), "lsd_db": f(self.lsd_db),
                "corr": [f(c) for c in self.corr], "min_window_snr_db": f(self.min_window_snr_db),
                "max_window_nmse": f(self.max_window_nmse), "max_window_lsd_db": f(self.max_window_lsd_db),
                "min_window_corr": f(self.min_window_corr), "worst_window": self.worst_window,
                "worst_window_seconds": list(self.worst_window_seconds), "windows": [list(w) for w in self.windows],
                "window_snr_db": [f(v) for v in self.window_snr_db], "window_nmse": [f(v) for v in self.window_nmse],
                "window_lsd_db": [f(v) for v in self.window_lsd_db],
                "window_corr": [f(v) for v in self.window_corr],
                "reference_clipped": self.reference_clipped, "candidate_clipped": self.candidate_clipped}

    def __str__(self) -> str:
        corr = self.min_corr
        start, stop = self.worst_window_seconds
        return (f"audio: SNR {self.snr_db:.2f} dB (worst second {self.min_window_snr_db:.2f} dB at "
                f"{start:.2f}-{stop:.2f} s), correlation {'n/a' if corr is None else f'{corr:.4f}'}, "
                f"nMSE {self.nmse:.4g}, LSD {self.lsd_db:.2f} dB (worst {self.max_window_lsd_db:.2f} dB)")


def _check_sample_rate(sample_rate) -> int:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float)) or not sample_rate > 0 \
            or not math.isfinite(sample_rate) or int(sample_rate) != sample_rate:
        raise ValueError(f"sample_rate must be a positive whole number of samples per second, got {sample_rate!r}")
    return int(sample_rate)


def _scores(ref: torch.Tensor, cand: torch.Tensor, bad: torch.Tensor, quiet: torch.Tensor, n_fft: int):
    """Per track over one span: SNR (dB), nMSE, LSD (dB), correlation (NaN where undefined). ``bad``: tracks
    whose candidate holds non-finite samples in the span (scored the worst values)."""
    p_ref = ref.pow(2).mean(dim=1)
    p_err = (cand - ref).pow(2).mean(dim=1)
    level = torch.maximum(p_ref, quiet)
    nmse = p_err / level
    snr = 10.0 * torch.log10(level / p_err)  # p_err == 0 -> +inf
    lsd = _lsd(ref, cand, quiet, n_fft)
    corr, defined = _pearson(ref, cand)
    corr = torch.where(defined & (p_ref >= quiet), corr, math.nan)
    snr = torch.where(bad, -math.inf, snr)
    nmse = torch.where(bad, math.inf, nmse)
    lsd = torch.where(bad, math.inf, lsd)
    corr = torch.where(bad, -1.0, corr)
    return snr, nmse, lsd, corr, p_err, level


def _none_if_nan(value: float) -> Optional[float]:
    return None if math.isnan(value) else value


def compare_audio(reference: torch.Tensor, candidate: torch.Tensor, sample_rate: int) -> AudioQuality:
    """Score ``candidate``'s waveform against ``reference``'s, whole clip and per ``WINDOW_SECONDS`` window.

    Both are ``(B, C, S)``, ``(C, S)`` or ``(S,)`` of the same shape, at ``sample_rate`` samples per second. A
    reference with NaN or infinite samples is refused (ValueError); a candidate with them scores the worst values.
    """
    sample_rate = _check_sample_rate(sample_rate)
    ref, cand = as_tracks(reference, "reference audio"), as_tracks(candidate, "candidate audio")
    if tuple(reference.shape) != tuple(candidate.shape):
        raise ValueError(f"reference and candidate audio shapes differ: reference {tuple(reference.shape)} vs "
                         f"candidate {tuple(candidate.shape)}")
    bad_ref = int((~torch.isfinite(ref)).sum())
    if bad_ref:
        raise ValueError(f"the reference audio has {bad_ref} non-finite (NaN/inf) samples: nothing can be scored "
                         "against it")
    finite = torch.isfinite(cand)
    nonfinite = int((~finite).sum())
    identical = nonfinite == 0 and torch.equal(ref, cand)
    cand = torch.where(finite, cand, 0.0)
    tracks, samples = ref.shape
    p_clip = ref.pow(2).mean(dim=1)
    quiet = torch.where(p_clip > 0, p_clip, SILENT_LEVEL) * 10.0 ** (-QUIET_DB / 10.0)

    snr, nmse, lsd, corr, p_err, level = _scores(ref, cand, ~finite.all(dim=1), quiet,
                                                 stft_size(sample_rate, samples))
    bounds = window_bounds(samples, sample_rate)
    per_window = []
    for start, stop in bounds:
        per_window.append(_scores(ref[:, start:stop], cand[:, start:stop], ~finite[:, start:stop].all(dim=1),
                                  quiet, stft_size(sample_rate, stop - start)))
    w_snr = torch.stack([w[0] for w in per_window], dim=1)  # (tracks, windows)
    w_nmse = torch.stack([w[1] for w in per_window], dim=1)
    w_lsd = torch.stack([w[2] for w in per_window], dim=1)
    w_corr = torch.stack([w[3] for w in per_window], dim=1)

    window_snr = w_snr.min(dim=0).values
    window_corr = [_none_if_nan(float(v)) for v in torch.where(w_corr.isnan(), math.inf, w_corr).min(dim=0).values
                   .where(~w_corr.isnan().all(dim=0), math.nan)]
    worst = int(torch.argmin(window_snr)) if not torch.all(window_snr == math.inf) else 0
    defined_corr = [c for c in window_corr if c is not None]
    pooled_err = float(p_err.sum()) if nonfinite == 0 else math.inf
    pooled_level = float(level.sum())
    if pooled_err == 0:
        pooled_snr = math.inf
    elif math.isinf(pooled_err):
        pooled_snr = -math.inf
    else:
        pooled_snr = 10.0 * math.log10(pooled_level / pooled_err)
    return AudioQuality(
        sample_rate=sample_rate, num_samples=samples, num_tracks=tracks, windows=bounds,
        snr_db=pooled_snr, nmse=pooled_err / pooled_level,
        lsd_db=float(lsd.mean()),
        corr=[_none_if_nan(float(c)) for c in corr],
        window_snr_db=[float(v) for v in window_snr], window_nmse=[float(v) for v in w_nmse.max(dim=0).values],
        window_lsd_db=[float(v) for v in w_lsd.max(dim=0).values], window_corr=window_corr,
        min_window_snr_db=float(window_snr.min()), max_window_nmse=float(w_nmse.max()),
        max_window_lsd_db=float(w_lsd.max()), min_window_corr=min(defined_corr) if defined_corr else None,
        worst_window=worst, worst_window_seconds=(bounds[worst][0] / sample_rate, bounds[worst][1] / sample_rate),
        identical=identical, nonfinite_samples=nonfinite,
        reference_clipped=float((ref.abs() >= FULL_SCALE).double().mean()),
        candidate_clipped=float(((cand.abs() >= FULL_SCALE) | ~finite).double().mean()),
        track_window_snr_db=[[float(v) for v in row] for row in w_snr])
