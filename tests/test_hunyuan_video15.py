"""HunyuanVideo 1.5 with backend="sol_attn": high runs sparse over the valid prefix with its exact fraction counted,
the text refiner stays dense with its reason, calls whose mask is not the model's layout decline (counted; strict
raises), unknown layouts refused at apply(), regional compile, image-to-video, bf16; the step cache (FirstBlockCache
and MagCache) on the (video, text) blocks; and checks that catch a wrong kernel and a wrong stream layout. What every
family keeps (the tiers' bits, remove(), pickling, backward, ...) is tests/test_family_contract.py's."""
import dataclasses
import types

import pytest
import torch

import accelpatch
from accelpatch.models.hunyuan_video15 import adapter as hy_adapter
from accelpatch.models.hunyuan_video15 import high as hy_high
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.core.sites import SITE_ATTR
from accelpatch.testing import hunyuan_video15_transformer_inputs, tiny_hunyuan_video15_transformer

from _step_cache_streams import (STEPS, all_bits_equal, apply_cache, cached_high_run, check_dual_stream_cache,
                                 mag_reference, reused_reference, run_steps)
from _sol_attn_models import SPARSE, ModelCase, model_fixtures, sol_attn_runs

CASE = ModelCase(build=lambda num_layers=None: tiny_hunyuan_video15_transformer(
                     **({} if num_layers is None else {"num_layers": num_layers})),
                 inputs=hunyuan_video15_transformer_inputs, outputs=lambda out: (out.sample,),
                 sol_kind="hunyuan_video15_sol_attn", weight=lambda m: m.transformer_blocks[0].attn.to_q.weight)
#: the default inputs' joint sequence: 4 x 16 x 16 video tokens, then 4 image + 4 ByT5 + 8 Qwen text tokens, of
#: which 3 + 6 are valid (the image tokens are zeros: text-to-video masks them)
VIDEO, TEXT, VALID = 1024, 16, 9


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(
        a.view(torch.int32), b.view(torch.int32))


model_and_reference, model = model_fixtures(CASE, _forward)


def _sol(report):
    return [s for s in report.sites if s.kind == "hunyuan_video15_sol_attn"]


def _refiner(report):
    return [s for s in report.sites if s.kind == "hunyuan_video15_refiner_attention"]


def test_high_runs_sparse_with_its_exact_fraction_and_the_refiner_stays_dense(model):
    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE)
    out = _forward(m, inputs)
    assert torch.isfinite(out).all() and not torch.equal(out, reference)
    rep = accelpatch.report(m)
    assert [(s.path, s.fast_calls) for s in _sol(rep)] == [(f"transformer_blocks.{i}.attn", 1) for i in (0, 1)]
    assert all(0 < s.stats["exact_fraction"] < 1 for s in _sol(rep)), _sol(rep)
    # the 6 + 3 valid text rows recomputed densely: 1024 of the prefix's 1033 rows are sparse
    assert all(s.stats["sparse_row_fraction"] == VIDEO / (VIDEO + VALID) for s in _sol(rep)), _sol(rep)
    assert [(s.path, s.fast_calls, s.reference_calls) for s in _refiner(rep)] == [
        ("context_embedder.token_refiner.refiner_blocks.0.attn", 0, {hy_high.REFINER_DENSE: 1})]
    assert rep.fallback_calls == {} and "exact_fraction" in str(rep)
    accelpatch.apply(m, **SPARSE, dense_rows="none")
    _forward(m, inputs)
    assert all(s.stats["sparse_row_fraction"] == 1.0 for s in _sol(accelpatch.report(m)))
    # all blocks exact (tau -> -inf) is dense attention up to rounding: an independent check of the prefix
    accelpatch.apply(m, **SPARSE, tau=-1e9)
    torch.testing.assert_close(_forward(m, inputs), reference, atol=1e-4, rtol=1e-4)
    assert all(s.stats["exact_fraction"] == 1.0 for s in _sol(accelpatch.report(m)))


def _masked_dense_kernel(total, perturb=False):
    """A stand-in for the Sol-Attn op: dense SDPA the way the model's masked call runs it (the valid prefix's keys
    padded back to the whole sequence with masked keys, since CPU SDPA rounds differently over fewer keys), so the
    sparse path's restated projection, RoPE, prefix and output split must give the reference bit for bit;
    optionally perturbed in one element."""
    def kernel(q, k, v, **kwargs):
        b, length, h, d = q.shape
        pad = q.new_zeros(b, total - length, h, d)
        mask = (torch.arange(total) < length).expand(b, 1, length, total)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.permute(0, 2, 1, 3), torch.cat([k, pad], 1).permute(0, 2, 1, 3),
            torch.cat([v, pad], 1).permute(0, 2, 1, 3), attn_mask=mask).permute(0, 2, 1, 3)
        if perturb:
            out = out.clone()
            out[0, 5, 1, 7] += 1e-3
        return out, types.SimpleNamespace(exact_pairs=torch.ones(1), total_pairs=1)
    return kernel


