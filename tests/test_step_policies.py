"""#42, part 1: step policies in proportion to the call. A number of steps is a count or a fraction of this call's
steps (rounded up: 20 % of 4 steps is 1, of 10 is 2, of 50 is 10); the scheduler (or denoising_step(i, total=N))
gives the call's number of steps; Sol-Attn keeps the first dense_steps and the last dense_last_steps dense, and
calls over fewer than min_tokens tokens; each reason is counted in report()."""
import pytest
import torch
from _tiny_pipeline_checks import dense_kernel

import accelpatch
from accelpatch.core import steps
from accelpatch.core.steps import StepCount, from_end, step_count
from accelpatch.sol_attn import op as sol_op
from accelpatch.sol_attn.config import (DENSE_LAST_STEP, DENSE_STEP, SHORT_SEQUENCE, TOTAL_UNKNOWN, SolAttnConfig)
from accelpatch.testing import (tiny_wan_pipeline, tiny_wan_transformer, wan_pipeline_call_kwargs,
                                wan_transformer_inputs)


@pytest.mark.parametrize("value, expected", [
    (10, StepCount(count=10)), (0, StepCount(count=0)), (0.2, StepCount(fraction=0.2)), ("20%", StepCount(fraction=0.2)),
    ("12.5 %", StepCount(fraction=0.125)), ("7", StepCount(count=7)), (1.0, StepCount(fraction=1.0))])
def test_a_step_count_is_a_count_a_fraction_or_a_percentage(value, expected):
    assert step_count(value, "dense_steps") == expected


@pytest.mark.parametrize("value", [-1, 1.5, "120%", "ten", True, None, [1]])
def test_a_bad_step_count_is_named_with_the_choices(value):
    with pytest.raises(ValueError, match=rf"dense_steps must be a number of steps \(an int >= 0\), a fraction of this "
                                         rf"call's steps \(a float from 0 to 1, e.g. 0.2\) or a percentage \(e.g. "
                                         rf"'20%'\), got {__import__('re').escape(repr(value))}"):
        step_count(value, "dense_steps")


def test_fractions_round_up_in_proportion_to_the_call():
    twenty = step_count("20%")
    assert [twenty.of(n) for n in (4, 8, 10, 50)] == [1, 2, 2, 10]
    assert step_count(0.25).of(4) == 1 and step_count(1.0).of(4) == 4 and step_count(0.0).of(4) == 0
    assert twenty.of(None) is None and step_count(10).of(None) == 10 and step_count(10).of(4) == 4
    tail = from_end(1)
    assert tail.threshold(4) == 3 and tail.threshold(None) is None and from_end("25%").threshold(8) == 6
    assert str(twenty) == "20%" and str(step_count(3)) == "3"


def test_the_sol_attn_options_take_counts_and_fractions_and_name_bad_values():
    config = SolAttnConfig(dense_steps="20%", dense_last_steps=1, min_tokens=4096)
    assert (config.dense_steps, config.dense_last_steps, config.min_tokens) == (0.2, 1, 4096)
    # the defaults: the first 20 % of the call's steps (10 of 50 as before, 1 of 4), no dense tail, the 12,288 floor
    assert SolAttnConfig().dense_steps == 0.2 and SolAttnConfig().dense_last_steps == 0
    assert [step_count(SolAttnConfig().dense_steps).of(n) for n in (4, 8, 10, 50)] == [1, 2, 2, 10]
    assert SolAttnConfig().min_tokens == 12288
    with pytest.raises(ValueError, match="dense_last_steps must be a number of steps"):
        SolAttnConfig(dense_last_steps="last")
    with pytest.raises(ValueError, match="min_tokens must be an int >= 0, got -5"):
        SolAttnConfig(min_tokens=-5)


def test_the_scheduler_gives_the_calls_number_of_steps():
    pipe = tiny_wan_pipeline()
    pipe.scheduler.set_timesteps(4)
    assert steps.scheduler_total(pipe.scheduler) == 4
    assert steps.scheduler_total(object()) is None


