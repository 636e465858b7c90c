"""Per-frame PSNR/SSIM: closed-form values, symmetry, monotonicity, per-frame localisation."""
import math

import pytest
import torch

from accelpatch.eval.metrics import (
    SSIM_K1,
    VideoQuality,
    compare_videos,
    psnr_per_frame,
    ssim_per_frame,
    ssim_window_size,
)


def _video(seed=0, shape=(1, 4, 3, 32, 32)):
    """A smooth-ish random video in [0, 1] (blurred noise, so SSIM has structure to measure)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64)
    flat = x.reshape(-1, 1, *shape[-2:])
    flat = torch.nn.functional.avg_pool2d(flat, 3, stride=1, padding=1)
    return flat.reshape(shape).clamp(0, 1)


def test_psnr_constant_offset_matches_formula():
    ref = _video().clamp(0.0, 0.8)
    delta = 0.05
    out = psnr_per_frame(ref, ref + delta, data_range=1.0)
    expected = 10.0 * math.log10(1.0 / delta**2)
    assert out.shape == (1, 4)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.full_like(out, expected), rtol=0, atol=1e-9)


def test_psnr_data_range_scales_as_expected():
    ref = torch.zeros(2, 1, 8, 8)
    cand = ref + 2.0
    # MSE 4 on data range 255: 10*log10(255^2/4)
    out = psnr_per_frame(ref, cand, data_range=255.0)
    torch.testing.assert_close(out, torch.full((2,), 10 * math.log10(255.0**2 / 4.0), dtype=torch.float64))


def test_identical_gives_inf_psnr_and_exact_unit_ssim():
    ref = _video(1)
    assert torch.all(torch.isinf(psnr_per_frame(ref, ref.clone())))
    assert torch.all(psnr_per_frame(ref, ref.clone()) > 0)
    s = ssim_per_frame(ref, ref.clone())
    assert torch.equal(s, torch.ones_like(s))
    q = compare_videos(ref, ref.clone())
    assert q.passes and q.min_ssim == 1.0 and math.isinf(q.min_psnr)


def test_ssim_symmetric():
    a = _video(2)
    b = (a + 0.05 * torch.randn(a.shape, generator=torch.Generator().manual_seed(3), dtype=a.dtype)).clamp(0, 1)
    torch.testing.assert_close(
        ssim_per_frame(a, b, data_range=1.0), ssim_per_frame(b, a, data_range=1.0), rtol=0, atol=1e-14
    )


def test_ssim_strictly_decreases_with_noise():
    ref = _video(4, shape=(1, 2, 3, 32, 32))
    noise = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=ref.dtype)
    scores = [ssim_per_frame(ref, ref + s * noise, data_range=1.0) for s in (0.0, 0.01, 0.03, 0.1, 0.3)]
    for hi, lo in zip(scores, scores[1:]):
        assert torch.all(lo < hi), (hi, lo)
    psnrs = [psnr_per_frame(ref, ref + s * noise, data_range=1.0) for s in (0.01, 0.03, 0.1, 0.3)]
    for hi, lo in zip(psnrs, psnrs[1:]):
        assert torch.all(lo < hi)


@pytest.mark.parametrize("a,b", [(0.2, 0.5), (0.9, 0.1), (0.0, 0.3)])
def test_ssim_of_constant_images_is_luminance_term(a, b):
    # For constant images sigma_x = sigma_y = sigma_xy = 0, so the contrast/structure factor
    # is C2/C2 = 1 and SSIM = (2*mu_x*mu_y + C1) / (mu_x^2 + mu_y^2 + C1).
    c1 = (SSIM_K1 * 1.0) ** 2
    expected = (2 * a * b + c1) / (a * a + b * b + c1)
    ref = torch.full((3, 3, 16, 16), a, dtype=torch.float64)
    cand = torch.full((3, 3, 16, 16), b, dtype=torch.float64)
    out = ssim_per_frame(ref, cand, data_range=1.0)
    torch.testing.assert_close(out, torch.full((3,), expected, dtype=torch.float64), rtol=1e-10, atol=1e-12)


def test_small_frames_use_largest_odd_window():
    assert ssim_window_size(32, 32) == 11
    assert ssim_window_size(8, 32) == 7
    assert ssim_window_size(9, 9) == 9
    assert ssim_window_size(1, 5) == 1
    ref = _video(6, shape=(2, 3, 8, 8))
    out = ssim_per_frame(ref, (ref + 0.05).clamp(0, 1), data_range=1.0)
    assert out.shape == (2,) and torch.all(out < 1) and torch.all(out > 0)


def test_corrupting_one_frame_is_localised():
    ref = _video(7, shape=(1, 5, 3, 32, 32))
    cand = ref.clone()
    noise = torch.randn(cand[0, 2].shape, generator=torch.Generator().manual_seed(8), dtype=cand.dtype)
    cand[0, 2] = (cand[0, 2] + 0.3 * noise).clamp(0, 1)
    q = compare_videos(ref, cand)
    assert isinstance(q, VideoQuality)
    assert len(q.ssim) == len(q.psnr) == 5
    for f in (0, 1, 3, 4):
        assert q.ssim[f] == 1.0 and math.isinf(q.psnr[f])
    assert q.ssim[2] < 0.92 and q.psnr[2] < 24.0
    assert not q.passes
    assert q.min_ssim == q.ssim[2] and q.min_psnr == q.psnr[2]
    assert q.worst_ssim_frame == 2 and q.worst_psnr_frame == 2
    assert q.mean_ssim > q.min_ssim
    text = str(q)
    assert "FAIL" in text and "frame 2" in text


def test_gate_uses_minimum_over_frames():
    ref = _video(9, shape=(1, 3, 3, 32, 32))
    cand = ref.clone()
    cand[0, 1] = (cand[0, 1] + 0.01).clamp(0, 1)  # mild: passes both floors
    q = compare_videos(ref, cand)
    assert q.passes and "PASS" in str(q)
    assert not compare_videos(ref, cand, psnr_floor=q.min_psnr + 1.0).passes
    assert not compare_videos(ref, cand, ssim_floor=q.min_ssim + 1e-9).passes


def test_four_dim_layout_and_batch_layout_agree():
    ref = _video(10, shape=(2, 3, 3, 16, 16))
    cand = (ref + 0.02).clamp(0, 1)
    batched = ssim_per_frame(ref, cand, data_range=1.0)
    assert batched.shape == (2, 3)
    torch.testing.assert_close(batched[1], ssim_per_frame(ref[1], cand[1], data_range=1.0))
    q = compare_videos(ref, cand)
    assert q.batch_size == 2 and q.num_frames == 3 and len(q.ssim) == 6


def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"\(1, 2, 3, 8, 8\).*\(1, 2, 3, 8, 6\)"):
        ssim_per_frame(torch.zeros(1, 2, 3, 8, 8), torch.zeros(1, 2, 3, 8, 6))
    with pytest.raises(ValueError, match=r"\(3, 8, 8\)"):
        psnr_per_frame(torch.zeros(3, 8, 8), torch.zeros(3, 8, 8))
    with pytest.raises(ValueError, match=r"\(2, 3, 4, 4\).*\(2, 3, 4, 5\)"):
        compare_videos(torch.zeros(2, 3, 4, 4), torch.zeros(2, 3, 4, 5))


def test_data_range_inference():
    ref = _video(11)
    cand = (ref + 0.05).clamp(0, 1)
    torch.testing.assert_close(psnr_per_frame(ref, cand), psnr_per_frame(ref, cand, data_range=1.0))
    torch.testing.assert_close(
        psnr_per_frame(ref * 2 - 1, cand * 2 - 1), psnr_per_frame(ref, cand, data_range=1.0)
    )
    with pytest.raises(ValueError):
        psnr_per_frame(ref, cand, data_range=0.0)


def test_ssim_and_psnr_equal_scikit_image_to_1e_6():
    """Our SSIM/PSNR are the standard ones: per frame they equal scikit-image's (Gaussian window, sigma 1.5,
    population covariance, channels averaged) to 1e-6."""
    from skimage import metrics as skimage_metrics  # the dev extra installs scikit-image: no skip

    gen = torch.Generator().manual_seed(7)
    reference = torch.rand(2, 3, 3, 24, 20, generator=gen, dtype=torch.float64)
    candidate = (reference + 0.08 * torch.randn(reference.shape, generator=gen, dtype=torch.float64)).clamp(0, 1)
    ours_ssim = ssim_per_frame(reference, candidate, data_range=1.0)
    ours_psnr = psnr_per_frame(reference, candidate, data_range=1.0)
    for b in range(2):
        for f in range(3):
            ref, cand = reference[b, f].numpy(), candidate[b, f].numpy()
            theirs = skimage_metrics.structural_similarity(ref, cand, data_range=1.0, gaussian_weights=True,
                                                           sigma=1.5, use_sample_covariance=False, channel_axis=0)
            assert abs(float(ours_ssim[b, f]) - theirs) < 1e-6
            assert abs(float(ours_psnr[b, f]) - skimage_metrics.peak_signal_noise_ratio(ref, cand, data_range=1.0)) < 1e-6
