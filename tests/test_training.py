"""Training and fine-tuning through patched models: gradients flow through every path, and gradient checkpointing
recomputes under the context the forward saw. (Once, backward through sol_attn raised "no autograd formula", and a
checkpointed recomputation read the tier, step and layout in force at backward time: MiniMax-H3 raised "A different
number of tensors was saved", SANA-Video recomputed on the reference path.)"""
import pytest
import torch

import accelpatch
from accelpatch.adapters.sana_video import linear_attention as sana_site
from accelpatch.testing import (minimax_h3_transformer_inputs, sana_video_transformer_inputs,
                                tiny_minimax_h3_transformer, tiny_sana_video_transformer)

H3_SPARSE = dict(backend="sol_attn", dense_steps=0, dense_layers="", tau=3.0)


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
def sana_high_on_cpu():
    """SANA-Video in bf16 with its high-tier fast path running on CPU (emulated BF16 GEMM), and a count of fast-path
    runs that includes recomputations (the site's counters skip those)."""
    runs = []
    original = sana_site.SanaLinearAttentionBF16._forward

    def counted(*args, **kwargs):
        runs.append(torch.is_grad_enabled())
        return original(*args, **kwargs)

    sana_site.SanaLinearAttentionBF16._forward = staticmethod(counted)
    try:
        with sana_site.emulate_bf16_gemm_on_cpu():
            model = tiny_sana_video_transformer(dtype=torch.bfloat16)
            accelpatch.apply(model)
            yield model, runs
    finally:
        sana_site.SanaLinearAttentionBF16._forward = staticmethod(original)


def test_sana_video_high_tier_trains_and_checkpointing_recomputes_on_the_fast_path(sana_high_on_cpu):
    model, runs = sana_high_on_cpu
    inputs = sana_video_transformer_inputs(model, batch_size=2)
    unpatched = _grads(model, inputs, tier="exact")
    plain = _grads(model, inputs, tier="high")
    assert len(runs) == 2 and unpatched.keys() == plain.keys()
    for name in plain:  # the same gradients up to the fast path's BF16 rounding
        torch.testing.assert_close(plain[name].float(), unpatched[name].float(), atol=0.1, rtol=0.05, msg=name)
    runs.clear()
    accelpatch.report(model, reset=True)
    checkpointed = _grads(model, inputs, checkpointing=True, tier="high")  # backward outside the quality block
    assert runs == [True, True, True, True]  # 2 sites: the forward and the recomputation both took the fast path
    _assert_equal_grads(checkpointed, plain)
    rep = accelpatch.report(model)
    assert rep.fast_calls == 2 and rep.reference_calls == {}  # the recomputation is not counted twice


def test_a_lossless_forward_recomputes_lossless_even_when_backward_runs_inside_quality_high(sana_high_on_cpu):
    model, runs = sana_high_on_cpu
    inputs = sana_video_transformer_inputs(model, batch_size=1)
    plain = _grads(model, inputs)
    checkpointed = _grads(model, inputs, checkpointing=True, backward_tier="high")
    assert runs == []
    _assert_equal_grads(checkpointed, plain)


def _h3():
    model = tiny_minimax_h3_transformer()
    return model, minimax_h3_transformer_inputs(model, num_video=1100)


def test_minimax_h3_all_exact_sol_attn_gradients_match_dense_attention():
    model, inputs = _h3()
    reference = _grads(model, inputs)
    accelpatch.apply(model, **{**H3_SPARSE, "tau": -1e9})  # every block exact: dense attention, other kernel
    grads = _grads(model, inputs)
    assert accelpatch.report(model).fast_calls == 2
    assert reference.keys() == grads.keys()
    for name in reference:
        torch.testing.assert_close(grads[name], reference[name], atol=2e-4, rtol=2e-4, msg=name)


def test_minimax_h3_sparse_training_with_and_without_checkpointing_agree():
    model, inputs = _h3()
    dense = _grads(model, inputs)
    accelpatch.apply(model, **H3_SPARSE)
    sparse = _grads(model, inputs)
    rep = accelpatch.report(model, reset=True)
    assert rep.fast_calls == 2 and all(s.stats["exact_fraction"] < 0.6 for s in rep.sites if s.kind == "sol_attn")
    assert any(not torch.allclose(sparse[n], dense[n], atol=1e-4, rtol=1e-4) for n in dense)  # really sparse
    checkpointed = _grads(model, inputs, checkpointing=True)
    _assert_equal_grads(checkpointed, sparse)
    assert accelpatch.report(model).fast_calls == 2  # recomputations are not counted again
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
    assert accelpatch.report(model).fast_calls == 2
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
