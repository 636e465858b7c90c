"""Audio quality: the metrics against an independent numpy implementation on synthetic signals (known SNR, known
delay, silence, clipping, NaN, a corrupted second), and validate's audio gates on the tiny MiniMax-H3 pipeline."""
import json
import math
import warnings

import numpy as np
import pytest
import torch

import accelpatch
from accelpatch import testing
from accelpatch.recipes import Gates
from accelpatch.eval import audio_metrics
from accelpatch.eval.audio_metrics import compare_audio, window_bounds
from accelpatch.eval.candidates import audio_of
from accelpatch.eval.preflight import check_audio_request, pipeline_makes_audio
from accelpatch.eval.validate import validate

SR = 1000  # 1-second windows of 1000 samples; 10 Hz sines fit whole periods in each


# --- an independent implementation of the documented definitions (numpy, float64) -----------------------------

def np_windows(n, sr):
    size = sr
    if n <= size:
        return [(0, n)]
    full, tail = divmod(n, size)
    bounds = [(i * size, (i + 1) * size) for i in range(full)]
    if 2 * tail >= size:
        bounds.append((full * size, n))
    elif tail:
        bounds[-1] = (bounds[-1][0], n)
    return bounds


def np_lsd(ref, cand, floor, sr):
    n_fft = 16
    while n_fft < sr * 0.032:
        n_fft *= 2
    while n_fft > len(ref):
        n_fft //= 2
    hop = max(1, n_fft // 4)
    w = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    out = []
    for i in range(1 + (len(ref) - n_fft) // hop):
        a = slice(i * hop, i * hop + n_fft)
        pr = np.abs(np.fft.rfft(ref[a] * w)) ** 2 / np.sum(w * w)
        pc = np.abs(np.fft.rfft(cand[a] * w)) ** 2 / np.sum(w * w)
        d = 10 * np.log10(np.maximum(pr, floor)) - 10 * np.log10(np.maximum(pc, floor))
        out.append(np.sqrt(np.mean(d * d)))
    return float(np.mean(out))


def np_scores(ref, cand, quiet, sr):
    """(SNR dB, nMSE, LSD dB, corr or None) of one track over one span."""
    p_ref = np.mean(ref ** 2)
    p_err = np.mean((cand - ref) ** 2)
    level = max(p_ref, quiet)
    snr = math.inf if p_err == 0 else 10 * math.log10(level / p_err)
    corr = None
    if p_ref >= quiet and np.std(ref) > 0:
        corr = 0.0 if np.std(cand) == 0 else float(np.corrcoef(ref, cand)[0, 1])
    return snr, p_err / level, np_lsd(ref, cand, quiet, sr), corr


def np_quiet(track):
    p = np.mean(track ** 2)
    return (p if p > 0 else 0.5) * 10 ** (-40 / 10)


def assert_matches_independent(q, reference, candidate, sr, tol=1e-9):
    ref = reference.double().reshape(-1, reference.shape[-1]).numpy()
    cand = candidate.double().reshape(-1, candidate.shape[-1]).numpy()
    bounds = np_windows(ref.shape[1], sr)
    assert q.windows == bounds
    quiet = [np_quiet(t) for t in ref]
    per = [[np_scores(r[a:b], c[a:b], qt, sr) for a, b in bounds] for r, c, qt in zip(ref, cand, quiet)]
    for w in range(len(bounds)):
        assert q.window_snr_db[w] == pytest.approx(min(p[w][0] for p in per), abs=tol)
        assert q.window_nmse[w] == pytest.approx(max(p[w][1] for p in per), abs=tol)
        assert q.window_lsd_db[w] == pytest.approx(max(p[w][2] for p in per), abs=tol)
        corrs = [p[w][3] for p in per if p[w][3] is not None]
        assert (q.window_corr[w] is None) == (not corrs)
        if corrs:
            assert q.window_corr[w] == pytest.approx(min(corrs), abs=tol)
    err = sum(np.mean((c - r) ** 2) for r, c in zip(ref, cand))
    level = sum(max(np.mean(r ** 2), qt) for r, qt in zip(ref, quiet))
    assert q.snr_db == pytest.approx(10 * math.log10(level / err), abs=tol)
    assert q.nmse == pytest.approx(err / level, abs=tol)
    assert q.lsd_db == pytest.approx(np.mean([np_lsd(r, c, qt, sr) for r, c, qt in zip(ref, cand, quiet)]), abs=tol)
    for t, (r, c, qt) in enumerate(zip(ref, cand, quiet)):
        expected = np_scores(r, c, qt, sr)[3]
        assert (q.corr[t] is None) == (expected is None)
        if expected is not None:
            assert q.corr[t] == pytest.approx(expected, abs=tol)
    assert q.min_window_snr_db == pytest.approx(min(q.window_snr_db), abs=tol)
    assert q.worst_window == int(np.argmin(q.window_snr_db))


def sine(seconds, freq=10.0, sr=SR, amplitude=1.0, phase=0.0):
    t = torch.arange(int(round(seconds * sr)), dtype=torch.float64) / sr
    return amplitude * torch.sin(2 * math.pi * freq * t + phase)


def music(seconds, sr=SR, seed=0):
    """Stereo (1, 2, S): a few sines per channel with seeded amplitudes and phases."""
    g = torch.Generator().manual_seed(seed)
    channels = []
    for _ in range(2):
        amps, phases = torch.rand(4, generator=g, dtype=torch.float64), torch.rand(4, generator=g) * 6.28
        channels.append(sum(0.2 * a * sine(seconds, f, sr, phase=float(p))
                            for a, p, f in zip(amps, phases, (10.0, 37.0, 83.0, 151.0))))
    return torch.stack(channels)[None]


def noise_like(x, seed=1):
    return torch.randn(x.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- metrics ---------------------------------------------------------------------------------------------------

def test_a_sine_with_noise_at_20_db_measures_20_db_and_matches_the_independent_implementation():
    ref = sine(4.7)[None]
    noise = noise_like(ref)
    noise *= math.sqrt(float(ref.pow(2).mean()) / float(noise.pow(2).mean()) / 100.0)  # exactly 20 dB
    q = compare_audio(ref.float(), (ref + noise).float(), SR)
    assert q.snr_db == pytest.approx(20.0, abs=0.01)  # float32 inputs: the rounding of the samples
    assert q.nmse == pytest.approx(0.01, rel=2e-3)
    assert all(18.5 < s < 21.5 for s in q.window_snr_db), q.window_snr_db
    # corr of signal + independent noise at SNR s: 1 / sqrt(1 + 10^(-s/10)), up to the sample cross-term
    assert q.corr[0] == pytest.approx(1 / math.sqrt(1.01), abs=3e-3)
    assert_matches_independent(q, ref.float(), (ref + noise).float(), SR)
    assert q.windows == [(0, 1000), (1000, 2000), (2000, 3000), (3000, 4000), (4000, 4700)]


@pytest.mark.parametrize("delay", [1, 10, 25])
def test_a_delayed_sine_loses_the_predicted_correlation_and_snr(delay):
    ref = sine(3.0)
    cand = sine(3.0, phase=-2 * math.pi * 10.0 * delay / SR)  # the same sine, ``delay`` samples later
    phi = 2 * math.pi * 10.0 * delay / SR
    q = compare_audio(ref, cand, SR)
    # whole periods in every window: Pearson's r is cos(phi), P_err = 2 P (1 - cos phi)
    assert q.corr[0] == pytest.approx(math.cos(phi), abs=1e-9)
    assert all(c == pytest.approx(math.cos(phi), abs=1e-9) for c in q.window_corr)
    assert q.snr_db == pytest.approx(-10 * math.log10(2 * (1 - math.cos(phi))), abs=1e-9)
    assert_matches_independent(q, ref, cand, SR)


def test_identical_audio_is_inf_snr_null_in_json_and_never_nan():
    ref = music(2.5)
    q = compare_audio(ref, ref.clone(), SR)
    assert q.identical and q.snr_db == math.inf and q.min_window_snr_db == math.inf
    assert q.nmse == 0.0 and q.lsd_db == 0.0 and q.corr == [1.0, 1.0] and q.min_window_corr == 1.0
    data = json.loads(json.dumps(q.to_dict(), allow_nan=False))
    assert data["snr_db"] is None and data["identical"] is True and data["nonfinite_samples"] == 0
    assert q.gate_failures(snr_floor=60, corr_floor=0.999, lsd_ceiling=0.0) == []


def test_silence_is_scored_against_the_quiet_level_and_correlation_is_undefined_not_nan():
    silent = torch.zeros(2, 2300, dtype=torch.float64)
    same = compare_audio(silent, silent.clone(), SR)
    assert same.identical and same.snr_db == math.inf and same.corr == [None, None] and same.min_window_corr is None
    assert same.min_corr is None and same.gate_failures(snr_floor=10, corr_floor=0.95) == []
    hiss = 1e-4 * noise_like(silent)
    q = compare_audio(silent, hiss, SR)
    # a silent track is scored at 0.5 (a full-scale sine) 40 dB down: 5e-5
    assert q.snr_db == pytest.approx(10 * math.log10(5e-5 / float(hiss.pow(2).mean())), abs=1e-9)
    assert q.corr == [None, None] and all(c is None for c in q.window_corr)
    assert not any(isinstance(v, float) and math.isnan(v) for v in q.to_dict().values())
    assert_matches_independent(q, silent, hiss, SR)
    loud = 1e-2 * noise_like(silent)  # sound where the reference is silent: fails the SNR floor
    assert any("audio_snr_floor" in r for r in compare_audio(silent, loud, SR).gate_failures(snr_floor=10))


def test_a_quiet_second_inside_a_loud_clip_has_no_correlation_and_its_noise_counts_against_the_clip():
    ref = music(3.0)
    ref[..., 1000:2000] *= 1e-4  # -80 dB: quiet
    cand = ref + 1e-6 * noise_like(ref)
    q = compare_audio(ref, cand, SR)
    assert q.window_corr[1] is None and q.window_corr[0] is not None
    assert q.window_snr_db[1] > 40  # 1e-6 noise is far below the quiet level, even though it is near the window's
    assert_matches_independent(q, ref, cand, SR)


def test_clipping_is_scored_as_distortion_and_reported():
    ref = 0.9 * sine(2.0)[None]
    clipped = (1.5 * ref).clamp(-1.0, 1.0)
    q = compare_audio(ref, clipped, SR)
    assert q.reference_clipped == 0.0 and 0.2 < q.candidate_clipped < 0.6
    assert_matches_independent(q, ref, clipped, SR)
    assert q.corr[0] > 0.95  # clipping keeps the shape, but the gain and flat tops cost SNR
    assert q.snr_db < 12


def test_nan_in_the_candidate_fails_in_its_window_and_a_nan_reference_is_refused():
    ref = music(4.0)
    cand = ref + 1e-3 * noise_like(ref)
    cand[0, 1, 2500] = float("nan")
    q = compare_audio(ref, cand, SR)
    assert q.nonfinite_samples == 1 and not q.identical
    assert q.worst_window == 2 and q.window_snr_db[2] == -math.inf and q.window_corr[2] == -1.0
    assert q.snr_db == -math.inf and q.lsd_db == math.inf and q.corr[1] == -1.0
    assert all(math.isfinite(v) for i, v in enumerate(q.window_snr_db) if i != 2)
    assert "1 non-finite (NaN/inf) audio samples" in q.gate_failures(snr_floor=-100)
    json.dumps(q.to_dict(), allow_nan=False)
    with pytest.raises(ValueError, match="reference audio has 1 non-finite"):
        compare_audio(cand, ref, SR)


def test_the_worst_window_is_the_corrupted_second_in_the_middle_of_a_clean_clip():
    ref = music(5.0)
    cand = ref + 1e-4 * noise_like(ref)
    cand[..., 2000:3000] += 0.1 * noise_like(ref, seed=2)[..., 2000:3000]
    q = compare_audio(ref, cand, SR)
    assert q.worst_window == 2 and q.worst_window_seconds == (2.0, 3.0)
    assert q.min_window_snr_db < 10 < min(s for i, s in enumerate(q.window_snr_db) if i != 2)
    assert max(range(5), key=q.window_lsd_db.__getitem__) == 2 and max(range(5), key=q.window_nmse.__getitem__) == 2
    assert min(range(5), key=lambda i: q.window_corr[i]) == 2
    failures = q.gate_failures(snr_floor=10.0, corr_floor=0.95)
    windows = [f for f in failures if "window" in f]
    assert len(windows) == 2 and all(f.startswith("audio 2.00-3.00 s (window 2): ") for f in windows), failures
    assert q.snr_db > q.min_window_snr_db  # the whole clip hides what the worst second shows
    assert_matches_independent(q, ref, cand, SR)


@pytest.mark.parametrize("seconds, expected", [(0.3, [(0, 300)]), (1.0, [(0, 1000)]), (2.4, [(0, 1000), (1000, 2400)]),
                                               (2.6, [(0, 1000), (1000, 2000), (2000, 2600)])])
def test_windows_are_seconds_with_a_long_tail_kept_and_a_short_one_merged(seconds, expected):
    assert window_bounds(int(seconds * SR), SR) == expected


def test_layouts_and_bad_input():
    ref = music(1.5)
    cand = ref + 1e-2 * noise_like(ref)
    batched = compare_audio(ref, cand, SR)
    assert batched.num_tracks == 2 and len(batched.corr) == 2
    assert compare_audio(ref[0, 0], cand[0, 0], SR).corr == pytest.approx(batched.corr[:1])
    assert compare_audio(ref[0], cand[0], SR).snr_db == pytest.approx(batched.snr_db)
    with pytest.raises(ValueError, match=r"shapes differ: reference \(1, 2, 1500\) vs candidate \(1, 1, 1500\)"):
        compare_audio(ref, cand[:, :1], SR)
    with pytest.raises(ValueError, match="sample_rate must be a positive whole number.*got 0"):
        compare_audio(ref, cand, 0)
    with pytest.raises(ValueError, match=r"got shape \(1, 1, 2, 3\)"):
        compare_audio(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3), SR)
    with pytest.raises(ValueError, match="empty"):
        compare_audio(torch.zeros(2, 0), torch.zeros(2, 0), SR)


def test_the_independent_check_catches_a_deliberately_wrong_metric(monkeypatch):
    """The comparison above can fail: a Pearson without centring, or an LSD in natural log, is caught."""
    ref = music(2.0) + 0.05  # a DC offset, so the centring matters
    cand = ref + 1e-2 * noise_like(ref)

    def uncentred(reference, candidate):
        num = (reference * candidate).sum(dim=1)
        den = (reference.pow(2).sum(dim=1) * candidate.pow(2).sum(dim=1)).sqrt()
        return num / den, torch.ones(reference.shape[0], dtype=torch.bool)

    monkeypatch.setattr(audio_metrics, "_pearson", uncentred)
    with pytest.raises(AssertionError):
        assert_matches_independent(compare_audio(ref, cand, SR), ref, cand, SR)
    monkeypatch.undo()
    monkeypatch.setattr(audio_metrics, "_power_spectra",
                        lambda tracks, n_fft: torch.stft(tracks, n_fft, hop_length=n_fft // 4, center=False,
                                                         window=torch.ones(n_fft, dtype=tracks.dtype),
                                                         return_complex=True).abs().pow(2).transpose(1, 2))
    with pytest.raises(AssertionError):  # no Hann window, no normalisation
        assert_matches_independent(compare_audio(ref, cand, SR), ref, cand, SR)
    monkeypatch.undo()
    assert_matches_independent(compare_audio(ref, cand, SR), ref, cand, SR)


# --- validate's audio gates on the tiny MiniMax-H3 pipeline -----------------------------------------------------

@pytest.fixture(scope="module")
def h3():
    """The tiny MiniMax-H3 t2va pipeline and a 2-step call (one transformer forward) at 32x32, 124 frames: its
    stereo audio is 828 samples at 160 Hz (5.2 s: five windows)."""
    torch.set_num_threads(1)
    pipe = testing.tiny_minimax_h3_pipeline()
    kwargs = testing.minimax_h3_pipeline_call_kwargs(num_inference_steps=2, pipeline=pipe)
    kwargs.pop("generator")
    kwargs["output"] = "videos"  # as the recipes call it: validate still asks for the audio
    yield pipe, kwargs
    accelpatch.remove(pipe)


def corrupt_audio_under(monkeypatch, pipe, tier, *, start=320, stop=480, scale=0.2, every=1):
    """Add seeded noise to samples [start, stop) of the audio VAE's output when the call runs under ``tier`` (on
    every ``every``-th such decode): audio made worse on purpose, the video untouched."""
    original = pipe.audio_vae.decode
    calls = []

    def decode(latents, return_dict=True):
        out = original(latents, return_dict=return_dict)
        if accelpatch.current_quality() != tier:
            return out
        calls.append(1)
        if len(calls) % every:
            return out
        wave = out[0] if not return_dict else out.sample
        noise = torch.randn(wave.shape, generator=torch.Generator().manual_seed(7), dtype=wave.dtype)
        wave = wave.clone()
        wave[..., start:stop] += scale * noise[..., start:stop]
        return (wave,) if not return_dict else type(out)(sample=wave)

    monkeypatch.setattr(pipe.audio_vae, "decode", decode)


def quiet_validate(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return validate(*args, progress=False, **kwargs)


def test_the_pipeline_audio_is_read_with_its_sample_rate(h3):
    pipe, kwargs = h3
    assert pipeline_makes_audio(pipe) is True
    state = pipe(**kwargs | {"output": None}, generator=torch.Generator().manual_seed(0))
    audio = audio_of(state, pipe)
    assert audio.sample_rate == 160 == pipe.audio_vae.config.sampling_rate
    assert audio.waveform.shape == (1, 2, 828) and audio.waveform.dtype == torch.float32
    assert audio_of(state.get("videos"), pipe) is None  # a bare video tensor has no audio


def test_audio_corrupted_in_one_second_fails_the_audio_gate_while_the_video_passes(h3, monkeypatch, tmp_path):
    pipe, kwargs = h3
    corrupt_audio_under(monkeypatch, pipe, "high")
    report = quiet_validate(pipe, kwargs, ["lossless", "unpatched", "high"], seeds=(0,))
    lossless, unpatched, high = report.candidates
    # lossless and unpatched: bit-identical, audio included (its SHA-256)
    assert lossless.passed and lossless.gate == "bit-identical" and lossless.identical
    assert unpatched.passed and unpatched.gate == "bit-identical" and unpatched.scores[0].audio_identical
    assert lossless.scores[0].audio_sha256 == lossless.scores[0].reference_audio_sha256 is not None
    assert lossless.min_audio_snr == math.inf and lossless.min_audio_corr == 1.0
    # high: the video is untouched (every frame bit-identical) and passes; the audio fails, in its worst second
    assert high.scores[0].frames_identical and high.min_ssim == 1.0
    assert not high.passed and high.gate == "floors"
    assert not any("frame" in r for r in high.reasons), high.reasons  # only the audio gate fails
    assert any("audio 2.00-3.00 s (window 2): SNR" in r and "below the audio_snr_floor 10.0 dB" in r
               for r in high.reasons), high.reasons
    assert high.min_audio_snr < 10.0 and high.min_audio_corr < 0.95
    assert high.scores[0].audio.worst_window == 2
    assert report.noise_floor.audio_identical is True and not report.passed
    text = str(report)
    assert "min audio SNR" in text and "audio every second SNR >= 10.0 dB and correlation >= 0.95" in text
    assert "worst audio second: seed 0, 2.00-3.00 s" in text
    data = json.loads(report.to_json())
    assert data["candidates"][2]["min_audio_snr_db"] == pytest.approx(high.min_audio_snr)
    assert data["candidates"][0]["min_audio_snr_db"] is None and data["noise_floor"]["audio_identical"] is True
    assert data["candidates"][2]["seeds"][0]["audio"]["worst_window"] == 2
    report.plot(str(tmp_path / "v.png"))
    assert (tmp_path / "v.png").stat().st_size > 0
    # audio: off reports the audio without gating it
    off = quiet_validate(pipe, kwargs, ["high"], seeds=(0,), gates={"audio": "off"})
    assert off.passed and off.candidates[0].min_audio_snr < 10.0 and "audio reported, not gated" in str(off)


def test_a_lossless_candidate_whose_audio_differs_is_not_bit_identical(h3, monkeypatch):
    pipe, kwargs = h3
    corrupt_audio_under(monkeypatch, pipe, "lossless", scale=1e-6)
    report = quiet_validate(pipe, kwargs, ["lossless"], seeds=(0,))
    (lossless,) = report.candidates
    assert lossless.scores[0].frames_identical and not lossless.identical and not lossless.passed
    assert lossless.reasons == ["audio differs from the reference for seeds [0] (a lossless candidate must be "
                                "bit-identical, its audio too)"]


def test_a_reference_whose_audio_does_not_reproduce_shows_its_audio_noise_floor(h3, monkeypatch):
    pipe, kwargs = h3
    corrupt_audio_under(monkeypatch, pipe, "exact", scale=1e-3, every=2)  # every second reference run differs
    report = quiet_validate(pipe, kwargs, ["lossless"], seeds=(0,))
    floor = report.noise_floor
    assert not floor.identical and floor.audio_identical is False and floor.audio_min_snr > 10
    assert "audio min SNR" in floor.describe()
    (lossless,) = report.candidates
    assert lossless.gate == "floors" and lossless.passed  # no bit identity when the reference is not reproducible


def test_explicit_audio_gates_on_a_pipeline_without_audio_are_refused():
    torch.set_num_threads(1)
    pipe = testing.tiny_sana_video_pipeline()
    kwargs = testing.sana_video_pipeline_call_kwargs(num_inference_steps=2)
    kwargs.pop("generator")
    calls = []
    handle = pipe.transformer.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"gates ask for audio gates \(audio_snr_floor=12\.0\), but "
                                             r"SanaVideoPipeline returned no audio \(on the first reference call\)"):
            quiet_validate(pipe, kwargs, ["high"], gates={"audio_snr_floor": 12.0})
        assert len(calls) <= 2  # one reference call (2 steps), no candidate ran
        with pytest.raises(ValueError, match=r"audio: required.*returned no audio"):
            quiet_validate(pipe, kwargs, ["high"], gates=Gates(audio="required"))
        # the defaults gate audio only where there is some: a video-only pipeline validates as before
        report = quiet_validate(pipe, kwargs, ["lossless"])
        assert report.passed and not report.has_audio and "audio" not in str(report)
        assert "min_audio_snr_db" not in report.to_dict()["candidates"][0]
        assert report.candidates[0].min_audio_snr is None and report.candidates[0].min_audio_corr is None
    finally:
        handle.remove()
        accelpatch.remove(pipe)


def test_a_modular_pipeline_that_declares_no_audio_is_refused_before_any_call():
    class Output:
        def __init__(self, name):
            self.name = name

    class Blocks:
        outputs = [Output("videos")]

    class VideoOnly:
        blocks = Blocks()

    assert pipeline_makes_audio(VideoOnly()) is False
    with pytest.raises(ValueError, match=r"audio_corr_floor=0\.9.*VideoOnly returned no audio \(its blocks declare "
                                         r"the outputs videos\)"):
        check_audio_request(VideoOnly(), Gates(audio_corr_floor=0.9))
    check_audio_request(VideoOnly(), Gates())  # the defaults ask for nothing
