"""Wan 2.x with backend="sol_attn": high runs sparse with its exact fraction counted, cross-attention stays dense with
its reason, a masked call declines (strict raises), unknown layouts refused at apply(), Wan 2.2's two transformers,
compile at every tier, the step cache, threads, Ulysses, I2V; and a check that catches a wrong kernel. What every
family keeps (the tiers' bits, remove(), pickling, backward, the pipeline's dense steps, ...) is
tests/test_family_contract.py's."""
import textwrap
import warnings

import pytest
import torch

from _tiny_pipeline_checks import dense_kernel

import accelpatch
from accelpatch.models.wan import high as wan_high
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.core.sites import SITE_ATTR
from _multiprocess import START, run_ranks
from accelpatch.testing import (tiny_wan_pipeline, tiny_wan_transformer, wan_pipeline_call_kwargs,
                                wan_transformer_inputs)

from _sol_attn_models import SPARSE, ModelCase, model_fixtures, sol_attn_runs

CASE = ModelCase(build=lambda num_layers=None: tiny_wan_transformer(**({} if num_layers is None else
                                                                        {"num_layers": num_layers})),
                 inputs=wan_transformer_inputs, outputs=lambda out: (out.sample,), sol_kind="wan_sol_attn",
                 weight=lambda m: m.blocks[0].attn1.to_q.weight)


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(
        a.view(torch.int32), b.view(torch.int32))


model_and_reference, model = model_fixtures(CASE, _forward)


@pytest.fixture(scope="module")
def pipe_and_reference():
    pipe = tiny_wan_pipeline()
    return pipe, pipe(**wan_pipeline_call_kwargs(output_type="latent")).frames


def _sol(report):
    return [s for s in report.sites if s.kind == "wan_sol_attn"]


def _cross(report):
    return [s for s in report.sites if s.kind == "wan_cross_attention"]


def test_high_runs_sparse_with_its_exact_fraction_and_cross_attention_stays_dense(model):
    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE)
    out = _forward(m, inputs)
    assert torch.isfinite(out).all() and not torch.equal(out, reference)
    rep = accelpatch.report(m)
    assert [(s.path, s.fast_calls) for s in _sol(rep)] == [("blocks.0.attn1", 1), ("blocks.1.attn1", 1)]
    assert all(0 < s.stats["exact_fraction"] < 1 for s in _sol(rep)), _sol(rep)
    assert [(s.path, s.fast_calls, s.reference_calls) for s in _cross(rep)] == [
        (f"blocks.{i}.attn2", 0, {wan_high.CROSS_DENSE: 1}) for i in (0, 1)]
    assert rep.fallback_calls == {} and "exact_fraction" in str(rep)
    # all blocks exact (tau -> -inf) is dense attention up to rounding: an independent check of the projection
    accelpatch.apply(m, **SPARSE, tau=-1e9)
    torch.testing.assert_close(_forward(m, inputs), reference, atol=1e-4, rtol=1e-4)
    assert all(s.stats["exact_fraction"] == 1.0 for s in _sol(accelpatch.report(m)))


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_the_restated_projection_is_the_processors_and_a_wrong_kernel_is_caught(model, monkeypatch, fused_qkv):
    m, inputs, reference = model
    import accelpatch.sol_attn.op as ops

    if fused_qkv:  # diffusers' fuse_qkv_projections: one to_qkv linear (numerically another GEMM: a new reference)
        m.fuse_qkv_projections()
        reference = _forward(m, inputs)
    try:
        accelpatch.apply(m, **SPARSE)
        monkeypatch.setattr(ops, "sol_attn", dense_kernel(total_pairs=1))
        assert _bits_equal(_forward(m, inputs), reference)  # q/k/v, RoPE and to_out exactly as WanAttnProcessor's
        monkeypatch.setattr(ops, "sol_attn", dense_kernel(perturb=True, total_pairs=1))
        assert not torch.equal(_forward(m, inputs), reference)  # the same check sees a one-element error
        assert sol_attn_runs(_sol(accelpatch.report(m))) == 4
    finally:
        accelpatch.remove(m)
        if fused_qkv:
            m.unfuse_qkv_projections()


