"""SANA-Video's GLUMB convolutions and self-attention projections through the real pointwise_conv and linear
kernels at the default tier: bit-identical to unpatched diffusers and really fused on the CPU kind the kernels replay
(AVX-512 without bf16 instructions), the reference counted "not this CPU" on any other (tests/_cpu_kind.py); a hook
added after ``apply``, an instance forward, several threads and ``exact`` each run diffusers' module (counted, never
warned), and the hook still fires."""
import warnings

import pytest
import torch

import accelpatch
from accelpatch import testing as t
from accelpatch.lossless import verify

from _cpu_kind import ONEDNN_EMULATED_BF16, check_onednn_counts
from _wrapped_tensors import Wrapped
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
    assert fusion.sites == _blocks(model)
    frames = inputs["hidden_states"].shape[0] * inputs["hidden_states"].shape[2]
    convs = {",".join(map(str, c.weight.shape)) for c in (model.transformer_blocks[0].ff.conv_inverted,
                                                          model.transformer_blocks[0].ff.conv_point)}
    mine = [d for d, _ in fusion.verified if d.startswith(f"cpu bfloat16[{frames},")
            and any(f"[{w}]" in d for w in convs)]
    # conv_inverted and conv_point (verdicts are per process: other tests' are listed too); none elsewhere
    assert len(mine) == (2 if ONEDNN_EMULATED_BF16 else 0)
    check_onednn_counts(fusion, 3 * 2 * _blocks(model))
    projections = _conv_fusion(model, "linear")
    assert projections.sites == _blocks(model)
    check_onednn_counts(projections, 3 * 4 * _blocks(model))  # to_q, to_k, to_v, to_out[0]
    weight = ",".join(map(str, model.transformer_blocks[0].attn1.to_q.weight.shape))
    mine = [d for d, _ in projections.verified if d.startswith(f"cpu bfloat16[{batch},") and f"[{weight}]" in d]
    # q/k/v share a signature; to_out's feature-minor input with its bias is the other
    assert len(mine) == (2 if ONEDNN_EMULATED_BF16 else 0)
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), expected)


def test_a_hook_added_after_apply_runs_the_module_and_fires():
    model, inputs, expected = _model()
    seen = []
    handle = model.transformer_blocks[0].ff.conv_inverted.register_forward_hook(lambda m, a, out: seen.append(1))
    assert torch.equal(_forward(model, inputs), expected)
    assert seen == [1]
    check_onednn_counts(_conv_fusion(model), 2 * _blocks(model) - 1, {verify.MODULE_RUNS: 1})
    handle.remove()
    assert torch.equal(_forward(model, inputs), expected) and seen == [1]
    check_onednn_counts(_conv_fusion(model), 2 * (2 * _blocks(model)) - 1, {verify.MODULE_RUNS: 1})


def test_a_hooked_projection_runs_the_module_and_fires():
    model, inputs, expected = _model()
    seen = []
    model.transformer_blocks[1].attn1.to_k.register_forward_pre_hook(lambda m, a: seen.append(1))
    assert torch.equal(_forward(model, inputs), expected) and seen == [1]
    check_onednn_counts(_conv_fusion(model, "linear"), 4 * _blocks(model) - 1, {verify.MODULE_RUNS: 1})


def test_a_convolution_with_its_own_forward_runs_the_module():
    model, inputs, expected = _model()
    conv = model.transformer_blocks[1].ff.conv_point
    calls = []

    def forward(x):
        calls.append(1)
        return torch.nn.Conv2d.forward(conv, x)

    conv.forward = forward
    assert torch.equal(_forward(model, inputs), expected) and calls == [1]
    check_onednn_counts(_conv_fusion(model), 2 * _blocks(model) - 1, {verify.MODULE_RUNS: 1})


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
    for op, calls in (("pointwise_conv", 2 * _blocks(model)), ("linear", 4 * _blocks(model))):
        fusion = _conv_fusion(model, op)
        if ONEDNN_EMULATED_BF16:
            assert fusion.fused_calls == 0 and fusion.reference_calls == {verify.THREADED: calls}
        else:  # not this CPU comes first, whatever the thread count
            check_onednn_counts(fusion, calls)


def test_exact_runs_no_convolution_kernel():
    model, inputs, expected = _model()
    with accelpatch.quality("exact"):
        assert torch.equal(_forward(model, inputs), expected)
    assert _conv_fusion(model).fused_calls == 0 and _conv_fusion(model, "linear").fused_calls == 0


