"""The sound of a procedural clip, and a reader that hears what a soundtrack does, for the audio families.

Why: MiniMax-H3 and LTX-2 make video with sound (issue #43); a tiny model of theirs can only show that it learned
the sound if the training clips' sound follows what happens in the picture, and a check can read that from the
waveform alone, as :mod:`accelpatch.tiny_models.detect` reads the frames.

What the sound is (:func:`procedural_sound`): a shape clip sings one tone whose **pitch follows the shape's height
in the frame** (bottom 220 Hz, top 880 Hz: two octaves, so "moves up" rises), whose **loudness follows its size**
("grows" swells) and whose **stereo position follows its x** ("moves left" pans left, equal-power). A camera clip
hums (110 Hz with its fifth) louder as the camera zooms in and panned where the view is. Pitch, loudness and
position are set per video frame and glide between frames (the phase is continuous: no clicks). Waveforms are
float32 (channels, samples) in [-1, 1]; the clip lasts ``frames / fps`` seconds (13 frames at :data:`FPS` = 8 are
1.625 s).

What the reader hears (:func:`read_sound`): per video frame, the strongest frequency (Hann-windowed FFT with
parabolic peak interpolation), the RMS level and the pan ((R - L) / (R + L) of the channels' RMS), and their
trends from the first quarter of the clip to the last. Plain torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from accelpatch.tiny_models.procedural import Clip

#: video frames per second the sound is timed to (13 frames: 1.625 s)
FPS = 8.0
#: default sample rate (LTX-2's audio VAE runs at 16 kHz)
SAMPLE_RATE = 16000
#: a shape at the bottom of the frame sings this pitch (Hz); at the top, two octaves higher
LOW_HZ = 220.0
OCTAVES = 2.0
#: a camera clip's hum (Hz) and the fifth above it, at half its level
HUM_HZ = 110.0
#: what the reader looks for a pitch in (Hz)
PITCH_RANGE = (80.0, 2000.0)


def sound_samples(frames: int, *, fps: float = FPS, sample_rate: int = SAMPLE_RATE) -> int:
    """Samples of the sound of a ``frames``-frame clip."""
    return int(round(frames / fps * sample_rate))


def clip_pitch(clip: Clip) -> list[float]:
    """The pitch (Hz) a shape clip sings at each frame: two octaves over the frame's height, high at the top."""
    return [LOW_HZ * 2.0 ** (OCTAVES * (1.0 - y / clip.height)) for _, y in clip.centres]