def _model(**options):
    """The tiny Wan transformer under sol_attn on every layer; min_tokens=0 unless given (its 256 tokens lie below
    the default floor)."""
    torch.manual_seed(0)
    model = tiny_wan_transformer()
    accelpatch.apply(model, backend="sol_attn", dense_layers="", **{"min_tokens": 0, **options})
    return model, wan_transformer_inputs(model)


def _sol_reasons(model):
    sites = [s for s in accelpatch.report(model).sites if s.kind == "wan_sol_attn"]
    fast = sum(s.fast_calls for s in sites)
    reference = {}
    for s in sites:
        for reason, n in s.reference_calls.items():  # fallbacks included
            reference[reason] = reference.get(reason, 0) + n
    return fast, reference, len(sites)


def _run_steps(model, inputs, total, monkeypatch, *, say_total=True):
    monkeypatch.setattr(sol_op, "sol_attn", dense_kernel())
    with torch.no_grad():
        for i in range(total):
            with accelpatch.denoising_step(i, total=total if say_total else None):
                model(**inputs)


@pytest.mark.parametrize("total, dense", [(4, 1), (10, 2)])
def test_dense_steps_as_a_fraction_keeps_that_share_of_this_calls_steps_dense(total, dense, monkeypatch):
    model, inputs = _model(dense_steps="20%")
    _run_steps(model, inputs, total, monkeypatch)
    fast, reference, sites = _sol_reasons(model)
    assert reference == {DENSE_STEP: dense * sites} and fast == (total - dense) * sites


def test_dense_last_steps_keeps_the_tail_dense(monkeypatch):
    model, inputs = _model(dense_steps=1, dense_last_steps=1)
    _run_steps(model, inputs, 4, monkeypatch)
    fast, reference, sites = _sol_reasons(model)
    assert reference == {DENSE_STEP: sites, DENSE_LAST_STEP: sites} and fast == 2 * sites
    text = str(accelpatch.report(model))
    assert f"dense in the latest call of 4 steps: step 0 ({DENSE_STEP}); step 3 ({DENSE_LAST_STEP})" in text


def test_a_fraction_without_the_calls_number_of_steps_runs_dense_and_says_why(monkeypatch):
    model, inputs = _model(dense_steps=0.5)
    with pytest.warns(RuntimeWarning, match="number of denoising steps is unknown"):
        _run_steps(model, inputs, 2, monkeypatch, say_total=False)
    fast, reference, sites = _sol_reasons(model)
    assert fast == 0 and reference == {TOTAL_UNKNOWN: 2 * sites}
    with pytest.raises(accelpatch.FastPathUnavailableError, match="number of denoising steps is unknown"):
        strict, strict_inputs = _model(dense_steps=0.5, strict=True)
        with torch.no_grad(), accelpatch.denoising_step(1):
            strict(**strict_inputs)


def test_min_tokens_keeps_short_sequences_dense(monkeypatch):
    model, inputs = _model(dense_steps=0, min_tokens=10**6)
    _run_steps(model, inputs, 2, monkeypatch)
    fast, reference, sites = _sol_reasons(model)
    assert fast == 0 and reference == {SHORT_SEQUENCE: 2 * sites}
    assert f"dense in the latest call of 2 steps: steps 0-1 ({SHORT_SEQUENCE})" in str(accelpatch.report(model))
    accelpatch.remove(model)
    model, inputs = _model(dense_steps=0, min_tokens=1)
    _run_steps(model, inputs, 2, monkeypatch)
    assert _sol_reasons(model)[:2] == (2 * _sol_reasons(model)[2], {})