@pytest.mark.parametrize("dense_rows", ["text_audio", "none"])
def test_the_restated_path_is_the_processors_and_a_wrong_kernel_is_caught(model, monkeypatch, dense_rows):
    m, inputs, reference = model
    import accelpatch.sol_attn.op as ops

    accelpatch.apply(m, **SPARSE, dense_rows=dense_rows)
    monkeypatch.setattr(ops, "sol_attn", _masked_dense_kernel(VIDEO + TEXT))
    assert _bits_equal(_forward(m, inputs), reference)  # q/k/v, RoPE, text rows, padding rows, to_out as diffusers'
    monkeypatch.setattr(ops, "sol_attn", _masked_dense_kernel(VIDEO + TEXT, perturb=True))
    assert not torch.equal(_forward(m, inputs), reference)  # the same check sees a one-element error
    assert sol_attn_runs(_sol(accelpatch.report(m))) == 4


def test_a_mask_that_is_not_the_layout_declines_counted_and_strict_raises(model):
    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE, strict=True)
    # two batch rows with 6 and 5 valid Qwen tokens: no common valid prefix
    batch = hunyuan_video15_transformer_inputs(m, batch_size=2)
    batch["encoder_attention_mask"] = batch["encoder_attention_mask"].clone()
    batch["encoder_attention_mask"][1, 5] = 0
    with accelpatch.quality("exact"):
        expected = _forward(m, batch)
    with pytest.raises(FastPathUnavailableError, match="different numbers of valid text tokens"):
        _forward(m, batch)
    accelpatch.apply(m, **SPARSE)
    with pytest.warns(RuntimeWarning, match="different numbers of valid text tokens"):
        assert _bits_equal(_forward(m, batch), expected)  # the fallback is the processor's output
    assert accelpatch.report(m).fallback_calls == {hy_high.UNEVEN_TEXT: 2}
    # valid text tokens that are not first (the model's forward never builds this; a direct call can)
    attn = m.transformer_blocks[0].attn
    x, text = torch.randn(1, 64, 256), torch.randn(1, 4, 256)
    holes = torch.tensor([[1, 0, 1, 0]])
    with pytest.warns(RuntimeWarning, match="not first"):
        out = attn(x, text, holes)
    accelpatch.remove(m)
    assert all(torch.equal(a, b) for a, b in zip(out, attn(x, text, holes)))


def test_unknown_layouts_and_layer_indices_are_refused_at_apply(model):
    m, inputs, reference = model
    from diffusers.models.attention_processor import AttnProcessor2_0

    original = m.transformer_blocks[1].attn.processor
    m.transformer_blocks[1].attn.processor = AttnProcessor2_0()
    try:
        with pytest.raises(ValueError, match="transformer_blocks.1.attn.processor is AttnProcessor2_0, expected "
                                             "HunyuanVideo15AttnProcessor2_0"):
            accelpatch.apply(m, **SPARSE)
        assert not any(SITE_ATTR in mod.__dict__ for mod in m.modules())
    finally:
        m.transformer_blocks[1].attn.processor = original
    with pytest.raises(ValueError, match="valid layer indices are 0-1"):
        accelpatch.apply(m, backend="sol_attn", dense_layers="0,5")


def test_regional_compile_equals_eager_at_every_tier(model):
    """A block compiled on its own (diffusers' compile_repeated_blocks pattern): fullgraph at exact; at high the
    valid-text count read from the mask is a graph break, so high compiles without fullgraph."""
    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE)
    with accelpatch.quality("high"):
        sparse = _forward(m, inputs)
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        for tier, fullgraph, expected in (("exact", True, reference), ("high", False, sparse)):
            block = m.transformer_blocks[0]  # one block compiled (the other eager) keeps the test short
            block._compiled_call_impl = None
            block.compile(backend="eager", fullgraph=fullgraph)
            with accelpatch.quality(tier):
                assert torch.equal(_forward(m, inputs), expected), tier
        rep = accelpatch.report(m)
        assert sum(s.fast_calls for s in _sol(rep)) == 4 and rep.fallback_calls == {}
        assert counters["stats"]["unique_graphs"] >= 3  # exact: one graph; high: graphs around the break
    finally:
        for block in m.transformer_blocks:
            block._compiled_call_impl = None
        torch._dynamo.reset()


