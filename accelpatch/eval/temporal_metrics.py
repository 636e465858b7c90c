"""Quality checks that see time: what per-frame SSIM/PSNR cannot, in plain torch (no downloaded weights).

A candidate's video is compared with the reference's (both ``(B, F, C, H, W)`` or ``(F, C, H, W)``, as
:func:`accelpatch.eval.candidates.frames_of` returns them); every value below is per video of the batch, in units
of the data range (:func:`accelpatch.eval.metrics.infer_data_range` of the reference, as the per-frame metrics use):

* **motion energy** ``M(v) = mean_t mean_pixels |v_t - v_(t-1)| / data_range`` over the ``F - 1`` consecutive
  pairs. The **motion ratio** is ``(M(candidate) + eps) / (M(reference) + eps)`` with ``eps`` =
  :data:`MOTION_EPS` (a tenth of an 8-bit level: a still reference and a still candidate agree, ratio 1, instead of
  0/0). Below 1: the candidate moves less (frozen, slowed); above 1: more (sped up, skipped frames, flicker).
* **temporal flicker** (VBench's ``temporal_flickering``: ``(255 - mean_t MAE(frame_t, frame_(t+1))) / 255`` on
  8-bit frames) is ``1 - M(v)`` here, the same formula on the data range without rounding to 8 bits. The **flicker
  delta** is candidate minus reference: negative when the candidate changes more from frame to frame. The ratio is
  relative (it catches a frozen clip whatever its amount of motion), the delta absolute (it catches added
  frame-to-frame change, flicker, in VBench's units, where a relative change of a busy clip would hide it).
* **PSNR drift**: the per-frame PSNR against the reference, each frame's capped at :data:`PSNR_DRIFT_CEILING_DB`
  (identical frames are +inf, and a fall between two invisible errors is no drift), as a least-squares slope in dB
  per frame, and the **drop**: the mean of the first quarter of the frames minus the mean of the last quarter
  (``max(1, F // 4)`` frames each); positive when the candidate gets worse towards the end.
* **degenerate frames**: a frame with NaN/inf values, a black one (max at most :data:`DEGENERATE_EPS` above the
  bottom of the data range) or a constant one (every channel's standard deviation at most ``DEGENERATE_EPS``) in
  the candidate where the reference's frame is none of these.
* **frame 0 vs the conditioning image** (image-to-video): the image (PIL, tensor or array, resized to the frame
  size, bicubic with antialiasing) against frame 0 of the candidate and of the reference, PSNR and SSIM on the
  [0, 1] scale, and frame 0 of the candidate against the reference's.

A one-frame video has no motion, flicker or drift: those are ``None`` ("n/a (one frame)"), never a failure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

from accelpatch.eval.metrics import psnr_per_frame, ssim_per_frame

__all__ = ["MOTION_EPS", "PSNR_DRIFT_CEILING_DB", "DEGENERATE_EPS", "TemporalQuality", "Frame0Image",
           "compare_temporal", "motion_energy", "flicker_score", "psnr_drift", "degenerate_frames",
           "conditioning_images", "data_range_of", "frame0_psnr_bound", "frame0_ssim_bound"]

#: added to both motion energies (fraction of the data range, a tenth of an 8-bit level): still against still is 1
MOTION_EPS = 0.1 / 255.0
#: per-frame PSNR above this (an RMS error of 1% of the range, 2.55 8-bit levels: not visible) counts as this for
#: the drift, so that identical (+inf) or near-identical frames do not read as a fall
PSNR_DRIFT_CEILING_DB = 40.0
#: a frame whose max is within this fraction of the range's bottom is black; one whose every channel's standard
#: deviation is within it is constant (a quarter of an 8-bit level)
DEGENERATE_EPS = 1e-3


def data_range_of(reference: torch.Tensor) -> tuple[float, float]:
    """(bottom, range) of the reference's values, read as :func:`~accelpatch.eval.metrics.infer_data_range` reads
    them but over the finite values only: uint8 -> (0, 255); within [0, 1] -> (0, 1); within [-1, 1] -> (-1, 2);
    otherwise (min, max - min), (min, 1) for a constant reference."""
    if reference.dtype == torch.uint8:
        return 0.0, 255.0
    finite = reference
    if reference.is_floating_point() and not bool(torch.isfinite(reference).all()):
        finite = reference[torch.isfinite(reference)]
    if finite.numel() == 0:
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    if lo >= 0.0 and hi <= 1.0:
        return 0.0, 1.0
    if lo >= -1.0 and hi <= 1.0:
        return -1.0, 2.0
    return lo, (hi - lo) or 1.0


def _batched(video: torch.Tensor) -> torch.Tensor:
    """(B, F, C, H, W) view of a video (frames are converted to float64 one at a time, not here: a long clip in
    float64 at once would be gigabytes)."""
    if video.dim() == 4:
        video = video.unsqueeze(0)
    if video.dim() != 5:
        raise ValueError(f"expected videos shaped (B, F, C, H, W) or (F, C, H, W), got shape {tuple(video.shape)}")
    return video


def motion_energy(video: torch.Tensor, *, data_range: float) -> list[float]:
    """Per video of the batch: the mean absolute difference of consecutive frames over the pairs, channels and
    pixels, divided by ``data_range``. Needs at least two frames."""
    v = _batched(video)
    b, f = v.shape[:2]
    if f < 2:
        raise ValueError("motion energy needs at least two frames")
    total = torch.zeros(b, dtype=torch.float64)
    for t in range(1, f):
        total += (v[:, t].to(torch.float64) - v[:, t - 1].to(torch.float64)).abs().flatten(1).mean(dim=1).cpu()
    return [float(x) for x in total / (f - 1) / float(data_range)]


def flicker_score(video: torch.Tensor, *, data_range: float) -> list[float]:
    """VBench's temporal-flickering score per video, ``1 - motion energy``: 1 for a still clip, lower when frames
    change more from one to the next (VBench: ``(255 - mean MAE of consecutive 8-bit frames) / 255``)."""
    return [1.0 - m for m in motion_energy(video, data_range=data_range)]


def psnr_drift(psnr: Sequence[float], ceiling: float = PSNR_DRIFT_CEILING_DB) -> tuple[float, float]:
    """(slope in dB per frame by least squares, first-quarter mean minus last-quarter mean in dB) of one video's
    per-frame PSNR, each value capped at ``ceiling``. Needs at least two frames."""
    values = [min(float(p), ceiling) for p in psnr]
    n = len(values)
    if n < 2:
        raise ValueError("a PSNR drift needs at least two frames")
    t_mean = (n - 1) / 2.0
    p_mean = math.fsum(values) / n
    slope = math.fsum((t - t_mean) * (p - p_mean) for t, p in enumerate(values)) / \
        math.fsum((t - t_mean) ** 2 for t in range(n))
    q = max(1, n // 4)
    drop = math.fsum(values[:q]) / q - math.fsum(values[-q:]) / q
    return slope, drop


def _frame_kind(frame: torch.Tensor, bottom: float, data_range: float) -> Optional[str]:
    """None, or why one (C, H, W) frame is degenerate."""
    u = ((frame.to(torch.float64) - bottom) / data_range).flatten(1)
    finite = torch.isfinite(u)
    if not bool(finite.all()):
        return "NaN/inf values"
    if float(u.max()) <= DEGENERATE_EPS:
        return f"black (nothing above {DEGENERATE_EPS:g} of the range)"
    if u.shape[1] < 2 or float(u.std(dim=1, unbiased=False).max()) <= DEGENERATE_EPS:
        return f"constant (one colour: every channel's std within {DEGENERATE_EPS:g} of the range)"
    return None


def _frame_kinds(video: torch.Tensor, bottom: float, data_range: float) -> list[list[Optional[str]]]:
    """Per video and frame: None, or why the frame is degenerate."""
    v = _batched(video)
    return [[_frame_kind(v[i, j], bottom, data_range) for j in range(v.shape[1])] for i in range(v.shape[0])]


def degenerate_frames(reference: torch.Tensor, candidate: torch.Tensor) -> list[tuple[int, int, str]]:
    """(video, frame, why) of every degenerate candidate frame whose reference frame is not degenerate."""
    bottom, dr = data_range_of(reference)
    ref = _frame_kinds(reference, bottom, dr)
    cand = _frame_kinds(candidate, bottom, dr)
    return [(i, j, kind) for i, row in enumerate(cand) for j, kind in enumerate(row)
            if kind is not None and ref[i][j] is None]


# --- image-to-video ----------------------------------------------------------------------------------------------

def _image_tensor(image: Any) -> Optional[torch.Tensor]:
    """One conditioning image as (C, H, W) float64 in [0, 1], or None when it is not an image we can read."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow ships with diffusers
        Image = None
    if Image is not None and isinstance(image, Image.Image):
        import numpy as np

        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        array = np.asarray(image, dtype=np.float64) / 255.0
        t = torch.from_numpy(array.copy())
        return t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)
    if not isinstance(image, torch.Tensor):
        try:
            import numpy as np
        except ImportError:  # pragma: no cover
            return None
        if not isinstance(image, np.ndarray):
            return None
        image = torch.from_numpy(np.ascontiguousarray(image))
    t = image.detach().cpu()
    if t.dim() == 4 and t.shape[0] == 1:
        t = t[0]
    if t.dim() == 2:
        t = t.unsqueeze(0)
    if t.dim() != 3:
        return None
    if t.shape[-1] in (1, 3, 4) and t.shape[0] not in (1, 3, 4):  # (H, W, C)
        t = t.permute(2, 0, 1)
    if t.dtype == torch.uint8:
        return t.to(torch.float64) / 255.0
    if not t.is_floating_point():
        return None
    t = t.to(torch.float64)
    if t.numel() and float(t.min()) < 0.0:  # diffusers' [-1, 1] convention
        return ((t + 1.0) / 2.0).clamp(0.0, 1.0)
    if t.numel() and float(t.max()) > 1.0:
        return (t / 255.0).clamp(0.0, 1.0)
    return t


