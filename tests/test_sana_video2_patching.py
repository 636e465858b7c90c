"""accelpatch.apply on SANA-Video 2.0: anchor and linear attention become sites with their own marker pairs; on CPU
their high fast paths (CUDA-only) are rejected and said so, while the lossless fused sites below them (and on the
blocks) mount and run, each fused op counted, also with per-frame timesteps. What every family keeps (the default
tiers' bits, remove(), saved files, copies, compile, training, the CFG pipeline) is tests/test_family_contract.py's."""
import warnings

import pytest
import torch

import accelpatch
from accelpatch.models.sana_video2.modeling import SanaVideo2LinearAttention, SanaVideo2SoftmaxAttention
from accelpatch.testing import sana_video2_transformer_inputs, tiny_sana_video2_transformer

SOFTMAX_MARKERS = ("_sgl_sana_video2_softmax_attention_site", "_sgl_sana_video2_softmax_attention_enabled")  # sglang's
LINEAR_MARKERS = ("_accelpatch_sana_video2_linear_attention_site", "_accelpatch_sana_video2_linear_attention_enabled")
HIGH_KINDS = {"blocks.0.attn": "sana_video2_linear_attention", "blocks.1.attn": "sana_video2_linear_attention",
              "blocks.2.attn": "sana_video2_linear_attention", "blocks.3.attn": "sana_video2_softmax_attention"}
LOSSLESS_KINDS = {"blocks.0": "sana_video2_fused_block", "blocks.0.attn": "sana_video2_fused_linear_attention",
                  "blocks.1": "sana_video2_fused_block", "blocks.1.attn": "sana_video2_fused_linear_attention",
                  "blocks.2": "sana_video2_fused_block", "blocks.2.attn": "sana_video2_fused_linear_attention",
                  "blocks.3": "sana_video2_fused_block", "blocks.3.attn": "sana_video2_fused_softmax_attention"}
LOSSLESS_ADMITS_NO_HIGH, EXACT_ADMITS_NO_HIGH = "tier lossless does not admit high", "tier exact does not admit high"
EXACT_ADMITS_NO_LOSSLESS = "tier exact does not admit lossless"


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


def _apply(model, **kwargs):
    with pytest.warns(RuntimeWarning, match="CUDA is unavailable"):
        return accelpatch.apply(model, **kwargs)


def _tier(report, tier):
    return [s for s in report.sites if s.tier == tier]


def _counts(sites):
    """{path: (fast calls, reference calls by reason, fallback calls by reason)} of ``sites``."""
    return {s.path: (s.fast_calls, s.reference_calls, s.fallback_calls) for s in sites}


def _lossless_counts(*, fast_forwards, exact_forwards):
    """What the lossless sites count after ``fast_forwards`` forwards they ran and ``exact_forwards`` under exact:
    each block is called twice a forward (its attention and its mlp sub-layer), each attention once."""
    calls = {"sana_video2_fused_block": 2}
    return {path: (calls.get(kind, 1) * fast_forwards,
                   {EXACT_ADMITS_NO_LOSSLESS: calls.get(kind, 1) * exact_forwards} if exact_forwards else {}, {})
            for path, kind in LOSSLESS_KINDS.items()}


def test_anchor_and_linear_attention_are_sites_with_their_own_markers():
    model = tiny_sana_video2_transformer()
    report = _apply(model)
    assert {s.path: s.kind for s in _tier(report, "high")} == HIGH_KINDS
    assert {s.path: s.kind for s in _tier(report, "lossless")} == LOSSLESS_KINDS
    assert len(report.sites) == len(HIGH_KINDS) + len(LOSSLESS_KINDS)
    # per module, highest tier first: the high site is asked first and hands what it does not take below
    assert [(s.path, s.tier) for s in report.sites[:3]] == [("blocks.0", "lossless"), ("blocks.0.attn", "high"),
                                                            ("blocks.0.attn", "lossless")]
    anchor, linear = model.blocks[3].attn, model.blocks[0].attn
    assert isinstance(anchor, SanaVideo2SoftmaxAttention) and type(anchor).__name__ == "GatedSanaVideo2SoftmaxAttention"
    assert isinstance(linear, SanaVideo2LinearAttention)
    assert getattr(anchor, SOFTMAX_MARKERS[0]).path == "blocks.3.attn" and getattr(anchor, SOFTMAX_MARKERS[1]) is False
    assert getattr(linear, LINEAR_MARKERS[0]).path == "blocks.0.attn" and getattr(linear, LINEAR_MARKERS[1]) is False
    assert not hasattr(anchor, LINEAR_MARKERS[0]) and not hasattr(linear, SOFTMAX_MARKERS[0])
    assert all(not s.mounted and "CUDA is unavailable" in s.reason for s in _tier(report, "high"))
    assert all(s.mounted and s.reason is None for s in _tier(report, "lossless"))  # the lossless ones run on CPU
    assert type(model.blocks[0]).__name__ == "GatedSanaVideo2Block"
    assert accelpatch.supported_models()["SanaVideo2Transformer3DModel"] == ("sol_attn",)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("per_frame", [False, True], ids=["t-per-item", "t-per-frame"])
