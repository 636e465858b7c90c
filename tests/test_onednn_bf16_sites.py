"""SANA-Video's GLUMB convolutions and self-attention projections through the real pointwise_conv and linear
kernels at the default tier: bit-identical to unpatched diffusers and really fused; a hook added after ``apply``,
an instance forward, several threads and ``exact`` each run diffusers' module (counted, never warned), and the
hook still fires."""
import warnings

import pytest
import torch

import accelpatch
from accelpatch import testing as t
from accelpatch import verify

from ops.test_fused_cpu import needs_kernels

pytestmark = needs_kernels


def _model(batch=2):
    model = t.tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = t.sana_video_transformer_inputs(model, batch_size=batch, with_mask=True, seed=batch)
    with torch.no_grad():
        expected = model(**inputs).sample
    accelpatch.apply(model)
    return model, inputs, expected


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _conv_fusion(model, op="pointwise_conv"):
    return next(f for f in accelpatch.report(model).models[0].fusions if f.op == op)


def _blocks(model):
    return len(model.transformer_blocks)


@pytest.mark.parametrize("batch", [1, 2])
def test_the_glumb_convolutions_run_fused_and_bit_identical(batch):
    model, inputs, expected = _model(batch)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="accelpatch: lossless")
        for _ in range(3):
            assert torch.equal(_forward(model, inputs), expected)
    fusion = _conv_fusion(model)
    assert fusion.sites == _blocks(model) and not fusion.declined
    frames = inputs["hidden_states"].shape[0] * inputs["hidden_states"].shape[2]
    convs = {",".join(map(str, c.weight.shape)) for c in (model.transformer_blocks[0].ff.conv_inverted,
                                                          model.transformer_blocks[0].ff.conv_point)}
    mine = [d for d, _ in fusion.verified if d.startswith(f"cpu bfloat16[{frames},")
            and any(f"[{w}]" in d for w in convs)]
    assert len(mine) == 2  # conv_inverted and conv_point (verdicts are per process: other tests' are listed too)
    assert fusion.fused_calls == 3 * 2 * _blocks(model)
    projections = _conv_fusion(model, "linear")
    assert projections.sites == _blocks(model) and not projections.declined
    assert projections.fused_calls == 3 * 4 * _blocks(model)  # to_q, to_k, to_v, to_out[0]
    weight = ",".join(map(str, model.transformer_blocks[0].attn1.to_q.weight.shape))
    mine = [d for d, _ in projections.verified if d.startswith(f"cpu bfloat16[{batch},") and f"[{weight}]" in d]
    assert len(mine) == 2  # q/k/v share a signature; to_out's feature-minor input with its bias is the other
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), expected)


def test_a_hook_added_after_apply_runs_the_module_and_fires():
    model, inputs, expected = _model()
    seen = []
    handle = model.transformer_blocks[0].ff.conv_inverted.register_forward_hook(lambda m, a, out: seen.append(1))
    assert torch.equal(_forward(model, inputs), expected)
    assert seen == [1]
    fusion = _conv_fusion(model)
    assert fusion.reference_calls == {verify.MODULE_RUNS: 1}
    assert fusion.fused_calls == 2 * _blocks(model) - 1
    handle.remove()
    assert torch.equal(_forward(model, inputs), expected) and seen == [1]
    assert _conv_fusion(model).fused_calls == 2 * (2 * _blocks(model)) - 1


def test_a_hooked_projection_runs_the_module_and_fires():
    model, inputs, expected = _model()
    seen = []
    model.transformer_blocks[1].attn1.to_k.register_forward_pre_hook(lambda m, a: seen.append(1))
    assert torch.equal(_forward(model, inputs), expected) and seen == [1]
    fusion = _conv_fusion(model, "linear")
    assert fusion.reference_calls == {verify.MODULE_RUNS: 1} and fusion.fused_calls == 4 * _blocks(model) - 1


def test_a_convolution_with_its_own_forward_runs_the_module():
    model, inputs, expected = _model()
    conv = model.transformer_blocks[1].ff.conv_point
    calls = []

    def forward(x):
        calls.append(1)
        return torch.nn.Conv2d.forward(conv, x)

    conv.forward = forward
    assert torch.equal(_forward(model, inputs), expected) and calls == [1]
    assert _conv_fusion(model).reference_calls == {verify.MODULE_RUNS: 1}


def test_several_threads_run_eager_counted_without_warning():
    model, inputs, _ = _model()
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            unpatched = accelpatch.remove(model) or model(**inputs).sample
        accelpatch.apply(model)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="accelpatch: lossless")
            assert torch.equal(_forward(model, inputs), unpatched)
    finally:
        torch.set_num_threads(previous)
    fusion = _conv_fusion(model)
    assert fusion.fused_calls == 0 and fusion.reference_calls == {verify.THREADED: 2 * _blocks(model)}
    fusion = _conv_fusion(model, "linear")
    assert fusion.fused_calls == 0 and fusion.reference_calls == {verify.THREADED: 4 * _blocks(model)}


def test_exact_runs_no_convolution_kernel():
    model, inputs, expected = _model()
    with accelpatch.quality("exact"):
        assert torch.equal(_forward(model, inputs), expected)
    assert _conv_fusion(model).fused_calls == 0 and _conv_fusion(model, "linear").fused_calls == 0
