"""validate, bench and the timing statistics: gates that pass and fail when they should, honest speed verdicts,
JSON that programs can read, and a pipeline left exactly as it came."""
import json
import math
import random
import warnings

import pytest
import torch

import accelpatch
from accelpatch import testing
from accelpatch.eval.bench import bench
from accelpatch.eval.stats import compare_timings, summarize
from accelpatch.eval.validate import validate
from accelpatch.eval.validate_scores import video_sha256


@pytest.fixture(scope="module")
def sana():
    """A tiny SANA-Video pipeline (release head dims) and the kwargs of a 2-step call, without a generator."""
    torch.set_num_threads(1)
    pipe = testing.tiny_sana_video_pipeline(transformer_config=testing.SANA_VIDEO_RELEASE_LIKE_CONFIG)
    kwargs = testing.sana_video_pipeline_call_kwargs(num_inference_steps=2)
    kwargs.pop("generator")
    yield pipe, kwargs
    accelpatch.remove(pipe)


def quiet_validate(*args, hooks=(), **kwargs):
    """validate() with the apply-time CPU warnings silenced, and forward ``hooks`` removed afterwards."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return validate(*args, progress=False, **kwargs)
    finally:
        for handle in hooks:
            handle.remove()


def perturb_under(pipe, tier: str, scale: float):
    """A forward hook that adds ``scale`` * noise to the transformer's output when the call runs under ``tier``:
    a candidate built to differ from the reference by a known amount."""
    def hook(module, args, output):
        if accelpatch.current_quality() != tier:
            return output
        sample = output[0]
        noise = torch.randn(sample.shape, generator=torch.Generator().manual_seed(1), dtype=sample.dtype)
        return (sample + scale * noise,) + tuple(output[1:])
    return pipe.transformer.register_forward_hook(hook)


# --- statistics -----------------------------------------------------------------------------------------------

def test_identical_timing_distributions_are_called_noise():
    rng = random.Random(0)
    base = [1.0 + rng.gauss(0, 0.05) for _ in range(9)]
    cand = [1.0 + rng.gauss(0, 0.05) for _ in range(9)]
    comparison = compare_timings(base, cand)
    assert not comparison.distinguishable
    assert comparison.describe().startswith("not distinguishable from noise")


def test_a_real_twofold_speedup_is_distinguishable_with_an_interval_around_it():
    rng = random.Random(1)
    base = [2.0 + rng.gauss(0, 0.05) for _ in range(9)]
    cand = [1.0 + rng.gauss(0, 0.03) for _ in range(9)]
    comparison = compare_timings(base, cand)
    assert comparison.distinguishable and comparison.paired
    assert comparison.low < comparison.speedup < comparison.high
    assert 1.8 < comparison.low and comparison.high < 2.2
    assert comparison.describe().startswith(f"{comparison.speedup:.2f}x faster")
    slower = compare_timings(cand, base)
    assert slower.distinguishable and "slower" in slower.describe()


def test_the_median_interval_is_distribution_free_and_needs_six_rounds():
    from accelpatch.eval.stats import median_interval

    assert median_interval([1, 2, 3, 4, 5]) == (-math.inf, math.inf)  # P(all 5 on one side) = 1/16 > 5 %
    assert median_interval([1, 2, 3, 4, 5, 6]) == (1.0, 6.0)
    assert median_interval(list(range(12))) == (2.0, 9.0)  # P(Binomial(12, 1/2) <= 2) = 1.9 % <= 2.5 %
    # identical code, many simulated runs of 6-12 rounds: at most ~5 % are called faster or slower
    rng = random.Random(3)
    wrong = sum(compare_timings([1 + rng.gauss(0, 0.1) for _ in range(n)],
                                [1 + rng.gauss(0, 0.1) for _ in range(n)]).distinguishable
                for n in (6, 7, 9, 12) for _ in range(500))
    assert wrong / 2000 <= 0.06


def test_statistics_reject_bad_samples():
    with pytest.raises(ValueError, match="no timing samples"):
        summarize([])
    with pytest.raises(ValueError, match="finite and non-negative"):
        summarize([1.0, math.nan])
    with pytest.raises(ValueError, match="confidence"):
        compare_timings([1.0, 1.0], [1.0, 1.0], confidence=1.5)
    assert summarize([3.0, 1.0, 2.0, 4.0]).median == 2.5


# --- validate ---------------------------------------------------------------------------------------------------

def test_validate_passes_bit_identical_tiers_and_reports_the_cpu_fallback(sana, tmp_path):
    pipe, kwargs = sana
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = validate(pipe, kwargs, ["lossless", "high", "unpatched"], seeds=(0, 1), progress=False)
    assert report.passed and report.noise_floor.identical
    lossless, high, unpatched = report.candidates
    assert lossless.gate == "bit-identical" and lossless.identical
    assert unpatched.gate == "bit-identical" and unpatched.identical
    # On a CPU-only torch the BF16 GEMM never mounts: the verdict says so instead of claiming the fast path passed.
    # The lossless fused sites run under quality("high") too (2 blocks x 2 sites, 2 steps, 2 seeds), bit for bit;
    # they are counted apart and never pass for the high path.
    assert high.fast_by_tier == lossless.fast_by_tier == {"lossless": 16}
    assert high.fast_by_kind == {"sana_video_fused_block": 8, "sana_video_fused_linear_attention": 8}
    assert sum(high.fallbacks.values()) > 0
    assert any(reason.startswith("no fast path ran at tier high") for reason in high.reasons), high.reasons
    assert "CUDA is unavailable" in str(report)
    # The digests really are of the frames: a fresh exact call hashes to the reference's digest.
    fresh = pipe(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    assert high.scores[0].reference_sha256 == video_sha256(fresh)
    data = json.loads(report.to_json(str(tmp_path / "v.json")))
    assert data["kind"] == "accelpatch.validate" and data["passed"] is True
    assert [c["label"] for c in data["candidates"]] == ["lossless", "high", "unpatched"]
    assert data["candidates"][0]["seeds"][0]["psnr"][0] is None  # identical frames: inf, written as null
    assert json.loads((tmp_path / "v.json").read_text()) == data


def test_validate_fails_a_candidate_below_the_floors_and_names_the_frames(sana, tmp_path):
    pipe, kwargs = sana
    report = quiet_validate(pipe, kwargs, ["lossless", "high"], gates={"psnr_floor": 60.0},
                            hooks=[perturb_under(pipe, "high", 0.5)])
    lossless, high = report.candidates
    assert lossless.passed and not high.passed and not report.passed
    assert high.min_psnr < 60.0 and not high.identical
    assert any("below the floors" in reason for reason in high.reasons)
    assert "overall: FAIL" in str(report)
    report.plot(str(tmp_path / "plot.png"))
    report.save_worst_frames(str(tmp_path / "frames.png"))
    from PIL import Image

    with Image.open(tmp_path / "plot.png") as image:
        assert image.width > 400
    with Image.open(tmp_path / "frames.png") as image:
        assert image.height >= 128 and image.width >= 3 * 128


def test_a_lossless_candidate_that_differs_fails_even_when_it_is_close(sana):
    pipe, kwargs = sana
    report = quiet_validate(pipe, kwargs, ["lossless"], hooks=[perturb_under(pipe, "lossless", 1e-6)])
    (lossless,) = report.candidates
    assert lossless.gate == "bit-identical" and not lossless.passed
    assert "must be bit-identical" in lossless.reasons[0]


def test_require_fast_path_fails_a_high_candidate_that_only_fell_back(sana):
    pipe, kwargs = sana
    report = quiet_validate(pipe, kwargs, ["high"], gates={"require_fast_path": True})
    assert not report.passed
    # regression (issue #17): the lossless fused sites' calls once counted as the high candidate's fast path
    assert report.candidates[0].fast_by_tier == {"lossless": 8}
    assert report.candidates[0].reasons[-1].startswith("no fast path ran at tier high")
    assert "require_fast_path" in report.candidates[0].reasons[-1]


def test_a_reference_that_does_not_reproduce_itself_is_reported_and_floors_apply(sana):
    pipe, kwargs = sana
    calls = []

    def jitter(module, args, output):  # a different perturbation on every call, as a nondeterministic kernel
        calls.append(1)
        return (output[0] + 1e-4 * len(calls),) + tuple(output[1:])

    report = quiet_validate(pipe, kwargs, ["lossless"], hooks=[pipe.transformer.register_forward_hook(jitter)])
    assert not report.noise_floor.identical and report.noise_floor.min_psnr < math.inf
    assert report.candidates[0].gate == "floors" and report.candidates[0].passed
    assert "does NOT reproduce itself" in str(report)


def test_reference_runs_are_reused_by_a_later_validate_and_change_no_verdict(sana):
    """tune validates many candidates against one reference: the second call runs only the candidates (and the
    reference for a seed it has not seen), with the same verdicts and scores as a call that reruns everything."""
    pipe, kwargs = sana
    calls = []
    counting = pipe.transformer.register_forward_pre_hook(lambda module, args: calls.append(1))
    first = quiet_validate(pipe, kwargs, ["lossless"], seeds=(0,))
    per_call = len(calls) // 3  # two reference runs and one candidate: forwards per pipeline call
    del calls[:]
    again = quiet_validate(pipe, kwargs, ["lossless", "high"], seeds=(0, 1), references=first.references,
                           hooks=[counting, perturb_under(pipe, "high", 0.5)])
    assert len(calls) == per_call * (2 + 2 * 2)  # seed 1's two reference runs, two candidates on two seeds
    fresh = quiet_validate(pipe, kwargs, ["lossless", "high"], seeds=(0, 1), hooks=[perturb_under(pipe, "high", 0.5)])
    assert [c.passed for c in again.candidates] == [c.passed for c in fresh.candidates] == [True, False]
    assert [s.sha256 for c in again.candidates for s in c.scores] == [s.sha256 for c in fresh.candidates
                                                                      for s in c.scores]
    assert again.candidates[1].min_psnr == fresh.candidates[1].min_psnr
    assert set(again.references.runs) == {0, 1}
    with pytest.raises(ValueError, match="reference='exact'"):
        quiet_validate(pipe, kwargs, ["high"], reference="lossless", references=first.references)


def test_validate_leaves_the_pipeline_in_the_state_it_came_in_also_after_an_error(sana):
    pipe, kwargs = sana
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accelpatch.apply(pipe, tier="high")
        before = accelpatch.report(pipe)
        validate(pipe, kwargs, ["lossless", "unpatched"], progress=False)
        assert str(accelpatch.report(pipe)).splitlines()[0] == str(before).splitlines()[0]
        assert accelpatch.current_quality(pipe) == "high"
        # the second candidate cannot apply (SANA-Video has no such option): refused before anything runs
        with pytest.raises(ValueError, match="anchor_fp32_steps"):
            validate(pipe, kwargs, ["lossless", {"tier": "high", "options": {"anchor_fp32_steps": 3}}],
                     progress=False)
        assert accelpatch.current_quality(pipe) == "high"
        accelpatch.remove(pipe)
        validate(pipe, kwargs, ["lossless"], progress=False)
    assert accelpatch.current_quality(pipe) == "exact"  # came unpatched, left unpatched


def test_validate_rejects_bad_arguments(sana):
    pipe, kwargs = sana
    with pytest.raises(ValueError, match="generator"):
        validate(pipe, {**kwargs, "generator": torch.Generator()}, ["high"], progress=False)
    with pytest.raises(ValueError, match="unknown candidate 'fast'"):
        validate(pipe, kwargs, ["fast"], progress=False)
    with pytest.raises(ValueError, match="unique"):
        validate(pipe, kwargs, ["high", "high"], progress=False)
    with pytest.raises(ValueError, match="less than or equal to 1"):
        validate(pipe, kwargs, ["high"], gates={"ssim_floor": 2}, progress=False)


def count_calls(pipe):
    """A list that gets one entry per transformer forward, and the hook handle to remove."""
    calls = []
    return calls, pipe.transformer.register_forward_pre_hook(lambda module, args: calls.append(1))


@pytest.mark.parametrize("instrument", [validate, bench])
def test_every_candidate_is_checked_before_the_first_call(sana, instrument):
    pipe, kwargs = sana
    calls, handle = count_calls(pipe)
    bad = [{"name": "no-such-option", "tier": "high", "options": {"anchor_fp32_steps": 3}},
           {"name": "no-such-backend-option", "tier": "high", "options": {"tau": 2.0}}]
    try:
        with pytest.raises(ValueError) as error:
            instrument(pipe, kwargs, ["lossless", *bad], progress=False)
    finally:
        handle.remove()
    assert calls == []  # nothing generated: the bad candidates were found up front, not after minutes of runs
    message = str(error.value)
    assert message.startswith("2 of 3 candidate(s) cannot be applied to SanaVideoPipeline (nothing was run)")
    assert "candidate 'no-such-option': " in message and "candidate 'no-such-backend-option': " in message
    assert accelpatch.current_quality(pipe) == "exact"  # came unpatched, left unpatched


@pytest.mark.parametrize("instrument", [validate, bench])
@pytest.mark.parametrize("arguments, expected", [
    (dict(candidates=["ultra"]), "unknown candidate 'ultra'; a candidate is a tier (exact, lossless, high), "
                                 "'unpatched', a mapping of Candidate fields"),
    (dict(candidates=["hihg"]), "unknown candidate 'hihg' (did you mean 'high'?)"),
    (dict(candidates=[{"tier": "high", "bakend": "sol_attn"}]),
     "bakend: unknown field (did you mean 'backend'?); allowed here: backend, name, options, tier, unpatched"),
    (dict(candidates=[{"tier": "ultra"}]), "tier: unknown quality tier 'ultra'; valid tiers are exact, lossless, "
                                           "high"),
])
def test_bad_candidates_are_named_with_the_valid_choices_not_pydantic_codes(sana, instrument, arguments, expected):
    pipe, kwargs = sana
    with pytest.raises(ValueError) as error:
        instrument(pipe, kwargs, progress=False, **arguments)
    assert expected in str(error.value)
    assert "pydantic" not in str(error.value) and "type=" not in str(error.value)


def test_bad_gates_name_the_field_the_allowed_ones_and_a_close_match(sana):
    pipe, kwargs = sana
    with pytest.raises(ValueError) as error:
        validate(pipe, kwargs, ["high"], gates={"ssim_flor": 0.9}, progress=False)
    assert str(error.value) == ("bad gates: ssim_flor: unknown field (did you mean 'ssim_floor'?); allowed here: "
                                "audio, audio_corr_floor, audio_lsd_ceiling, audio_snr_floor, flicker_delta_max, "
                                "i2v_image, motion_ratio_max, motion_ratio_min, psnr_drift_max_db, psnr_floor, "
                                "require_fast_path, ssim_floor")
    with pytest.raises(TypeError, match="gates must be a mapping of ssim_floor, psnr_floor, require_fast_path"):
        validate(pipe, kwargs, ["high"], gates=0.9, progress=False)


def test_seeds_must_be_a_list_of_integers_and_say_how(sana):
    pipe, kwargs = sana
    with pytest.raises(TypeError, match=r"seeds must be a list of integers, got the integer 0: write seeds=\[0\] "
                                        r"for that one seed, or seeds=range\(0\)"):
        validate(pipe, kwargs, ["high"], seeds=0, progress=False)
    with pytest.raises(TypeError, match=r"seeds must be integers, got 1.5 \(float\)"):
        validate(pipe, kwargs, ["high"], seeds=[0, 1.5], progress=False)
    with pytest.raises(ValueError, match=r"seeds must be distinct, got \[1\] more than once"):
        validate(pipe, kwargs, ["high"], seeds=[1, 1], progress=False)
    with pytest.raises(TypeError, match="seed must be one integer"):
        bench(pipe, kwargs, ["exact"], seed=[0], progress=False)


@pytest.mark.parametrize("instrument", [validate, bench])
def test_a_transformer_is_refused_with_a_pointer_to_its_pipeline(sana, instrument):
    pipe, kwargs = sana
    with pytest.raises(TypeError, match=rf"{instrument.__name__}\(\) needs a pipeline .* got the module "
                                        r"SanaVideoTransformer3DModel: pass the pipeline it belongs to"):
        instrument(pipe.transformer, kwargs, ["exact"], progress=False)


@pytest.mark.parametrize("instrument", [validate, bench])
def test_call_arguments_the_pipeline_does_not_take_are_refused_before_the_first_call(sana, instrument):
    pipe, kwargs = sana
    calls, handle = count_calls(pipe)
    try:
        with pytest.raises(ValueError, match=r"SanaVideoPipeline does not take the call argument\(s\) 'num_frame' "
                                             r"\(did you mean 'frames'\?\); it takes: attention_kwargs, "):
            instrument(pipe, {**kwargs, "num_frame": 9}, ["exact"], progress=False)
    finally:
        handle.remove()
    assert calls == []


def test_a_modular_pipeline_is_checked_against_its_blocks_inputs():
    """diffusers' ModularPipeline takes **kwargs and drops unknown ones with a warning: its blocks say which count."""
    from accelpatch.eval.preflight import accepted_call_arguments, check_call_arguments

    pipe = testing.tiny_minimax_h3_pipeline()
    accepted = accepted_call_arguments(pipe)
    assert {"num_frames", "height", "num_inference_steps", "prompt_embeds", "output"} <= accepted
    with pytest.raises(ValueError, match=r"does not take the call argument\(s\) 'num_frame' \(did you mean "
                                         r"'num_frames'\?\)"):
        check_call_arguments(pipe, {"num_frame": 5, "height": 32}, "validate")
    check_call_arguments(pipe, {"num_frames": 5, "height": 32, "output": "videos"}, "validate")


