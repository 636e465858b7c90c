"""Wan 2.x's lossless block fusion: ``WanTransformerBlock.forward`` restated with its element-wise chains fused.

Wan runs its AdaLN chains in float32 whatever the weights' dtype: the table plus ``temb.float()`` gives float32
shift/scale/gate rows, the norms see ``hidden_states.float()``, and each chain is cast back with ``.type_as`` at its
end. The fused ops are therefore the shared ones (accelpatch.lossless.ops), called on float32 operands:

- both modulations, ``norm(x.float()) * (1 + scale) + shift``: :data:`~accelpatch.lossless.ops.MODULATE`;
- both gated residual adds, ``x.float() + out * gate``: :data:`~accelpatch.lossless.ops.GATED_RESIDUAL` as
  ``residual + gate * out`` with ``out`` upcast first. Both are bit-identical to diffusers' expression: a product
  is commutative in IEEE arithmetic, and eager computes a bf16 × float32 product in float32 from the exactly
  widened bf16 value, which is what ``out.float() * gate`` computes.

The casts back (``.type_as``), the norms, both attentions, the cross-attention residual and the feed-forward stay
diffusers' own. Wan 2.2 TI2V's per-token rows (``temb`` [B, N, 6, C]) take the same ops with strided rows.

``blocks.N.attn1`` (self-attention) carries a second fusion: ``WanAttnProcessor`` restated with its interleaved
RoPE of q and k (``x1 * cos - x2 * sin``, ``x1 * sin + x2 * cos`` on pairs (2i, 2i+1) at the promoted dtype of
the activations and the tables, stored back in the activations' dtype) as one verified op,
:data:`~accelpatch.lossless.ops.ROPE_PAIR` (SANA-Video's RoPE kernels without their ReLU). The projections, the q/k
RMSNorms, the dispatcher and ``to_out`` stay diffusers'; the Sol-Attn path (``high``, stacked above it) builds its
q/k/v with the same function.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.ops import GATED_RESIDUAL, MODULATE, ROPE_PAIR
from accelpatch.low_memory.chunked import CHUNKED, chunk_rows
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.outcomes import NotApplicable
from accelpatch.core.sites import FusedOpsPath, Site, bind_call, restated_class_mismatch
from accelpatch.core.tiers import Tier

BLOCK_FUSION = QualityGatedFusion.named("wan_fused_block", Tier.LOSSLESS)
ATTENTION_FUSION = QualityGatedFusion.named("wan_fused_attention", Tier.LOSSLESS)

NOT_SELF = ("encoder_hidden_states given: a cross-attention call, which WanAttnProcessor computes without RoPE "
            "(diffusers' processor runs it)")


_WAN = "diffusers.models.transformers.transformer_wan:"
#: the self-attention paths (this fused one and Sol-Attn's) restate the processor and the module forward it replaces
ATTENTION_RESTATES = (_WAN + "WanAttnProcessor.__call__", _WAN + "WanAttention.forward")


def _wan():
    from diffusers.models.transformers import transformer_wan

    return transformer_wan


def _wan_block_class() -> type:
    from diffusers.models.transformers.transformer_wan import WanTransformerBlock

    return WanTransformerBlock


def modulation_rows(block: torch.nn.Module, temb: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The six float32 AdaLN rows (shift, scale, gate for attention, then for the feed-forward) exactly as
    ``WanTransformerBlock.forward`` builds them, for Wan 2.1/2.2 ``temb`` [B, 6, C] and TI2V's [B, N, 6, C]."""
    if temb.ndim == 4:
        rows = (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
        return tuple(row.squeeze(2) for row in rows)
    return (block.scale_shift_table + temb.float()).chunk(6, dim=1)


class WanFusedBlock(FusedOpsPath):
    fusion = BLOCK_FUSION
    description = "block with its float32 AdaLN modulations and gated residual adds fused (bit-exact)"
    fused_ops = (MODULATE, GATED_RESIDUAL, CHUNKED)
    restates = (_WAN + "WanTransformerBlock.forward",)

    def block_class(self) -> type:
        """The diffusers block class whose forward this path restates (Wan Animate's path: diffusers' copy of it)."""
        return _wan_block_class()

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        return restated_class_mismatch(site, self.block_class())

    def run(self, block: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ("hidden_states", "encoder_hidden_states", "temb", "rotary_emb"))
        hidden_states = call["hidden_states"]
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = modulation_rows(block, call["temb"])

        # The row-wise parts run whole, or in chunks of tokens under memory="low" (chunk_rows)
        # 1. Self-attention
        norm_hidden_states = chunk_rows(site, modulated_norm, block.norm1, hidden_states, scale_msa, shift_msa)
        attn_output = block.attn1(norm_hidden_states, None, None, call["rotary_emb"])
        hidden_states = chunk_rows(site, gated_residual, None, hidden_states, attn_output, gate_msa)
        del attn_output  # dead intermediates are dropped (diffusers' block holds them to its end)

        # 2. Cross-attention (diffusers' own)
        norm_hidden_states = chunk_rows(site, float_norm, block.norm2, hidden_states)
        attn_output = block.attn2(norm_hidden_states, call["encoder_hidden_states"], None, None)
        hidden_states = hidden_states + attn_output
        del attn_output

        # 3. Feed-forward
        norm_hidden_states = chunk_rows(site, modulated_norm, block.norm3, hidden_states, c_scale_msa, c_shift_msa)
        ff_output = block.ffn(norm_hidden_states)
        del norm_hidden_states
        return chunk_rows(site, gated_residual, None, hidden_states, ff_output, c_gate_msa)


def modulated_norm(site: Site, norm: torch.nn.Module, hidden_states: torch.Tensor, scale: torch.Tensor,
                   shift: torch.Tensor) -> torch.Tensor:
    """``(norm(x.float()) * (1 + scale) + shift).type_as(x)`` (the block's float32 AdaLN), its modulation fused."""
    return MODULATE(site, norm(hidden_states.float()), scale, shift).type_as(hidden_states)


def gated_residual(site: Site, _: None, hidden_states: torch.Tensor, update: torch.Tensor,
                   gate: torch.Tensor) -> torch.Tensor:
    """``(x.float() + update.float() * gate).type_as(x)`` (the block's float32 gated residual), fused."""
    return GATED_RESIDUAL(site, hidden_states.float(), gate, update.float()).type_as(hidden_states)


def float_norm(site: Site, norm: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``norm(x.float()).type_as(x)``."""
    return norm(hidden_states.float()).type_as(hidden_states)


FUSED_BLOCK = WanFusedBlock()


def project_qkv(attn: torch.nn.Module, site: Site, hidden_states: torch.Tensor, rotary_emb, wan=None):
    """q, k, v [B, N, H, D] exactly as ``WanAttnProcessor`` hands them to the dispatcher for self-attention:
    diffusers' projection helper, the q/k RMSNorms across heads, then the RoPE of q and k as ROPE_PAIR. ``wan``: the
    diffusers module whose helper the processor calls (None: ``transformer_wan``; Wan Animate has its own copy)."""
    query, key, value = (_wan() if wan is None else wan)._get_qkv_projections(attn, hidden_states, None)
    query = attn.norm_q(query)  # one statement each: the unnormed query is freed before norm_k
    key = attn.norm_k(key)
    query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
    if rotary_emb is not None:
        query, key = ROPE_PAIR(site, query, key, *rotary_emb)
    return query, key, value


def _project_rows(site: Site, attn: torch.nn.Module, hidden_states: torch.Tensor, *rotary_emb: torch.Tensor):
    """:func:`project_qkv` of the tokens given (row-wise: chunks of tokens under memory="low", their RoPE rows
    with them)."""
    return project_qkv(attn, site, hidden_states, rotary_emb or None, site.fast_path.diffusers_module())


class WanFusedAttention(FusedOpsPath):
    fusion = ATTENTION_FUSION
    description = "self-attention with the q/k interleaved RoPE fused (bit-exact)"
    fused_ops = (ROPE_PAIR, CHUNKED)
    policy_reasons = (NOT_SELF,)
    restates = ATTENTION_RESTATES

    def diffusers_module(self):
        """The diffusers module whose ``WanAttnProcessor`` this path restates and whose helpers it calls (Wan
        Animate's path: ``transformer_wan_animate``, which has its own copies)."""
        return _wan()

    def expected_processor(self) -> type:
        return self.diffusers_module().WanAttnProcessor

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, ("hidden_states", "encoder_hidden_states", "attention_mask", "rotary_emb"))
        if call["encoder_hidden_states"] is not None or attn.add_k_proj is not None:
            return NotApplicable(NOT_SELF)
        processor = attn.processor
        wan = self.diffusers_module()
        query, key, value = chunk_rows(site, _project_rows, attn, call["hidden_states"],
                                       *(call["rotary_emb"] or ()))
        hidden_states = wan.dispatch_attention_fn(
            query, key, value, attn_mask=call["attention_mask"], dropout_p=0.0, is_causal=False,
            backend=processor._attention_backend, parallel_config=processor._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        del query, key, value  # dead: not held through the output projection (the processor holds them there)
        return attn.to_out[1](attn.to_out[0](hidden_states))


FUSED_ATTENTION = WanFusedAttention()
