"""SANA-Video self-attention (``transformer_blocks.N.attn1``): diffusers' linear attention restated once, run by
two fast paths stacked on the same module.

Reference: diffusers ``SanaLinearAttnProcessor3_0``. The restatement (:func:`.restated_attention.linear_attention`,
shared with the split-aware exact-tier processor) calls the lossless
fused ops for its element-wise chains — ReLU + RoPE + the float32 upcast of q and k in one pass, and the
normaliser product, transpose and cast back in another — each verified against the eager chain on first sight.

- ``lossless`` (:data:`FUSED_LINEAR_ATTENTION`): the restatement with the reference GEMMs; bit-identical.
- ``high`` (:data:`BF16_LINEAR_ATTENTION`): the same restatement whose first GEMM, ``S = v · k_rotᵀ``, takes BF16
  operands with FP32 accumulation and output (:func:`accelpatch.models.sana_video.gemm.bmm_bf16_fp32`); the second GEMM stays
  FP32. Operand precision drops, so it is ``high`` (approximate), as in the prior art. Unlike the prior art it runs
  at any batch size: the math is independent per (batch, head), and diffusers runs CFG as batch 2.

A call the high path does not take goes to the lossless one, and from there to the original diffusers processor.

Under sequence parallelism (:mod:`.sequence_parallel`) each rank holds whole frames of the tokens; the restatement
then all-reduces its two token sums (the normaliser's ``Σ relu(k)`` and the state ``S = v · k_rotᵀ``) over the
sequence group its processor sees, so both fast paths keep running per rank. The exact tier's processor
(:class:`.split_processors.SplitLinearAttnProcessor`) runs the same restatement with the eager reference chains.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.ops import RELU_ROPE_PAIR, SCALE_TO_TOKENS
from accelpatch.core.gate import SGLANG_PREFIX, QualityGatedFusion
from accelpatch.models.sana_video.gemm import bmm_bf16_fp32_reject_reason
from accelpatch.core.tiers import Tier
from accelpatch.core.outcomes import Declined
from accelpatch.core.sites import FastPath, FusedOpsPath, Site, bind_call, device_reject_reason
from accelpatch.models.sana_video.restated_attention import attention_shards, linear_attention, linear_attention_bf16_gemm  # noqa: F401

#: sglang's site, by its marker names: _sgl_sana_video_linear_attention_site / _enabled
FUSION = QualityGatedFusion.named("sana_video_linear_attention", Tier.HIGH, prefix=SGLANG_PREFIX)
FUSED_FUSION = QualityGatedFusion.named("sana_video_fused_linear_attention", Tier.LOSSLESS)


def _reference_processor_class() -> type:
    from diffusers.models.transformers.transformer_sana_video import SanaLinearAttnProcessor3_0

    return SanaLinearAttnProcessor3_0


def _split_processor_class() -> type:
    from accelpatch.models.sana_video.split_processors import SplitLinearAttnProcessor

    return SplitLinearAttnProcessor


class _AcceptsSplitProcessor:
    """The fast paths restate diffusers' processor; accelpatch's split-aware subclass of it (swapped in at ``apply``,
    diffusers' code whenever the model is not split) is the same processor to them."""

    #: the processor's math, and the attention module's forward the gated forward stands in for
    restates = ("diffusers.models.transformers.transformer_sana_video:SanaLinearAttnProcessor3_0.__call__",
                "diffusers.models.attention_processor:Attention.forward")

    def processor_mismatch(self, module: torch.nn.Module) -> Optional[str]:
        if type(getattr(module, "processor", None)) is _split_processor_class():
            return None
        return super().processor_mismatch(module)


def _self_attention_call(fast_path: FastPath, attn: torch.nn.Module, args: tuple, kwargs: dict):
    """The call's hidden states and rotary tables, or a Declined naming what the restatement does not cover."""
    call = bind_call(args, kwargs, ("hidden_states", "encoder_hidden_states", "attention_mask"))
    mismatch = fast_path.processor_mismatch(attn)
    if mismatch is not None:
        return Declined(mismatch)
    if call["encoder_hidden_states"] is not None:
        return Declined("encoder_hidden_states given: the fast path covers self-attention only")
    if call.get("rotary_emb") is None:
        return Declined("no rotary_emb: the reference processor needs it")
    return call["hidden_states"], call["rotary_emb"]


class SanaLinearAttentionFused(_AcceptsSplitProcessor, FusedOpsPath):
    fusion = FUSED_FUSION
    description = "linear attention with its RoPE prologue and normaliser fused (bit-exact)"
    fused_ops = (RELU_ROPE_PAIR, SCALE_TO_TOKENS)

    def expected_processor(self) -> type:
        return _reference_processor_class()

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = _self_attention_call(self, attn, args, kwargs)
        if isinstance(call, Declined):
            return call
        hidden_states, rotary_emb = call
        return linear_attention(attn, site, hidden_states, rotary_emb, bf16_first_gemm=False,
                                shards=attention_shards(attn))


class SanaLinearAttentionBF16(_AcceptsSplitProcessor, FastPath):
    fusion = FUSION
    description = "first linear-attention GEMM (v·k_rotᵀ) on BF16 operands with FP32 accumulation"

    def expected_processor(self) -> type:
        return _reference_processor_class()

    def kernel_reject_reason(self) -> Optional[str]:
        return bmm_bf16_fp32_reject_reason()

    fused_ops = (RELU_ROPE_PAIR,)

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = _self_attention_call(self, attn, args, kwargs)
        if isinstance(call, Declined):
            return call
        hidden_states, rotary_emb = call
        device_reason = device_reject_reason(hidden_states.device, "the BF16-input GEMM")
        if device_reason is not None:
            return Declined(device_reason)
        if hidden_states.dtype != torch.bfloat16 or attn.to_q.weight.dtype != torch.bfloat16:
            return Declined(f"activations are {hidden_states.dtype} and weights {attn.to_q.weight.dtype}: "
                           "the fast path needs bfloat16")
        return linear_attention(attn, site, hidden_states, rotary_emb, bf16_first_gemm=True,
                                shards=attention_shards(attn))


BF16_LINEAR_ATTENTION = SanaLinearAttentionBF16()
FUSED_LINEAR_ATTENTION = SanaLinearAttentionFused()
