"""Seeded procedural videos with prompts that say what happens in them, to train tiny video models on.

Two kinds of clip: a coloured square or circle on a dark grey background that moves, grows, shrinks, bounces or
changes colour ("a red square moves left"), and a camera that pans or zooms over one of scikit-image's sample
photographs ("camera pans left over astronaut": real image statistics, bundled with scikit-image, no download).
A clip is fully determined by its seed; :class:`Clip` keeps the ground truth (shape centre, size and colour per
frame) so tests and quality checks can measure what a model generated against what the prompt asked for.

Videos come as float32 tensors in [-1, 1] shaped (C, F, H, W) (one clip) or (B, C, F, H, W) (a batch), as Wan's
VAE encodes them. The default size, 13 frames of 128 x 256, is 4 x 16 x 32 latents for Wan's VAE (4x temporal,
8x spatial) and 4 x 8 x 16 = 512 tokens for a transformer with patch (1, 2, 2): see :func:`video_tokens`.
Imports torch, numpy and scikit-image only.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

#: Default clip size: 13 frames (4 latent frames for a 4x temporal VAE) of 128 x 256 pixels.
VIDEO_FRAMES, VIDEO_HEIGHT, VIDEO_WIDTH = 13, 128, 256

#: Shape colours in [-1, 1] RGB: each has a channel (two for yellow) well above the others.
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.95, -0.85, -0.85),
    "green": (-0.85, 0.85, -0.85),
    "blue": (-0.85, -0.7, 0.95),
    "yellow": (0.95, 0.9, -0.85),
}
SHAPES: tuple[str, ...] = ("square", "circle")
#: What a shape can do; "turns" takes a second colour ("a red circle turns blue").
SHAPE_MOTIONS: tuple[str, ...] = ("moves left", "moves right", "moves up", "moves down", "grows", "shrinks",
                                  "bounces", "turns")
#: Prompt word -> scikit-image sample (``skimage.data`` function name).
PHOTOS: dict[str, str] = {"astronaut": "astronaut", "coffee": "coffee", "cat": "chelsea", "rocket": "rocket"}
#: "Camera pans left": the view moves left, so the picture's content moves right in the frame.
CAMERA_MOTIONS: tuple[str, ...] = ("pans left", "pans right", "zooms in", "zooms out")
#: Dark grey background level of shape clips (in [-1, 1]).
BACKGROUND = -0.7


def vocabulary() -> list[str]:
    """Every word a procedural prompt can contain, in a fixed order (a word-level tokenizer's vocabulary)."""
    words = ["a", *COLOURS, *SHAPES, "camera", "over"]
    for phrase in (*SHAPE_MOTIONS, *CAMERA_MOTIONS):
        words += phrase.split()
    words += list(PHOTOS)
    return list(dict.fromkeys(words))


@dataclass(frozen=True)
class Clip:
    """One procedural clip: its prompt and the parameters that render it.

    Shape clips: ``centres`` (x, y in pixels), ``sizes`` (half-extent in pixels) and ``colours`` (RGB in [-1, 1])
    per frame. Camera clips: ``windows`` per frame, (centre x, centre y, width) of the viewed window as fractions
    of the photo's width and height (the window's height follows from the clip's aspect)."""

    prompt: str
    kind: str  # "shape" or "camera"
    frames: int
    height: int
    width: int
    shape: str | None = None
    colour: str | None = None
    motion: str | None = None
    end_colour: str | None = None
    photo: str | None = None
    flip: bool = False
    centres: tuple[tuple[float, float], ...] = ()
    sizes: tuple[float, ...] = ()
    colours: tuple[tuple[float, float, float], ...] = ()
    windows: tuple[tuple[float, float, float], ...] = ()
    background: tuple[float, float] = (0.0, 0.0)  # gradient of the grey background along x and y


def video_tokens(frames: int = VIDEO_FRAMES, height: int = VIDEO_HEIGHT, width: int = VIDEO_WIDTH, *,
                 temporal_compression: int = 4, spatial_compression: int = 8,
                 patch_size: Sequence[int] = (1, 2, 2)) -> int:
    """Tokens the transformer sees per forward for a clip of this size: latent frames x patches per frame."""
    latent_frames = (frames - 1) // temporal_compression + 1
    pt, ph, pw = patch_size
    return (latent_frames // pt) * (height // spatial_compression // ph) * (width // spatial_compression // pw)


def _rng(seed: int | Sequence[int]) -> np.random.Generator:
    return np.random.default_rng(list(seed) if isinstance(seed, (list, tuple)) else int(seed))


def sample_prompt(seed: int | Sequence[int], *, camera_fraction: float = 0.25) -> str:
    """A prompt drawn from the vocabulary: a camera clip with probability ``camera_fraction``, else a shape clip."""
    rng = _rng(seed)
    if rng.random() < camera_fraction:
        motion, photo = CAMERA_MOTIONS[rng.integers(len(CAMERA_MOTIONS))], list(PHOTOS)[rng.integers(len(PHOTOS))]
        return f"camera {motion} over {photo}"
    colour = list(COLOURS)[rng.integers(len(COLOURS))]
    shape = SHAPES[rng.integers(len(SHAPES))]
    motion = SHAPE_MOTIONS[rng.integers(len(SHAPE_MOTIONS))]
    if motion == "turns":
        others = [c for c in COLOURS if c != colour]
        motion = f"turns {others[rng.integers(len(others))]}"
    return f"a {colour} {shape} {motion}"


def parse_prompt(prompt: str) -> dict[str, str]:
    """The parts of a procedural prompt (kind, colour, shape, motion, end_colour, photo); ValueError otherwise."""
    words = prompt.lower().split()
    if len(words) == 5 and words[0] == "camera" and words[3] == "over":
        motion, photo = " ".join(words[1:3]), words[4]
        if motion in CAMERA_MOTIONS and photo in PHOTOS:
            return dict(kind="camera", motion=motion, photo=photo)
    if len(words) >= 4 and words[0] == "a" and words[1] in COLOURS and words[2] in SHAPES:
        motion = " ".join(words[3:])
        if motion in SHAPE_MOTIONS and motion != "turns":
            return dict(kind="shape", colour=words[1], shape=words[2], motion=motion)
        if len(words) == 5 and words[3] == "turns" and words[4] in COLOURS and words[4] != words[1]:
            return dict(kind="shape", colour=words[1], shape=words[2], motion="turns", end_colour=words[4])
    raise ValueError(f"not a procedural prompt: {prompt!r} (e.g. 'a red square moves left', "
                     "'a blue circle turns green', 'camera pans left over astronaut')")


def make_clip(prompt: str, seed: int | Sequence[int] = 0, *, frames: int = VIDEO_FRAMES, height: int = VIDEO_HEIGHT,
              width: int = VIDEO_WIDTH) -> Clip:
    """The clip ``prompt`` describes, its layout (start position, size, speed, background) drawn from ``seed``."""
    parts = parse_prompt(prompt)
    rng = _rng(seed)
    t = np.linspace(0.0, 1.0, frames)
    if parts["kind"] == "camera":
        return _camera_clip(prompt, parts, rng, t, frames, height, width)
    motion = parts["motion"]
    size = rng.uniform(0.11, 0.16) * height
    x0, y0 = rng.uniform(0.35, 0.65) * width, rng.uniform(0.35, 0.65) * height
    xs, ys, sizes = np.full(frames, x0), np.full(frames, y0), np.full(frames, size)
    if motion in ("moves left", "moves right"):
        travel = rng.uniform(0.35, 0.5) * width
        start = rng.uniform(width / 2 + travel / 2 - 0.05 * width, width / 2 + travel / 2 + 0.05 * width)
        xs = start - travel * t if motion == "moves left" else (width - start) + travel * t
    elif motion in ("moves up", "moves down"):
        travel = rng.uniform(0.4, 0.5) * height
        start = height / 2 + travel / 2
        ys = start - travel * t if motion == "moves up" else (height - start) + travel * t
    elif motion in ("grows", "shrinks"):
        small, large = rng.uniform(0.07, 0.1) * height, rng.uniform(0.22, 0.28) * height
        sizes = small + (large - small) * (t if motion == "grows" else 1.0 - t)
    elif motion == "bounces":  # falls onto a floor and bounces back up, twice per clip
        floor, top = height - size - rng.uniform(0.03, 0.08) * height, size + rng.uniform(0.03, 0.08) * height
        ys = floor - (floor - top) * np.abs(np.cos(2 * math.pi * t * rng.uniform(0.9, 1.1)))
    rgb0 = np.array(COLOURS[parts["colour"]])
    rgb1 = np.array(COLOURS[parts.get("end_colour") or parts["colour"]])
    colours = [tuple(float(c) for c in rgb0 + (rgb1 - rgb0) * s) for s in t]
    return Clip(prompt=prompt, kind="shape", frames=frames, height=height, width=width, shape=parts["shape"],
                colour=parts["colour"], motion=motion, end_colour=parts.get("end_colour"),
                centres=tuple((float(x), float(y)) for x, y in zip(xs, ys)), sizes=tuple(float(s) for s in sizes),
                colours=tuple(colours), background=(float(rng.uniform(-0.1, 0.1)), float(rng.uniform(-0.1, 0.1))))


def _camera_clip(prompt, parts, rng, t, frames, height, width) -> Clip:
    photo_h, photo_w = _photo(parts["photo"]).shape[-2:]
    aspect = (height / width) * (photo_w / photo_h)  # window height / window width, in fractions of the photo
    motion = parts["motion"]
    if motion.startswith("pans"):
        win = rng.uniform(0.55, 0.65)
        travel = rng.uniform(0.25, 1.0 - win - 0.02)
        cy = rng.uniform(win * aspect / 2, 1 - win * aspect / 2)
        right = 1 - win / 2 - rng.uniform(0.0, 1.0 - win - travel)
        cx = right - travel * t if motion == "pans left" else (1 - right) + travel * t
        windows = [(float(x), float(cy), float(win)) for x in cx]
    else:
        wide, close = rng.uniform(0.8, 0.95), rng.uniform(0.4, 0.5)
        wins = wide + (close - wide) * (t if motion == "zooms in" else 1.0 - t)
        cx = rng.uniform(0.5 - (1 - wide) / 2, 0.5 + (1 - wide) / 2)
        cy = rng.uniform(0.5 - (1 - wide * aspect) / 2, 0.5 + (1 - wide * aspect) / 2)
        windows = [(float(cx), float(cy), float(w)) for w in wins]
    return Clip(prompt=prompt, kind="camera", frames=frames, height=height, width=width, motion=motion,
                photo=parts["photo"], flip=bool(rng.random() < 0.5), windows=tuple(windows))


@functools.lru_cache(maxsize=None)
def _photo(name: str) -> torch.Tensor:
    """A scikit-image sample photo as a (3, h, w) float32 tensor in [-1, 1], downscaled (antialiased) to 480 wide."""
    import skimage.data

    image = torch.from_numpy(np.ascontiguousarray(getattr(skimage.data, PHOTOS[name])()[..., :3])).float()
    image = image.permute(2, 0, 1)[None] / 127.5 - 1.0
    h, w = image.shape[-2:]
    image = torch.nn.functional.interpolate(image, size=(round(h * 480 / w), 480), mode="bilinear",
                                            antialias=True, align_corners=False)
    return image[0].clamp(-1, 1)


def render_clip(clip: Clip) -> torch.Tensor:
    """The clip's frames: a float32 tensor (3, F, H, W) in [-1, 1]."""
    if clip.kind == "camera":
        return _render_camera(clip)
    ys, xs = torch.meshgrid(torch.arange(clip.height, dtype=torch.float32) + 0.5,
                            torch.arange(clip.width, dtype=torch.float32) + 0.5, indexing="ij")
    gx, gy = clip.background
    background = BACKGROUND + gx * (xs / clip.width - 0.5) + gy * (ys / clip.height - 0.5)
    frames = []
    for (cx, cy), size, rgb in zip(clip.centres, clip.sizes, clip.colours):
        if clip.shape == "circle":
            distance = torch.sqrt((xs - cx) ** 2 + (ys - cy) ** 2) - size
        else:
            distance = torch.maximum((xs - cx).abs(), (ys - cy).abs()) - size
        alpha = (0.5 - distance).clamp(0.0, 1.0)  # one pixel of antialiasing at the edge
        colour = torch.tensor(rgb, dtype=torch.float32).view(3, 1, 1)
        frames.append(background * (1 - alpha) + colour * alpha)
    return torch.stack(frames, dim=1)


def _render_camera(clip: Clip) -> torch.Tensor:
    photo = _photo(clip.photo)
    if clip.flip:
        photo = photo.flip(-1)
    photo_h, photo_w = photo.shape[-2:]
    aspect = (clip.height / clip.width) * (photo_w / photo_h)
    theta = torch.tensor([[[w, 0.0, 2 * cx - 1], [0.0, w * aspect, 2 * cy - 1]] for cx, cy, w in clip.windows],
                         dtype=torch.float32)
    grid = torch.nn.functional.affine_grid(theta, [clip.frames, 3, clip.height, clip.width], align_corners=False)
    frames = torch.nn.functional.grid_sample(photo[None].expand(clip.frames, -1, -1, -1), grid, mode="bilinear",
                                             padding_mode="border", align_corners=False)
    return frames.permute(1, 0, 2, 3).clamp(-1, 1).contiguous()


def procedural_video(prompt: str | None = None, seed: int | Sequence[int] = 0, *, frames: int = VIDEO_FRAMES,
                     height: int = VIDEO_HEIGHT, width: int = VIDEO_WIDTH,
                     camera_fraction: float = 0.25) -> tuple[torch.Tensor, Clip]:
    """One clip, (3, F, H, W) in [-1, 1], and its :class:`Clip`: for ``prompt``, or for a prompt drawn from
    ``seed`` when None. The same arguments always give the same tensor."""
    if prompt is None:
        prompt = sample_prompt([*_seed_list(seed), 1], camera_fraction=camera_fraction)
    clip = make_clip(prompt, [*_seed_list(seed), 2], frames=frames, height=height, width=width)
    return render_clip(clip), clip


def procedural_batch(seed: int, batch_size: int, *, start: int = 0, frames: int = VIDEO_FRAMES,
                     height: int = VIDEO_HEIGHT, width: int = VIDEO_WIDTH,
                     camera_fraction: float = 0.25) -> tuple[torch.Tensor, list[str], list[Clip]]:
    """Clips ``start`` .. ``start + batch_size - 1`` of the dataset ``seed``: videos (B, 3, F, H, W) in [-1, 1],
    their prompts and :class:`Clip` s. Clip i depends only on (seed, i), so datasets can be read in any order."""
    videos, clips = [], []
    for index in range(start, start + batch_size):
        video, clip = procedural_video(None, [seed, index], frames=frames, height=height, width=width,
                                       camera_fraction=camera_fraction)
        videos.append(video)
        clips.append(clip)
    return torch.stack(videos), [c.prompt for c in clips], clips


def _seed_list(seed: int | Sequence[int]) -> list[int]:
    return [int(s) for s in seed] if isinstance(seed, (list, tuple)) else [int(seed)]
