"""Pictures of a validation: PSNR/SSIM per frame per candidate (matplotlib), the audio SNR and correlation per
second next to them when the pipeline returned audio, and the worst frames side by side.

matplotlib is optional (``pip install matplotlib``, in the ``plots`` and ``dev`` extras); the frame strip needs only
Pillow. Identical frames (and seconds of audio) have infinite PSNR (SNR) and are drawn at the top of the axis; a
second of audio with non-finite samples (SNR -inf) at its bottom.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

__all__ = ["plot_validation", "side_by_side", "worst_frame_strip"]

#: where frames with infinite PSNR (bit-identical) are drawn
PSNR_CEILING = 100.0
#: where seconds of audio with infinite SNR (bit-identical) are drawn: above float32 rounding (~140 dB)
SNR_CEILING = 160.0
#: where seconds of audio with SNR -inf (non-finite candidate samples) are drawn
SNR_BOTTOM = -40.0


def _new_figure(**kwargs):
    """A matplotlib Figure that pyplot does not track: a notebook then shows it once, where it is displayed or
    returned (a pyplot figure is also shown again by the inline backend at the end of the cell)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install matplotlib (or accelpatch[plots])") from None
    return Figure(**kwargs)


def _clamped(values, bottom, top):
    return [top if math.isnan(v) or v > top else max(v, bottom) for v in values]


def _plot_audio(report, snr_axis, corr_axis) -> None:
    """Audio SNR and correlation per 1-second window, one line per candidate and seed, the audio gates dashed."""
    for candidate in report.candidates:
        for scores in candidate.scores:
            if scores.audio is None:
                continue
            quality = scores.audio
            label = candidate.label if len(report.seeds) == 1 else f"{candidate.label} (seed {scores.seed})"
            starts = [start / quality.sample_rate for start, _ in quality.windows]
            snr = _clamped(quality.window_snr_db, SNR_BOTTOM, SNR_CEILING)
            snr_axis.plot(starts, snr, marker="o", markersize=3, label=label)
            corr = [math.nan if c is None else c for c in quality.window_corr]  # a gap where it means nothing
            corr_axis.plot(starts, corr, marker="o", markersize=3, label=label)
    gates = report.gates
    style = dict(color="red", linestyle="--") if gates.gates_audio else dict(color="grey", linestyle=":")
    snr_axis.axhline(gates.audio_snr_floor, label=f"audio_snr_floor {gates.audio_snr_floor} dB", **style)
    corr_axis.axhline(gates.audio_corr_floor, label=f"audio_corr_floor {gates.audio_corr_floor}", **style)
    off = "" if gates.gates_audio else " (audio: off, not gated)"
    snr_axis.set(title=f"audio SNR per second, worst track (identical at {SNR_CEILING:.0f} dB){off}",
                 xlabel="window start (s)", ylabel="dB")
    corr_axis.set(title=f"audio correlation per second, worst track{off}", xlabel="window start (s)",
                  ylabel="Pearson r")


def plot_validation(report, path: Optional[str] = None):
    """Two panels (PSNR, SSIM) over frame index, one line per candidate and seed, with the gate floors dashed; with
    audio, two more below: audio SNR and correlation per second with the audio gates. ``report``: a
    :class:`~accelpatch.eval.validate_report.ValidationReport` (a plot takes the results it draws; it does not import
    the code that computes them)."""
    audio = report.has_audio
    figure = _new_figure(figsize=(11, 8 if audio else 4), constrained_layout=True)
    axes = figure.subplots(2 if audio else 1, 2)
    psnr_axis, ssim_axis = axes[0] if audio else axes
    for candidate in report.candidates:
        for scores in candidate.scores:
            label = candidate.label if len(report.seeds) == 1 else f"{candidate.label} (seed {scores.seed})"
            frames = range(len(scores.ssim))
            psnr = [min(p, PSNR_CEILING) if not math.isnan(p) else PSNR_CEILING for p in scores.psnr]
            psnr_axis.plot(frames, psnr, marker="o", markersize=3, label=label)
            ssim_axis.plot(frames, scores.ssim, marker="o", markersize=3, label=label)
    psnr_axis.axhline(report.gates.psnr_floor, color="red", linestyle="--", label=f"floor {report.gates.psnr_floor} dB")
    ssim_axis.axhline(report.gates.ssim_floor, color="red", linestyle="--", label=f"floor {report.gates.ssim_floor}")
    psnr_axis.set(title=f"PSNR vs {report.reference} (identical frames at {PSNR_CEILING:.0f} dB)", xlabel="frame",
                  ylabel="dB")
    ssim_axis.set(title=f"SSIM vs {report.reference}", xlabel="frame", ylabel="SSIM")
    if audio:
        _plot_audio(report, *axes[1])
    for axis in (axes.flatten() if audio else (psnr_axis, ssim_axis)):
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    if path is not None:
        figure.savefig(path, dpi=100)
    return figure


