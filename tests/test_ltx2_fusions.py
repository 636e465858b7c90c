"""LTX-2's lossless block fusion (accelpatch/adapters/ltx2/fused.py): the default tier is bit-identical to unpatched
diffusers on both outputs (video and audio) in fp32 and bf16, batch 1 and 2, with the text and self-attention masks,
per-token timestep rows and LTX-2.3's layout (cross-attention AdaLN, gates, split RoPE, the STG processor), with the
real fused kernels running and nothing declined; a deliberately wrong kernel is declined on first sight and never run
again; ``exact`` never fuses; ``remove()`` restores; with ``sol_attn`` the fusion sits below the attention sites and
``high`` runs both; the first-block step cache reuses both streams over fused blocks; fullgraph compile equals the
unpatched compiled model."""
import inspect
import types
import warnings

import pytest
import torch
from diffusers import FirstBlockCacheConfig

import _fused_doubles as doubles
from _model_fusion_checks import (bits_equal, check_exact_never_fuses, fresh_verdicts, fusion_of,
                                  lossless_warnings, stand_in_kernels)  # noqa: F401 - fixtures
import accelpatch
import accelpatch.fused_ops  # noqa: F401 - registers the ops verify.ops() lists
from accelpatch import verify
from accelpatch.sites.base import SITE_ATTR
from accelpatch.testing import LTX2_3_TINY_CONFIG, ltx2_transformer_inputs, tiny_ltx2_transformer

from _step_cache_streams import COMPUTED, STEPS, all_bits_equal, apply_cache, reused_reference, run_steps

OPS = ("modulate", "gated_residual")
#: fused chains per block call, counted in diffusers' LTX2VideoTransformerBlock.forward: modulations (self-attention
#: x2 streams, a2v and v2a q/k x4, feed-forward x2; LTX-2.3 adds the text queries x2 and the prompt k/v x2) and gated
#: residual adds (self-attention x2, a2v/v2a x2, feed-forward x2; LTX-2.3 adds the text cross-attention gates x2)
PER_BLOCK = {"ltx2": {"modulate": 8, "gated_residual": 6}, "ltx2.3": {"modulate": 12, "gated_residual": 8}}
VIDEO_TOKENS = 2 * 8 * 8


def _inputs(model, batch=1, masks=False, per_token=False):
    inputs = ltx2_transformer_inputs(model, batch_size=batch, num_frames=2, height=8, width=8)
    if masks:  # the last text tokens of the last sample masked out; a self-attention mask with a hole
        text = torch.ones(batch, inputs["encoder_hidden_states"].shape[1])
        text[-1, -3:] = 0
        inputs["encoder_attention_mask"], inputs["audio_encoder_attention_mask"] = text, text.clone()
        video = torch.ones(batch, VIDEO_TOKENS, VIDEO_TOKENS)
        video[-1, :, -5:] = 0
        inputs["video_self_attention_mask"] = video
    if per_token:  # one timestep per video token (image conditioning): temb [B, N, k*C], rows [B, N, C]
        inputs["audio_timestep"] = inputs["timestep"]
        inputs["timestep"] = torch.linspace(100.0, 900.0, VIDEO_TOKENS).repeat(batch, 1)
    return inputs


def _build(layout="ltx2", dtype=torch.bfloat16, **input_options):
    model = tiny_ltx2_transformer(LTX2_3_TINY_CONFIG if layout == "ltx2.3" else None, dtype=dtype)
    inputs = _inputs(model, **input_options)
    return model, inputs, _forward(model, inputs)


def _forward(model, inputs):
    with torch.no_grad():
        out = model(**inputs)
    return out.sample, out.audio_sample


def _outputs(out):
    return out.sample, out.audio_sample


def _both_equal(outs, reference):
    return all(bits_equal(o, r) for o, r in zip(outs, reference, strict=True))