def conditioning_images(image: Any) -> Optional[list[torch.Tensor]]:
    """A call's ``image`` argument as a list of (C, H, W) float64 images in [0, 1] (one, or one per video of the
    batch); None when there is none or it cannot be read (a batched tensor is split along its first dimension)."""
    if image is None:
        return None
    if isinstance(image, (list, tuple)):
        images = [_image_tensor(i) for i in image]
        return images if images and all(i is not None for i in images) else None
    if isinstance(image, torch.Tensor) and image.dim() == 4 and image.shape[0] > 1:
        images = [_image_tensor(i) for i in image]
        return images if all(i is not None for i in images) else None
    one = _image_tensor(image)
    return None if one is None else [one]


def _resized(image: torch.Tensor, height: int, width: int, channels: int) -> Optional[torch.Tensor]:
    if image.shape[0] == 4 and channels == 3:
        image = image[:3]
    elif image.shape[0] == 1 and channels == 3:
        image = image.expand(3, -1, -1)
    if image.shape[0] != channels:
        return None
    if tuple(image.shape[-2:]) != (height, width):
        image = F.interpolate(image[None].float(), size=(height, width), mode="bicubic", align_corners=False,
                              antialias=True)[0].to(torch.float64).clamp(0.0, 1.0)
    return image