def test_validate_prints_no_speed_ratio_from_single_runs(sana):
    pipe, kwargs = sana
    report = quiet_validate(pipe, kwargs, ["lossless", "unpatched"], seeds=(0, 1, 2))
    text = str(report)
    assert "speed vs reference" not in text and "x faster" not in text and "x slower" not in text
    assert "speed: not compared here (one run per seed cannot tell a speed-up from noise): use bench" in text
    data = report.to_dict()
    assert data["version"] == 2
    for candidate in data["candidates"]:
        assert "speed_ratio" not in candidate and "speed" not in candidate
        assert len(candidate["seconds_per_step"]) == 3  # the raw timings stay, for whoever wants them


# --- bench ------------------------------------------------------------------------------------------------------

def test_bench_json_schema_and_interleaved_rounds(sana, tmp_path):
    pipe, kwargs = sana
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = bench(pipe, kwargs, ["exact", "lossless", "unpatched"], rounds=3, warmup=1, progress=False)
    data = json.loads(report.to_json(str(tmp_path / "b.json")))
    assert data["kind"] == "accelpatch.bench" and data["version"] == 1 and data["baseline"] == "exact"
    assert data["rounds"] == 3 and data["warmup"] == 1
    assert [c["label"] for c in data["candidates"]] == ["exact", "lossless", "unpatched"]
    for entry in data["candidates"]:
        assert len(entry["seconds_per_step"]) == 3 and len(entry["call_seconds"]) == 3
        assert all(0 < s <= c for s, c in zip(entry["seconds_per_step"], entry["call_seconds"]))
        assert entry["steps_per_call"] == 2  # 2 denoising steps, CFG batched: 2 transformer forwards
        assert set(entry["summary"]) >= {"n", "median", "p25", "p75", "relative_spread"}
    assert data["candidates"][0]["vs_baseline"] is None
    verdict = data["candidates"][1]["vs_baseline"]
    assert set(verdict) >= {"speedup", "ci_low", "ci_high", "distinguishable", "verdict"}
    # 3 rounds are too few for a 95 % interval of a median: no verdict, said so, JSON-safe
    assert verdict["ci_low"] is None and verdict["distinguishable"] is False
    assert "too few rounds (3)" in verdict["verdict"]
    assert "exact" in str(report) and "baseline" in str(report)


