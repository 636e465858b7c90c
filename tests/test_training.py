"""Training and fine-tuning through patched models: gradients flow through every path, and gradient checkpointing
recomputes under the context the forward saw. (Once, backward through sol_attn raised "no autograd formula", and a
checkpointed recomputation read the tier, step and layout in force at backward time: MiniMax-H3 raised "A different
number of tensors was saved", SANA-Video recomputed on the reference path.)"""
import pytest
import torch
from _cpu_fast_paths import run_fast_paths_on_cpu

import accelpatch
from accelpatch.sol_attn.config import NOTHING_SKIPPED
from accelpatch.core.sites import NO_FUSED_OP
from accelpatch.lossless import verify
from accelpatch.models.sana_video import linear_attention as sana_site
from accelpatch.testing import (minimax_h3_transformer_inputs, sana_video_transformer_inputs,
                                tiny_minimax_h3_transformer, tiny_sana_video_transformer)

#: min_tokens=0: the tiny model's 1,114 rows lie below the default floor, under which every call runs dense
H3_SPARSE = dict(backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0, tau=3.0)


def _grads(model, inputs, *, checkpointing=False, tier=None, backward_tier=None):
    """Parameter gradients of sum(output**2) after one training step (forward under ``tier``, backward under
    ``backward_tier``)."""
    model.train()
    model.zero_grad(set_to_none=True)
    if checkpointing:
        model.enable_gradient_checkpointing()
    else:
        model.disable_gradient_checkpointing()
    with (accelpatch.quality(tier) if tier else _nothing()):
        loss = model(**inputs).sample.float().pow(2).sum()
    with (accelpatch.quality(backward_tier) if backward_tier else _nothing()):
        loss.backward()
    model.eval()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _assert_equal_grads(a, b):
    assert a.keys() == b.keys() and len(a) > 10
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, different[:5]


def test_exact_and_lossless_training_give_the_unpatched_gradients_bit_for_bit():
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model, batch_size=2)
    reference = _grads(model, inputs)
    reference_ckpt = _grads(model, inputs, checkpointing=True)
    accelpatch.apply(model)
    for tier in (None, "exact", "lossless"):
        _assert_equal_grads(_grads(model, inputs, tier=tier), reference)
        _assert_equal_grads(_grads(model, inputs, tier=tier, checkpointing=True), reference_ckpt)


@pytest.fixture
def sana_high_on_cpu(monkeypatch):
    """SANA-Video in bf16 with its high-tier fast path running on CPU (emulated BF16 GEMM), and the runs of the attn1
    restatement that include recomputations (the sites' counters skip those): grad mode per run of the high path
    (BF16 first GEMM), and of the lossless path stacked below it (reference GEMMs)."""
    runs, lossless_runs = [], []
    original = sana_site.linear_attention

    def counted(*args, bf16_first_gemm, **kwargs):
        (runs if bf16_first_gemm else lossless_runs).append(torch.is_grad_enabled())
        return original(*args, bf16_first_gemm=bf16_first_gemm, **kwargs)

    monkeypatch.setattr(sana_site, "linear_attention", counted)  # both attn1 paths call it through the module
    with run_fast_paths_on_cpu():
        model = tiny_sana_video_transformer(dtype=torch.bfloat16)
        accelpatch.apply(model)
        yield model, runs, lossless_runs


def test_sana_video_high_tier_trains_and_checkpointing_recomputes_on_the_fast_path(sana_high_on_cpu):
    model, runs, lossless_runs = sana_high_on_cpu
    inputs = sana_video_transformer_inputs(model, batch_size=2)
    unpatched = _grads(model, inputs, tier="exact")
    plain = _grads(model, inputs, tier="high")
    assert len(runs) == 2 and lossless_runs == [] and unpatched.keys() == plain.keys()
    for name in plain:  # the same gradients up to the fast path's BF16 rounding
        torch.testing.assert_close(plain[name].float(), unpatched[name].float(), atol=0.1, rtol=0.05, msg=name)
    runs.clear()
    accelpatch.report(model, reset=True)
    checkpointed = _grads(model, inputs, checkpointing=True, tier="high")  # backward outside the quality block
    assert runs == [True, True, True, True]  # 2 sites: the forward and the recomputation both took the fast path
    assert lossless_runs == []  # and never passed a call to the lossless attn1 path below it
    _assert_equal_grads(checkpointed, plain)
    rep = accelpatch.report(model)
    # the recomputation is not counted twice: one call per site; the block and GLUMB fusions ran (high admits
    # lossless) but under autograd their fused ops ran the eager chains, so those calls were not fast; the lossless
    # attn1 path below the high one saw no call
    assert [(s.path, s.fast_calls) for s in rep.sites if s.tier == "high"] == \
        [("transformer_blocks.0.attn1", 1), ("transformer_blocks.1.attn1", 1)]
    assert {(s.kind, s.fast_calls, sum(s.reference_calls.values())) for s in rep.sites if s.tier == "lossless"} == {
        ("sana_video_fused_block", 0, 1), ("sana_video_fused_glumb", 0, 1), ("sana_video_fused_linear_attention", 0, 0)}
    assert rep.fast_calls == 2 and rep.reference_calls == {NO_FUSED_OP: 4} and rep.fallback_calls == {}