@dataclass
class Frame0Image:
    """Image-to-video: frame 0 of one video against the conditioning image (on the [0, 1] scale) for the candidate
    and the reference, and the candidate's frame 0 against the reference's."""

    video: int
    candidate_psnr: float
    candidate_ssim: float
    reference_psnr: float
    reference_ssim: float
    vs_reference_psnr: float
    vs_reference_ssim: float

    def to_dict(self) -> dict:
        f = _finite_or_none
        return {"video": self.video, "candidate_psnr": f(self.candidate_psnr), "candidate_ssim": f(self.candidate_ssim),
                "reference_psnr": f(self.reference_psnr), "reference_ssim": f(self.reference_ssim),
                "vs_reference_psnr": f(self.vs_reference_psnr), "vs_reference_ssim": f(self.vs_reference_ssim)}


def frame0_psnr_bound(reference_psnr: float, psnr_floor: float) -> float:
    """The lowest frame-0-vs-image PSNR a candidate may have: its error against the reference may add at most the
    per-frame floor's error power to the reference's error against the image, ``MSE <= 10^(-ref/10) +
    10^(-floor/10)`` (an independent error adds in power; one that moves frame 0 further from the image than that
    has lost the conditioning)."""
    mse = 10.0 ** (-psnr_floor / 10.0) + (0.0 if reference_psnr == math.inf else 10.0 ** (-reference_psnr / 10.0))
    return -10.0 * math.log10(mse)