def procedural_sound(clip: Clip, *, channels: int = 2, fps: float = FPS,
                     sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """The sound of ``clip``, (channels, samples) float32 in [-1, 1]: see the module docstring. ``channels`` 1
    (mono: no position) or 2 (stereo). The same clip always gives the same waveform."""
    if channels not in (1, 2):
        raise ValueError(f"channels={channels}: the procedural sound is mono (1) or stereo (2)")
    if fps <= 0 or sample_rate <= 0:
        raise ValueError(f"fps={fps} and sample_rate={sample_rate} must be positive")
    if clip.kind == "shape":
        partials = [(1.0, clip_pitch(clip))]
        level = [min(0.9, 0.1 + 2.5 * size / clip.height) for size in clip.sizes]
        position = [x / clip.width for x, _ in clip.centres]
    else:  # the window's width (a fraction of the photo) shrinks as the camera zooms in
        partials = [(1.0, [HUM_HZ] * clip.frames), (0.5, [1.5 * HUM_HZ] * clip.frames)]
        level = [min(0.9, 0.15 + 0.25 / max(width, 0.05)) for _, _, width in clip.windows]
        position = [x for x, _, _ in clip.windows]
    samples = sound_samples(clip.frames, fps=fps, sample_rate=sample_rate)
    frame_at = _frame_positions(samples, clip.frames, fps, sample_rate)
    tone = torch.zeros(samples, dtype=torch.float64)
    for weight, pitch in partials:
        frequency = _glide(pitch, frame_at)
        phase = 2 * math.pi * torch.cumsum(frequency, 0) / sample_rate
        tone += weight * torch.sin(phase)
    tone *= _glide(level, frame_at) / sum(weight for weight, _ in partials)
    if channels == 1:
        return tone[None].float()
    angle = _glide(position, frame_at).clamp(0, 1) * (math.pi / 2)  # equal power: left cos, right sin
    return torch.stack([tone * torch.cos(angle), tone * torch.sin(angle)]).float()


def _frame_positions(samples: int, frames: int, fps: float, sample_rate: int) -> torch.Tensor:
    """Each sample's position in frame units (frame i lasts from i / fps to (i + 1) / fps; its value is held at its
    centre and interpolated between centres)."""
    seconds = (torch.arange(samples, dtype=torch.float64) + 0.5) / sample_rate
    return (seconds * fps - 0.5).clamp(0, frames - 1)


def _glide(values: list[float], at: torch.Tensor) -> torch.Tensor:
    """Per-frame ``values`` linearly interpolated at fractional frame positions ``at``."""
    table = torch.tensor(values, dtype=torch.float64)
    low = at.floor().long().clamp(max=len(values) - 1)
    high = (low + 1).clamp(max=len(values) - 1)
    fraction = at - low
    return table[low] * (1 - fraction) + table[high] * fraction


@dataclass(frozen=True)
class SoundReading:
    """What :func:`read_sound` heard, per video frame (pitch in Hz, None where too quiet to have one; level as
    RMS; pan in [-1, 1], left negative) and as trends over the clip: the last quarter of the frames against the
    first (pitch in octaves, level as a ratio, pan as a difference)."""

    pitch: tuple[float | None, ...]
    level: tuple[float, ...]
    pan: tuple[float, ...]
    pitch_octaves: float | None
    level_ratio: float
    pan_change: float


def read_sound(audio: torch.Tensor, frames: int, *, sample_rate: int = SAMPLE_RATE,
               silence: float = 1e-3) -> SoundReading:
    """Read ``audio`` ((channels, samples) or (samples,), any scale) in ``frames`` equal windows, one per video
    frame: the strongest frequency in :data:`PITCH_RANGE`, the RMS level and the stereo pan (0 for mono). A window
    whose RMS is below ``silence`` has no pitch."""
    if audio.dim() == 1:
        audio = audio[None]
    if audio.dim() != 2 or audio.shape[1] < frames:
        raise ValueError(f"audio of shape {tuple(audio.shape)}: expected (channels, samples) with at least "
                         f"{frames} samples")
    audio = audio.double()
    bounds = torch.linspace(0, audio.shape[1], frames + 1).round().long().tolist()
    pitch, level, pan = [], [], []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        window = audio[:, start:stop]
        mono = window.mean(0)
        rms = float(mono.pow(2).mean().sqrt())
        level.append(rms)
        pitch.append(_peak_frequency(mono, sample_rate) if rms >= silence else None)
        if window.shape[0] == 2:
            left, right = (float(channel.pow(2).mean().sqrt()) for channel in window)
            pan.append((right - left) / max(right + left, 1e-12))
        else:
            pan.append(0.0)
    quarter = max(1, frames // 4)

    def mean(values):
        return sum(values) / len(values)

    heard = [p for p in pitch[:quarter] if p], [p for p in pitch[-quarter:] if p]
    octaves = math.log2(mean(heard[1]) / mean(heard[0])) if all(heard) else None
    return SoundReading(pitch=tuple(pitch), level=tuple(level), pan=tuple(pan), pitch_octaves=octaves,
                        level_ratio=mean(level[-quarter:]) / max(mean(level[:quarter]), 1e-12),
                        pan_change=mean(pan[-quarter:]) - mean(pan[:quarter]))


def _peak_frequency(signal: torch.Tensor, sample_rate: int) -> float:
    """The strongest frequency of ``signal`` in :data:`PITCH_RANGE` (Hann window, zero-padded FFT, parabolic
    interpolation of the peak's log magnitude)."""
    size = 1 << max(12, (len(signal) - 1).bit_length() + 1)
    spectrum = torch.fft.rfft(signal * torch.hann_window(len(signal), dtype=signal.dtype), n=size).abs()
    bins = torch.fft.rfftfreq(size, 1.0 / sample_rate, dtype=signal.dtype)
    allowed = (bins >= PITCH_RANGE[0]) & (bins <= PITCH_RANGE[1])
    peak = int(torch.where(allowed, spectrum, torch.zeros_like(spectrum)).argmax())
    if 0 < peak < len(spectrum) - 1:
        a, b, c = (float(spectrum[i].clamp_min(1e-30).log()) for i in (peak - 1, peak, peak + 1))
        offset = 0.5 * (a - c) / (a - 2 * b + c) if a - 2 * b + c else 0.0
    else:
        offset = 0.0
    return float((peak + offset) * sample_rate / size)
