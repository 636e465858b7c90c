"""Wan 2.x's lossless fusions (accelpatch/models/wan/lossless.py: the block's AdaLN chains, the self-attention's q/k
RoPE): the default tier is bit-identical to unpatched diffusers in fp32 and bf16 (Wan 2.1's [B, 6, C] rows and Wan
2.2 TI2V's per-token rows) with the real fused kernels running, a deliberately wrong kernel is declined on first
sight and never run again, ``remove()`` restores, and with ``backend="sol_attn"`` the
fusions sit under the attention sites: ``lossless`` is still diffusers' bits and ``high`` runs both."""
import warnings

import pytest
import torch

import _fused_doubles as doubles
from _sol_attn_models import sol_attn_runs
from _model_fusion_checks import (bits_equal, fresh_verdicts, fusion_of,
                                  lossless_warnings, stand_in_kernels)  # noqa: F401 - fixtures
import accelpatch
from accelpatch.core.sites import SITE_ATTR
from accelpatch.testing import tiny_wan_transformer, wan_transformer_inputs

#: fused calls per forward of the 2-block model: two modulations and two gated residual adds per block, one RoPE
#: pair per self-attention
PER_FORWARD = {"modulate": 4, "gated_residual": 4, "rope_pair": 2}
KINDS = ["wan_fused_block", "wan_fused_attention", "fused_gelu"] * 2