def test_image_to_video_with_no_padding_runs_sparse_over_the_whole_sequence(model, monkeypatch):
    """I2V (image tokens valid) with every text token valid: the prefix is the whole joint sequence (no padding
    rows); the stand-in dense kernel still gives diffusers' bits and the real one runs sparse."""
    m, _, _ = model
    import accelpatch.sol_attn.op as ops

    inputs = hunyuan_video15_transformer_inputs(m, image=True, text_valid=8, text_2_valid=4)
    reference = _forward(m, inputs)
    accelpatch.apply(m, **SPARSE)
    out = _forward(m, inputs)
    assert torch.isfinite(out).all() and not torch.equal(out, reference)
    assert all(s.fast_calls == 1 and s.stats["sparse_row_fraction"] == VIDEO / (VIDEO + TEXT)
               for s in _sol(accelpatch.report(m)))
    monkeypatch.setattr(ops, "sol_attn", _masked_dense_kernel(VIDEO + TEXT))
    assert _bits_equal(_forward(m, inputs), reference)


def test_bf16_exact_is_diffusers_bits_and_high_runs_sparse():
    m = tiny_hunyuan_video15_transformer(dtype=torch.bfloat16, num_layers=1)
    inputs = hunyuan_video15_transformer_inputs(m)  # bf16 latents, embeddings and timestep, as the pipeline's
    reference = _forward(m, inputs)
    accelpatch.apply(m, **SPARSE)
    with accelpatch.quality("exact"):
        out = _forward(m, inputs)
    assert out.dtype == reference.dtype == torch.bfloat16 and out.stride() == reference.stride()
    assert torch.equal(out.view(torch.int16), reference.view(torch.int16))
    sparse = _forward(m, inputs)
    assert sparse.dtype == torch.bfloat16 and torch.isfinite(sparse).all() and not torch.equal(sparse, reference)
    assert _sol(accelpatch.report(m))[0].fast_calls == 1
    accelpatch.remove(m)


def _small_inputs(m):
    """A short video (2 x 8 x 8 tokens): the step-cache checks run many forwards."""
    return CASE.inputs(m, num_frames=2, height=8, width=8)


def test_the_step_cache_reuses_both_streams_under_high_and_is_bit_identical_below(model):
    m, inputs = model[0], _small_inputs(model[0])
    check_dual_stream_cache(m, inputs, CASE.outputs, second="encoder_hidden_states")


def test_a_wrong_stream_layout_is_caught_by_the_step_cache_check(model, monkeypatch):
    """The same check against a cache registered with the streams swapped (the text taken as the hidden states)."""
    m, inputs = model[0], _small_inputs(model[0])
    expected = reused_reference(m, inputs, CASE.outputs, "encoder_hidden_states")
    monkeypatch.setattr(hy_adapter.HunyuanVideo15Adapter, "cache",
                        dataclasses.replace(hy_adapter.HunyuanVideo15Adapter.cache, block_outputs=(1, 0)))
    with pytest.raises(RuntimeError, match="size of tensor"):
        assert all_bits_equal(cached_high_run(m, inputs, CASE.outputs), expected)
    monkeypatch.undo()
    assert all_bits_equal(cached_high_run(m, inputs, CASE.outputs), expected)


def test_mag_cache_skips_the_stack_under_high_and_is_bit_identical_below(model):
    from diffusers import MagCacheConfig

    m, inputs = model[0], _small_inputs(model[0])
    plain = run_steps(m, inputs, CASE.outputs)
    expected = mag_reference(m, inputs, CASE.outputs)
    # ratios of 1: MagCache's accumulated error stays 0; it skips whenever its max_skip_steps and the guards allow
    config = MagCacheConfig(mag_ratios=[1.0] * STEPS, num_inference_steps=STEPS, retention_ratio=0.0,
                            max_skip_steps=2)
    apply_cache(m, cache=config, cache_warmup_steps=1)
    try:
        assert all_bits_equal(run_steps(m, inputs, CASE.outputs), plain)  # lossless: MagCache never skips
        with accelpatch.quality("high"):
            cached = run_steps(m, inputs, CASE.outputs)
        cache = accelpatch.report(m).models[0].cache
        assert (cache["computed"], cache["reused"]) == (STEPS + 2, 3), cache
    finally:
        accelpatch.remove(m)
    assert all_bits_equal(cached, expected)
    assert not all_bits_equal(cached, plain)
