"""SANA-Video self-attention (``transformer_blocks.N.attn1``): diffusers' linear attention restated once, run by
two fast paths stacked on the same module.

Reference: diffusers ``SanaLinearAttnProcessor3_0``. The restatement (:func:`linear_attention`) calls the lossless
fused ops for its element-wise chains — ReLU + RoPE + the float32 upcast of q and k in one pass, and the
normaliser product, transpose and cast back in another — each verified against the eager chain on first sight.

- ``lossless`` (:data:`FUSED_LINEAR_ATTENTION`): the restatement with the reference GEMMs; bit-identical.
- ``high`` (:data:`BF16_LINEAR_ATTENTION`): the same restatement whose first GEMM, ``S = v · k_rotᵀ``, takes BF16
  operands with FP32 accumulation and output (:func:`accelpatch.ops.gemm.bmm_bf16_fp32`); the second GEMM stays
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

from ...fused_ops import RELU_ROPE_PAIR, SCALE_TO_TOKENS
from ...gate import QualityGatedFusion
from ...ops.gemm import bmm_bf16_fp32_reject_reason, key_value_state_bf16
from ...parallel.sequence import SequenceShards, sum_over_ranks
from ...tiers import Tier
from ...sites.base import (Decline, FastPath, FusedOpsPath, Site, bind_call, device_reject_reason,
                           run_fast_paths_on_cpu)

FUSION = QualityGatedFusion(
    name="sana_video_linear_attention",
    marker_attr="_sgl_sana_video_linear_attention_site",
    enabled_attr="_sgl_sana_video_linear_attention_enabled",
    tier=Tier.HIGH,
)
FUSED_FUSION = QualityGatedFusion.named("sana_video_fused_linear_attention", Tier.LOSSLESS)

#: TEST-ONLY: the GEMM's CUDA guard is bypassed and the exact FP32 emulation runs on CPU (see sites.base).
emulate_bf16_gemm_on_cpu = run_fast_paths_on_cpu


def _reference_processor_class() -> type:
    from diffusers.models.transformers.transformer_sana_video import SanaLinearAttnProcessor3_0

    return SanaLinearAttnProcessor3_0


def _split_processor_class() -> type:
    from .split_processors import SplitLinearAttnProcessor

    return SplitLinearAttnProcessor


def attention_shards(attn: torch.nn.Module) -> Optional[SequenceShards]:
    """The sequence split ``attn``'s processor sees (None: not split, or a processor that knows of no split)."""
    shards = getattr(attn.processor, "sequence_shards", None)
    return None if shards is None else shards()


def linear_attention_bf16_gemm(query_rotate: torch.Tensor, key_rotate: torch.Tensor, value: torch.Tensor,
                               z: torch.Tensor, shards: Optional[SequenceShards] = None) -> torch.Tensor:
    """((v·k_rotᵀ)·q_rot)·z for ``[B, H, D, N]`` BF16 operands, FP32 result: the first GEMM on BF16 operands with
    FP32 accumulation, the second in FP32, as the reference does; the state summed over ``shards`` when split."""
    state = key_value_state_bf16(value, key_rotate)
    if shards is not None:
        state = sum_over_ranks(state, shards)
    return torch.matmul(state, query_rotate.float()) * z


def _key_sum(key: torch.Tensor, shards: Optional[SequenceShards]) -> torch.Tensor:
    """``Σ_tokens relu(k)`` for ``[B, H, D, N]`` keys in their dtype, as the reference sums. Split over several ranks,
    the partial sums are taken and summed in float32 and rounded once to the keys' dtype (a low-precision all-reduce
    would round at every hop); on one rank the reference's own sum goes through the (identity) all-reduce."""
    if shards is None:
        return key.sum(dim=-1, keepdim=True)
    if shards.world == 1 or key.dtype == torch.float32:
        return sum_over_ranks(key.sum(dim=-1, keepdim=True), shards)
    return sum_over_ranks(key.sum(dim=-1, keepdim=True, dtype=torch.float32), shards).to(key.dtype)


def _chain(op, site: Optional[Site], *args):
    """A fused op at a fast path's site; with no site (the exact tier's split processor) its eager reference chain."""
    return op.reference(*args) if site is None else op(site, *args)