def _model_and_inputs(dtype=torch.bfloat16, per_token=False):
    model = tiny_wan_transformer(dtype=dtype, num_layers=2)
    inputs = wan_transformer_inputs(model, num_frames=2, height=8, width=8)
    if per_token:  # Wan 2.2 TI2V: one timestep per token, so temb is [B, N, 6, C] and the rows are strided
        tokens = inputs["hidden_states"].shape[2] * (inputs["hidden_states"].shape[3] // 2) ** 2
        inputs["timestep"] = torch.linspace(100.0, 900.0, tokens)[None]
    with torch.no_grad():
        reference = model(**inputs).sample
    return model, inputs, reference


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


@pytest.mark.parametrize("per_token", [False, True], ids=["rows", "ti2v-per-token-rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_default_tier_is_bit_identical_with_the_real_kernels_fused(dtype, per_token):
    model, inputs, reference = _model_and_inputs(dtype, per_token)
    accelpatch.apply(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="accelpatch: lossless")  # a declined signature would warn
        for _ in range(2):  # first sight, then the verified kernels
            assert bits_equal(_forward(model, inputs), reference)
    report = accelpatch.report(model)
    assert [s.kind for s in report.sites] == KINDS
    gelu = fusion_of(report, "gelu_inplace")  # the feed-forward's GELU over its projection: 2 forwards x 2 blocks
    assert gelu.sites == 2 and gelu.fused_calls == 4 and not gelu.declined and len(gelu.verified) == 1, gelu
    for op in ("modulate", "gated_residual"):
        fusion = fusion_of(report, op)
        # 2 forwards x 2 blocks x (attention, feed-forward): all fused, first sight included
        assert fusion.sites == 2 and fusion.fused_calls == 8 and not fusion.declined, fusion
        assert fusion.verified and all(sig.split()[1].startswith("float32") for sig, _ in fusion.verified)
        rows = {sig.split()[2].split("/")[0] for sig, _ in fusion.verified}  # the gate/scale rows' shape
        assert rows == ({"float32[1,32,256]"} if per_token else {"float32[1,1,256]"}), rows
    rope = fusion_of(report, "rope_pair")  # 2 forwards x 2 self-attentions: q, k in the model's dtype, float32 tables
    assert rope.sites == 2 and rope.fused_calls == 4 and not rope.declined and len(rope.verified) == 1, rope
    name = str(dtype).removeprefix("torch.")
    assert [sig.split()[1:5:3] for sig, _ in rope.verified] == [[f"{name}[1,32,2,128]/(8192,256,128,1)",
                                                                 "float32[1,32,1,128]/(4096,128,128,1)"]]
    accelpatch.remove(model)
    assert not any(SITE_ATTR in m.__dict__ for m in model.modules())
    assert type(model.blocks[0]).__name__ == "WanTransformerBlock"
    assert bits_equal(_forward(model, inputs), reference)


@pytest.mark.parametrize("op", list(PER_FORWARD))
def test_a_wrong_kernel_is_declined_on_first_sight_for_good(stand_in_kernels, op):
    doubles.WRONG.add(op)
    model, inputs, reference = _model_and_inputs()
    accelpatch.apply(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = _forward(model, inputs)
        calls_after_first = doubles.CALLS[op]
        second = _forward(model, inputs)
    assert bits_equal(first, reference) and bits_equal(second, reference)
    assert doubles.CALLS[op] == calls_after_first  # the declined signatures never run the kernel again
    messages = lossless_warnings(record)
    assert len(messages) == 1 and op in messages[0] and "largest difference 1" in messages[0], messages
    fusion = fusion_of(accelpatch.report(model), op)
    assert fusion.fused_calls == 0 and fusion.declined and not fusion.verified
    assert all("differs from the reference in 1 of" in reason for _, reason, _ in fusion.declined)
    assert sum(n for r, n in fusion.reference_calls.items() if r.startswith("declined: ")) == 2 * PER_FORWARD[op]
    for other in set(PER_FORWARD) - {op}:  # the right ops still run fused
        fused = fusion_of(accelpatch.report(model), other)
        assert fused.fused_calls == 2 * PER_FORWARD[other] and not fused.declined


def test_with_sol_attn_lossless_is_bit_identical_and_high_runs_both():
    model, inputs, reference = _model_and_inputs()
    accelpatch.apply(model, backend="sol_attn", dense_steps=0, dense_layers="", min_tokens=0)
    kinds = [s.kind for s in accelpatch.report(model).sites]
    assert kinds.count("wan_fused_block") == 2 and kinds.count("wan_sol_attn") == 2
    assert kinds.count("wan_cross_attention") == 2 and kinds.count("wan_fused_attention") == 2
    with accelpatch.quality("lossless"):
        assert bits_equal(_forward(model, inputs), reference)
    assert fusion_of(accelpatch.report(model), "modulate").fused_calls == 4
    assert fusion_of(accelpatch.report(model), "rope_pair").fused_calls == 2
    sparse = _forward(model, inputs)  # the default tier is high with a backend
    report = accelpatch.report(model)
    assert not torch.equal(sparse, reference)
    assert all(s.fast_calls == 1 for s in report.sites if s.kind == "wan_fused_attention")
    # the Sol-Attn op ran once per site (on this short sequence it may skip nothing: then not a fast call)
    assert all(sol_attn_runs([s]) == 1 for s in report.sites if s.kind == "wan_sol_attn")
    assert fusion_of(report, "modulate").fused_calls == 8 and fusion_of(report, "gated_residual").fused_calls == 8
    assert fusion_of(report, "rope_pair").fused_calls == 2  # under high the sparse path took attn1 (its own RoPE)
    accelpatch.remove(model)
    assert bits_equal(_forward(model, inputs), reference)


def test_a_block_class_that_is_not_diffusers_leaves_the_fusion_unmounted_with_its_reason():
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    class CustomBlock(WanTransformerBlock):  # a forward of its own: the restatement would not be its chain
        pass

    model, inputs, reference = _model_and_inputs()
    model.blocks[1].__class__ = CustomBlock
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # apply() says which site did not mount
        accelpatch.apply(model)
    assert bits_equal(_forward(model, inputs), reference)
    sites = [s for s in accelpatch.report(model).sites if s.kind == "wan_fused_block"]
    assert [(s.mounted, s.fast_calls) for s in sites] == [(False, 0), (False, 0)]  # one rejected block: none
    assert all("CustomBlock is not diffusers' WanTransformerBlock" in s.reason for s in sites), sites
    assert sites[0].reason.startswith("model rejected at blocks.1: ")
    accelpatch.remove(model)
    assert type(model.blocks[1]) is CustomBlock
