"""The SANA-Video 2.0 4-step preview's sampler (``SanaVideo2FewStepScheduler``, inferred stage values): its schedule
and one stage against values computed here from the formulas, the tiny pipeline with it (four transformer calls,
seeded transition noise), the refusal of other step counts, saving and loading, and accelpatch's step reading and
default tier on it (all offline, on the CPU)."""
import json
import subprocess
import sys
import warnings
from fractions import Fraction

import pytest
import torch
from _tiny_pipeline_checks import rehome

import accelpatch
from accelpatch.core import steps
from accelpatch.models.sana_video2.modeling import SanaVideo2FewStepScheduler, SanaVideo2Pipeline
from accelpatch.testing import sana_video2_pipeline_call_kwargs, tiny_sana_video2_pipeline

LATENT_SHAPE = (1, 8, 2, 2, 3)  # the tiny call's latents: 9 frames, 64 x 96 pixels at stride (8, 32, 32)


def _flow_shift(t, shift):
    return shift * t / (1 + (shift - 1) * t)


#: shift 6 on t = 1, 3/4, 1/2, 1/4, exactly: 1, 18/19, 6/7, 2/3
EXACT_SIGMAS = [_flow_shift(Fraction(t), 6) for t in (1, Fraction(3, 4), Fraction(1, 2), Fraction(1, 4))]
SIGMAS = torch.tensor([float(s) for s in EXACT_SIGMAS] + [0.0], dtype=torch.float32)
TIMESTEPS = torch.tensor([float(1000 * s) for s in EXACT_SIGMAS], dtype=torch.float32)


def kwargs(**overrides):
    return {**sana_video2_pipeline_call_kwargs(4, guidance_scale=1.0), **overrides}


@pytest.fixture(scope="module")
def pipe():
    pipe = tiny_sana_video2_pipeline()
    pipe.scheduler = SanaVideo2Pipeline.four_step_scheduler()
    return pipe


def _hand_step(sigmas, i, x, v, generator):
    """Stage ``i`` by hand: x0 = x - sigma·v, then (1 - sigma_next)·x0 + sigma_next·eps (eps: one draw), or x0."""
    x0 = x - sigmas[i] * v
    if i == len(sigmas) - 2:
        return x0, x0
    noise = torch.randn(x.shape, generator=generator, dtype=torch.float32)
    return (1 - sigmas[i + 1]) * x0 + sigmas[i + 1] * noise, x0


# -- the schedule -------------------------------------------------------------------------------------------------

def test_schedule_is_the_shift_6_flow_of_the_uniform_grid():
    assert EXACT_SIGMAS == [1, Fraction(18, 19), Fraction(6, 7), Fraction(2, 3)]
    scheduler = SanaVideo2Pipeline.four_step_scheduler()
    assert isinstance(scheduler, SanaVideo2FewStepScheduler)
    assert (scheduler.config.num_train_timesteps, scheduler.config.shift) == (1000, 6.0)
    assert scheduler.order == 1 and scheduler.init_noise_sigma == 1.0 and scheduler.num_stages == 4
    scheduler.set_timesteps(4)
    assert scheduler.num_inference_steps == 4 and scheduler.step_index is None
    assert scheduler.sigmas.dtype == torch.float32 and torch.equal(scheduler.sigmas, SIGMAS)
    assert scheduler.timesteps.dtype == torch.float32 and torch.equal(scheduler.timesteps, TIMESTEPS)
    assert [int(t) for t in scheduler.timesteps] == [1000, 947, 857, 666]  # what the transformer embeds (truncated)
    scheduler.set_timesteps()  # None: the stage count
    assert torch.equal(scheduler.sigmas, SIGMAS)
    sample = torch.randn(LATENT_SHAPE)
    assert scheduler.scale_model_input(sample, scheduler.timesteps[0]) is sample


def test_stage_values_are_config_fields():
    explicit = SanaVideo2FewStepScheduler(stage_sigmas=[0.9, 0.5, 0.2])
    explicit.set_timesteps(3)
    assert torch.equal(explicit.sigmas, torch.tensor([0.9, 0.5, 0.2, 0.0]))
    assert torch.allclose(explicit.timesteps, torch.tensor([900.0, 500.0, 200.0]))
    unshifted = SanaVideo2FewStepScheduler(shift=1.0, stage_fractions=(1.0, 0.5))
    unshifted.set_timesteps(2)
    assert torch.equal(unshifted.sigmas, torch.tensor([1.0, 0.5, 0.0]))
    for bad, message in ((dict(stage_sigmas=[0.5, 0.7]), "strictly decreasing"),
                         (dict(stage_fractions=(1.0, 0.0)), r"in \(0, 1\]"),
                         (dict(stage_sigmas=[]), "non-empty"), (dict(shift=0.0), "`shift` must be a number > 0")):
        with pytest.raises(ValueError, match=message):
            SanaVideo2FewStepScheduler(**bad)