def test_a_four_step_pipeline_call_reads_its_number_of_steps_from_the_scheduler(monkeypatch):
    """A 4-step call with dense_steps='20%': the first step dense, the other three sparse (the scheduler says 4)."""
    pipe = tiny_wan_pipeline()
    accelpatch.apply(pipe, backend="sol_attn", dense_steps="20%", dense_layers="", min_tokens=0)
    monkeypatch.setattr(sol_op, "sol_attn", dense_kernel())
    pipe(**wan_pipeline_call_kwargs(num_inference_steps=4, height=64, width=64, num_frames=5))
    fast, reference, sites = _sol_reasons(pipe.transformer)
    per_step = (fast + sum(reference.values())) // (4 * sites)  # two calls a step with classifier-free guidance
    assert reference == {DENSE_STEP: per_step * sites} and fast == 3 * per_step * sites
    report = accelpatch.report(pipe)
    assert report.models[0].step_sources == {"pipeline scheduler": 4 * per_step}
    # report() names the dense steps of the latest call in its own step numbers, with why
    assert report.models[0].dense_steps == {"total": 4, "steps": {0: {DENSE_STEP: per_step * sites}}}
    assert f"dense in the latest call of 4 steps: step 0 ({DENSE_STEP})" in str(report)
    pipe(**wan_pipeline_call_kwargs(num_inference_steps=10, height=64, width=64, num_frames=5))  # the next call
    assert accelpatch.report(pipe).models[0].dense_steps["steps"].keys() == {0, 1}  # 20 % of 10: its own numbers


def test_tune_searches_a_fraction_as_the_count_it_is_in_the_recipes_call():
    from accelpatch.eval.tune_space import _step_grid

    counts = lambda grid, total: [step_count(v).of(total) for v in grid]  # noqa: E731
    assert _step_grid("50%", 8)[0] == 0.5  # the user's own value, in the user's form
    assert counts(_step_grid("50%", 8), 8) == counts(_step_grid(4, 8), 8) == [4, 3, 2, 1, 0]
    assert counts(_step_grid(0.2, 4), 4) == counts(_step_grid(1, 4), 4) == [1, 0]


def test_wan22s_two_experts_count_the_calls_steps_across_the_boundary(monkeypatch):
    """#42: Wan 2.2 splits a call's steps over transformer (high noise) and transformer_2 (low noise). Both read the
    pipeline's scheduler, so the policies count the call's steps, not each expert's: with dense_steps='25%' and
    dense_last_steps=1 over 4 steps at CFG 1 (one call a step), the call's first step runs dense on the high-noise
    expert, its last on the low-noise one, and every other step runs sparse on either side of the boundary."""
    pipe = tiny_wan_pipeline(two_transformers=True)
    accelpatch.apply(pipe, backend="sol_attn", dense_steps="25%", dense_last_steps=1, dense_layers="", min_tokens=0)
    monkeypatch.setattr(sol_op, "sol_attn", dense_kernel())
    pipe(**wan_pipeline_call_kwargs(num_inference_steps=4, height=64, width=64, num_frames=5, guidance_scale=1.0))
    high_fast, high_dense, sites = _sol_reasons(pipe.transformer)
    low_fast, low_dense, _ = _sol_reasons(pipe.transformer_2)
    high_calls, low_calls = (high_fast + sum(high_dense.values())) // sites, (low_fast + sum(low_dense.values())) // sites
    assert high_calls + low_calls == 4 and high_calls >= 1 and low_calls >= 1  # the boundary splits the call
    assert high_dense == {DENSE_STEP: sites} and low_dense == {DENSE_LAST_STEP: sites}
    assert high_fast == (high_calls - 1) * sites and low_fast == (low_calls - 1) * sites
    for model in (pipe.transformer, pipe.transformer_2):
        assert set(accelpatch.report(model).models[0].step_sources) == {"pipeline scheduler"}
    assert accelpatch.report(pipe.transformer).models[0].dense_steps["steps"] == {0: {DENSE_STEP: sites}}
    assert accelpatch.report(pipe.transformer_2).models[0].dense_steps["steps"] == {3: {DENSE_LAST_STEP: sites}}


def test_diffusers_route_takes_a_fraction_and_a_tail():
    """configure_sol_attn_backend(dense_steps='20%') used to reach the step phases as a float, which only took ints."""
    from accelpatch.sol_attn import diffusers_backend

    config = diffusers_backend.backend_config(dense_steps="20%", dense_last_steps=1)
    assert (config.dense_steps, config.dense_last_steps) == (0.2, 1)
    assert steps.register_counts(config.dense_steps, from_end(config.dense_last_steps)) == (
        StepCount(fraction=0.2), StepCount(count=1, from_end=True))
