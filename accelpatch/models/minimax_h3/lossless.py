"""MiniMax-H3's lossless fast paths: its block and its attention restated with the element-wise chains fused.

- ``transformer_blocks.N``: both per-row AdaLN modulations (``norm * (1.0 + scale[idx]) + shift[idx]``) and both
  gated residual adds (``residual + gate[idx] * out``) as verified fused ops; the row gathers (``index_select``)
  and the RMSNorms stay diffusers' own.
- ``transformer_blocks.N.attn``: ``MiniMaxH3AttnProcessor`` with the partial rotate-half RoPE of q and k (tables
  cast to the activations' dtype, pass-through channels, ``.contiguous()``) as one fused op; the Sol-Attn path
  (``high``, stacked above it) builds its q/k/v with the same function.
- ``transformer_blocks.N.ff.net.0`` (diffusers ``SwiGLU``): the generic fused SwiGLU (accelpatch.lossless.swiglu).
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.ops import GATED_RESIDUAL, MODULATE, ROTATE_HALF_PAIR
from accelpatch.low_memory.chunked import CHUNKED, chunk_rows
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.sites import FusedOpsPath, Site, bind_call, restated_class_mismatch
from accelpatch.core.tiers import Tier

BLOCK_FUSION = QualityGatedFusion.named("minimax_h3_fused_block", Tier.LOSSLESS)
ATTENTION_FUSION = QualityGatedFusion.named("minimax_h3_fused_attention", Tier.LOSSLESS)


_H3 = "diffusers.models.transformers.transformer_minimax_h3:"
#: the attention's processor, the module forward the gated forward stands in for and the RoPE helper (this fused path
#: and the Sol-Attn one, both through project_qkv)
H3_ATTENTION_RESTATES = (_H3 + "MiniMaxH3AttnProcessor.__call__", _H3 + "MiniMaxH3Attention.forward",
                         _H3 + "_apply_rotary_emb")  # project_qkv's ROTATE_HALF_PAIR restates it


def _h3():
    from diffusers.models.transformers import transformer_minimax_h3

    return transformer_minimax_h3


def project_qkv(attn: torch.nn.Module, site: Site, hidden_states: torch.Tensor, rotary_emb):
    """q, k, v [B, S, H, D] exactly as ``MiniMaxH3AttnProcessor`` builds them before attention."""
    if attn.fused_projections:
        query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
    else:
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
    query = attn.norm_q(query.unflatten(-1, (attn.heads, -1)))
    key = attn.norm_k(key.unflatten(-1, (attn.heads, -1)))
    value = value.unflatten(-1, (attn.heads, -1))
    if rotary_emb is not None:
        query, key = ROTATE_HALF_PAIR(site, query, key, *rotary_emb)
    return query, key, value


class MiniMaxH3FusedBlock(FusedOpsPath):
    fusion = BLOCK_FUSION
    description = "block with its per-row AdaLN modulations and gated residual adds fused (bit-exact)"
    fused_ops = (MODULATE, GATED_RESIDUAL, CHUNKED)
    restates = (_H3 + "MiniMaxH3TransformerBlock.forward",)

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        return restated_class_mismatch(site, _h3().MiniMaxH3TransformerBlock)

    def run(self, block: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ("hidden_states", "temb", "adaln_indices", "rotary_emb", "attention_mask"))
        hidden_states, index = call["hidden_states"], call["adaln_indices"]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaln_proj(call["temb"])

        # The row-wise parts run whole, or in chunks of tokens under memory="low" (chunk_rows: the per-token
        # AdaLN index goes with the tokens as a (1, tokens) view)
        tokens = index.unsqueeze(0)
        norm_hidden_states = chunk_rows(site, modulated_norm, block.norm1, hidden_states, tokens, scale_msa,
                                        shift_msa)
        attn_output = block.attn(norm_hidden_states, call["rotary_emb"], call["attention_mask"])
        del norm_hidden_states  # dead intermediates are dropped (diffusers' block holds them to its end)
        hidden_states = chunk_rows(site, gated_residual, None, hidden_states, attn_output, tokens, gate_msa)
        del attn_output

        norm_hidden_states = chunk_rows(site, modulated_norm, block.norm2, hidden_states, tokens, scale_mlp,
                                        shift_mlp)
        ff_output = block.ff(norm_hidden_states)
        del norm_hidden_states
        return chunk_rows(site, gated_residual, None, hidden_states, ff_output, tokens, gate_mlp)


def modulated_norm(site: Site, norm: torch.nn.Module, hidden_states: torch.Tensor, tokens: torch.Tensor,
                   scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``norm(x) * (1 + scale[index]) + shift[index]`` (the block's per-token AdaLN; ``tokens``: the index as a
    (1, tokens) view), its modulation fused."""
    index = tokens[0]
    return MODULATE(site, norm(hidden_states), scale.index_select(0, index), shift.index_select(0, index))


def gated_residual(site: Site, _: None, hidden_states: torch.Tensor, update: torch.Tensor, tokens: torch.Tensor,
                   gate: torch.Tensor) -> torch.Tensor:
    """``x + update * gate[index]`` (the block's per-token gated residual), fused."""
    return GATED_RESIDUAL(site, hidden_states, gate.index_select(0, tokens[0]), update)


def _project_rows(site: Site, attn: torch.nn.Module, hidden_states: torch.Tensor, *rotary_rows: torch.Tensor):
    """:func:`project_qkv` of the tokens given (row-wise: chunks of tokens under memory="low"; the RoPE's
    (tokens, dim) cos and sin come as (1, tokens, dim) views, to go with them)."""
    return project_qkv(attn, site, hidden_states, tuple(rows[0] for rows in rotary_rows) or None)


class MiniMaxH3FusedAttention(FusedOpsPath):
    fusion = ATTENTION_FUSION
    description = "attention with the q/k rotate-half RoPE fused (bit-exact)"
    fused_ops = (ROTATE_HALF_PAIR, CHUNKED)
    #: ROTATE_HALF_PAIR restates the processor's _apply_rotary_emb
    restates = H3_ATTENTION_RESTATES

    def expected_processor(self) -> type:
        return _h3().MiniMaxH3AttnProcessor

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ("hidden_states", "rotary_emb", "attention_mask"))
        processor = attn.processor
        query, key, value = chunk_rows(site, _project_rows, attn, call["hidden_states"],
                                       *(rows.unsqueeze(0) for rows in call["rotary_emb"] or ()))
        hidden_states = _h3().dispatch_attention_fn(
            query, key, value, attn_mask=call["attention_mask"], dropout_p=0.0, is_causal=False,
            backend=processor._attention_backend, parallel_config=processor._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        del query, key, value  # dead: not held through the output projection (the processor holds them there)
        return attn.to_out[1](attn.to_out[0](hidden_states))


FUSED_BLOCK = MiniMaxH3FusedBlock()
FUSED_ATTENTION = MiniMaxH3FusedAttention()