def _to_image(frame: torch.Tensor, size: int):
    """(C, H, W) in [0, 1] → a PIL RGB image at least ``size`` pixels high (nearest-neighbour upscaling)."""
    from PIL import Image

    frame = frame.float().clamp(0, 1)
    if frame.shape[0] == 1:
        frame = frame.expand(3, -1, -1)
    array = (frame[:3].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    image = Image.fromarray(array, "RGB")
    scale = max(1, math.ceil(size / image.height))
    return image.resize((image.width * scale, image.height * scale), Image.NEAREST)


def worst_frame_strip(report, path: str, *, min_height: int = 128) -> None:
    """One row per candidate: reference | candidate | |difference| (scaled so the largest difference is white), from
    ``report``, a :class:`~accelpatch.eval.validate_report.ValidationReport`."""
    from PIL import Image, ImageDraw

    rows = []
    for candidate in report.candidates:
        if candidate.worst is None:
            continue
        reference, frame, index, seed, ssim = candidate.worst
        difference = (frame.float() - reference.float()).abs()
        peak = float(difference.max())
        scaled = difference / peak if peak > 0 else difference
        tiles = [_to_image(reference, min_height), _to_image(frame, min_height), _to_image(scaled, min_height)]
        caption = (f"{candidate.label}: seed {seed} frame {index}, SSIM {ssim:.4f}; "
                   f"reference | candidate | difference x{(1 / peak) if peak > 0 else 1:.0f}")
        rows.append((tiles, caption))
    if not rows:
        raise ValueError("the report has no candidate frames to show")
    caption_height, gap = 16, 4
    width = max(sum(t.width for t in tiles) + gap * (len(tiles) - 1) for tiles, _ in rows)
    height = sum(tiles[0].height + caption_height + gap for tiles, _ in rows)
    strip = Image.new("RGB", (max(width, 480), height), "white")
    draw = ImageDraw.Draw(strip)
    y = 0
    for tiles, caption in rows:
        draw.text((2, y + 2), caption, fill="black")
        x = 0
        for tile in tiles:
            strip.paste(tile, (x, y + caption_height))
            x += tile.width + gap
        y += tiles[0].height + caption_height + gap
    strip.save(path)


def side_by_side(videos: dict, stem: str, *, notes: Sequence[str] = (), columns: int = 5,
                 min_height: int = 128, fps: int = 8) -> tuple[str, str]:
    """Write ``videos`` (label -> frames (F, C, H, W) in [0, 1], e.g. exact | lossless | high) for a person to look
    at: ``STEM.png``, one row per label through ``columns`` evenly spaced frames, and ``STEM.gif``, the labels side
    by side playing at ``fps``; ``notes`` (e.g. the metrics) are written under both. Returns the two paths."""
    from PIL import Image, ImageDraw

    if not videos:
        raise ValueError("side_by_side needs at least one video")
    lengths = {label: video.shape[0] for label, video in videos.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"the videos have different frame counts: {lengths}")
    frames = next(iter(lengths.values()))
    line, gap = 14, 4
    text_height = line * len(notes) + gap

    def canvas(width: int, height: int):
        image = Image.new("RGB", (width, height + text_height), "white")
        draw = ImageDraw.Draw(image)
        for i, note in enumerate(notes):
            draw.text((2, height + gap // 2 + i * line), note, fill="black")
        return image, draw

    picks = sorted({round(i * (frames - 1) / max(1, columns - 1)) for i in range(min(columns, frames))})
    rows = [[_to_image(video[t], min_height) for t in picks] for video in videos.values()]
    tile_w, tile_h = rows[0][0].size
    label_h = line + 2
    width = len(picks) * (tile_w + gap)
    png, draw = canvas(max(width, 480), len(rows) * (tile_h + label_h + gap))
    for r, (label, tiles) in enumerate(zip(videos, rows)):
        y = r * (tile_h + label_h + gap)
        draw.text((2, y), f"{label}: frames {', '.join(str(t) for t in picks)}", fill="black")
        for c, tile in enumerate(tiles):
            png.paste(tile, (c * (tile_w + gap), y + label_h))
    png.save(f"{stem}.png")

    gif_frames = []
    for t in range(frames):
        image, draw = canvas(max(len(videos) * (tile_w + gap), 480), tile_h + label_h)
        for c, (label, video) in enumerate(videos.items()):
            draw.text((c * (tile_w + gap) + 2, 0), label, fill="black")
            image.paste(_to_image(video[t], min_height), (c * (tile_w + gap), label_h))
        gif_frames.append(image)
    gif_frames[0].save(f"{stem}.gif", save_all=True, append_images=gif_frames[1:], duration=round(1000 / fps),
                       loop=0)
    return f"{stem}.png", f"{stem}.gif"
