"""LTX-2 with backend="sol_attn": the default dense steps and min_tokens floor keep a direct call dense (video and audio
bits), counted with their reasons; high runs sparse on the video self-attention with its exact fraction counted while
the audio self-attention and every cross-attention stay dense with their reasons, strict mode, unknown layouts refused
at apply(), LTX-2.3's layout (split RoPE, gates, the STG processor), compile; the step cache (FirstBlockCache) on the
(video, audio) blocks; and checks that catch a wrong kernel and a wrong second stream. What every family keeps (the
tiers' bits, remove(), pickling, backward, ...) is tests/test_family_contract.py's."""
import dataclasses

import pytest
import torch

from _tiny_pipeline_checks import dense_kernel

import accelpatch
from accelpatch.sol_attn.config import NOTHING_SKIPPED, SHORT_SEQUENCE, TOTAL_UNKNOWN
from accelpatch.models.ltx2 import adapter as ltx2_adapter
from accelpatch.models.ltx2 import high as ltx2_high
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.sol_attn import sites as sol_attention
from accelpatch.core.sites import SITE_ATTR
from accelpatch.testing import LTX2_3_TINY_CONFIG, ltx2_transformer_inputs, tiny_ltx2_transformer

from _step_cache_streams import all_bits_equal, cached_high_run, check_dual_stream_cache, reused_reference
from _sol_attn_models import SPARSE, ModelCase, model_fixtures, sol_attn_runs

CASE = ModelCase(build=lambda num_layers=None: tiny_ltx2_transformer(**({} if num_layers is None else
                                                                         {"num_layers": num_layers})),
                 inputs=ltx2_transformer_inputs, outputs=lambda out: (out.sample, out.audio_sample),
                 sol_kind="ltx2_sol_attn", weight=lambda m: m.transformer_blocks[0].attn1.to_q.weight)
ATTENTIONS = ltx2_adapter.ATTENTIONS


def _forward(model, inputs):
    with torch.no_grad():
        out = model(**inputs)
    return out.sample, out.audio_sample


def _bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(
        a.view(torch.int32), b.view(torch.int32))


def _both_equal(outs, reference):
    return all(_bits_equal(o, r) for o, r in zip(outs, reference, strict=True))


model_and_reference, model = model_fixtures(CASE, _forward)


def _sol(report):
    return [s for s in report.sites if s.kind == "ltx2_sol_attn"]


def _dense(report):
    return {s.path: (s.fast_calls, s.reference_calls) for s in report.sites if s.kind == "ltx2_dense_attention"}


def _expected_dense(calls=1):
    expected = {}
    for i in (0, 1):
        for name in ATTENTIONS[1:]:
            reason = ltx2_high.AUDIO_DENSE if name == "audio_attn1" else ltx2_high.CROSS_DENSE
            expected[f"transformer_blocks.{i}.{name}"] = (0, {reason: calls})
    return expected


def _reasons(m):
    return [(s.fast_calls, s.reference_calls, s.fallback_calls) for s in _sol(accelpatch.report(m, reset=True))]


def test_the_default_dense_steps_and_floor_keep_a_direct_call_dense_and_bit_identical(model):
    """The default dense_steps is a fraction (0.2 of the call's steps), which a direct call without its number of
    steps cannot place: it runs dense, warned and counted; with the number of steps given, the first step is a dense
    step and a later one runs dense under the default min_tokens floor (1,024 video tokens); with the floor off the
    later step runs the Sol-Attn op."""
    m, inputs, reference = model
    accelpatch.apply(m, backend="sol_attn", dense_layers="")
    with pytest.warns(RuntimeWarning, match="number of denoising steps is unknown"):
        assert _both_equal(_forward(m, inputs), reference)  # the timestep gives step 0, but not the call's length
    assert _reasons(m) == [(0, {TOTAL_UNKNOWN: 1}, {TOTAL_UNKNOWN: 1})] * 2
    with accelpatch.denoising_step(0, total=4):
        assert _both_equal(_forward(m, inputs), reference)
    assert _reasons(m) == [(0, {sol_attention.DENSE_STEP: 1}, {})] * 2
    with accelpatch.denoising_step(1, total=4):
        assert _both_equal(_forward(m, inputs), reference)
    assert _reasons(m) == [(0, {SHORT_SEQUENCE: 1}, {})] * 2
    accelpatch.apply(m, backend="sol_attn", dense_layers="", min_tokens=0)
    with accelpatch.denoising_step(0, total=4):
        assert _both_equal(_forward(m, inputs), reference)
    assert _reasons(m) == [(0, {sol_attention.DENSE_STEP: 1}, {})] * 2
    with accelpatch.denoising_step(1, total=4):
        assert not torch.equal(_forward(m, inputs)[0], reference[0])
    assert [sol_attn_runs([s]) for s in _sol(accelpatch.report(m))] == [1, 1]


