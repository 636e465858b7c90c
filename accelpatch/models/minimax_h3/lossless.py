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
    fused_ops = (MODULATE, GATED_RESIDUAL)
    restates = (_H3 + "MiniMaxH3TransformerBlock.forward",)

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        return restated_class_mismatch(site, _h3().MiniMaxH3TransformerBlock)

    def run(self, block: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ("hidden_states", "temb", "adaln_indices", "rotary_emb", "attention_mask"))
        hidden_states, index = call["hidden_states"], call["adaln_indices"]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaln_proj(call["temb"])

        residual = hidden_states
        norm_hidden_states = MODULATE(site, block.norm1(hidden_states), scale_msa.index_select(0, index),
                                      shift_msa.index_select(0, index))
        attn_output = block.attn(norm_hidden_states, call["rotary_emb"], call["attention_mask"])
        hidden_states = GATED_RESIDUAL(site, residual, gate_msa.index_select(0, index), attn_output)

        residual = hidden_states
        norm_hidden_states = MODULATE(site, block.norm2(hidden_states), scale_mlp.index_select(0, index),
                                      shift_mlp.index_select(0, index))
        ff_output = block.ff(norm_hidden_states)
        return GATED_RESIDUAL(site, residual, gate_mlp.index_select(0, index), ff_output)


class MiniMaxH3FusedAttention(FusedOpsPath):
    fusion = ATTENTION_FUSION
    description = "attention with the q/k rotate-half RoPE fused (bit-exact)"
    fused_ops = (ROTATE_HALF_PAIR,)
    #: ROTATE_HALF_PAIR restates the processor's _apply_rotary_emb
    restates = H3_ATTENTION_RESTATES

    def expected_processor(self) -> type:
        return _h3().MiniMaxH3AttnProcessor

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ("hidden_states", "rotary_emb", "attention_mask"))
        processor = attn.processor
        query, key, value = project_qkv(attn, site, call["hidden_states"], call["rotary_emb"])
        hidden_states = _h3().dispatch_attention_fn(
            query, key, value, attn_mask=call["attention_mask"], dropout_p=0.0, is_causal=False,
            backend=processor._attention_backend, parallel_config=processor._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](hidden_states))


FUSED_BLOCK = MiniMaxH3FusedBlock()
FUSED_ATTENTION = MiniMaxH3FusedAttention()