def test_a_masked_call_declines_warned_and_strict_raises(model):
    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE, strict=True)
    attn = m.blocks[0].attn1
    x = torch.randn(1, 64, m.config.num_attention_heads * m.config.attention_head_dim)
    with pytest.raises(FastPathUnavailableError, match="attention_mask"):
        attn(x, None, torch.zeros(1, 1, 64, 64))
    accelpatch.apply(m, **SPARSE)
    with pytest.warns(RuntimeWarning, match="attention_mask"):
        out = attn(x, None, torch.zeros(1, 1, 64, 64))
    accelpatch.remove(m)
    assert torch.equal(out, attn(x, None, torch.zeros(1, 1, 64, 64)))  # the fallback is the processor's output


def test_unknown_layouts_and_layer_indices_are_refused_at_apply(model):
    m, inputs, reference = model
    from diffusers.models.attention_processor import AttnProcessor2_0

    original = m.blocks[1].attn1.processor
    m.blocks[1].attn1.processor = AttnProcessor2_0()
    try:
        with pytest.raises(ValueError, match="blocks.1.attn1.processor is AttnProcessor2_0, expected WanAttnProcessor"):
            accelpatch.apply(m, **SPARSE)
        assert not any(SITE_ATTR in mod.__dict__ for mod in m.modules())
    finally:
        m.blocks[1].attn1.processor = original
    with pytest.raises(ValueError, match="valid layer indices are 0-1"):
        accelpatch.apply(m, backend="sol_attn", dense_layers="0,5")


def test_wan22_two_transformers_are_both_patched():
    pipe = tiny_wan_pipeline(two_transformers=True, boundary_ratio=0.9)
    call = lambda: wan_pipeline_call_kwargs(num_inference_steps=3, output_type="latent")  # noqa: E731
    reference = pipe(**call()).frames
    accelpatch.apply(pipe, **SPARSE)
    try:
        out = pipe(**call()).frames
        reports = [accelpatch.report(t) for t in (pipe.transformer, pipe.transformer_2)]
        fast = [sum(s.fast_calls for s in _sol(r)) for r in reports]
        assert all(f > 0 for f in fast) and sum(fast) == 3 * 2 * 2, fast  # 3 steps x CFG x 2 blocks
        assert not torch.equal(out, reference)
        with accelpatch.quality("exact"):
            assert _bits_equal(pipe(**call()).frames, reference)
    finally:
        accelpatch.remove(pipe)
    assert _bits_equal(pipe(**call()).frames, reference)


@pytest.mark.parametrize("region", ["blocks", "whole"])
def test_fullgraph_compile_equals_eager_at_every_tier(model, region):
    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE)
    eager = {tier: None for tier in ("exact", "high")}
    for tier in eager:
        with accelpatch.quality(tier):
            eager[tier] = _forward(m, inputs)
    torch._dynamo.reset()
    try:
        if region == "blocks":  # the pattern of diffusers' compile_repeated_blocks
            for block in m.blocks:
                block.compile(backend="eager", fullgraph=True)
            compiled = m
        else:
            compiled = torch.compile(m, backend="eager", fullgraph=True)
        for tier in eager:
            with accelpatch.quality(tier):
                assert torch.equal(_forward(compiled, inputs), eager[tier]), tier
        rep = accelpatch.report(m)
        assert sum(s.fast_calls for s in _sol(rep)) == 4 and rep.fallback_calls == {}
    finally:
        for block in m.blocks:
            block._compiled_call_impl = None
        torch._dynamo.reset()
    assert torch.equal(eager["exact"], reference)