CASES = {"b1": ("ltx2", dict()), "b2-masks": ("ltx2", dict(batch=2, masks=True)),
         "b2-per-token-rows": ("ltx2", dict(batch=2, per_token=True)),
         "ltx2.3-b2-masks": ("ltx2.3", dict(batch=2, masks=True))}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_default_tier_is_bit_identical_on_both_streams_with_the_real_kernels_fused(dtype, case):
    layout, options = CASES[case]
    model, inputs, reference = _build(layout, dtype, **options)
    accelpatch.apply(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="accelpatch: lossless")  # a declined signature would warn
        for _ in range(2):  # first sight, then the verified kernels
            assert _both_equal(_forward(model, inputs), reference)
    report = accelpatch.report(model)
    assert [(s.kind, s.fast_calls) for s in report.sites] == [("ltx2_fused_block", 2)] * 2
    name = str(dtype).removeprefix("torch.")
    for op in OPS:
        fusion = fusion_of(report, op)
        # 2 forwards x 2 blocks, every chain fused, first sight included
        assert fusion.sites == 2 and fusion.fused_calls == 4 * PER_BLOCK[layout][op], fusion
        assert not fusion.declined and fusion.verified, fusion
        assert all(sig.split()[1].startswith(name) for sig, _ in fusion.verified)
        rows = {sig.split()[2].split("/")[0] for sig, _ in fusion.verified}  # the scale/gate rows' shapes
        batch = options.get("batch", 1)
        video_rows = f"{name}[{batch},{VIDEO_TOKENS if options.get('per_token') else 1},256]"
        assert rows == {video_rows, f"{name}[{batch},1,64]"}, rows  # the audio timestep is one per sample
    accelpatch.remove(model)
    assert not any(SITE_ATTR in m.__dict__ for m in model.modules())
    assert type(model.transformer_blocks[0]).__name__ == "LTX2VideoTransformerBlock"
    assert _both_equal(_forward(model, inputs), reference)


