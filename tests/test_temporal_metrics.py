"""Quality checks that see time (issue #43): motion ratio, temporal flicker, PSNR drift, degenerate frames and frame 0
against the conditioning image, on synthetic videos whose expected values are worked out here from their geometry,
then the gates in Gates and validate's verdict and report on a tiny Wan pipeline."""
import json
import math
import warnings

import pytest
import torch

import accelpatch
from accelpatch.eval.preflight import parse_gates
from accelpatch.eval.temporal_metrics import (MOTION_EPS, PSNR_DRIFT_CEILING_DB, compare_temporal,
                                              conditioning_images, data_range_of, psnr_drift)
from accelpatch.recipes import Gates

# A square of SIDE x SIDE pixels (value FG) on a BG background, W x H, rolled sideways (wrapping) by `pos` pixels.
# Values are multiples of 1/255 so the frames survive a round trip through an 8-bit PIL image exactly.
H = W = 32
SIDE = 8
BG, FG = 51 / 255, 153 / 255
CONTRAST = FG - BG  # 0.4
STEP = 4  # the reference moves the square 4 pixels per frame
FRAMES = 16
PIXELS = H * W


def square_video(positions, frames_dtype=torch.float32):
    base = torch.full((3, H, W), BG, dtype=frames_dtype)
    base[:, 12:12 + SIDE, 0:SIDE] = FG
    return torch.stack([torch.roll(base, int(p), dims=-1) for p in positions])[None]  # (1, F, 3, H, W)


def reference_video():
    return square_video([STEP * t for t in range(FRAMES)])


def motion_of_shift(shift):
    """Mean |frame_t - frame_t-1| of one pair when the square moves `shift` <= SIDE pixels: 2 * shift columns of
    SIDE rows change by CONTRAST (the leading and the trailing edge), every channel alike."""
    return CONTRAST * 2 * shift * SIDE / PIXELS


def checker(amplitude):
    """+-amplitude on a checkerboard: its MSE is exactly amplitude**2, and it is balanced on any even run of rows."""
    sign = ((torch.arange(H)[:, None] + torch.arange(W)[None]) % 2) * 2 - 1
    return amplitude * sign.to(torch.float32).expand(3, H, W)


DEFAULTS = dict(motion_ratio_min=0.8, motion_ratio_max=1.25, flicker_delta_max=0.01, psnr_drift_max_db=6.0)


def failures(quality, **gates):
    return quality.gate_failures(**{**DEFAULTS, **gates})


def test_the_defaults_are_the_documented_ones():
    g = Gates()
    assert (g.motion_ratio_min, g.motion_ratio_max, g.flicker_delta_max, g.psnr_drift_max_db, g.i2v_image) == \
        (0.8, 1.25, 0.01, 6.0, True)
    assert MOTION_EPS == pytest.approx(0.1 / 255) and PSNR_DRIFT_CEILING_DB == 40.0


def test_an_identical_video_passes_with_ratio_exactly_one_and_delta_zero():
    ref = reference_video()
    q = compare_temporal(ref, ref.clone())
    assert q.motion_ratio == [1.0] and q.flicker_delta == [0.0] and q.psnr_drop_db == [0.0]
    assert q.worst_motion_ratio == 1.0 and q.worst_flicker_delta == 0.0
    assert q.motion_reference[0] == pytest.approx(motion_of_shift(STEP))  # 0.4 * 64 / 1024 = 0.025
    assert q.flicker_reference[0] == pytest.approx(1 - 0.025)  # VBench: (255 - 0.025 * 255) / 255
    assert failures(q) == [] and q.degenerate == []
    assert "motion ratio 1.000, flicker delta +0.0000" in q.describe()