def test_a_lossless_forward_recomputes_lossless_even_when_backward_runs_inside_quality_high(sana_high_on_cpu):
    model, runs, lossless_runs = sana_high_on_cpu
    inputs = sana_video_transformer_inputs(model, batch_size=1)
    plain = _grads(model, inputs)
    assert lossless_runs == [True, True]  # the default tier: the lossless attn1 path, once per block
    lossless_runs.clear()
    accelpatch.report(model, reset=True)
    checkpointed = _grads(model, inputs, checkpointing=True, backward_tier="high")
    assert runs == []  # the high path never ran, not even in the recomputation under quality("high")
    assert lossless_runs == [True, True, True, True]  # 2 blocks: the forward and its recomputation
    _assert_equal_grads(checkpointed, plain)
    rep = accelpatch.report(model)
    assert [(s.fast_calls, s.reference_calls) for s in rep.sites if s.tier == "high"] == \
        [(0, {"tier lossless does not admit high": 1})] * 2  # the recomputation not counted again
    # each lossless site ran once (its fused ops under autograd: the eager chains), not again in the recomputation
    assert [(s.fast_calls, s.reference_calls) for s in rep.sites if s.tier == "lossless"] == [(0, {NO_FUSED_OP: 1})] * 6


def test_a_recomputation_does_not_count_the_fused_ops_again():
    """Regression: accelpatch.lossless.verify.FusedOp counted its calls again while a checkpointed block was recomputed (the
    sites' own counters skip recomputations, call_context.recomputing())."""
    model = tiny_sana_video_transformer()
    inputs = sana_video_transformer_inputs(model, batch_size=1)
    accelpatch.apply(model)
    _grads(model, inputs)
    plain = {f.op: f.reference_calls for f in accelpatch.report(model, reset=True).models[0].fusions}
    assert plain["modulate"] == {verify.IN_AUTOGRAD: 2 * 2}  # 2 blocks × norm1/norm2, under autograd
    _grads(model, inputs, checkpointing=True)
    rep = accelpatch.report(model)
    # the sites count each call once (per block: the block, attn1 below the high path, their fused ops under
    # autograd running the eager chains; float32 GLUMB stays dense by its policy)
    lossless = [s for s in rep.sites if s.tier == "lossless"]
    assert [s.fast_calls for s in lossless] == [0] * 6
    assert [s.reference_calls.get(NO_FUSED_OP, 0) for s in lossless] == [1, 1, 0] * 2
    assert {f.op: f.reference_calls for f in rep.models[0].fusions} == plain  # and so should the fused ops


def _h3():
    model = tiny_minimax_h3_transformer()
    return model, minimax_h3_transformer_inputs(model, num_video=1100)


def _fast_by_kind(report):
    """kind -> fast calls of each of its sites, in site order."""
    out = {}
    for s in report.sites:
        out.setdefault(s.kind, []).append(s.fast_calls)
    return out


#: fast calls of one training forward of the float32 H3 with sol_attn, per site kind: sol_attn ran in both blocks
#: (the refiner stays dense, the lossless attention below sol_attn saw no call); the lossless block fusion ran, but
#: under autograd its fused ops ran the eager chains (not fast); SwiGLU's bf16 tables kept its float32 calls on the
#: reference
H3_ONE_SPARSE_FORWARD = {"sol_attn_refiner": [0, 0], "minimax_h3_fused_block": [0, 0], "sol_attn": [1, 1],
                         "minimax_h3_fused_attention": [0, 0], "fused_swiglu": [0, 0]}


def test_minimax_h3_all_exact_sol_attn_gradients_match_dense_attention():
    model, inputs = _h3()
    reference = _grads(model, inputs)
    accelpatch.apply(model, **{**H3_SPARSE, "tau": -1e9})  # every block exact: dense attention, other kernel
    grads = _grads(model, inputs)
    rep = accelpatch.report(model)
    assert _fast_by_kind(rep) == {**H3_ONE_SPARSE_FORWARD, "sol_attn": [0, 0]}  # Sol-Attn ran, skipping nothing
    assert [s.reference_calls for s in rep.sites if s.kind == "sol_attn"] == [{NOTHING_SKIPPED: 1}] * 2
    assert {r: n for s in rep.sites if s.kind == "fused_swiglu" for r, n in s.reference_calls.items()} == {
        "activations are torch.float32: the fused SiLU tables are bfloat16": 1}
    assert reference.keys() == grads.keys()
    for name in reference:
        torch.testing.assert_close(grads[name], reference[name], atol=2e-4, rtol=2e-4, msg=name)


def test_minimax_h3_sparse_training_with_and_without_checkpointing_agree():
    model, inputs = _h3()
    dense = _grads(model, inputs)
    accelpatch.apply(model, **H3_SPARSE)
    sparse = _grads(model, inputs)
    rep = accelpatch.report(model, reset=True)
    assert _fast_by_kind(rep) == H3_ONE_SPARSE_FORWARD
    assert all(s.stats["exact_fraction"] < 0.6 for s in rep.sites if s.kind == "sol_attn")
    assert any(not torch.allclose(sparse[n], dense[n], atol=1e-4, rtol=1e-4) for n in dense)  # really sparse
    checkpointed = _grads(model, inputs, checkpointing=True)
    _assert_equal_grads(checkpointed, sparse)
    assert _fast_by_kind(accelpatch.report(model)) == H3_ONE_SPARSE_FORWARD  # recomputations are not counted again
    accelpatch.remove(model)
    _assert_equal_grads(_grads(model, inputs, checkpointing=True), _grads(model, inputs))
    assert model._gradient_checkpointing_func.__class__.__name__ != "ContextPreservingCheckpoint"


def test_minimax_h3_checkpointing_enabled_before_apply_and_a_dense_step_in_backward():
    model, inputs = _h3()
    model.enable_gradient_checkpointing()
    accelpatch.apply(model, **{**H3_SPARSE, "dense_steps": 2})
    model.train()
    with accelpatch.denoising_step(5):  # a sparse step; backward runs outside it (where the step would be 0)
        loss = model(**inputs).sample.pow(2).sum()
    loss.backward()
    assert _fast_by_kind(accelpatch.report(model)) == H3_ONE_SPARSE_FORWARD  # the recomputation is not counted
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
