"""The step clock works for a transformer patched alone: the step comes from the timestep it receives. Once, a
MiniMax-H3 transformer patched without its pipeline ran every call as a dense step (0 fast calls) without a word.
(The tiny models' sequences lie under the default min_tokens floor, so every test here sets min_tokens=0.)"""
import asyncio
import threading
import warnings

import pytest
import torch

import accelpatch
from accelpatch.core import steps
from accelpatch.models.minimax_h3 import high as h3_high
from accelpatch.testing import (minimax_h3_pipeline_call_kwargs, minimax_h3_transformer_inputs,
                                sana_video_pipeline_call_kwargs, tiny_minimax_h3_pipeline, tiny_minimax_h3_transformer,
                                tiny_sana_video_pipeline)

SANA_LEVEL = max  # diffusers' 0-1000 scale: larger is noisier


def _h3_call(pipe):
    return pipe(**minimax_h3_pipeline_call_kwargs(num_inference_steps=4, height=128, width=128), output="videos")


def _record_steps(module):
    seen = []
    handle = module.register_forward_pre_hook(lambda *_: seen.append(steps.current_step()))
    return seen, handle


def test_a_transformer_patched_alone_follows_the_pipeline_steps_from_its_timesteps():
    pipe = tiny_minimax_h3_pipeline()
    accelpatch.apply(pipe, backend="sol_attn", dense_steps=1, dense_layers="", min_tokens=0, tau=1.0)  # the scheduler's clock
    through_pipeline = [_h3_call(pipe) for _ in range(2)]
    accelpatch.remove(pipe)

    accelpatch.apply(pipe.transformer, backend="sol_attn", dense_steps=1, dense_layers="", min_tokens=0, tau=1.0)
    seen, handle = _record_steps(pipe.transformer.transformer_blocks[1].attn)
    alone = [_h3_call(pipe) for _ in range(2)]
    handle.remove()
    assert [r.step for r in seen] == [0, 1, 2, 0, 1, 2]  # N steps run N-1 transformer calls; each call restarts
    assert {r.source for r in seen} == {steps.TIMESTEP}
    assert all(torch.equal(a, b) for a, b in zip(alone, through_pipeline))
    rep = accelpatch.report(pipe)
    main = [s for s in rep.sites if s.kind == "sol_attn"]
    assert all(s.fast_calls == 4 and s.reference_calls == {h3_high.DENSE_STEP: 2} for s in main)
    assert rep.models[0].step_sources == {steps.TIMESTEP: 6}
    assert "step clock: timestep argument ×6" in str(rep)


def test_direct_calls_count_steps_by_timestep_and_restart_when_the_noise_goes_back_up():
    model = tiny_minimax_h3_transformer()
    accelpatch.apply(model, backend="sol_attn", dense_steps=1, dense_layers="", min_tokens=0, tau=3.0)
    seen, handle = _record_steps(model.transformer_blocks[0].attn)
    with torch.no_grad():
        for t in (0.1, 0.1, 0.4, 0.7, 0.2, 0.2):  # H3: 1 means clean, so rising t is the denoising direction
            model(**minimax_h3_transformer_inputs(model, num_video=300, video_timestep=t, audio_timestep=t))
    handle.remove()
    assert [r.step for r in seen] == [0, 0, 1, 2, 0, 0]
    rep = accelpatch.report(model)
    main = [s for s in rep.sites if s.kind == "sol_attn"]
    assert all(s.fast_calls == 2 and s.reference_calls == {h3_high.DENSE_STEP: 4} for s in main)


def test_an_explicit_denoising_step_wins_over_the_timestep():
    model = tiny_minimax_h3_transformer()
    accelpatch.apply(model, backend="sol_attn", dense_steps=3, dense_layers="", min_tokens=0, tau=3.0)
    seen, handle = _record_steps(model.transformer_blocks[0].attn)
    with torch.no_grad(), accelpatch.denoising_step(7):
        model(**minimax_h3_transformer_inputs(model, num_video=300))
    handle.remove()
    assert seen == [steps.StepReading(7, steps.EXPLICIT)]
    assert accelpatch.report(model).models[0].step_sources == {steps.EXPLICIT: 1}