def test_where_the_probe_refuses_the_ops_decline_by_its_reason_and_stay_bit_identical(monkeypatch):
    """On the CPU kind the kernels replay, a signature whose order the probe cannot find (here: it is offered only
    wrong block lengths, on every CPU) is declined with the probe's reason, warned once per op, counted, and the
    reference runs: bit-identical. Then under strict=True the same decline raises."""
    from accelpatch.lossless import ops as fused_ops
    from accelpatch.core.errors import FastPathUnavailableError
    from accelpatch.lossless.kernels import onednn_bf16

    for op in (fused_ops.POINTWISE_CONV, fused_ops.LINEAR):
        monkeypatch.setattr(op, "_host_outcome", [None])  # as on AVX-512 without bf16 instructions
        monkeypatch.setattr(op, "_verdicts", {})
    monkeypatch.setattr(onednn_bf16, "_ORDERS", {})
    monkeypatch.setattr(onednn_bf16, "candidate_orders", lambda op, x: ((3, onednn_bf16.BIAS_FIRST),))
    model, inputs, expected = _model()
    with pytest.warns(RuntimeWarning, match="accelpatch: lossless") as record:
        assert torch.equal(_forward(model, inputs), expected)
        assert torch.equal(_forward(model, inputs), expected)
    ours = sorted(str(w.message).split(" fast path")[0] for w in record if "does not replay" in str(w.message))
    assert ours == ["accelpatch: lossless linear", "accelpatch: lossless pointwise_conv"]  # once per op
    for op, calls in (("pointwise_conv", 2 * 2 * _blocks(model)), ("linear", 2 * 4 * _blocks(model))):
        fusion = _conv_fusion(model, op)
        assert fusion.fused_calls == 0 and fusion.declined
        assert sum(fusion.reference_calls.values()) == calls
        assert all("does not replay" in reason for reason in fusion.reference_calls), fusion.reference_calls
    accelpatch.remove(model)
    accelpatch.apply(model, strict=True)
    with pytest.raises(FastPathUnavailableError, match="does not replay"):
        _forward(model, inputs)
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), expected)


def _accepting_everywhere(monkeypatch):
    """As on the CPU kind the kernels replay, with the probe accepting every signature: any operand that reaches
    the op's kernel is run by it."""
    from accelpatch.lossless import ops as fused_ops
    from accelpatch.lossless.kernels import onednn_bf16

    for op in (fused_ops.POINTWISE_CONV, fused_ops.LINEAR):
        monkeypatch.setattr(op, "_host_outcome", [None])
        monkeypatch.setattr(op, "_verdicts", {})
    monkeypatch.setattr(onednn_bf16, "summation_order", lambda op, x, weight, bias: ((0, onednn_bf16.BIAS_LAST), None))


def test_a_wrapped_weight_never_reaches_the_kernel(monkeypatch):
    """The torchao crash, without torchao: projections whose weights are wrapper subclasses (data_ptr() 0) run
    the module itself, counted with the wrapper's class named, and the output is the unpatched model's bit for bit.
    Before the operand check, the probe's acceptance sent the wrapper's address 0 into the kernel (a segfault)."""
    _accepting_everywhere(monkeypatch)
    model = t.tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = t.sana_video_transformer_inputs(model, batch_size=1, seed=3)
    for block in model.transformer_blocks:
        for name in ("to_q", "to_k", "to_v"):
            layer = getattr(block.attn1, name)
            layer.weight = torch.nn.Parameter(Wrapped(layer.weight.detach()), requires_grad=False)
    assert model.transformer_blocks[0].attn1.to_q.weight.data_ptr() == 0
    expected = _forward(model, inputs)
    accelpatch.apply(model)
    assert torch.equal(_forward(model, inputs), expected)
    fusion = _conv_fusion(model, "linear")
    wrapped = {k: v for k, v in fusion.reference_calls.items() if "Wrapped" in k}
    assert sum(wrapped.values()) == 3 * _blocks(model) and "tensor subclass" in next(iter(wrapped))
    # to_out[0] holds a plain weight: the op takes it, fused where the forced order is eager's, else declined by
    # the first-sight check (this is a check of the operand gate, not of the order)
    assert fusion.fused_calls + sum(v for k, v in fusion.reference_calls.items() if k.startswith("declined")) \
        == _blocks(model)
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), expected)


@pytest.mark.parametrize("config", ["Int8WeightOnlyConfig", "Float8WeightOnlyConfig"])
def test_torchao_quantized_projections_run_themselves(monkeypatch, config):
    """The reported crash: torchao's quantize_ on a bf16 SANA-Video, the linear op accepted. Now bit-identical to
    the quantized unpatched model, torchao's tensor class named in the report, remove() bit for bit."""
    quantization = pytest.importorskip("torchao.quantization")
    _accepting_everywhere(monkeypatch)
    model = t.tiny_sana_video_transformer(dtype=torch.bfloat16)
    inputs = t.sana_video_transformer_inputs(model, batch_size=1, seed=4)
    quantization.quantize_(model, getattr(quantization, config)())
    expected = _forward(model, inputs)
    accelpatch.apply(model)
    assert torch.equal(_forward(model, inputs), expected)
    fusion = _conv_fusion(model, "linear")
    assert fusion.fused_calls == 0 and not fusion.declined
    assert all("torchao" in reason and "tensor subclass" in reason for reason in fusion.reference_calls)
    accelpatch.remove(model)
    assert torch.equal(_forward(model, inputs), expected)