@pytest.mark.parametrize("op", OPS)
def test_a_wrong_kernel_is_declined_on_first_sight_for_good(stand_in_kernels, op):
    doubles.WRONG.add(op)
    model, inputs, reference = _build()
    accelpatch.apply(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = _forward(model, inputs)
        calls_after_first = doubles.CALLS[op]
        second = _forward(model, inputs)
    assert _both_equal(first, reference) and _both_equal(second, reference)
    assert doubles.CALLS[op] == calls_after_first  # the declined signatures never run the kernel again
    report = accelpatch.report(model)
    fusion = fusion_of(report, op)
    assert fusion.fused_calls == 0 and fusion.declined and not fusion.verified
    assert all("differs from the reference in 1 of" in reason for _, reason, _ in fusion.declined)
    messages = lossless_warnings(record)  # once per reason (they name the element count: one per shape)
    assert len(messages) == len({reason for _, reason, _ in fusion.declined}) > 1, messages
    assert all(op in m and "largest difference " in m for m in messages), "\n".join(messages)
    assert sum(n for r, n in fusion.reference_calls.items() if r.startswith("declined: ")) == 4 * PER_BLOCK["ltx2"][op]
    other = ({"modulate", "gated_residual"} - {op}).pop()
    assert fusion_of(report, other).fused_calls == 4 * PER_BLOCK["ltx2"][other] and not fusion_of(report, other).declined


def test_exact_never_runs_a_fused_op(stand_in_kernels):
    check_exact_never_fuses(*_build(), _forward, equal=_both_equal)


def _dense_sol_kernel(q, k, v, **kwargs):
    """A stand-in for the Sol-Attn op: dense SDPA as diffusers' native dispatch runs it, so a high run that takes
    the sparse path at every video self-attention must still give the unpatched bits."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
    return out, types.SimpleNamespace(exact_pairs=torch.ones(1), total_pairs=1)


@pytest.mark.parametrize("layout", ["ltx2", "ltx2.3"])
def test_with_sol_attn_the_fusion_sits_below_and_high_runs_both(layout, monkeypatch):
    import accelpatch.ops as ops

    model = tiny_ltx2_transformer(LTX2_3_TINY_CONFIG if layout == "ltx2.3" else None)
    inputs = ltx2_transformer_inputs(model)  # 1,024 video tokens: 16 blocks, so that some are skipped
    reference = _forward(model, inputs)
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="")
    kinds = [s.kind for s in accelpatch.report(model).sites]
    assert kinds.count("ltx2_fused_block") == 2 and kinds.count("ltx2_sol_attn") == 2
    assert kinds.count("ltx2_dense_attention") == 10
    with accelpatch.quality("lossless"):
        assert _both_equal(_forward(model, inputs), reference)
    assert fusion_of(accelpatch.report(model), "modulate").fused_calls == 2 * PER_BLOCK[layout]["modulate"]
    sparse = _forward(model, inputs)  # the default tier is high with a backend
    assert not torch.equal(sparse[0], reference[0]) and not torch.equal(sparse[1], reference[1])
    with monkeypatch.context() as patched:
        patched.setattr(ops, "sol_attn", _dense_sol_kernel)
        assert _both_equal(_forward(model, inputs), reference)  # sparse path inside the fused block: exact bits
    report = accelpatch.report(model)
    assert [s.fast_calls for s in report.sites if s.kind == "ltx2_sol_attn"] == [2, 2]
    assert [s.fast_calls for s in report.sites if s.kind == "ltx2_fused_block"] == [3, 3]
    for op in OPS:
        assert fusion_of(report, op).fused_calls == 6 * PER_BLOCK[layout][op] and not fusion_of(report, op).declined
    assert report.fallback_calls == {}
    accelpatch.remove(model)
    assert _both_equal(_forward(model, inputs), reference)


def test_the_first_block_step_cache_reuses_both_streams_over_fused_blocks():
    model, inputs, _ = _build(dtype=torch.float32)
    plain = run_steps(model, inputs, _outputs)
    expected = reused_reference(model, inputs, _outputs, "audio_hidden_states")  # unpatched, independent of the cache
    apply_cache(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=1)
    try:
        with accelpatch.quality("high"):
            cached = run_steps(model, inputs, _outputs)
        report = accelpatch.report(model)
        assert (report.models[0].cache["computed"], report.models[0].cache["reused"]) == (2, 3)
        # every step runs the head block, the computed ones the tail block too
        block_calls = STEPS + len(COMPUTED)
        assert [s.fast_calls for s in report.sites if s.kind == "ltx2_fused_block"] == [STEPS, len(COMPUTED)]
        for op in OPS:
            assert fusion_of(report, op).fused_calls == block_calls * PER_BLOCK["ltx2"][op]
    finally:
        accelpatch.remove(model)
    assert all_bits_equal(cached, expected)
    assert not all_bits_equal(cached, plain)  # the reused steps did reuse
    apply_cache(model, cache=FirstBlockCacheConfig(threshold=1e9), cache_warmup_steps=0)
    try:  # the default tier (lossless): nothing reused, the fused blocks give the unpatched bits
        assert all_bits_equal(run_steps(model, inputs, _outputs), plain)
        assert fusion_of(accelpatch.report(model), "modulate").fused_calls == 2 * STEPS * PER_BLOCK["ltx2"]["modulate"]
    finally:
        accelpatch.remove(model)


def test_fullgraph_compile_of_the_patched_model_equals_the_unpatched_compiled_one():
    model = tiny_ltx2_transformer(dtype=torch.bfloat16, num_layers=1)  # one block: half the tracing
    inputs = _inputs(model, batch=2, masks=True)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            compiled_reference = _outputs(torch.compile(model, backend="eager", fullgraph=True)(**inputs))
        torch._dynamo.reset()
        accelpatch.apply(model)
        with torch.no_grad():
            compiled = _outputs(torch.compile(model, backend="eager", fullgraph=True)(**inputs))
    finally:
        torch._dynamo.reset()
    assert _both_equal(compiled, compiled_reference)
    report = accelpatch.report(model)
    assert [s.fast_calls for s in report.sites if s.kind == "ltx2_fused_block"] == [1]
    for op in OPS:  # inside the compiled graph the reference chains run (the compiler fuses them itself)
        fusion = fusion_of(report, op)
        assert fusion.fused_calls == 0 and fusion.reference_calls == {verify.IN_COMPILE: PER_BLOCK["ltx2"][op]}
    accelpatch.remove(model)


def test_a_block_class_that_is_not_diffusers_leaves_the_fusion_unmounted_with_its_reason():
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock

    class CustomBlock(LTX2VideoTransformerBlock):  # a forward of its own: the restatement would not be its chain
        pass

    model, inputs, reference = _build()
    model.transformer_blocks[1].__class__ = CustomBlock
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # apply() says which site did not mount
        accelpatch.apply(model)
    assert _both_equal(_forward(model, inputs), reference)
    sites = accelpatch.report(model).sites  # one rejected block keeps the fusion off the whole model
    assert [(s.mounted, s.fast_calls) for s in sites] == [(False, 0), (False, 0)]
    assert all("CustomBlock is not diffusers' LTX2VideoTransformerBlock" in s.reason for s in sites), sites
    accelpatch.remove(model)
    assert type(model.transformer_blocks[1]) is CustomBlock


def test_a_changed_block_signature_is_refused_with_what_differed():
    from accelpatch.adapters.ltx2 import fused
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock

    assert fused.signature_mismatch(LTX2VideoTransformerBlock) is None

    class Renamed:
        def forward(self, hidden_states, audio_hidden_states, new_argument=None):
            pass

    reason = fused.signature_mismatch(Renamed)
    assert reason.startswith("its forward takes (hidden_states, audio_hidden_states, new_argument)"), reason

    class OtherDefault:
        pass

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False if n.startswith("use_") else None)
        for n in fused.CALL_NAMES]
    OtherDefault.forward = lambda self, *args: None
    OtherDefault.forward.__signature__ = inspect.Signature(params)
    reason = fused.signature_mismatch(OtherDefault)
    assert reason.startswith("its forward's defaults are {'use_a2v_cross_attention': False"), reason