def linear_attention(attn: torch.nn.Module, site: Optional[Site], hidden_states: torch.Tensor, rotary_emb,
                     *, bf16_first_gemm: bool, shards: Optional[SequenceShards] = None) -> torch.Tensor:
    """``SanaLinearAttnProcessor3_0`` on self-attention, op for op, with its element-wise chains as fused ops (their
    reference chains when ``site`` is None). With ``shards``, the local tokens' two sums are all-reduced over the
    sequence group: the output is this rank's tokens of the unsplit attention (up to summation order)."""
    original_dtype = hidden_states.dtype
    query = attn.to_q(hidden_states)
    key = attn.to_k(hidden_states)
    value = attn.to_v(hidden_states)
    if attn.norm_q is not None:
        query = attn.norm_q(query)
    if attn.norm_k is not None:
        key = attn.norm_k(key)

    query = query.unflatten(2, (attn.heads, -1))
    key = key.unflatten(2, (attn.heads, -1))
    value = value.unflatten(2, (attn.heads, -1))
    # ReLU, RoPE and the float32 upcast the reference applies after permuting (.float() keeps the layout)
    query, key, query_rotate, key_rotate = _chain(RELU_ROPE_PAIR, site, query, key, *rotary_emb)

    # B, H, D, N
    query = query.permute(0, 2, 3, 1)
    key = key.permute(0, 2, 3, 1)
    query_rotate = query_rotate.permute(0, 2, 3, 1)
    key_rotate = key_rotate.permute(0, 2, 3, 1)
    value = value.permute(0, 2, 3, 1)

    z = 1 / (_key_sum(key, shards).transpose(-2, -1) @ query + 1e-15)
    if bf16_first_gemm:
        hidden_states = linear_attention_bf16_gemm(query_rotate, key_rotate.to(value.dtype), value, z, shards)
        hidden_states = hidden_states.flatten(1, 2).transpose(1, 2).to(original_dtype)
    else:
        scores = torch.matmul(value.float(), key_rotate.transpose(-1, -2))
        if shards is not None:
            scores = sum_over_ranks(scores, shards)
        hidden_states = torch.matmul(scores, query_rotate)
        if original_dtype == torch.float32:  # no cast: the chain is one product
            hidden_states = (hidden_states * z).flatten(1, 2).transpose(1, 2)
        else:
            hidden_states = _chain(SCALE_TO_TOKENS, site, hidden_states, z, original_dtype)

    hidden_states = attn.to_out[0](hidden_states)
    hidden_states = attn.to_out[1](hidden_states)
    return hidden_states


class _AcceptsSplitProcessor:
    """The fast paths restate diffusers' processor; accelpatch's split-aware subclass of it (swapped in at ``apply``,
    diffusers' code whenever the model is not split) is the same processor to them."""

    def processor_mismatch(self, module: torch.nn.Module) -> Optional[str]:
        if type(getattr(module, "processor", None)) is _split_processor_class():
            return None
        return super().processor_mismatch(module)


def _self_attention_call(fast_path: FastPath, attn: torch.nn.Module, args: tuple, kwargs: dict):
    """The call's hidden states and rotary tables, or a Decline naming what the restatement does not cover."""
    call = bind_call(args, kwargs, ("hidden_states", "encoder_hidden_states", "attention_mask"))
    mismatch = fast_path.processor_mismatch(attn)
    if mismatch is not None:
        return Decline(mismatch)
    if call["encoder_hidden_states"] is not None:
        return Decline("encoder_hidden_states given: the fast path covers self-attention only")
    if call.get("rotary_emb") is None:
        return Decline("no rotary_emb: the reference processor needs it")
    return call["hidden_states"], call["rotary_emb"]


class SanaLinearAttentionFused(_AcceptsSplitProcessor, FusedOpsPath):
    fusion = FUSED_FUSION
    description = "linear attention with its ReLU/RoPE/upcast prologue and normaliser epilogue fused (bit-exact)"
    fused_ops = (RELU_ROPE_PAIR, SCALE_TO_TOKENS)

    def expected_processor(self) -> type:
        return _reference_processor_class()

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = _self_attention_call(self, attn, args, kwargs)
        if isinstance(call, Decline):
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
        if isinstance(call, Decline):
            return call
        hidden_states, rotary_emb = call
        device_reason = device_reject_reason(hidden_states.device, "the BF16-input GEMM")
        if device_reason is not None:
            return Decline(device_reason)
        if hidden_states.dtype != torch.bfloat16 or attn.to_q.weight.dtype != torch.bfloat16:
            return Decline(f"activations are {hidden_states.dtype} and weights {attn.to_q.weight.dtype}: "
                           "the fast path needs bfloat16")
        return linear_attention(attn, site, hidden_states, rotary_emb, bf16_first_gemm=True,
                                shards=attention_shards(attn))


BF16_LINEAR_ATTENTION = SanaLinearAttentionBF16()
FUSED_LINEAR_ATTENTION = SanaLinearAttentionFused()