def test_high_runs_sparse_on_video_self_attention_only_and_moves_the_audio_through_v2a(model):
    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE)
    video, audio = _forward(m, inputs)
    assert torch.isfinite(video).all() and torch.isfinite(audio).all() and not torch.equal(video, reference[0])
    rep = accelpatch.report(m)
    assert [(s.path, s.fast_calls) for s in _sol(rep)] == [(f"transformer_blocks.{i}.attn1", 1) for i in (0, 1)]
    assert all(0 < s.stats["exact_fraction"] < 1 for s in _sol(rep)), _sol(rep)
    assert _dense(rep) == _expected_dense() and rep.fallback_calls == {} and "exact_fraction" in str(rep)
    # The audio stream's own attention is dense, but it reads the video through video_to_audio_attn: it moves,
    # by much less than the video (measured: ~0.0018 vs ~0.0088 max abs, outputs of magnitude ~1-2).
    audio_moved = (audio - reference[1]).abs().max() / reference[1].abs().max()
    video_moved = (video - reference[0]).abs().max() / reference[0].abs().max()
    assert 0 < audio_moved < video_moved, (audio_moved, video_moved)
    # all blocks exact (tau -> -inf) is dense attention up to rounding: an independent check of the projection
    accelpatch.apply(m, **SPARSE, tau=-1e9)
    for out, ref in zip(_forward(m, inputs), reference):
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert all(s.stats["exact_fraction"] == 1.0 for s in _sol(accelpatch.report(m)))


@pytest.mark.parametrize("layout", ["ltx2", "ltx2.3"])
def test_the_restated_projection_is_the_processors_and_a_wrong_kernel_is_caught(model_and_reference, monkeypatch,
                                                                                 layout):
    """LTX-2 (interleaved RoPE) and LTX-2.3 (split RoPE, per-head gates, the STG processor, prompt modulation)."""
    import accelpatch.sol_attn.op as ops

    if layout == "ltx2":
        m, inputs, reference = model_and_reference
    else:
        m = tiny_ltx2_transformer(LTX2_3_TINY_CONFIG)
        inputs = ltx2_transformer_inputs(m)
        reference = _forward(m, inputs)
        assert m.transformer_blocks[0].attn1.to_gate_logits is not None
    try:
        accelpatch.apply(m, **SPARSE)
        monkeypatch.setattr(ops, "sol_attn", dense_kernel(total_pairs=1))
        assert _both_equal(_forward(m, inputs), reference)  # q/k/v, RoPE, gates, to_out exactly as the processor's
        monkeypatch.setattr(ops, "sol_attn", dense_kernel(perturb=True, total_pairs=1))
        perturbed = _forward(m, inputs)
        assert not torch.equal(perturbed[0], reference[0])  # the same check sees a one-element error
        assert not torch.equal(perturbed[1], reference[1])  # and so does the audio output (through v2a)
        assert sol_attn_runs(_sol(accelpatch.report(m))) == 4
    finally:
        accelpatch.remove(m)


def test_ltx23_stg_blocks_and_masked_calls_run_the_processor_counted(monkeypatch):
    import accelpatch.sol_attn.op as ops

    m = tiny_ltx2_transformer(LTX2_3_TINY_CONFIG)
    stg = {**ltx2_transformer_inputs(m), "spatio_temporal_guidance_blocks": [1],
           "perturbation_mask": torch.tensor([0.0])}
    masked = {**ltx2_transformer_inputs(m), "video_self_attention_mask": torch.ones(1, 1024, 1024)}
    references = [_forward(m, stg), _forward(m, masked)]
    accelpatch.apply(m, **SPARSE)
    monkeypatch.setattr(ops, "sol_attn", dense_kernel(total_pairs=1))
    assert _both_equal(_forward(m, stg), references[0])  # no warning: a dense-by-policy call
    assert {s.path: (s.fast_calls, s.reference_calls) for s in _sol(accelpatch.report(m))} == {
        "transformer_blocks.0.attn1": (0, {NOTHING_SKIPPED: 1}),  # the dense stand-in ran: it skips nothing
        "transformer_blocks.1.attn1": (0, {ltx2_high.PERTURBED_CALL: 1})}
    with pytest.warns(RuntimeWarning, match="attention_mask"):
        assert _both_equal(_forward(m, masked), references[1])
    assert all(s.reference_calls.get(sol_attention.MASKED_CALL) == 1 for s in _sol(accelpatch.report(m)))
    accelpatch.apply(m, **SPARSE, strict=True)
    with pytest.raises(FastPathUnavailableError, match="attention_mask"):
        _forward(m, masked)
    accelpatch.remove(m)