def test_a_clip_frozen_after_frame_two_fails_the_motion_ratio_named():
    ref = reference_video()
    frozen = square_video([0, STEP, 2 * STEP] + [2 * STEP] * (FRAMES - 3))  # moves in pairs 1 and 2 only
    q = compare_temporal(ref, frozen)
    m = motion_of_shift(STEP)
    expected = (m * 2 / (FRAMES - 1) + MOTION_EPS) / (m + MOTION_EPS)  # ~0.147
    assert q.motion_ratio[0] == pytest.approx(expected, rel=1e-6) and expected < 0.2
    assert any(line.startswith(f"motion ratio {expected:.2f} outside [0.8, 1.25] (static") for line in failures(q))
    # reported but not gated when the band is off
    assert not any("motion ratio" in line for line in failures(q, motion_ratio_min=None, motion_ratio_max=None))


def test_a_sped_up_clip_every_other_frame_fails_with_a_ratio_near_two():
    ref = reference_video()
    fast = square_video([2 * STEP * t for t in range(FRAMES)])  # every other frame of the same motion
    q = compare_temporal(ref, fast)
    expected = (motion_of_shift(2 * STEP) + MOTION_EPS) / (motion_of_shift(STEP) + MOTION_EPS)
    assert q.motion_ratio[0] == pytest.approx(expected, rel=1e-6) and 1.95 < expected < 2.0
    assert any(line.startswith(f"motion ratio {expected:.2f} outside [0.8, 1.25] (sped-up") for line in failures(q))


def test_alternating_brightness_flicker_fails_the_flicker_delta():
    ref = reference_video()
    delta = 0.05
    flicker = ref.clone()
    flicker[:, 1::2] += delta  # odd frames brighter
    q = compare_temporal(ref, flicker)
    # Every pair now differs by delta on the pixels the square leaves alone; on the moving edges |0.4 +- delta|
    # averages 0.4 (as many leading as trailing edge pixels), so the motion energy grows by delta * unchanged share.
    unchanged = (PIXELS - 2 * STEP * SIDE) / PIXELS
    assert q.flicker_delta[0] == pytest.approx(-delta * unchanged, rel=1e-5)  # -0.046875
    assert q.flicker_candidate[0] == pytest.approx(1 - motion_of_shift(STEP) - delta * unchanged, rel=1e-5)
    lines = failures(q)
    assert any(line.startswith("temporal flicker delta -0.0469 below -0.01") for line in lines), lines
    assert not any("flicker delta" in line for line in failures(q, flicker_delta_max=0.05))


def test_noise_growing_over_the_clip_fails_the_drift_alone():
    ref = reference_video()
    # frame t gets a checkerboard whose PSNR falls linearly from 36 dB to 24 dB: MSE = a**2 exactly
    psnr = [36.0 - 12.0 * t / (FRAMES - 1) for t in range(FRAMES)]
    drifting = ref.clone()
    for t, p in enumerate(psnr):
        drifting[0, t] += checker(10 ** (-p / 20))
    q = compare_temporal(ref, drifting)
    quarter = FRAMES // 4
    expected_drop = sum(psnr[:quarter]) / quarter - sum(psnr[-quarter:]) / quarter  # 34.8 - 25.2 = 9.6 dB
    assert expected_drop == pytest.approx(9.6)
    assert q.psnr_drop_db[0] == pytest.approx(expected_drop, abs=1e-4)
    assert q.psnr_slope_db[0] == pytest.approx(-12.0 / (FRAMES - 1), abs=1e-5)  # -0.8 dB per frame
    lines = failures(q)
    assert lines == [f"PSNR drift: falls 9.60 dB from the first to the last quarter of the clip, more than 6.0 dB "
                     f"(slope -0.800 dB/frame)"], lines  # the motion and the flicker stay within their gates
    assert failures(q, psnr_drift_max_db=10.0) == []


