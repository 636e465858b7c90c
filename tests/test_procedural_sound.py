"""The procedural clips' sound (accelpatch.tiny_models.sound, issue #43's audio families): its pitch, loudness and
stereo position follow what the picture does, and the reader hears them.

The reader is checked first on signals written here from formulas (a sine of known frequency, level and side); then
the rendered sound is read and compared with the clip's own ground truth (the shape's centre and size per frame),
converted by the documented mapping written out here, never by the renderer's helpers."""
import math

import pytest
import torch

from accelpatch.tiny_models.procedural import make_clip
from accelpatch.tiny_models.sound import FPS, SAMPLE_RATE, procedural_sound, read_sound


def test_the_reader_hears_a_sines_frequency_level_and_side():
    seconds = torch.arange(SAMPLE_RATE, dtype=torch.float64) / SAMPLE_RATE
    sine = 0.5 * torch.sin(2 * math.pi * 437.0 * seconds)
    reading = read_sound(torch.stack([sine * 0.0, sine]), frames=8)
    assert all(abs(p - 437.0) < 0.005 * 437.0 for p in reading.pitch), reading.pitch
    assert all(abs(level - 0.25 / math.sqrt(2)) < 0.01 for level in reading.level)  # the mono mix: half of one side
    assert reading.pan == (1.0,) * 8 and reading.pitch_octaves == pytest.approx(0.0, abs=1e-3)
    rising = torch.sin(2 * math.pi * torch.cumsum(220.0 * 2 ** (seconds * 2), 0) / SAMPLE_RATE)  # 220 -> 880 Hz
    # quarter means, the first 2 frames' windows (centres 1/16 and 3/16 s: 240 and 285 Hz) against the last 2's
    # (676 and 806 Hz): log2(741 / 262) = 1.50 octaves
    assert 1.45 < read_sound(rising, frames=8).pitch_octaves < 1.55
    silent = read_sound(torch.zeros(2, 1600), frames=4)
    assert silent.pitch == (None,) * 4 and silent.pitch_octaves is None


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("prompt, octaves, level, pan", [
    ("a red square moves up", (0.5, 2.0), (0.9, 1.1), (-0.05, 0.05)),
    ("a red square moves down", (-2.0, -0.5), (0.9, 1.1), (-0.05, 0.05)),
    ("a blue circle moves left", (-0.05, 0.05), (0.9, 1.1), (-1.0, -0.3)),
    ("a blue circle moves right", (-0.05, 0.05), (0.9, 1.1), (0.3, 1.0)),
    ("a green square grows", (-0.05, 0.05), (1.4, 4.0), (-0.05, 0.05)),
    ("a green square shrinks", (-0.05, 0.05), (0.2, 0.7), (-0.05, 0.05)),
    ("camera zooms in over cat", (-0.05, 0.05), (1.2, 4.0), (-0.05, 0.05)),
    ("camera zooms out over cat", (-0.05, 0.05), (0.25, 0.85), (-0.05, 0.05)),
    ("camera pans left over rocket", (-0.05, 0.05), (0.9, 1.1), (-1.0, -0.15)),
    ("camera pans right over rocket", (-0.05, 0.05), (0.9, 1.1), (0.15, 1.0)),
])
def test_the_sound_does_what_the_prompt_says(prompt, octaves, level, pan, seed):
    """Up rises and down falls in pitch, left and right pan, growing and zooming in swell; what the prompt does not
    ask for stays flat (octaves over the clip, level ratio, pan change: last quarter against the first)."""
    clip = make_clip(prompt, seed)
    reading = read_sound(procedural_sound(clip), clip.frames)
    assert octaves[0] < reading.pitch_octaves < octaves[1], reading
    assert level[0] < reading.level_ratio < level[1], reading
    assert pan[0] < reading.pan_change < pan[1], reading


@pytest.mark.parametrize("prompt", ["a red square moves up", "a yellow circle bounces", "a blue square grows"])
def test_a_shapes_pitch_follows_its_height_frame_by_frame(prompt):
    """The clip's ground truth, mapped as documented (220 Hz at the bottom, two octaves up at the top), against the
    pitch heard in each frame's window (the tone glides, so a window hears about its centre's pitch; within a tenth
    of an octave: a bounce turns inside a window)."""
    clip = make_clip(prompt, 4)
    heard = read_sound(procedural_sound(clip), clip.frames).pitch
    for frame, ((_, y), pitch) in enumerate(zip(clip.centres, heard)):
        expected = 220.0 * 4.0 ** (1.0 - y / clip.height)
        assert abs(math.log2(pitch / expected)) < 0.1, (frame, pitch, expected)


def test_the_sound_is_seeded_bounded_and_timed_to_the_frames():
    clip = make_clip("a red circle moves right", 7)
    stereo = procedural_sound(clip)
    assert stereo.shape == (2, round(clip.frames / FPS * SAMPLE_RATE)) and stereo.dtype == torch.float32
    assert torch.equal(stereo, procedural_sound(make_clip("a red circle moves right", 7)))
    assert not torch.equal(stereo, procedural_sound(make_clip("a red circle moves right", 8)))
    assert float(stereo.abs().max()) <= 1.0 and float(stereo.abs().max()) > 0.1
    mono = procedural_sound(clip, channels=1, sample_rate=8000, fps=4.0)
    assert mono.shape == (1, round(clip.frames / 4.0 * 8000)) and read_sound(mono, clip.frames).pan_change == 0.0
    # no clicks: the phase runs on between frames, so no sample jumps more than the top pitch's slope allows
    assert float(stereo.diff(dim=1).abs().max()) < 2 * math.pi * 900.0 / SAMPLE_RATE


def test_bad_arguments_are_refused_with_the_valid_choices():
    clip = make_clip("a red circle grows", 0)
    with pytest.raises(ValueError, match=r"channels=3: the procedural sound is mono \(1\) or stereo \(2\)"):
        procedural_sound(clip, channels=3)
    with pytest.raises(ValueError, match="fps=0 and sample_rate=16000 must be positive"):
        procedural_sound(clip, fps=0)
    with pytest.raises(ValueError, match=r"audio of shape \(2, 3\): expected \(channels, samples\) with at least 13"):
        read_sound(torch.zeros(2, 3), 13)