def test_strict_is_no_failure_at_a_dense_by_design_site(model):
    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE, strict=True)  # a dense-by-design site is no failure, also under strict
    x = torch.randn(1, 32, 64)
    assert _forward(m, inputs)[0].shape == reference[0].shape
    out = m.transformer_blocks[0].audio_attn1(x)
    accelpatch.remove(m)
    assert torch.equal(out, m.transformer_blocks[0].audio_attn1(x))


def test_unknown_layouts_layer_indices_and_mag_cache_are_refused_at_apply(model):
    m, inputs, reference = model
    from diffusers.models.attention_processor import AttnProcessor2_0

    original = m.transformer_blocks[1].attn1.processor
    m.transformer_blocks[1].attn1.processor = AttnProcessor2_0()
    try:
        with pytest.raises(ValueError, match="transformer_blocks.1.attn1.processor is AttnProcessor2_0, expected "
                                             "LTX2AudioVideoAttnProcessor"):
            accelpatch.apply(m, **SPARSE)
        assert not any(SITE_ATTR in mod.__dict__ for mod in m.modules())
    finally:
        m.transformer_blocks[1].attn1.processor = original
    original = m.transformer_blocks[0].audio_to_video_attn
    m.transformer_blocks[0].audio_to_video_attn = torch.nn.Identity()
    try:
        with pytest.raises(ValueError, match="audio_to_video_attn is Identity, expected LTX2Attention"):
            accelpatch.apply(m, **SPARSE)
    finally:
        m.transformer_blocks[0].audio_to_video_attn = original
    with pytest.raises(ValueError, match="valid layer indices are 0-1"):
        accelpatch.apply(m, backend="sol_attn", dense_layers="0,5")
    from diffusers import MagCacheConfig

    with pytest.raises(ValueError, match="cache method 'mag' is not available for LTX-2 .*MagCache hooks pass a "
                                         "block's second stream .*audio output.*it runs 'first_block'"):
        accelpatch.apply(m, cache=MagCacheConfig(mag_ratios=[1.0] * 4, num_inference_steps=4))
    assert not any(SITE_ATTR in mod.__dict__ for mod in m.modules())


def test_per_block_fullgraph_compile_equals_eager_on_the_sparse_path(model):
    """At ``high`` (the tier switch under compile is the shared mechanism, covered for every tier in test_wan.py;
    a second tier would recompile, ~3 s here)."""
    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE)
    eager = _forward(m, inputs)
    torch._dynamo.reset()
    try:
        for block in m.transformer_blocks:  # the pattern of diffusers' compile_repeated_blocks
            block.compile(backend="eager", fullgraph=True)
        assert _both_equal(_forward(m, inputs), eager)
        rep = accelpatch.report(m)
        assert sum(s.fast_calls for s in _sol(rep)) == 4 and rep.fallback_calls == {}  # eager and compiled
    finally:
        for block in m.transformer_blocks:
            block._compiled_call_impl = None
        torch._dynamo.reset()
    with accelpatch.quality("exact"):
        assert _both_equal(_forward(m, inputs), reference)


def _small_inputs(m):
    """A short video (2 x 8 x 8 tokens): the step-cache checks run many forwards."""
    return CASE.inputs(m, num_frames=2, height=8, width=8)


def test_the_step_cache_reuses_video_and_audio_under_high_and_is_bit_identical_below(model):
    m, inputs = model[0], _small_inputs(model[0])
    check_dual_stream_cache(m, inputs, CASE.outputs, second="audio_hidden_states")


def test_a_wrong_second_stream_is_caught_by_the_step_cache_check(model, monkeypatch):
    """Registered as diffusers' hooks read a second stream by default (``encoder_hidden_states``: here the text),
    a reused step's audio would be the text (here its width differs: the run fails); and a reference that passes
    the audio through a reused step without its residual (what MagCache's hooks do) differs in the audio alone."""
    m, inputs = model[0], _small_inputs(model[0])
    expected = reused_reference(m, inputs, CASE.outputs, "audio_hidden_states")
    monkeypatch.setattr(ltx2_adapter.LTX2Adapter, "cache",
                        dataclasses.replace(ltx2_adapter.LTX2Adapter.cache, second_stream="encoder_hidden_states"))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        cached_high_run(m, inputs, CASE.outputs)
    monkeypatch.undo()
    cached = cached_high_run(m, inputs, CASE.outputs)
    assert all_bits_equal(cached, expected)
    no_audio_residual = reused_reference(m, inputs, CASE.outputs, "audio_hidden_states", second_residual=False)
    assert not all_bits_equal(cached, no_audio_residual)
    assert all(torch.equal(run[0], ref[0]) for run, ref in zip(cached, no_audio_residual))  # the video agrees