def test_psnr_drift_by_hand_caps_identical_frames_at_the_ceiling():
    slope, drop = psnr_drift([math.inf, 50.0, 34.0, 30.0])  # capped: 40, 40, 34, 30
    assert drop == pytest.approx(10.0)  # one frame per quarter: 40 - 30
    t_mean, p_mean = 1.5, 36.0
    expected = sum((t - t_mean) * (p - p_mean) for t, p in enumerate([40, 40, 34, 30])) / 5.0
    assert slope == pytest.approx(expected)  # -3.6 dB/frame
    assert psnr_drift([math.inf, math.inf]) == (0.0, 0.0)


def test_a_black_frame_fails_naming_its_index():
    ref = reference_video()
    cand = ref.clone()
    cand[0, 5] = 0.0
    q = compare_temporal(ref, cand)
    assert [(v, f) for v, f, _ in q.degenerate] == [(0, 5)]
    assert any(line.startswith("degenerate frame 5: black") for line in failures(q)), failures(q)
    # degenerate frames always fail, whatever the other gates
    assert any("degenerate frame 5" in line for line in failures(q, motion_ratio_min=None, motion_ratio_max=None,
                                                                   flicker_delta_max=None, psnr_drift_max_db=None))


def test_a_nan_frame_and_a_constant_frame_fail():
    ref = reference_video()
    cand = ref.clone()
    cand[0, 3] = float("nan")
    cand[0, 9] = 0.5
    q = compare_temporal(ref, cand)
    lines = failures(q)
    assert lines[0].startswith("degenerate frame 3: NaN/inf values") and lines[1].startswith(
        "degenerate frame 9: constant"), lines
    assert q.nonfinite_videos == [0] and len(lines) == 2  # NaN motion/drift are not judged twice


def test_a_frame_degenerate_in_the_reference_too_is_not_a_failure():
    ref = reference_video()
    ref[0, 4] = 0.0  # a cut to black in the reference itself
    cand = ref.clone()
    cand[0, 4] = float("nan")
    assert compare_temporal(ref, cand).degenerate == []


def test_a_one_frame_video_is_not_applicable_not_a_failure():
    ref = reference_video()[:, :1]
    q = compare_temporal(ref, ref.clone() + checker(0.001))
    assert q.one_frame and q.motion_ratio == [] and q.worst_motion_ratio is None and q.psnr_drop_db == []
    assert q.describe().startswith("n/a (one frame)")
    assert failures(q) == []
    assert q.to_dict()["one_frame"] is True


def test_image_to_video_frame_zero_that_loses_the_image_fails():
    ref = reference_video()
    image = ref[0, 0].clone()  # the reference's frame 0 is the conditioning image
    cand = ref.clone()
    cand[0, 0] += checker(0.1)  # 20 dB against the image (and against the reference's frame 0)
    q = compare_temporal(ref, cand, images=conditioning_images(image))
    (f0,) = q.frame0
    assert f0.reference_psnr == math.inf and f0.reference_ssim == pytest.approx(1.0)
    assert f0.candidate_psnr == pytest.approx(20.0, abs=1e-5) and f0.vs_reference_psnr == pytest.approx(20.0, abs=1e-5)
    lines = q.gate_failures(i2v_image=True, ssim_floor=0.92, psnr_floor=24.0)
    # reference exact: the bound is the per-frame floor itself, -10 log10(0 + 10^-2.4) = 24 dB
    assert any(line.startswith("frame 0 vs the conditioning image: PSNR 20.00 dB below 24.00 dB") for line in lines)
    assert q.gate_failures(i2v_image=False, ssim_floor=0.92, psnr_floor=24.0) == []
    # a candidate 50 dB from the image passes: 10^-5 + 0 <= 10^-2.4, and on these flat frames its SSIM stays above
    # 0.92 (a +-0.01 checkerboard would not: 0.9197, as it would not pass the per-frame floor either)
    close = ref.clone()
    close[0, 0] += checker(0.003)
    assert compare_temporal(ref, close, images=conditioning_images(image)).gate_failures(
        i2v_image=True, ssim_floor=0.92, psnr_floor=24.0) == []


