"""The first-sight contract of the lossless fusions (accelpatch.lossless.verify), on SANA-Video with stand-in kernels.

The stand-ins (tests/_fused_doubles.py) are the reference chains themselves, so they are exact; a test makes one
wrong, unsupported or failing on purpose and checks what the contract promises: the output stays bit-identical,
the signature is declined for good with its reason, one warning, strict mode raises, compiled and exported code run
the reference and say so (``exact`` never running a fused op is every family's: tests/test_family_contract.py). The real kernels are tested in tests/ops/.
"""
import threading
import types
import warnings

import pytest
import torch

import _fused_doubles as doubles
import accelpatch
import accelpatch.lossless.ops  # noqa: F401 - registers the ops verify.ops() lists
from accelpatch.lossless import verify
from accelpatch.core.errors import FastPathUnavailableError
from accelpatch.testing import sana_video_transformer_inputs, tiny_sana_video_transformer


@pytest.fixture(autouse=True)
def stand_in_kernels():
    for op in verify.ops().values():
        op.forget()
    doubles.CALLS.clear(), doubles.WRONG.clear(), doubles.UNSUPPORTED.clear()
    with doubles.substituted():
        yield
    for op in verify.ops().values():
        op.forget()
    doubles.WRONG.clear(), doubles.UNSUPPORTED.clear()


def _model_and_inputs(dtype=torch.bfloat16, batch=2, **input_options):
    model = tiny_sana_video_transformer(dtype=dtype)
    inputs = sana_video_transformer_inputs(model, batch_size=batch, **input_options)
    with torch.no_grad():
        reference = model(**inputs).sample
    return model, inputs, reference


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _fusion(report, op):
    return next(f for f in report.models[0].fusions if f.op == op)


