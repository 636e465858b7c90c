"""diffusers' ``SanaLinearAttnProcessor3_0`` on self-attention restated once, op for op: the math the SANA-Video
attention fast paths (:mod:`.linear_attention`) and the split-aware exact-tier processor (:mod:`.split_processors`)
share. Its element-wise chains are the lossless fused ops at a fast path's site, their eager reference chains
without one; under a sequence split its two token sums are all-reduced over the group.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.ops import RELU_ROPE_PAIR, SCALE_TO_TOKENS
from accelpatch.models.sana_video.gemm import key_value_state_bf16
from accelpatch.parallel.sequence import SequenceShards, sum_over_ranks
from accelpatch.core.sites import Site


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

    # each intermediate is dropped as soon as it is dead (the same ops: a lower peak than the reference's, which
    # holds q, k and the float32 value to the end)
    z = 1 / (_key_sum(key, shards).transpose(-2, -1) @ query + 1e-15)
    del query, key
    if bf16_first_gemm:
        hidden_states = linear_attention_bf16_gemm(query_rotate, key_rotate.to(value.dtype), value, z, shards)
        hidden_states = hidden_states.flatten(1, 2).transpose(1, 2).to(original_dtype)
    else:
        value = value.float()
        scores = torch.matmul(value, key_rotate.transpose(-1, -2))
        del value, key_rotate
        if shards is not None:
            scores = sum_over_ranks(scores, shards)
        hidden_states = torch.matmul(scores, query_rotate)
        del scores, query_rotate
        if original_dtype == torch.float32:  # no cast: the chain is one product
            hidden_states = (hidden_states * z).flatten(1, 2).transpose(1, 2)
        else:
            hidden_states = _chain(SCALE_TO_TOKENS, site, hidden_states, z, original_dtype)

    hidden_states = attn.to_out[0](hidden_states)
    hidden_states = attn.to_out[1](hidden_states)
    return hidden_states