def test_an_unknown_step_warns_once_runs_dense_and_says_so_in_the_report(monkeypatch):
    model = tiny_minimax_h3_transformer()
    inputs = minimax_h3_transformer_inputs(model, num_video=300)
    with torch.no_grad():
        reference = model(**inputs).sample
    accelpatch.apply(model, backend="sol_attn", dense_steps=2, dense_layers="", min_tokens=0, tau=3.0)
    monkeypatch.setattr(steps, "timestep_values", lambda timestep: None)  # a timestep without readable values
    with pytest.warns(RuntimeWarning, match="no denoising step is known") as record:
        with torch.no_grad():
            outs = [model(**inputs).sample for _ in range(2)]
    assert len([w for w in record if "denoising step" in str(w.message)]) == 1
    assert all(torch.equal(o, reference) for o in outs)
    rep = accelpatch.report(model)
    assert rep.models[0].step_sources == {steps.UNKNOWN: 2}
    assert rep.fallback_calls == {h3_high.STEP_UNKNOWN: 4}
    assert "2 call(s) had no known step" in str(rep)

    accelpatch.apply(model, backend="sol_attn", dense_steps=2, dense_layers="", min_tokens=0, tau=3.0, strict=True)
    with pytest.raises(accelpatch.FastPathUnavailableError, match="no denoising step is known"):
        with torch.no_grad():
            model(**inputs)


def test_dense_steps_zero_needs_no_step():
    model = tiny_minimax_h3_transformer()
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            model(**minimax_h3_transformer_inputs(model, num_video=300))
    rep = accelpatch.report(model)
    assert [s.fast_calls for s in rep.sites if s.kind == "sol_attn"] == [1, 1]  # sparse without a step
    # the lossless attention below sol_attn got no call; the lossless block fusion ran in both blocks
    assert [s.fast_calls for s in rep.sites if s.kind == "minimax_h3_fused_attention"] == [0, 0]
    assert rep.fast_calls == 2 + 2
    assert rep.models[0].step_sources == {}


def test_timestep_values_reads_tensors_and_numbers_and_refuses_what_has_no_data():
    assert steps.timestep_values(torch.tensor([999.0, 999.0])) == (999.0, 999.0)
    assert steps.timestep_values(500) == (500.0,)
    assert steps.timestep_values(None) is None
    assert steps.timestep_values(torch.empty(2, device="meta")) is None
    assert steps.timestep_values(torch.empty(0)) is None


def test_the_clock_on_sana_video_pipeline_timesteps_with_cfg_as_a_batch():
    pipe = tiny_sana_video_pipeline()
    timesteps = []
    handle = pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: timesteps.append(kwargs["timestep"].clone()), with_kwargs=True)
    pipe(**sana_video_pipeline_call_kwargs(num_inference_steps=3, guidance_scale=4.5))
    pipe(**sana_video_pipeline_call_kwargs(num_inference_steps=3, guidance_scale=4.5))
    handle.remove()
    assert all(t.shape == (2,) for t in timesteps)  # classifier-free guidance as one batch of two
    clock = steps.TimestepClock(SANA_LEVEL)
    assert [clock.advance(steps.timestep_values(t)).step for t in timesteps] == [0, 1, 2, 0, 1, 2]


def test_cfg_as_two_calls_is_one_step():
    clock = steps.TimestepClock(SANA_LEVEL)
    calls = [(900.0,), (900.0,), (600.0,), (600.0,), (300.0,), (300.0,)]
    assert [clock.advance(c).step for c in calls] == [0, 0, 1, 1, 2, 2]


def test_each_thread_and_each_task_counts_on_its_own():
    clock = steps.TimestepClock(SANA_LEVEL)
    results = {}

    def generation(name, start):
        results[name] = [clock.advance((t,)).step for t in range(start, 0, -100)]

    threads = [threading.Thread(target=generation, args=(n, s)) for n, s in (("a", 1000), ("b", 500))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"a": list(range(10)), "b": list(range(5))}

    async def task(start):
        out = []
        for t in range(start, 0, -250):
            out.append(clock.advance((float(t),)).step)
            await asyncio.sleep(0)  # interleave the two tasks
        return out

    async def both():
        return await asyncio.gather(task(1000), task(750))

    assert asyncio.run(both()) == [[0, 1, 2, 3], [0, 1, 2]]