@pytest.mark.parametrize("method", ["first_block", "mag"])
def test_step_cache_serves_wan(pipe_and_reference, method):
    from diffusers import FirstBlockCacheConfig, MagCacheConfig

    pipe, reference = pipe_and_reference
    steps = 4
    call = lambda: wan_pipeline_call_kwargs(num_inference_steps=steps, output_type="latent")  # noqa: E731
    plain = pipe(**call()).frames
    cache = FirstBlockCacheConfig(threshold=1e9) if method == "first_block" else MagCacheConfig(
        mag_ratios=[1.0] * steps, num_inference_steps=steps, retention_ratio=0.0, max_skip_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU-kernel build notes of the lossless fused block
        accelpatch.apply(pipe, cache=cache, cache_warmup_steps=1)
    try:
        assert _bits_equal(pipe(**call()).frames, plain)  # default tier: lossless, nothing reused
        with accelpatch.quality("high"):
            cached = pipe(**call()).frames
        counts = accelpatch.report(pipe).models[0].cache
        assert counts["reused"] > 0 and not torch.equal(cached, plain), counts
    finally:
        accelpatch.remove(pipe)
    assert _bits_equal(pipe(**call()).frames, plain)


def test_threads_share_one_patched_model_with_their_own_tiers(model):
    import threading

    m, inputs, reference = model
    accelpatch.apply(m, **SPARSE)
    sparse = _forward(m, inputs)
    barrier, outs = threading.Barrier(2), {}

    def worker(tier):
        with accelpatch.quality(tier):
            for _ in range(2):
                barrier.wait()
                outs.setdefault(tier, []).append(_forward(m, inputs))

    threads = [threading.Thread(target=worker, args=(t,)) for t in ("exact", "high")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outs["exact"]) == len(outs["high"]) == 2
    assert all(_bits_equal(o, reference) for o in outs["exact"]) and all(torch.equal(o, sparse) for o in outs["high"])


ULYSSES = START + textwrap.dedent("""
    def worker(rank, world, port, folder):
        start(rank, world, port)
        import accelpatch
        from diffusers import ContextParallelConfig
        from accelpatch.testing import tiny_wan_transformer, wan_transformer_inputs
        model = tiny_wan_transformer()
        inputs = {**wan_transformer_inputs(model), "return_dict": False}  # diffusers' CP hooks gather tensors only
        # (the gathered output is a functional collective's tensor: clone() waits for it, torch.save would not)
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        out = {}
        with torch.no_grad():
            out["unpatched"] = model(**inputs)[0].clone()
            accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)
            with accelpatch.quality("exact"):
                out["exact"] = model(**inputs)[0].clone()
            out["high"] = model(**inputs)[0].clone()
        report = accelpatch.report(model)
        out["sites"] = {s.path: (s.fast_calls, s.reference_calls) for s in report.sites
                        if s.kind != "wan_fused_attention"}  # the lossless RoPE site below Sol-Attn on attn1
        out["fallbacks"] = report.fallback_calls
        torch.save(out, os.path.join(folder, f"rank{rank}.pt"))

    if __name__ == "__main__":
        launch(worker, args=(2, int(sys.argv[2]), sys.argv[1]), nprocs=2)
""")


def test_ulysses_on_two_processes_runs_sol_attn_on_every_rank(model, tmp_path):
    """diffusers' own _cp_plan for Wan, Ulysses over 2 gloo ranks: each rank runs Sol-Attn over the whole sequence
    for its head, and gives the one-process sparse output; exact is the unsplit model's."""
    m, inputs, reference = model
    ranks = run_ranks(tmp_path, ULYSSES, 2)
    accelpatch.apply(m, **SPARSE)
    one_process = _forward(m, inputs)
    for out in ranks:
        assert torch.equal(out["exact"], out["unpatched"]) and out["fallbacks"] == {}
        torch.testing.assert_close(out["high"], one_process, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out["high"], out["unpatched"], atol=1e-4, rtol=1e-4)
        assert {p: c for p, c in out["sites"].items() if p.endswith("attn1")} == {
            f"blocks.{i}.attn1": (1, {"tier exact does not admit high": 1}) for i in (0, 1)}


def test_i2v_layout_image_context_stays_in_the_dense_cross_attention():
    """Wan 2.1 I2V: attn2 also attends to image tokens (added k/v; diffusers splits them off the first
    ``len - 512`` context rows): still a dense cross-attention site, and attn1 still runs sparse."""
    m = tiny_wan_transformer(image_dim=16, added_kv_proj_dim=256)
    inputs = {**wan_transformer_inputs(m, text_len=512), "encoder_hidden_states_image": torch.randn(1, 4, 16)}
    reference = _forward(m, inputs)
    accelpatch.apply(m, **SPARSE)
    with accelpatch.quality("exact"):
        assert _bits_equal(_forward(m, inputs), reference)
    assert not torch.equal(_forward(m, inputs), reference)
    rep = accelpatch.report(m)
    assert [s.fast_calls for s in _sol(rep)] == [1, 1] and all(
        s.fast_calls == 0 and s.reference_calls[wan_high.CROSS_DENSE] == 1 for s in _cross(rep))
    accelpatch.remove(m)