# -- one stage ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", range(4))
def test_one_step_against_a_hand_computation(stage):
    scheduler = SanaVideo2FewStepScheduler()
    scheduler.set_timesteps(4)
    scheduler.set_begin_index(stage)
    data = torch.Generator().manual_seed(10 + stage)
    x, v = torch.randn(LATENT_SHAPE, generator=data), torch.randn(LATENT_SHAPE, generator=data)
    generator = torch.Generator().manual_seed(7)
    out = scheduler.step(v, scheduler.timesteps[stage], x, generator=generator)
    expected, x0 = _hand_step(SIGMAS, stage, x, v, torch.Generator().manual_seed(7))
    assert torch.equal(out.pred_original_sample, x0)
    assert torch.equal(out.prev_sample, expected)
    assert scheduler.step_index == stage + 1
    if stage == 3:  # the last stage returns x0 and draws nothing
        assert torch.equal(out.prev_sample, x - SIGMAS[3] * v)
        assert torch.equal(generator.get_state(), torch.Generator().manual_seed(7).get_state())
    else:
        assert not torch.equal(out.prev_sample, x0)


def test_steps_follow_the_timesteps_and_a_generator_list_draws_per_item():
    scheduler = SanaVideo2FewStepScheduler()
    scheduler.set_timesteps(4)
    data = torch.Generator().manual_seed(0)
    x = torch.randn(2, *LATENT_SHAPE[1:], generator=data)
    generators, hand = [torch.Generator().manual_seed(s) for s in (1, 2)], [torch.Generator().manual_seed(s)
                                                                          for s in (1, 2)]
    expected = x.clone()
    for i, t in enumerate(scheduler.timesteps):  # the stage is found from the timestep (no begin index)
        v = torch.randn(x.shape, generator=data)
        prev, x0 = scheduler.step(v, t, x, generator=generators, return_dict=False)
        items = [_hand_step(SIGMAS, i, expected[b:b + 1], v[b:b + 1], hand[b]) for b in range(2)]
        expected = torch.cat([item[0] for item in items])
        assert torch.equal(x0, torch.cat([item[1] for item in items]))
        assert torch.equal(prev, expected)
        x = prev
    with pytest.raises(ValueError, match="all 4 stages have run"):
        scheduler.step(v, scheduler.timesteps[0], x)
    half = SanaVideo2FewStepScheduler()
    half.set_timesteps(4)
    out = half.step(v.bfloat16(), half.timesteps[0], x.bfloat16(), generator=torch.Generator().manual_seed(0))
    assert out.prev_sample.dtype == torch.bfloat16  # computed in float32, returned in the sample's dtype


def test_wrong_step_count_is_refused_naming_the_value_and_the_valid_count(pipe):
    scheduler = SanaVideo2FewStepScheduler()
    for count in (3, 50, True):
        with pytest.raises(ValueError, match=rf"num_inference_steps must be 4; got num_inference_steps={count!r}"):
            scheduler.set_timesteps(count)
    with pytest.raises(ValueError, match="num_inference_steps must be 4; got num_inference_steps=50"):
        pipe(**kwargs(num_inference_steps=50))
    with pytest.raises(ValueError, match="does not accept custom `sigmas`"):
        pipe(**kwargs(sigmas=[1.0, 0.5]))
    with pytest.raises(ValueError, match="set_timesteps"):
        SanaVideo2FewStepScheduler().step(torch.zeros(1), 1000.0, torch.zeros(1))


# -- the pipeline -------------------------------------------------------------------------------------------------

def test_four_transformer_calls_one_per_step_without_guidance(pipe):
    calls = []
    handle = pipe.transformer.register_forward_pre_hook(
        lambda _, args, kw: calls.append((args[0].shape[0], kw["timestep"].clone())), with_kwargs=True)
    try:
        out = pipe(**kwargs()).frames
    finally:
        handle.remove()
    assert [batch for batch, _ in calls] == [1, 1, 1, 1]
    assert torch.equal(torch.cat([t for _, t in calls]), pipe.scheduler.timesteps)
    assert out.shape == (1, 9, 3, 64, 96) and torch.isfinite(out).all()


