"""Every call starts clean, also after a call that raised or was interrupted, eager or compiled.

torch runs ``always_call`` forward hooks for an ``Exception`` only. Once, a ``KeyboardInterrupt`` during a patched
forward left the step reading and the call's frame in the calling context; later calls then reset to that stale
value, and a whole-model compiled SANA-Video 2.0 (``sol_attn, dense_steps=2``) ran sparse at "step 3" where a
clean process runs dense (its step is unknown inside a whole-model graph).
"""
import warnings

import pytest
import torch

import accelpatch
from accelpatch.core.sites import NO_FUSED_OP_COMPILED
from accelpatch.core import steps
from accelpatch.testing import sana_video2_transformer_inputs, tiny_sana_video2_transformer


class Stop(Exception):
    pass


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUDA-only paths and the unknown step warn on CPU
        yield
    torch._dynamo.reset()


def _model():
    model = tiny_sana_video2_transformer().eval()
    accelpatch.apply(model, backend="sol_attn", dense_steps=2)
    return model


def _call(model, t, *, block_hook=None):
    inputs = sana_video2_transformer_inputs(model.config)
    inputs["timestep"] = torch.tensor([float(t), float(t)])
    handle = model.blocks[1].register_forward_pre_hook(block_hook) if block_hook else None
    try:
        with torch.no_grad():
            return model(**inputs).sample
    finally:
        if handle is not None:
            handle.remove()


def _interrupted_generation(model, error):
    for t in (900, 800, 700):  # steps 0, 1, 2 by the timestep clock
        _call(model, t)

    def stop(module, args):
        raise error

    with pytest.raises(type(error)):
        _call(model, 600, block_hook=stop)  # step 3, stopped midway


def _sparse_sites(report):
    return [s for s in report.sites if s.kind == "sol_attn" and s.mounted]


def _high_fast_calls(report):
    return sum(s.fast_calls for s in report.sites if s.tier == "high")


def _counts(report):
    """Every site's counts: what one call did, site by site."""
    return [(s.path, s.kind, s.fast_calls, s.reference_calls, s.fallback_calls) for s in report.sites]


#: the lossless site calls of one call of the 4-block test model: each block's lossless fusion (its two
#: sub-layers), and per attention the lossless path below the high one (linear attention in blocks 0-2, softmax
#: attention in block 3)
LOSSLESS_CALLS_PER_CALL = [("sana_video2_fused_block", 2), ("sana_video2_fused_linear_attention", 1)] * 3 + [
    ("sana_video2_fused_block", 2), ("sana_video2_fused_softmax_attention", 1)]


@pytest.mark.parametrize("error", [KeyboardInterrupt(), Stop("a failing hook")], ids=["interrupt", "exception"])
def test_an_eager_call_after_a_stopped_call_starts_and_ends_clean(error):
    model = _model()
    _interrupted_generation(model, error)
    seen = []
    _call(model, 950, block_hook=lambda module, args: seen.append(steps.current_step()))
    assert seen and set(seen) == {steps.StepReading(0, steps.TIMESTEP)}  # a new generation: step 0, not 4
    assert steps.current_step() == steps.StepReading(None, steps.UNKNOWN)
    assert steps.current_step().step is None
    assert accelpatch.core.steps.current_denoising_step() == 0


def _compile(model, how, fullgraph):
    if how == "torch.compile":  # hooks and forward compile as separate frames
        return torch.compile(model, backend="eager", fullgraph=fullgraph)
    model.compile(backend="eager", fullgraph=fullgraph)  # one frame: hooks inlined
    return model


CASES = [(KeyboardInterrupt(), "torch.compile", False), (KeyboardInterrupt(), "torch.compile", True),
         (KeyboardInterrupt(), "module.compile", True), (Stop("a failing hook"), "torch.compile", False)]


@pytest.mark.parametrize("error, how, fullgraph", CASES,
                         ids=["interrupt-torch.compile", "interrupt-torch.compile-fullgraph",
                              "interrupt-module.compile-fullgraph", "exception-torch.compile"])
def test_a_compiled_call_after_a_stopped_call_runs_as_in_a_clean_process(error, how, fullgraph):
    clean = _model()
    expected = _call(_compile(clean, how, fullgraph), 950)
    clean_report = accelpatch.report(clean)
    assert _high_fast_calls(clean_report) == 0 and clean_report.fallback_calls  # unknown step: the dense guard holds
    lossless = [s for s in clean_report.sites if s.tier == "lossless"]
    # compiled: the fused ops stand aside in the graph, so each lossless call is counted, and not as a fast one
    assert [(s.kind, s.reference_calls.get(NO_FUSED_OP_COMPILED, 0)) for s in lossless] == LOSSLESS_CALLS_PER_CALL
    assert sum(s.fast_calls for s in lossless) == 0
    torch._dynamo.reset()

    model = _model()
    compiled = _compile(model, how, fullgraph)
    _call(compiled, 950)  # a graph compiled in a clean context is cached before the interruption
    eager = model if how == "torch.compile" else _Eager(model)
    _interrupted_generation(eager, error)
    accelpatch.report(model, reset=True)
    out = _call(compiled, 950)
    report = accelpatch.report(model)
    assert _high_fast_calls(report) == 0, [(s.path, s.fast_calls) for s in _sparse_sites(report)]
    assert report.fallback_calls == clean_report.fallback_calls
    assert _counts(report) == _counts(clean_report)  # site by site, the lossless fusions included
    assert torch.equal(out, expected)
    assert steps.current_step().step is None


class _Eager:
    """Calls an in-place compiled module eagerly (its _call_impl, as torch does for an uncompiled module)."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        return self.model._call_impl(*args, **kwargs)