def frame0_ssim_bound(reference_ssim: float, ssim_floor: float) -> float:
    """The lowest frame-0-vs-image SSIM a candidate may have: the reference's minus what the per-frame floor lets a
    frame lose, ``ref - (1 - floor)`` (1 - SSIM grows about as the error power for small errors)."""
    return reference_ssim - (1.0 - ssim_floor)


def _frame0(reference: torch.Tensor, candidate: torch.Tensor, images: list[torch.Tensor]) -> list[Frame0Image]:
    ref, cand = _batched(reference), _batched(candidate)
    bottom, dr = data_range_of(reference)
    c, h, w = ref.shape[-3:]
    if len(images) not in (1, ref.shape[0]):
        return []
    out = []
    for b in range(ref.shape[0]):
        image = _resized(images[b if len(images) > 1 else 0], h, w, c)
        if image is None:
            return []
        r0 = (ref[b, :1].to(torch.float64) - bottom) / dr
        c0 = (cand[b, :1].to(torch.float64) - bottom) / dr
        img = image[None]
        out.append(Frame0Image(
            video=b, candidate_psnr=float(psnr_per_frame(img, c0, data_range=1.0)[0]),
            candidate_ssim=float(ssim_per_frame(img, c0, data_range=1.0)[0]),
            reference_psnr=float(psnr_per_frame(img, r0, data_range=1.0)[0]),
            reference_ssim=float(ssim_per_frame(img, r0, data_range=1.0)[0]),
            vs_reference_psnr=float(psnr_per_frame(r0, c0, data_range=1.0)[0]),
            vs_reference_ssim=float(ssim_per_frame(r0, c0, data_range=1.0)[0])))
    return out


# --- one seed's temporal scores ------------------------------------------------------------------------------------

