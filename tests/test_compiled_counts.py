"""Counting inside compiled code stays true, and never stops a model from being exported or packaged.

Once, the counters bumped captured tensors in place inside the graph (``tally.add_``): the eager backend kept those
adds, AOTAutograd dropped every add whose value the graph computed (the sparse exact fraction read 0.0 under
aot_eager and inductor while the output was right), and AOTInductor packaging of any patched model failed ("expected
an entirely functional graph"). Now a mutating custom op does the counting in compiled code, and an export counts
nothing and says so in the report.
"""
import warnings

import pytest
import torch

import accelpatch
from accelpatch.core.sites import NO_FUSED_OP_COMPILED
from accelpatch.lossless import verify
from accelpatch.testing import (minimax_h3_transformer_inputs, sana_video_transformer_inputs,
                                sana_video2_transformer_inputs, tiny_minimax_h3_transformer, tiny_sana_video2_transformer,
                                tiny_sana_video_transformer)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rejected CUDA-only paths warn at apply() on CPU
        yield
    torch._dynamo.reset()


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _sparse_h3():
    model = tiny_minimax_h3_transformer().eval()
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)
    return model, minimax_h3_transformer_inputs(model, num_video=300)


def _exact_fractions(model):
    return {s.path: s.stats.get("exact_fraction") for s in accelpatch.report(model).sites if s.kind == "sol_attn"}


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_statistics_of_compiled_blocks_equal_eager(backend):
    model, inputs = _sparse_h3()
    _forward(model, inputs)
    eager = _exact_fractions(model)
    assert all(0 < f < 1 for f in eager.values()), eager  # the input routes some blocks exactly, skips others
    accelpatch.report(model, reset=True)
    for block in model.transformer_blocks:
        block.compile(backend=backend)
    for _ in range(2):
        _forward(model, inputs)
    report = accelpatch.report(model)
    assert sum(s.fast_calls for s in report.sites if s.kind == "sol_attn") == 2 * len(eager)
    # the compiled blocks' lossless paths are counted, as what they were: their fused ops ran the reference chain
    # inside the graph, so the calls did nothing fast of accelpatch's (issue #30: they once counted as fast)
    blocks = [s for s in report.sites if s.kind == "minimax_h3_fused_block"]
    assert [(s.fast_calls, s.reference_calls) for s in blocks] == [(0, {NO_FUSED_OP_COMPILED: 2})] * len(eager)
    modulate = next(f for f in report.models[0].fusions if f.op == "modulate")
    assert modulate.fused_calls == 0 and modulate.reference_calls == {verify.IN_COMPILE: 2 * 2 * len(eager)}
    compiled = _exact_fractions(model)
    assert compiled.keys() == eager.keys()
    for path, fraction in eager.items():
        assert compiled[path] == pytest.approx(fraction, abs=1e-6), path


def test_an_export_counts_nothing_and_the_report_says_so():
    model, inputs = _sparse_h3()
    with accelpatch.quality("lossless"):
        program = torch.export.export(model, (), kwargs=inputs)
    program.module()(**inputs)
    report = accelpatch.report(model)
    assert report.fast_calls == 0 and not report.reference_calls
    text = str(report)
    assert "not counted: traced by torch.export" in text, text
    with pytest.raises(AssertionError, match="traced by torch.export"):
        report.assert_fast_path_ran()
    accelpatch.report(model, reset=True)
    _forward(model, inputs)  # eager calls count again, and the note is gone after the reset
    assert "not counted" not in str(accelpatch.report(model))


def _package(model, inputs, path):
    with torch.no_grad():
        program = torch.export.export(model, (), kwargs=inputs)
    package = torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    return torch._inductor.aoti_load_package(package)(**inputs).sample


def _sana():
    m = tiny_sana_video_transformer().eval()
    return m, sana_video_transformer_inputs(m), {}


def _sana_video2():
    m = tiny_sana_video2_transformer().eval()
    return m, sana_video2_transformer_inputs(m), {}


def _h3():
    m = tiny_minimax_h3_transformer().eval()
    return m, minimax_h3_transformer_inputs(m, num_video=300), {"backend": "sol_attn"}


# AOTInductor packaging compiles C++ for a minute or more per model: the default run packages MiniMax-H3 (sol_attn
# and the lossless fused sites), the slow marker the two SANA models too (their sites are exported by test_compile)
@pytest.mark.parametrize("make", [pytest.param(_sana, marks=pytest.mark.slow),
                                  pytest.param(_sana_video2, marks=pytest.mark.slow), _h3],
                         ids=["sana-video", "sana-video2", "minimax-h3-sol_attn"])
@pytest.mark.timeout(900)  # AOTInductor compiles C++: a minute or more per model
def test_aotinductor_package_of_a_patched_model_equals_the_unpatched_package(make, tmp_path):
    """diffusers' test_compile_works_with_aot, at the model's default tier (H3 with sol_attn: lossless, its bit
    identical tier; no quality("exact") needed)."""
    model, inputs, options = make()
    unpatched = _package(model, inputs, tmp_path / "unpatched.pt2")
    accelpatch.apply(model, **options)
    tier = accelpatch.quality("lossless") if options else accelpatch.quality(accelpatch.current_quality(model))
    with tier:
        patched = _package(model, inputs, tmp_path / "patched.pt2")
    assert torch.equal(patched, unpatched)
