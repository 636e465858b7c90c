"""The contract explored by a state machine (tests/_contract_machine.py), briefly, on each model family; and the holes
it found, each minimised to a plain regression test.

The short run here is derandomized (the same examples every run, so CI does not turn red on a hole nobody
introduced); ``python benchmarks/fuzz_contract.py`` runs the same machine at random for as long as you like. A test
marked ``xfail(strict=True)`` is a hole that is open: fixing it makes the test pass, which fails the run — then
remove the mark, and the hole's entry in ``_contract_machine.KNOWN_HOLES`` so that the machine checks it too.
"""
import contextvars
import dataclasses
import warnings

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

import accelpatch
from accelpatch.testing import (sana_video2_transformer_inputs, sana_video_transformer_inputs,
                                tiny_sana_video2_transformer, tiny_sana_video_transformer)

from _contract_machine import FAMILIES, KNOWN_HOLES, ContractMachine, RaiseFrom, UserError

SHORT_RUN = settings(max_examples=25, stateful_step_count=10, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_contract_holds_along_random_paths(family):
    class Machine(ContractMachine):
        families = (family,)

    Machine.examples = 0
    run_state_machine_as_test(Machine, settings=SHORT_RUN)
    assert Machine.examples >= SHORT_RUN.max_examples


def test_every_known_hole_has_its_regression_test():
    """The machine leaves out what KNOWN_HOLES names; each such hole must have its strict xfail below."""
    reasons = [mark.kwargs["reason"] for test in HOLE_TESTS for mark in test.pytestmark if mark.name == "xfail"]
    assert len(reasons) == len(HOLE_TESTS) == len(KNOWN_HOLES)
    assert all(reason.startswith(("issue 16: ", "issue 17: ")) for reason in reasons)


# --- the holes, minimised ----------------------------------------------------------------------------------------

def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _apply(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU: the fast paths guarded by CUDA are not mounted (apply() says so)
        accelpatch.apply(model, **kwargs)


def _sana_video2_call_at(model, t):
    inputs = sana_video2_transformer_inputs(model)
    inputs["timestep"] = torch.tensor([t, t])
    return _forward(model, inputs)


def _step_in_force_after(error):
    """In a fresh context (a new session): one call at step 0, then a call at step 1 that a hook on an inner block
    makes raise ``error``; returns the denoising step in force afterwards, between calls."""
    model = tiny_sana_video2_transformer()
    _apply(model)  # anchor_fp32_steps=10: the step clock reads each call's step from its timestep

    def session():
        _sana_video2_call_at(model, 950.0)
        handle = model.blocks[1].register_forward_hook(RaiseFrom(error))
        with pytest.raises(type(error)):
            _sana_video2_call_at(model, 400.0)  # the next step: step 1
        handle.remove()
        return accelpatch.core.steps.current_denoising_step()

    return contextvars.Context().run(session)


def test_a_call_that_raises_leaves_no_step_in_force():
    assert _step_in_force_after(UserError("raised by a user hook")) == 0


@pytest.mark.xfail(strict=True, reason="issue 16: after an interrupted call (KeyboardInterrupt) its step stays in "
                                       "force between calls, until the model's next call closes it (torch runs "
                                       "always_call hooks for Exception only; no hook runs at the interrupt)")
def test_an_interrupted_call_leaves_no_step_in_force():
    assert _step_in_force_after(KeyboardInterrupt()) == 0


def test_assert_fast_path_ran_counts_step_cache_reuse():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    _apply(model, cache="first_block", cache_threshold=1e9, cache_warmup_steps=0)
    with accelpatch.quality("high"):
        for t in (900.0, 600.0):
            _forward(model, {**inputs, "timestep": torch.full_like(inputs["timestep"], t)})
    report = accelpatch.report(model)
    assert report.models[0].cache["reused"] == 1  # the second step reused the cache after block 0
    # the only other fast calls are the lossless sites' (fused block and attn1): both blocks in the first call, block
    # 0 in the second; on CPU the high attn1 site never mounts
    lossless = sum(s.fast_calls for s in report.sites if s.tier == "lossless")
    assert (report.fast_calls, lossless) == (6, 6), report
    report.assert_fast_path_ran()
    # the reuse alone is enough: the same report without any fast site call still passes, and without the reuse too
    # it raises
    no_site_call = dataclasses.replace(report.models[0], sites=tuple(dataclasses.replace(s, fast_calls=0)
                                                                      for s in report.models[0].sites))
    dataclasses.replace(report, models=(no_site_call,)).assert_fast_path_ran()
    nothing = dataclasses.replace(no_site_call, cache={**no_site_call.cache, "reused": 0})
    with pytest.raises(AssertionError, match="no accelpatch fast path ran"):
        dataclasses.replace(report, models=(nothing,)).assert_fast_path_ran()


def test_remove_after_mag_cache_leaves_no_hook_registry():
    from diffusers import MagCacheConfig

    model = tiny_sana_video_transformer()
    attributes = set(vars(model))
    _apply(model, cache=MagCacheConfig(mag_ratios=[1.0] * 4, num_inference_steps=4))
    accelpatch.remove(model)
    assert set(vars(model)) - attributes == set()


def test_an_accelerate_hook_added_on_a_cached_block_after_apply_survives_remove():
    from accelerate.hooks import ModelHook, add_hook_to_module

    class Double(ModelHook):
        def post_forward(self, module, output):
            return output * 2

    model, twin = tiny_sana_video_transformer(), tiny_sana_video_transformer()  # twin: never patched, same hook
    inputs = sana_video_transformer_inputs(model)
    _apply(model, cache="first_block")
    for m in (model, twin):
        add_hook_to_module(m.transformer_blocks[1], Double())
    assert torch.equal(_forward(model, inputs), _forward(twin, inputs)), "while patched"
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), _forward(twin, inputs)), "after remove(): the hook no longer runs"