def test_bench_rejects_bad_arguments(sana):
    pipe, kwargs = sana
    with pytest.raises(ValueError, match="rounds must be an integer >= 2"):
        bench(pipe, kwargs, ["exact"], rounds=1, progress=False)
    with pytest.raises(ValueError, match="baseline 'fast' is not a candidate; candidates: exact, high"):
        bench(pipe, kwargs, ["exact", "high"], baseline="fast", progress=False)


def test_per_step_timing_counts_cfg_as_two_calls_as_one_step():
    from accelpatch.eval.candidates import CallTimer

    model = testing.tiny_sana_video_transformer()
    inputs = testing.sana_video_transformer_inputs(model)
    timer = CallTimer([model], torch.device("cpu"))
    with timer:
        for t in (900.0, 900.0, 800.0):  # step 1 as two calls (cond, uncond), then step 2
            model(**{**inputs, "timestep": torch.full_like(inputs["timestep"], t)})
    assert (timer.steps, timer.forwards) == (2, 3)
    assert timer.transformer_seconds() > 0


def test_reports_show_as_their_table_in_a_repl_and_a_notebook(sana):
    pipe, kwargs = sana
    report = quiet_validate(pipe, kwargs, ["lossless"])
    assert repr(report) == str(report) and repr(report).startswith("accelpatch validate:")
    assert report._repr_html_().startswith("<pre>accelpatch validate:")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timing = bench(pipe, kwargs, ["exact", "lossless"], rounds=2, warmup=0, progress=False)
    assert repr(timing) == str(timing) and repr(timing).startswith("accelpatch bench:")


