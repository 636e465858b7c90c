"""Read what a video shows, from its frames alone: the shape's colour, where it goes and whether it grows.

Why: "the tiny model learned something" must be measured on what it generates, with no outside weights. Shape
clips (:mod:`accelpatch.tiny_models.procedural`) are a saturated shape on a grey background, so the saturated
pixels are the shape: their mean colour names the colour, their centroid's path names the motion. The same
detectors read the procedural clips (where the tests check them against the renderer's ground truth) and a
trained model's videos (where they check that the prompt was followed).

Videos are (3, F, H, W) in [-1, 1], as the procedural clips are; :func:`from_pipeline_frames` converts a
pipeline's ``output_type="pt"`` frames ((B, F, 3, H, W) in [0, 1]).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from accelpatch.tiny_models.procedural import COLOURS

#: A pixel belongs to the shape when its largest channel exceeds its smallest by this much (the background is grey).
SATURATION = 0.5
#: Below this share of a frame's pixels, a frame has no shape to read.
MIN_SHAPE_FRACTION = 0.002
#: The channels well above the lowest (>= 1.0 on the [-1, 1] scale) name a colour.
CHANNELS_OF = {"red": {0}, "green": {1}, "blue": {2}, "yellow": {0, 1}}


def from_pipeline_frames(frames: torch.Tensor) -> torch.Tensor:
    """One video of a pipeline's ``output_type="pt"`` output, (F, 3, H, W) or (1, F, 3, H, W) in [0, 1], as
    (3, F, H, W) in [-1, 1]."""
    if frames.dim() == 5:
        frames = frames[0]
    return (frames.float().permute(1, 0, 2, 3) * 2 - 1).clamp(-1, 1)


def shape_masks(video: torch.Tensor, saturation: float = SATURATION) -> torch.Tensor:
    """(F, H, W) bool: the saturated pixels of each frame."""
    return (video.max(dim=0).values - video.min(dim=0).values) > saturation


def centroids(video: torch.Tensor) -> list[Optional[tuple[float, float]]]:
    """Per frame, the (x, y) pixel centroid of the shape mask (pixel centres at +0.5); None where a frame has too
    few saturated pixels to hold a shape."""
    out: list[Optional[tuple[float, float]]] = []
    masks = shape_masks(video)
    least = MIN_SHAPE_FRACTION * masks[0].numel()
    for mask in masks:
        ys, xs = torch.nonzero(mask, as_tuple=True)
        out.append(None if len(xs) < least else (float(xs.float().mean()) + 0.5, float(ys.float().mean()) + 0.5))
    return out


def mean_colour(video: torch.Tensor, frame: Optional[int] = None) -> Optional[torch.Tensor]:
    """Mean RGB over the shape mask of one frame (or of all frames); None without saturated pixels."""
    masks = shape_masks(video)
    if frame is not None:
        pixels = video[:, frame][:, masks[frame]]
    else:
        pixels = video.permute(1, 2, 3, 0)[masks].T
    return pixels.mean(dim=1) if pixels.shape[1] else None


def dominant_channels(rgb: torch.Tensor) -> set[int]:
    """Channels well above the lowest one (>= 1.0 on the [-1, 1] scale): {0} for red, {0, 1} for yellow, ..."""
    return {c for c in range(3) if rgb[c] - rgb.min() >= 1.0}


def colour_name(rgb: Optional[torch.Tensor]) -> Optional[str]:
    """The procedural colour nearest to ``rgb`` (Euclidean, in [-1, 1] RGB), or None for no shape."""
    if rgb is None:
        return None
    return min(COLOURS, key=lambda name: float((rgb - torch.tensor(COLOURS[name])).norm()))


@dataclass(frozen=True)
class Reading:
    """What a shape video shows: its colour, the direction its shape moves (``"left"``, ``"right"``, ``"up"``,
    ``"down"`` or None when it stays put or is not found), the centroid's net move (x, y) in pixels, the share of
    frames where a shape was found, and its growth: the shape's mean area over the last quarter of the frames over
    that of the first quarter (above 1 as it grows, below as it shrinks; 1.0 when no shape is found)."""

    colour: Optional[str]
    direction: Optional[str]
    displacement: tuple[float, float]
    found: float
    growth: float = 1.0


def read_shape_video(video: torch.Tensor, *, min_move: float = 0.1) -> Reading:
    """Read ``video`` (3, F, H, W in [-1, 1]): the colour nearest the shape's mean colour, and the direction of the
    centroid's net move from the first found frame to the last, when that move exceeds ``min_move`` of the frame's
    extent along its axis."""
    path = [p for p in centroids(video) if p is not None]
    found = len(path) / video.shape[1]
    colour = colour_name(mean_colour(video)) if path else None
    if len(path) < 2:
        return Reading(colour, None, (0.0, 0.0), found)
    areas = shape_masks(video).float().mean(dim=(1, 2))
    quarter = max(1, len(areas) // 4)
    growth = float(areas[-quarter:].mean() / areas[:quarter].mean().clamp_min(MIN_SHAPE_FRACTION))
    dx, dy = path[-1][0] - path[0][0], path[-1][1] - path[0][1]
    height, width = video.shape[-2:]
    if abs(dx) / width >= abs(dy) / height:
        direction = ("right" if dx > 0 else "left") if abs(dx) >= min_move * width else None
    else:
        direction = ("down" if dy > 0 else "up") if abs(dy) >= min_move * height else None
    return Reading(colour, direction, (dx, dy), found, growth)