def test_default_lossless_and_exact_are_bit_identical_with_each_fused_op_counted(dtype, per_frame):
    model = tiny_sana_video2_transformer(dtype=dtype)
    inputs = sana_video2_transformer_inputs(model, per_frame_timesteps=per_frame)
    reference = _forward(model, inputs)
    _apply(model)
    assert torch.equal(_forward(model, inputs), reference)
    for tier in ("exact", "lossless"):
        with accelpatch.quality(tier):
            assert torch.equal(_forward(model, inputs), reference)
    rep = accelpatch.report(model)
    # the high sites never ran: 2 default/lossless calls and 1 exact call each, counted with the tier's reason
    assert _counts(_tier(rep, "high")) == {
        path: (0, {LOSSLESS_ADMITS_NO_HIGH: 2, EXACT_ADMITS_NO_HIGH: 1}, {}) for path in HIGH_KINDS}
    # the lossless sites ran the default and lossless forwards (bit-identical, as checked above), not exact's
    assert _counts(_tier(rep, "lossless")) == _lossless_counts(fast_forwards=2, exact_forwards=1)
    # per forward: one modulation in each of a block's 2 sub-layer calls, one gate in its mlp call (a bf16 table:
    # in float32 the reference runs, counted with its reason)
    glu = {"glu_gate": {"ran": 2} if dtype == torch.bfloat16 else
           {"not applicable: float32 activations (fused for bfloat16 only)": 2}}
    # per attention call: the RoPE pair and the sigmoid output gate (a bf16 table, as the SwiGLU gate)
    gate = {"sigmoid_gate": {"ran": 2} if dtype == torch.bfloat16 else
            {"not applicable: float32 activations (fused for bfloat16 only)": 2}}
    assert {s.path: s.fused_ops for s in _tier(rep, "lossless")} == {
        path: ({"modulate": {"ran": 2 * 2}, **glu} if kind == "sana_video2_fused_block"
               else {"rotary_complex_pair": {"ran": 2}, **gate}) for path, kind in LOSSLESS_KINDS.items()}


def test_high_on_cpu_falls_back_counts_it_and_strict_raises():
    model = tiny_sana_video2_transformer()
    inputs = sana_video2_transformer_inputs(model)
    reference = _forward(model, inputs)
    _apply(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said at apply(): the call does not warn again
        with accelpatch.quality("high"):
            assert torch.equal(_forward(model, inputs), reference)
    rep = accelpatch.report(model)
    high = _tier(rep, "high")
    assert sum(s.fast_calls for s in high) == 0 and sum(sum(s.fallback_calls.values()) for s in high) == 4
    assert all(reason.startswith("not mounted: CUDA is unavailable") for s in high for reason in s.fallback_calls)
    # each fallback was handed to the lossless site below, which ran it; the blocks ran theirs too
    assert _counts(_tier(rep, "lossless")) == _lossless_counts(fast_forwards=1, exact_forwards=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the reason was said once in this process: a second apply does not repeat it
        accelpatch.apply(model, strict=True)
    with pytest.raises(accelpatch.FastPathUnavailableError, match="CUDA is unavailable"):
        with accelpatch.quality("high"):
            _forward(model, inputs)


def test_the_tiny_pipeline_without_guidance_is_bit_identical_and_counted_per_site():
    """Batch 1 (no classifier-free guidance; the contract's call is the builder's CFG one), counted per site."""
    from accelpatch.testing import sana_video2_pipeline_call_kwargs, tiny_sana_video2_pipeline

    call = lambda: sana_video2_pipeline_call_kwargs(guidance_scale=1.0, seed=3)  # noqa: E731
    expected = tiny_sana_video2_pipeline(seed=1)(**call()).frames
    pipe = tiny_sana_video2_pipeline(seed=1)
    _apply(pipe)
    for tier in (None, "exact", "lossless"):
        with (accelpatch.quality(tier) if tier else warnings.catch_warnings()):
            assert torch.equal(pipe(**call()).frames, expected), tier
    rep = accelpatch.report(pipe)
    # 2 steps (one transformer call each, CFG batched) under each of the 3 tiers: 2 default, 2 lossless, 2 exact
    assert _counts(_tier(rep, "high")) == {
        path: (0, {LOSSLESS_ADMITS_NO_HIGH: 2 * 2, EXACT_ADMITS_NO_HIGH: 2}, {}) for path in HIGH_KINDS}
    assert _counts(_tier(rep, "lossless")) == _lossless_counts(fast_forwards=2 * 2, exact_forwards=2)
    accelpatch.remove(pipe)
    assert torch.equal(pipe(**call()).frames, expected)