def _accelpatch_warnings(record):
    return [str(w.message) for w in record if "accelpatch: lossless" in str(w.message)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_verified_ops_run_fused_after_first_sight_and_stay_bit_identical(dtype):
    model, inputs, reference = _model_and_inputs(dtype, with_mask=True)
    accelpatch.apply(model)
    for _ in range(3):
        assert torch.equal(_forward(model, inputs), reference)
    report = accelpatch.report(model)
    modulate = _fusion(report, "modulate")
    assert modulate.sites == 2 and len(modulate.verified) == 1 and not modulate.declined
    assert modulate.fused_calls == 3 * 2 * 2  # 3 calls × 2 blocks × norm1/norm2
    # first sight runs the stand-in once (the comparison; no timed runs since #40), later calls once each
    assert doubles.CALLS["modulate"] == 3 * 4
    assert "lossless fusions" in str(report) and "modulate on 2 site(s): 12 ran" in str(report)


def test_a_kernel_build_at_first_sight_is_not_counted_as_checking_time(monkeypatch):
    """Issue #30: the first patched call's kernel build read as "51913 ms of checks". ``unsupported`` builds the
    kernels; a fake clock that a build advances by 100 s shows the verdicts' check time leaves it out (the report
    gives the build apart, on its "CPU kernels" line)."""
    clock = [0.0]

    def slow_build(op, *args):
        clock[0] += 100.0
        return None

    monkeypatch.setattr(doubles, "unsupported", slow_build)
    monkeypatch.setattr(verify, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    model, inputs, reference = _model_and_inputs()
    accelpatch.apply(model)
    assert torch.equal(_forward(model, inputs), reference)
    verdicts = [v for op in verify.ops().values() for v in op.verdicts()]
    assert verdicts and all(v.verified and v.cost_s < 100.0 for v in verdicts), verdicts
    assert all(f.check_s < 100.0 for f in accelpatch.report(model).models[0].fusions)


def test_a_wrong_fused_op_is_caught_on_first_sight_declined_for_good_and_warned_once():
    doubles.WRONG.add("gated_residual")
    model, inputs, reference = _model_and_inputs()
    accelpatch.apply(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = _forward(model, inputs)
        calls_after_first = doubles.CALLS["gated_residual"]
        second = _forward(model, inputs)
    assert torch.equal(first, reference) and torch.equal(second, reference)
    assert doubles.CALLS["gated_residual"] == calls_after_first  # never run again for those signatures
    messages = _accelpatch_warnings(record)
    assert len(messages) == 1 and "gated_residual" in messages[0] and "largest difference 1" in messages[0]
    fusion = _fusion(accelpatch.report(model), "gated_residual")
    assert fusion.fused_calls == 0 and fusion.declined and not fusion.verified
    assert all("differs from the reference in 1 of" in reason for _, reason, _ in fusion.declined)
    assert sum(fusion.reference_calls.values()) == 2 * 2 * 2


def test_strict_mode_raises_on_a_declined_signature():
    doubles.WRONG.add("modulate")
    model, inputs, _ = _model_and_inputs()
    accelpatch.apply(model, strict=True)
    with pytest.raises(FastPathUnavailableError, match="lossless fusion modulate at transformer_blocks.0 could not "
                                                       "run: the output differs"):
        _forward(model, inputs)


def test_inputs_the_kernel_cannot_take_are_not_applicable_with_its_reason(recwarn):
    """A kernel's own limits (a layout, a dtype, a thread count it does not reproduce) are by design: counted as
    not applicable with the kernel's reason, never warned, never a decline (issue #40; they were declines)."""
    doubles.UNSUPPORTED["glu_gate"] = "gate has strides the kernel does not take"
    model, inputs, reference = _model_and_inputs()
    accelpatch.apply(model, strict=True)
    assert torch.equal(_forward(model, inputs), reference)
    assert "glu_gate" not in doubles.CALLS
    fusion = _fusion(accelpatch.report(model), "glu_gate")
    assert fusion.declined == () and fusion.fused_calls == 0
    assert set(fusion.reference_calls) == {"not applicable: gate has strides the kernel does not take"}
    assert not [w for w in recwarn if "glu_gate" in str(w.message)]


def test_the_table_dtype_is_part_of_the_signature():
    model, inputs, _ = _model_and_inputs(torch.float32)
    accelpatch.apply(model)
    _forward(model, inputs)
    model.rope.to(torch.bfloat16)  # bf16 RoPE tables in an fp32 model: a new signature, checked again
    _forward(model, inputs)
    (fusion,) = [f for f in accelpatch.report(model).models[0].fusions if f.op == "relu_rope_pair"]
    tables = sorted(sig.split()[-1].split("[")[0] for sig, _ in fusion.verified)
    assert tables == ["bfloat16", "float32"]


def test_autograd_runs_the_reference_and_counts_why_without_warning():
    model, inputs, _ = _model_and_inputs(torch.float32, batch=1)
    accelpatch.apply(model)
    model.train()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model(**inputs).sample.sum().backward()
    assert not _accelpatch_warnings(record)
    fusion = _fusion(accelpatch.report(model), "gated_residual")
    assert fusion.fused_calls == 0 and fusion.reference_calls == {verify.IN_AUTOGRAD: 4}


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_code_runs_the_reference_counted_and_equals_the_unpatched_model_compiled(fullgraph):
    model, inputs, _ = _model_and_inputs(batch=1)
    torch._dynamo.reset()
    with torch.no_grad():
        expected = torch.compile(model, backend="aot_eager", fullgraph=fullgraph)(**inputs).sample
    accelpatch.apply(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=fullgraph)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(compiled(**inputs).sample, expected)
    fusion = _fusion(accelpatch.report(model), "modulate")
    assert fusion.reference_calls == {verify.IN_COMPILE: 2 * 2 * 2} and doubles.CALLS == {}


def test_export_traces_the_reference_chain():
    model, inputs, reference = _model_and_inputs(batch=1)
    accelpatch.apply(model)
    _forward(model, inputs)  # verified in eager: the exported program must still hold the plain chain
    with torch.no_grad():
        program = torch.export.export(model, (), kwargs=inputs)
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not any("accelpatch" in t for t in targets)
    assert torch.equal(program.module()(**inputs).sample, reference)


def test_threads_with_different_tiers_share_one_verdict_per_signature():
    model, inputs, reference = _model_and_inputs()
    accelpatch.apply(model)
    _forward(model, inputs)
    signatures = {f.op: len(f.verified) for f in accelpatch.report(model).models[0].fusions}
    first_sights = dict(doubles.CALLS)
    for op in verify.ops().values():
        op.forget()
    doubles.CALLS.clear()
    errors, barrier = [], threading.Barrier(3)

    def worker(tier):
        try:
            barrier.wait()
            with accelpatch.quality(tier):
                for _ in range(2):
                    assert torch.equal(_forward(model, inputs), reference)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(tier,)) for tier in ("lossless", "exact", "high")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for fusion in accelpatch.report(model).models[0].fusions:
        assert len(fusion.verified) == signatures[fusion.op] and not fusion.declined, fusion.op
    # one first sight per signature (one stand-in run, the comparison), then one run per fused call: two tiers ran
    # fusions, two calls each, so four times the first forward's runs
    for op, n in first_sights.items():
        assert doubles.CALLS[op] == 4 * n, op


# -- the comparison itself -------------------------------------------------------------------------------------------

def test_mismatch_compares_bits_signed_zeros_and_nan_positions_but_not_nan_payloads():
    ref = torch.tensor([0.0, 1.0, float("nan")], dtype=torch.bfloat16)
    assert verify.mismatch((ref,), (ref.clone(),)) is None
    signed = ref.clone()
    signed[0] = -0.0
    assert "1 of 3" in verify.mismatch((ref,), (signed,))
    payload = ref.clone()
    payload.view(torch.int16)[2] = 0x7FC1  # another NaN
    assert verify.mismatch((ref,), (payload,)) is None
    number = ref.clone()
    number[2] = 2.0
    assert "NaN where the reference has a number" in verify.mismatch((ref,), (number,))


def test_mismatch_checks_dtype_shape_and_strides():
    ref = torch.zeros(4, 6)
    assert "dtype" in verify.mismatch((ref,), (ref.double(),))
    assert "shape" in verify.mismatch((ref,), (ref.reshape(6, 4),))
    assert "strides" in verify.mismatch((ref,), (ref.t().contiguous().t(),))


def test_strides_of_size_one_dimensions_do_not_count():
    ref = torch.empty_strided((1, 2, 2, 1), (4, 2, 1, 1))
    ref.copy_(torch.arange(4.0).view(1, 2, 2, 1))
    out = torch.empty_strided((1, 2, 2, 1), (4, 2, 1, 4))
    out.copy_(ref)
    assert verify.mismatch((ref,), (out,)) is None


def test_flushing_subnormals_is_part_of_the_cpu_signature():
    x = torch.zeros(3)
    plain = verify.signature((x,))
    torch.set_flush_denormal(True)
    try:
        flushed = verify.signature((x,))
    finally:
        torch.set_flush_denormal(False)
    assert plain != flushed and verify.signature((x,)) == plain


def test_a_gated_forward_carries_the_original_signature_and_pickles_by_reference():
    """diffusers reads parameters by name from inspect.signature(type(module).forward) (block registry for its cache
    hooks, context-parallel split hooks: the torchrun example, then in the README, now in docs/parallelism.md,
    raised "Parameter 'adaln_indices' not found" on a gated MiniMax-H3 block); the per-class forward must still
    pickle (by reference, in any process)."""
    import inspect
    import pickle
    import subprocess
    import sys

    from accelpatch.testing import tiny_minimax_h3_transformer

    model = tiny_minimax_h3_transformer()
    original = type(model.transformer_blocks[0])
    accelpatch.apply(model)
    gated = type(model.transformer_blocks[0])
    assert gated is not original
    assert inspect.signature(gated.forward) == inspect.signature(original.forward)
    assert pickle.loads(pickle.dumps(gated.forward)) is gated.forward
    code = ("import inspect, pickle, sys; f = pickle.loads(sys.stdin.buffer.read()); "
            "print(list(inspect.signature(f).parameters))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(gated.forward), capture_output=True,
                         timeout=120)
    assert "adaln_indices" in out.stdout.decode(), out.stderr.decode()[-2000:]
