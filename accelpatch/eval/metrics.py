"""Per-frame video quality metrics (PSNR, SSIM) in plain torch.

These back the end-to-end gate for approximate (``high`` tier) fast paths: a patched
pipeline's video is compared frame by frame against the unpatched reference, and the
*worst* frame must reach SSIM >= 0.92 and PSNR >= 24 dB (quality_tiers.md, section 6).

Layout
------
Videos are ``(B, F, C, H, W)`` (batch, frames, channels, height, width) or ``(F, C, H, W)``.
This is what ``SanaVideoPipeline(..., output_type="pt")`` returns (values in [0, 1]).
Per-frame results have shape ``(B, F)`` or ``(F,)`` respectively.

All arithmetic is done in float64 on the inputs' device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "SSIM_WINDOW_SIZE",
    "SSIM_SIGMA",
    "SSIM_K1",
    "SSIM_K2",
    "VideoQuality",
    "compare_videos",
    "infer_data_range",
    "psnr_per_frame",
    "ssim_per_frame",
    "ssim_window_size",
]

SSIM_WINDOW_SIZE = 11
SSIM_SIGMA = 1.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03


def _check_pair(reference: torch.Tensor, candidate: torch.Tensor) -> None:
    if not isinstance(reference, torch.Tensor) or not isinstance(candidate, torch.Tensor):
        raise TypeError(
            f"expected two tensors, got {type(reference).__name__} and {type(candidate).__name__}"
        )
    if reference.shape != candidate.shape:
        raise ValueError(
            f"reference and candidate shapes differ: reference {tuple(reference.shape)} "
            f"vs candidate {tuple(candidate.shape)}"
        )
    if reference.dim() not in (4, 5):
        raise ValueError(
            f"expected videos shaped (B, F, C, H, W) or (F, C, H, W), got shape {tuple(reference.shape)}"
        )
    if reference.numel() == 0:
        raise ValueError(f"empty video of shape {tuple(reference.shape)}")


def infer_data_range(reference: torch.Tensor) -> float:
    """Guess the dynamic range of ``reference`` when the caller does not give one.

    uint8 -> 255; values within [0, 1] -> 1; within [-1, 1] -> 2; otherwise ``max - min``
    of the reference (1.0 if the reference is constant). Pass ``data_range`` explicitly
    whenever it is known.
    """
    if reference.dtype == torch.uint8:
        return 255.0
    lo = float(reference.min())
    hi = float(reference.max())
    if lo >= 0.0 and hi <= 1.0:
        return 1.0
    if lo >= -1.0 and hi <= 1.0:
        return 2.0
    return (hi - lo) or 1.0


def _as_frames(video: torch.Tensor) -> torch.Tensor:
    """(B, F, C, H, W) or (F, C, H, W) -> (N, C, H, W) float64."""
    return video.reshape(-1, *video.shape[-3:]).to(torch.float64)


def psnr_per_frame(
    reference: torch.Tensor, candidate: torch.Tensor, *, data_range: float | None = None
) -> torch.Tensor:
    """PSNR in dB of each frame: ``10 * log10(data_range**2 / MSE)``, MSE over (C, H, W).

    Returns float64 of shape (B, F) or (F,). Identical frames give ``+inf``.
    ``data_range`` defaults to :func:`infer_data_range` of the reference.
    """
    _check_pair(reference, candidate)
    dr = float(data_range) if data_range is not None else infer_data_range(reference)
    if dr <= 0:
        raise ValueError(f"data_range must be positive, got {dr}")
    x = _as_frames(reference)
    y = _as_frames(candidate)
    mse = (x - y).pow(2).flatten(1).mean(dim=1)
    psnr = 10.0 * torch.log10(dr * dr / mse)  # mse == 0 -> +inf
    return psnr.reshape(reference.shape[:-3])


def ssim_window_size(height: int, width: int, window_size: int = SSIM_WINDOW_SIZE) -> int:
    """The Gaussian window used for frames of this size.

    Normally 11. If a frame is smaller than 11 pixels in either direction, the largest odd
    size that fits (``min(H, W)``, minus one if even) is used instead, keeping sigma = 1.5,
    so tiny test frames still get a valid-region SSIM.
    """
    w = min(window_size, height, width)
    if w % 2 == 0:
        w -= 1
    if w < 1:
        raise ValueError(f"frames of size {height}x{width} are too small for SSIM")
    return w


def _gaussian_1d(size: int, sigma: float, device, dtype=torch.float64) -> torch.Tensor:
    coords = torch.arange(size, dtype=dtype, device=device) - (size - 1) / 2.0
    g = torch.exp(-(coords**2) / (2.0 * sigma * sigma))
    return g / g.sum()


def _filter(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian filter, valid region only. x: (N, 1, H, W)."""
    k = g.numel()
    x = F.conv2d(x, g.view(1, 1, k, 1))
    return F.conv2d(x, g.view(1, 1, 1, k))