def test_image_to_video_bound_adds_error_power_to_the_references():
    ref = reference_video()
    image = ref[0, 0] + checker(10 ** (-30 / 20))  # the reference's frame 0 is 30 dB from the image
    # allowed: MSE <= 10^-3 + 10^-2.4 -> 23.03 dB
    bound = -10 * math.log10(10 ** -3 + 10 ** -2.4)
    worse = ref.clone()
    worse[0, 0] -= checker(10 ** (-22 / 20))  # moves away from the image: |a + b| = 0.0316 + 0.0794
    q = compare_temporal(ref, worse, images=conditioning_images(image))
    expected = -20 * math.log10(10 ** (-30 / 20) + 10 ** (-22 / 20))  # 19.11 dB
    assert q.frame0[0].candidate_psnr == pytest.approx(expected, abs=1e-4) and expected < bound
    assert any(f"PSNR {expected:.2f} dB below {bound:.2f} dB" in line for line in q.gate_failures(
        i2v_image=True, ssim_floor=0.0, psnr_floor=24.0))


def test_conditioning_images_read_pil_arrays_and_tensors_on_the_unit_scale():
    from PIL import Image

    frame = reference_video()[0, 0]
    as_uint8 = (frame.permute(1, 2, 0) * 255).round().to(torch.uint8)
    pil = Image.fromarray(as_uint8.numpy())
    for image in (pil, as_uint8.numpy(), as_uint8, frame * 2 - 1, [frame]):
        (read,) = conditioning_images(image)
        assert read.shape == (3, H, W) and torch.allclose(read, frame.double(), atol=1e-6), type(image)
    assert conditioning_images(None) is None and conditioning_images("a prompt") is None
    # another size is resized to the frame's
    q = compare_temporal(reference_video(), reference_video(), images=conditioning_images(pil.resize((64, 64))))
    assert q.frame0[0].candidate_psnr > 30.0 and q.frame0[0].vs_reference_psnr == math.inf


def test_data_range_follows_the_reference():
    assert data_range_of(torch.tensor([0.2, 0.9])) == (0.0, 1.0)
    assert data_range_of(torch.tensor([-0.5, 0.9])) == (-1.0, 2.0)
    assert data_range_of(torch.tensor([0, 255], dtype=torch.uint8)) == (0.0, 255.0)
    assert data_range_of(torch.tensor([10.0, 30.0, float("nan")])) == (10.0, 20.0)
    # a [-1, 1] video: black is -1, and the motion energy is in units of the range 2
    ref = reference_video() * 2 - 1
    cand = ref.clone()
    cand[0, 2] = -1.0
    q = compare_temporal(ref, cand)
    assert q.degenerate[0][:2] == (0, 2) and q.degenerate[0][2].startswith("black")
    assert q.motion_reference[0] == pytest.approx(motion_of_shift(STEP))


def test_batched_videos_are_judged_per_video():
    ref = torch.cat([reference_video(), reference_video()])
    cand = ref.clone()
    cand[1] = square_video([0] * FRAMES)[0]  # the second video is still
    q = compare_temporal(ref, cand)
    assert q.motion_ratio[0] == 1.0 and q.motion_ratio[1] < 0.1
    assert any(line.startswith("video 1: motion ratio") for line in failures(q))


