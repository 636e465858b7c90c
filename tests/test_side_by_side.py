"""accelpatch.eval.plots.side_by_side: the PNG and GIF a person opens to see exact | lossless | high (issue #43,
part 3). Read back with Pillow: the GIF plays every frame, the tiles hold the videos' own pixels in their places,
and the notes are drawn."""
import pytest
import torch
from PIL import Image

from accelpatch.eval.plots import side_by_side

FRAMES, H, W = 6, 32, 48


def _video(colour):
    video = torch.zeros(FRAMES, 3, H, W)
    for t in range(FRAMES):  # a bar that moves right one column block per frame
        video[t, :, :, t * 8:(t + 1) * 8] = torch.tensor(colour).view(3, 1, 1)
    return video


def test_side_by_side_writes_a_png_strip_and_a_gif_that_plays_every_frame(tmp_path):
    videos = {"exact": _video([1.0, 0, 0]), "high": _video([0, 0, 1.0])}
    png, gif = side_by_side(videos, str(tmp_path / "wan"), notes=["SSIM 0.99", "motion ratio 1.00"], columns=3,
                            min_height=64)
    assert (png, gif) == (str(tmp_path / "wan.png"), str(tmp_path / "wan.gif"))
    animation = Image.open(gif)
    assert animation.n_frames == FRAMES
    label_h, gap = 16, 4
    for t in (0, FRAMES - 1):
        animation.seek(t)
        frame = animation.convert("RGB")
        # tile 1 (exact) is upscaled 2x: the red bar of frame t sits at columns 16t..16t+15, 2x rows
        assert frame.getpixel((16 * t + 8, label_h + 10)) == (255, 0, 0)
        assert frame.getpixel((W * 2 + gap + 16 * t + 8, label_h + 10)) == (0, 0, 255)
        assert frame.getpixel(((16 * t + 40) % 96, label_h + 10)) == (0, 0, 0)  # not the bar: black
    strip = Image.open(png).convert("RGB")
    # rows: exact, then high; columns: frames 0, 2 (round(2.5)), 5
    assert strip.getpixel((8, label_h + 10)) == (255, 0, 0)
    assert strip.getpixel((8, 2 * label_h + gap + 64 + 10)) == (0, 0, 255)
    notes_area = strip.crop((0, strip.height - 30, strip.width, strip.height))
    assert min(notes_area.convert("L").getextrema()) < 128  # the notes are drawn (dark text on white)


def test_side_by_side_refuses_videos_of_different_lengths_and_nothing(tmp_path):
    with pytest.raises(ValueError, match="different frame counts"):
        side_by_side({"exact": _video([1.0, 0, 0]), "high": _video([1.0, 0, 0])[:3]}, str(tmp_path / "x"))
    with pytest.raises(ValueError, match="at least one video"):
        side_by_side({}, str(tmp_path / "x"))