def test_a_call_after_one_that_raised_midway_does_not_reuse_its_half_written_cache_state():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    _apply(model, cache="first_block")
    handle = model.transformer_blocks[0].register_forward_hook(RaiseFrom(UserError("raised by a user hook")))
    with pytest.raises(UserError):
        _forward(model, inputs)  # step 0: block 0 ran (and the cache decided), the blocks after it did not
    handle.remove()
    with accelpatch.quality("high"), accelpatch.denoising_step(2):
        _forward(model, inputs)  # the same generation, past the warm-up steps


def test_training_through_a_step_cache_that_reuses_does_not_backpropagate_into_an_earlier_call():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    _apply(model, cache="first_block")
    model(**inputs).sample.sum().backward()  # step 0: computes every block, caches their residual
    with accelpatch.quality("high"), accelpatch.denoising_step(2):
        sample = model(**inputs).sample  # past the warm-up, the first block unchanged: would reuse
    cache = accelpatch.report(model).models[0].cache
    assert cache["reused"] == 0 and any("gradients are recorded" in r for r in cache["reasons"]), cache
    sample.sum().backward()  # once: "Trying to backward through the graph a second time"


def test_a_user_error_inside_a_lossless_fast_path_propagates_under_strict():
    """Regression (issue 17): Site.call took any non-fatal exception of a fast path for kernel trouble, so a user's
    hook error inside the lossless attention path came out as FastPathUnavailableError under strict=True (and ran
    the hook twice otherwise). Paths made of verified fused ops let it through."""
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model)
    _apply(model, strict=True)
    _forward(model, inputs)  # the fused ops' first sight, before the hook
    # norm_k runs inside the lossless attention site's fast path (at the default tier)
    handle = model.transformer_blocks[0].attn1.norm_k.register_forward_pre_hook(RaiseFrom(UserError("user hook")))
    with pytest.raises(UserError):
        _forward(model, inputs)
    handle.remove()


#: holes still open (each an xfail above); the ones found and closed keep their tests above as plain regressions
HOLE_TESTS = (test_an_interrupted_call_leaves_no_step_in_force,)