def ssim_per_frame(
    reference: torch.Tensor, candidate: torch.Tensor, *, data_range: float | None = None
) -> torch.Tensor:
    """Mean SSIM of each frame (Wang et al. 2004), averaged over channels.

    Standard settings: 11x11 Gaussian window with sigma 1.5, K1 = 0.01, K2 = 0.03,
    statistics over the valid region only (no padding). Frames smaller than 11 pixels use a
    smaller odd window (see :func:`ssim_window_size`). Each channel is scored separately and
    the per-channel means are averaged. Returns float64 of shape (B, F) or (F,).
    ``data_range`` defaults to :func:`infer_data_range` of the reference.
    """
    _check_pair(reference, candidate)
    dr = float(data_range) if data_range is not None else infer_data_range(reference)
    if dr <= 0:
        raise ValueError(f"data_range must be positive, got {dr}")
    n_frames_shape = reference.shape[:-3]
    c, h, w = reference.shape[-3:]
    x = _as_frames(reference).reshape(-1, 1, h, w)
    y = _as_frames(candidate).reshape(-1, 1, h, w)
    g = _gaussian_1d(ssim_window_size(h, w), SSIM_SIGMA, x.device)

    c1 = (SSIM_K1 * dr) ** 2
    c2 = (SSIM_K2 * dr) ** 2
    mu_x = _filter(x, g)
    mu_y = _filter(y, g)
    mu_xx = mu_x * mu_x
    mu_yy = mu_y * mu_y
    mu_xy = mu_x * mu_y
    sigma_xx = _filter(x * x, g) - mu_xx
    sigma_yy = _filter(y * y, g) - mu_yy
    sigma_xy = _filter(x * y, g) - mu_xy

    num = (2.0 * mu_xy + c1) * (2.0 * sigma_xy + c2)
    den = (mu_xx + mu_yy + c1) * (sigma_xx + sigma_yy + c2)
    ssim_map = num / den  # (N*C, 1, h', w')
    per_channel = ssim_map.flatten(1).mean(dim=1).reshape(-1, c)
    return per_channel.mean(dim=1).reshape(n_frames_shape)


@dataclass
class VideoQuality:
    """Per-frame SSIM/PSNR of a candidate video against a reference, and the gate verdict.

    For a batched video the frame lists run over the batch in (b, f) order, i.e. entry
    ``b * num_frames + f``. ``passes`` requires the *minimum* over frames to reach both floors.
    """

    ssim: list[float]
    psnr: list[float]
    ssim_floor: float
    psnr_floor: float
    batch_size: int = 1
    num_frames: int = 0

    @property
    def min_ssim(self) -> float:
        return min(self.ssim)

    @property
    def mean_ssim(self) -> float:
        return math.fsum(self.ssim) / len(self.ssim)

    @property
    def min_psnr(self) -> float:
        return min(self.psnr)

    @property
    def mean_psnr(self) -> float:
        # Identical frames have PSNR +inf, which makes the mean +inf: the honest answer.
        return math.fsum(self.psnr) / len(self.psnr)

    @property
    def worst_ssim_frame(self) -> int:
        """Index (into the frame lists) of the frame with the lowest SSIM."""
        return min(range(len(self.ssim)), key=self.ssim.__getitem__)

    @property
    def worst_psnr_frame(self) -> int:
        """Index (into the frame lists) of the frame with the lowest PSNR."""
        return min(range(len(self.psnr)), key=self.psnr.__getitem__)

    @property
    def passes(self) -> bool:
        return self.min_ssim >= self.ssim_floor and self.min_psnr >= self.psnr_floor

    def __str__(self) -> str:
        verdict = "PASS" if self.passes else "FAIL"
        return (
            f"{verdict}: {len(self.ssim)} frames; "
            f"SSIM min {self.min_ssim:.4f} (frame {self.worst_ssim_frame}) mean {self.mean_ssim:.4f} "
            f"[floor {self.ssim_floor}]; "
            f"PSNR min {self.min_psnr:.2f} dB (frame {self.worst_psnr_frame}) mean {self.mean_psnr:.2f} dB "
            f"[floor {self.psnr_floor} dB]"
        )


def compare_videos(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    *,
    ssim_floor: float = 0.92,
    psnr_floor: float = 24.0,
    data_range: float | None = None,
) -> VideoQuality:
    """Score ``candidate`` against ``reference`` frame by frame and apply the ``high``-tier gate.

    Defaults are the floors from quality_tiers.md section 6 (SSIM >= 0.92, PSNR >= 24 dB on
    the worst frame). Videos are (B, F, C, H, W) or (F, C, H, W).
    """
    _check_pair(reference, candidate)
    if data_range is None:
        data_range = infer_data_range(reference)
    ssim = ssim_per_frame(reference, candidate, data_range=data_range)
    psnr = psnr_per_frame(reference, candidate, data_range=data_range)
    batch = reference.shape[0] if reference.dim() == 5 else 1
    frames = reference.shape[-4]
    return VideoQuality(
        ssim=[float(v) for v in ssim.flatten()],
        psnr=[float(v) for v in psnr.flatten()],
        ssim_floor=ssim_floor,
        psnr_floor=psnr_floor,
        batch_size=batch,
        num_frames=frames,
    )