def _finite_or_none(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


def _fmt(value: Optional[float], spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


@dataclass
class TemporalQuality:
    """One seed's temporal scores of a candidate against the reference, per video of the batch (lists are per
    video; the temporal ones are empty for a one-frame video)."""

    num_frames: int
    batch_size: int
    motion_reference: list[float] = field(default_factory=list)
    motion_candidate: list[float] = field(default_factory=list)
    psnr_slope_db: list[float] = field(default_factory=list)
    psnr_drop_db: list[float] = field(default_factory=list)
    #: (video, frame, why) of degenerate candidate frames whose reference frame is not degenerate
    degenerate: list[tuple[int, int, str]] = field(default_factory=list)
    #: image-to-video: frame 0 against the conditioning image, per video (empty without an image)
    frame0: list[Frame0Image] = field(default_factory=list)
    #: videos whose candidate (or reference) has non-finite values: their motion, flicker and drift are not judged
    nonfinite_videos: list[int] = field(default_factory=list)

    @property
    def one_frame(self) -> bool:
        return self.num_frames < 2

    @property
    def motion_ratio(self) -> list[float]:
        return [(c + MOTION_EPS) / (r + MOTION_EPS) for r, c in zip(self.motion_reference, self.motion_candidate)]

    @property
    def flicker_reference(self) -> list[float]:
        return [1.0 - m for m in self.motion_reference]

    @property
    def flicker_candidate(self) -> list[float]:
        return [1.0 - m for m in self.motion_candidate]

    @property
    def flicker_delta(self) -> list[float]:
        """Candidate's VBench flicker score minus the reference's, per video: negative = flickers more."""
        return [c - r for r, c in zip(self.flicker_reference, self.flicker_candidate)]

    def _judged(self, values: list[float]) -> list[tuple[int, float]]:
        return [(i, v) for i, v in enumerate(values) if i not in self.nonfinite_videos and not math.isnan(v)]

    @property
    def worst_motion_ratio(self) -> Optional[float]:
        """The ratio furthest from 1 (in log), None for a one-frame video."""
        judged = self._judged(self.motion_ratio)
        return max((v for _, v in judged), key=lambda r: abs(math.log(r)) if r > 0 else math.inf, default=None)

    @property
    def worst_flicker_delta(self) -> Optional[float]:
        return min((v for _, v in self._judged(self.flicker_delta)), default=None)

    @property
    def worst_psnr_drop(self) -> Optional[float]:
        return max((v for _, v in self._judged(self.psnr_drop_db)), default=None)

    @property
    def worst_psnr_slope(self) -> Optional[float]:
        """The slope (dB per frame) of the video with the worst drop."""
        judged = self._judged(self.psnr_drop_db)
        if not judged:
            return None
        return self.psnr_slope_db[max(judged, key=lambda item: item[1])[0]]

    def gate_failures(self, *, motion_ratio_min: Optional[float] = None, motion_ratio_max: Optional[float] = None,
                      flicker_delta_max: Optional[float] = None, psnr_drift_max_db: Optional[float] = None,
                      i2v_image: bool = False, ssim_floor: float = 0.0, psnr_floor: float = 0.0) -> list[str]:
        """One line per video and gate that fails, naming the metric; empty when it passes. Degenerate frames always
        fail; a None threshold (and ``i2v_image=False``) reports without gating. A one-frame video has no motion,
        flicker or drift to fail."""
        problems = []
        where = (lambda i: f"video {i}: ") if self.batch_size > 1 else (lambda i: "")
        for i, j, kind in self.degenerate:
            problems.append(f"{where(i)}degenerate frame {j}: {kind} (the reference's frame {j} is not)")
        for i, ratio in self._judged(self.motion_ratio):
            lo, hi = motion_ratio_min, motion_ratio_max
            band = f"[{0 if lo is None else lo}, {'inf' if hi is None else hi}]"
            if lo is not None and ratio < lo:
                problems.append(f"{where(i)}motion ratio {ratio:.2f} outside {band} (static or slowed motion?)")
            elif hi is not None and ratio > hi:
                problems.append(f"{where(i)}motion ratio {ratio:.2f} outside {band} (sped-up motion, skipped frames or "
                                "flicker?)")
        if flicker_delta_max is not None:
            for i, delta in self._judged(self.flicker_delta):
                if delta < -flicker_delta_max:
                    problems.append(f"{where(i)}temporal flicker delta {delta:+.4f} below -{flicker_delta_max} (VBench "
                                    f"flicker score {self.flicker_candidate[i]:.4f}, reference "
                                    f"{self.flicker_reference[i]:.4f}: the candidate flickers more)")
        if psnr_drift_max_db is not None:
            for i, drop in self._judged(self.psnr_drop_db):
                if drop > psnr_drift_max_db:
                    problems.append(f"{where(i)}PSNR drift: falls {drop:.2f} dB from the first to the last quarter of "
                                    f"the clip, more than {psnr_drift_max_db} dB (slope "
                                    f"{self.psnr_slope_db[i]:+.3f} dB/frame)")
        if i2v_image:
            for f0 in self.frame0:
                psnr_bound = frame0_psnr_bound(f0.reference_psnr, psnr_floor)
                ssim_bound = frame0_ssim_bound(f0.reference_ssim, ssim_floor)
                if not f0.candidate_psnr >= psnr_bound:
                    problems.append(f"{where(f0.video)}frame 0 vs the conditioning image: PSNR "
                                    f"{f0.candidate_psnr:.2f} dB below {psnr_bound:.2f} dB (reference "
                                    f"{_psnr(f0.reference_psnr)} dB; the per-frame psnr_floor {psnr_floor} dB allows "
                                    "no more)")
                if not f0.candidate_ssim >= ssim_bound:
                    problems.append(f"{where(f0.video)}frame 0 vs the conditioning image: SSIM "
                                    f"{f0.candidate_ssim:.4f} below {ssim_bound:.4f} (reference "
                                    f"{f0.reference_ssim:.4f}; the per-frame ssim_floor {ssim_floor} allows no more)")
        return problems

    def describe(self) -> str:
        """The worst values in one line (the temporal ones n/a for a one-frame video)."""
        if self.one_frame:
            text = "n/a (one frame)"
        else:
            text = (f"motion ratio {_fmt(self.worst_motion_ratio, '.3f')}, flicker delta "
                    f"{_fmt(self.worst_flicker_delta, '+.4f')}, PSNR drift {_fmt(self.worst_psnr_drop, '.2f')} dB "
                    f"({_fmt(self.worst_psnr_slope, '+.3f')} dB/frame)")
        return text + f", degenerate frames {len(self.degenerate) or 'none'}"

    def to_dict(self) -> dict:
        f = _finite_or_none
        return {"num_frames": self.num_frames, "one_frame": self.one_frame,
                "motion_ratio": [f(r) for r in self.motion_ratio],
                "motion_energy": [f(m) for m in self.motion_candidate],
                "reference_motion_energy": [f(m) for m in self.motion_reference],
                "flicker_score": [f(s) for s in self.flicker_candidate],
                "reference_flicker_score": [f(s) for s in self.flicker_reference],
                "flicker_delta": [f(d) for d in self.flicker_delta],
                "psnr_slope_db_per_frame": [f(s) for s in self.psnr_slope_db],
                "psnr_drop_db": [f(d) for d in self.psnr_drop_db],
                "degenerate": [{"video": i, "frame": j, "why": kind} for i, j, kind in self.degenerate],
                "nonfinite_videos": self.nonfinite_videos,
                "frame0_image": [f0.to_dict() for f0 in self.frame0]}


def _psnr(value: float) -> str:
    return "inf" if value == math.inf else f"{value:.2f}"


def compare_temporal(reference: torch.Tensor, candidate: torch.Tensor, *, psnr: Optional[Sequence[float]] = None,
                     images: Optional[list[torch.Tensor]] = None) -> TemporalQuality:
    """The temporal scores of ``candidate`` against ``reference`` (same shape, (B, F, C, H, W) or (F, C, H, W)).

    ``psnr``: the per-frame PSNR already computed (batch then frames), else computed here. ``images``: the
    conditioning image(s) of an image-to-video call, as :func:`conditioning_images` returns them."""
    if reference.shape != candidate.shape:
        raise ValueError(f"reference and candidate shapes differ: reference {tuple(reference.shape)} vs candidate "
                         f"{tuple(candidate.shape)}")
    ref, cand = _batched(reference), _batched(candidate)
    b, f = ref.shape[:2]
    quality = TemporalQuality(num_frames=f, batch_size=b, degenerate=degenerate_frames(ref, cand))
    quality.nonfinite_videos = [i for i in range(b) if not (torch.isfinite(ref[i]).all() and
                                                            torch.isfinite(cand[i]).all())]
    if images:
        quality.frame0 = _frame0(ref, cand, images)
    if f < 2:
        return quality
    _, dr = data_range_of(reference)
    quality.motion_reference = motion_energy(ref, data_range=dr)
    quality.motion_candidate = motion_energy(cand, data_range=dr)
    if psnr is None:
        psnr = [float(p) for p in psnr_per_frame(ref, cand, data_range=dr).flatten()]
    for i in range(b):
        slope, drop = psnr_drift(psnr[i * f:(i + 1) * f])
        quality.psnr_slope_db.append(slope)
        quality.psnr_drop_db.append(drop)
    return quality