@pytest.mark.parametrize("gates, message", [
    ({"motion_ratio_min": 1.5}, "motion_ratio_min: the motion ratio band's lower end must be in (0, 1]"),
    ({"motion_ratio_min": 0}, "motion_ratio_min: the motion ratio band's lower end must be in (0, 1]"),
    ({"motion_ratio_max": 0.9}, "motion_ratio_max: the motion ratio band's upper end must be at least 1"),
    ({"flicker_delta_max": -0.1}, "flicker_delta_max: Input should be greater than or equal to 0"),
    ({"psnr_drift_max_db": float("nan")}, "psnr_drift_max_db: Input should be a finite number"),
    ({"motion_ratio_mn": 0.5}, "did you mean 'motion_ratio_min'?"),
])
def test_bad_temporal_gates_are_refused_with_the_field_named(gates, message):
    with pytest.raises(ValueError, match="bad gates: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_gates(gates)
    nulls = parse_gates({"motion_ratio_min": None, "motion_ratio_max": None, "flicker_delta_max": None,
                         "psnr_drift_max_db": None, "i2v_image": False})
    assert nulls.motion_ratio_min is None and not nulls.i2v_image


# --- validate end to end on a tiny Wan pipeline ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def wan():
    from accelpatch.testing import tiny_wan_pipeline, wan_pipeline_call_kwargs

    torch.set_num_threads(1)
    pipe = tiny_wan_pipeline()
    kwargs = wan_pipeline_call_kwargs(height=64, width=64, num_frames=9)
    kwargs.pop("generator")
    yield pipe, kwargs
    accelpatch.remove(pipe)


def _validate(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return accelpatch.validate(*args, progress=False, **kwargs)


def test_validate_reports_the_temporal_checks_and_a_lossless_candidate_passes_with_ratio_one(wan, monkeypatch):
    pipe, kwargs = wan
    processor = pipe.video_processor
    original = processor.postprocess_video

    def frozen_under_high(video, *args, **kw):  # a "high" candidate whose clip stops after frame 1
        frames = original(video, *args, **kw)
        if accelpatch.current_quality() == "high":
            frames = frames.clone()
            frames[:, 2:] = frames[:, 1:2]
        return frames

    monkeypatch.setattr(processor, "postprocess_video", frozen_under_high)
    report = _validate(pipe, kwargs, ["lossless", "high"], gates={"ssim_floor": 0.0, "psnr_floor": 0.0})
    lossless, high = report.candidates
    assert lossless.passed and lossless.gate == "bit-identical"
    assert lossless.temporal.motion_ratio == 1.0 and lossless.temporal.flicker_delta == 0.0
    assert lossless.temporal.psnr_drop_db == 0.0 and lossless.temporal.degenerate == []
    # the floors are off: only the temporal check sees the frozen clip, and names it
    assert not high.passed and high.gate == "floors"
    assert any(r.startswith("seed 0: motion ratio") and "outside [0.8, 1.25] (static" in r for r in high.reasons), \
        high.reasons
    text = str(report)
    assert "  temporal gates: motion ratio in [0.8, 1.25], flicker delta >= -0.01, PSNR drift <= 6.0 dB" in text
    assert ("    temporal (worst over seeds): motion ratio 1.000, flicker delta +0.0000, PSNR drift 0.00 dB first to "
            "last quarter (+0.000 dB/frame), degenerate frames none") in text
    assert ("  reference noise floor over time (second run vs first): motion ratio 1.000, flicker delta +0.0000"
            in text)
    data = json.loads(report.to_json())
    assert data["candidates"][0]["temporal"]["motion_ratio"] == 1.0
    assert data["candidates"][1]["temporal"]["motion_ratio"] < 0.8
    assert data["candidates"][0]["seeds"][0]["temporal"]["motion_ratio"] == [1.0]
    assert data["noise_floor"]["temporal"]["flicker_delta"] == 0.0
    assert data["gates"]["motion_ratio_min"] == 0.8
    # the same band off: the frozen candidate passes, its ratio still reported
    loose = _validate(pipe, kwargs, ["high"], gates={"ssim_floor": 0.0, "psnr_floor": 0.0, "motion_ratio_min": None,
                                                    "psnr_drift_max_db": None}, references=report.references)
    assert loose.passed and loose.candidates[0].temporal.motion_ratio < 0.8
    assert "temporal gates: motion ratio in [0, 1.25]" in str(loose)


def test_validate_on_a_one_frame_video_reads_not_applicable(wan):
    pipe, kwargs = wan
    report = _validate(pipe, {**kwargs, "num_frames": 1}, ["lossless"])
    assert report.passed
    assert "    temporal (worst over seeds): n/a (one frame), degenerate frames none" in str(report)
    assert json.loads(report.to_json())["candidates"][0]["temporal"]["one_frame"] is True


def test_validate_fails_a_nan_frame_by_name_and_still_writes_strict_json(wan, monkeypatch):
    pipe, kwargs = wan
    processor = pipe.video_processor
    original = processor.postprocess_video

    def nan_under_high(video, *args, **kw):
        frames = original(video, *args, **kw)
        if accelpatch.current_quality() == "high":
            frames = frames.clone()
            frames[:, 2] = float("nan")
        return frames

    monkeypatch.setattr(processor, "postprocess_video", nan_under_high)
    report = _validate(pipe, kwargs, ["high"])
    (high,) = report.candidates
    assert not high.passed
    assert "seed 0: degenerate frame 2: NaN/inf values (the reference's frame 2 is not)" in high.reasons
    assert any("frame 2: SSIM nan" in r and "below the floors" in r for r in high.reasons), high.reasons
    assert "degenerate frames 1 (seed 0 frame 2: NaN/inf values)" in str(report)
    data = json.loads(report.to_json())  # strict JSON: NaN scores are null
    assert data["candidates"][0]["seeds"][0]["ssim"][2] is None
    assert data["candidates"][0]["temporal"]["degenerate"] == [{"seed": 0, "video": 0, "frame": 2,
                                                               "why": "NaN/inf values"}]


def test_validate_image_to_video_reports_frame_zero_against_the_image_and_fails_a_lost_one(monkeypatch):
    """WanAnimatePipeline takes an ``image``: frame 0 is scored against it for the reference and each candidate."""
    import numpy as np

    from accelpatch.testing import tiny_wan_animate_pipeline, wan_animate_pipeline_call_kwargs

    torch.set_num_threads(1)
    pipe = tiny_wan_animate_pipeline()
    kwargs = wan_animate_pipeline_call_kwargs(height=64, width=64)
    kwargs.pop("generator")
    image = torch.from_numpy(np.asarray(kwargs["image"], dtype=np.float32) / 255.0).permute(2, 0, 1)
    processor = pipe.video_processor
    original = processor.postprocess_video

    def lost_under_high(video, *args, **kw):  # the high candidate's frame 0 is the image's negative
        frames = original(video, *args, **kw)
        if accelpatch.current_quality() == "high":
            frames = frames.clone()
            frames[:, 0] = 1.0 - image
        return frames

    monkeypatch.setattr(processor, "postprocess_video", lost_under_high)
    try:
        report = _validate(pipe, kwargs, ["lossless", "high"])
    finally:
        accelpatch.remove(pipe)
    lossless, high = report.candidates
    assert lossless.passed
    seed, f0 = lossless.temporal.frame0
    assert f0.candidate_psnr == f0.reference_psnr and f0.vs_reference_psnr == math.inf
    # the negative of a uniform random image: MSE = E[(1 - 2x)^2] = 1/3 -> about 4.8 dB; allowed: at least
    # -10 log10(10^(-ref/10) + 10^-2.4), above 9 dB for any reference at 10 dB or more from the image
    seed, f0 = high.temporal.frame0
    assert f0.candidate_psnr == pytest.approx(-10 * math.log10(1 / 3), abs=0.3)
    assert f0.reference_psnr > 10.0
    assert not high.passed
    assert any(r.startswith("seed 0: frame 0 vs the conditioning image: PSNR") for r in high.reasons), high.reasons
    text = str(report)
    assert "    frame 0 vs the conditioning image: PSNR" in text and "vs the reference's frame 0: PSNR inf dB" in text
    data = json.loads(report.to_json())
    assert data["candidates"][0]["temporal"]["frame0_image"]["vs_reference_psnr"] is None  # inf: null
    assert data["noise_floor"]["temporal"]["frame0_image"]["seed"] == 0