def test_same_seed_gives_identical_frames_another_seed_differs(pipe):
    first = pipe(**kwargs(generator=torch.Generator().manual_seed(3))).frames
    again = pipe(**kwargs(generator=torch.Generator().manual_seed(3))).frames
    other = pipe(**kwargs(generator=torch.Generator().manual_seed(4))).frames
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_transition_noise_comes_from_the_call_generator(pipe):
    """With the initial latents fixed, the generator still changes the result: it draws the three transitions,
    and the result is the stage chain computed by hand from the transformer's outputs and those draws."""
    latents = torch.randn(LATENT_SHAPE, generator=torch.Generator().manual_seed(5))
    velocities = []
    handle = pipe.transformer.register_forward_hook(lambda _, args, output: velocities.append(output[0].float()))
    generator = torch.Generator().manual_seed(0)
    try:
        a = pipe(**kwargs(latents=latents, generator=generator, output_type="latent")).frames
    finally:
        handle.remove()
    b = pipe(**kwargs(latents=latents, generator=torch.Generator().manual_seed(1), output_type="latent")).frames
    again = pipe(**kwargs(latents=latents, generator=torch.Generator().manual_seed(0), output_type="latent")).frames
    assert not torch.equal(a, b) and torch.equal(a, again)

    hand, x = torch.Generator().manual_seed(0), latents
    for i, v in enumerate(velocities):
        x, _ = _hand_step(SIGMAS, i, x, v, hand)
    assert len(velocities) == 4 and torch.equal(a, x)
    assert torch.equal(generator.get_state(), hand.get_state())  # exactly three draws of the latent shape


# -- saving and loading -------------------------------------------------------------------------------------------

def _config(scheduler):
    return json.loads(json.dumps({k: v for k, v in scheduler.config.items() if not k.startswith("_")}))


@pytest.mark.parametrize("config", [{}, {"stage_sigmas": [0.95, 0.8, 0.6, 0.3]}])
def test_scheduler_config_round_trip(tmp_path, config):
    scheduler = SanaVideo2Pipeline.four_step_scheduler(**config)
    scheduler.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "scheduler_config.json").read_text())
    assert saved["_class_name"] == "SanaVideo2FewStepScheduler" and saved["shift"] == 6.0
    loaded = SanaVideo2FewStepScheduler.from_pretrained(tmp_path)
    assert _config(loaded) == _config(scheduler)
    scheduler.set_timesteps(4)
    loaded.set_timesteps(4)
    assert torch.equal(loaded.sigmas, scheduler.sigmas) and torch.equal(loaded.timesteps, scheduler.timesteps)




def test_pipeline_with_the_four_step_scheduler_round_trips(pipe, tmp_path):
    import diffusers

    assert SanaVideo2FewStepScheduler in SanaVideo2Pipeline._get_signature_types()["scheduler"]
    reference = pipe(**kwargs()).frames
    pipe.save_pretrained(tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["scheduler"] == ["accelpatch.models.sana_video2.modeling.few_step", "SanaVideo2FewStepScheduler"]
    for loader in (SanaVideo2Pipeline, diffusers.DiffusionPipeline):
        loaded = rehome(loader.from_pretrained(tmp_path))
        assert type(loaded.scheduler) is SanaVideo2FewStepScheduler
        assert _config(loaded.scheduler) == _config(pipe.scheduler)
        loaded.set_progress_bar_config(disable=True)
        assert torch.equal(loaded(**kwargs()).frames, reference)


def test_a_fresh_process_loads_the_saved_scheduler_after_the_documented_import(pipe, tmp_path):
    pipe.save_pretrained(tmp_path)
    code = ("import sys\nimport accelpatch.models.sana_video2.modeling\nimport diffusers\n"
            "loaded = diffusers.DiffusionPipeline.from_pretrained(sys.argv[1])\n"
            "print(type(loaded).__name__, type(loaded.scheduler).__name__)\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["SanaVideo2Pipeline SanaVideo2FewStepScheduler"]


# -- accelpatch on it ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def unpatched_frames(pipe):
    return pipe(**kwargs(generator=torch.Generator().manual_seed(9))).frames


@pytest.fixture
def patched():
    pipe = tiny_sana_video2_pipeline()
    pipe.scheduler = SanaVideo2Pipeline.four_step_scheduler()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # on the CPU: the CUDA-only fast paths are not mounted
        accelpatch.apply(pipe)
    yield pipe
    accelpatch.remove(pipe)


def test_accelpatch_reads_four_steps_from_the_scheduler(patched):
    readings = []
    handle = patched.transformer.register_forward_pre_hook(lambda *_: readings.append(steps.current_step()))
    try:
        patched(**kwargs())
    finally:
        handle.remove()
    assert readings == [steps.StepReading(i, steps.SCHEDULER, 4) for i in range(4)]
    assert steps.scheduler_total(patched.scheduler) == 4
    assert accelpatch.report(patched).models[0].step_sources == {steps.SCHEDULER: 4}


def test_accelpatch_default_tier_is_bit_identical(patched, unpatched_frames):
    frames = patched(**kwargs(generator=torch.Generator().manual_seed(9))).frames
    assert torch.equal(frames, unpatched_frames)