# --- the conditions a timing ran under (issue #40, item 3) ---------------------------------------------------------

def test_timing_conditions_say_when_the_cores_are_oversubscribed():
    from accelpatch.eval.machine import TimingConditions

    quiet = TimingConditions(threads=1, cores=2, processes=1, load=0.5)
    assert quiet.oversubscribed is None and quiet.describe() == "torch threads 1 on 2 cores, load 0.5"
    assert quiet.header_lines() == []
    assert TimingConditions(threads=2, cores=2, processes=1, load=1.9).oversubscribed is None
    threads = TimingConditions(threads=2, cores=2, processes=2, load=None)
    assert threads.oversubscribed == "torch runs 2 threads in each of 2 processes on 2 cores"
    assert threads.describe() == "torch threads 2 x 2 processes on 2 cores"
    busy = TimingConditions(threads=1, cores=2, processes=1, load=3.4)
    assert "load average (3.4) is above its 2 cores" in busy.oversubscribed
    assert busy.to_dict() == {"threads": 1, "cores": 2, "processes": 1, "load": 3.4,
                              "oversubscribed": busy.oversubscribed}
    assert "torch.set_num_threads(1)" in busy.header_lines()[0]


def test_bench_and_validate_state_their_threads_and_warn_when_oversubscribed(sana, monkeypatch):
    """(tune: tests/test_tune.py::test_tune_states_its_threads_and_warns_when_oversubscribed)"""
    from accelpatch.eval import machine

    pipe, kwargs = sana
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet = bench(pipe, kwargs, ["exact", "lossless"], rounds=2, warmup=0, progress=False)
    threads = torch.get_num_threads()
    assert f"torch threads {threads} on " in str(quiet).splitlines()[0]
    assert json.loads(quiet.to_json())["conditions"]["threads"] == threads
    monkeypatch.setattr(machine, "_load", lambda: 99.0)  # a machine busy with other work
    with pytest.warns(RuntimeWarning, match="accelpatch bench: the machine is oversubscribed"):
        busy = bench(pipe, kwargs, ["exact", "lossless"], rounds=2, warmup=0, progress=False)
    assert "warning: oversubscribed, timings are unreliable: the machine's load average (99)" in str(busy)
    assert json.loads(busy.to_json())["conditions"]["oversubscribed"].startswith("the machine's load average")
    with pytest.warns(RuntimeWarning, match="accelpatch validate: the machine is oversubscribed"):
        checked = validate(pipe, kwargs, ["lossless"], seeds=[0], progress=False)
    assert "timed with torch threads" in str(checked) and "oversubscribed" in str(checked)
    assert json.loads(checked.to_json())["conditions"]["load"] == 99.0


def test_a_report_without_a_description_names_the_pipeline(sana):
    """#40: the header read "accelpatch validate: pipeline; ..." with no model in it."""
    pipe, kwargs = sana
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        checked = validate(pipe, kwargs, ["lossless"], seeds=[0], progress=False)
        timed = bench(pipe, kwargs, ["exact", "lossless"], rounds=2, warmup=0, progress=False)
    assert str(checked).startswith(f"accelpatch validate: {type(pipe).__name__}; ")
    assert str(timed).startswith(f"accelpatch bench: {type(pipe).__name__} on ")
    assert json.loads(checked.to_json())["description"] == type(pipe).__name__
