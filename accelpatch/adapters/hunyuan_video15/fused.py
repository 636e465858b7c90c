"""HunyuanVideo 1.5's lossless block fusion: ``HunyuanVideo15TransformerBlock.forward`` restated with its
element-wise chains fused.

The block runs its AdaLN chains in the activations' dtype (no upcast): ``AdaLayerNormZero`` gives six rows per
stream, ``linear(silu(temb)).chunk(6)``, and the chains are the shared verified ops (accelpatch.fused_ops):

- the four modulations, ``norm(x) * (1 + scale[:, None]) + shift[:, None]`` (video and text, before the attention
  inside ``norm1``/``norm1_context`` and before the feed-forwards): :data:`~accelpatch.fused_ops.MODULATE`;
- the four gated residual adds: after the attention ``x + out * gate.unsqueeze(1)``, as ``GATED_RESIDUAL``'s
  ``x + gate * out`` (a product is commutative in IEEE arithmetic, NaN payloads aside, which the check ignores);
  after the feed-forwards ``x + gate.unsqueeze(1) * out``, GATED_RESIDUAL as written.

``AdaLayerNormZero.forward`` is restated (its ``linear``, ``silu`` and ``norm`` stay diffusers' modules, called as
modules) only where the norm is diffusers' own class with no embedding of its own and no hook or forward override
on it; otherwise the norm module is called as it is and only the later chains are fused. The joint attention
(``attn``, where the Sol-Attn site sits), the LayerNorms and the feed-forwards stay diffusers' own.

The RoPE applied to q and k in the attention processor (``apply_rotary_emb(use_real=True)``: ``x.float() * cos +
x_rot.float() * sin`` with every channel's own table entry) is not fused: no shared op computes it for every input.
``rope_pair`` (Wan's) reads ``cos`` at even and ``sin`` at odd channels only, and runs bf16 tables in bf16 where
this upcasts to float32; ``relu_rope_pair`` adds a ReLU and float32 copies, ``rotate_half_pair`` pairs channel
halves and rounds the tables to ``x``'s dtype, ``rotary_complex_pair`` works in float64.
tests/test_hunyuan_video15_fusions.py proves when the interleaved reference does agree bit for bit (float32 tables
whose channel pairs hold equal values, as the model's ``rope`` builds them): a kernel reading each channel's
entry, upcasting as this does, would be the way to fuse it without a check of the tables' values.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...fused_ops import GATED_RESIDUAL, MODULATE
from ...gate import QualityGatedFusion
from ...sites.base import FusedOpsPath, Site, bind_call
from ...tiers import Tier

BLOCK_FUSION = QualityGatedFusion.named("hunyuan_video15_fused_block", Tier.LOSSLESS)

_CALL = ("hidden_states", "encoder_hidden_states", "temb", "attention_mask", "freqs_cis")


def _hy_block_class() -> type:
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15TransformerBlock

    return HunyuanVideo15TransformerBlock


def _restatable(norm: torch.nn.Module) -> bool:
    """Whether ``AdaLayerNormZero.forward`` may be restated for this norm: diffusers' own class with no embedding,
    no hooks and no instance forward (accelerate's hooks replace ``forward`` on the instance)."""
    from diffusers.models.normalization import AdaLayerNormZero

    return (type(norm) is AdaLayerNormZero and norm.emb is None and not norm._forward_hooks
            and not norm._forward_pre_hooks and "forward" not in norm.__dict__)


def adaln_zero(site: Site, norm: torch.nn.Module, x: torch.Tensor, temb: torch.Tensor) -> tuple:
    """``AdaLayerNormZero(x, emb=temb)`` with its modulation as MODULATE: the normalised, modulated ``x`` and the
    rows ``gate_msa, shift_mlp, scale_mlp, gate_mlp``, bit for bit diffusers' (the module itself where it cannot
    be restated)."""
    if not _restatable(norm):
        return norm(x, emb=temb)
    emb = norm.linear(norm.silu(temb))
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
    return MODULATE(site, norm.norm(x), scale_msa[:, None], shift_msa[:, None]), gate_msa, shift_mlp, scale_mlp, \
        gate_mlp


class HunyuanVideo15FusedBlock(FusedOpsPath):
    fusion = BLOCK_FUSION
    description = "dual-stream block with its AdaLN modulations and gated residual adds fused (bit-exact)"
    fused_ops = (MODULATE, GATED_RESIDUAL)

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        if site.original_class is not _hy_block_class():
            return (f"{site.original_class.__name__} is not diffusers' HunyuanVideo15TransformerBlock, whose forward "
                    "this fast path restates")
        return None

    def run(self, block: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, _CALL)
        hidden_states, encoder_hidden_states, temb = call["hidden_states"], call["encoder_hidden_states"], call["temb"]

        # 1. Input normalization (AdaLN-Zero, both streams)
        norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = adaln_zero(site, block.norm1, hidden_states,
                                                                                  temb)
        norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = adaln_zero(
            site, block.norm1_context, encoder_hidden_states, temb)

        # 2. Joint attention (diffusers' module: the Sol-Attn site, when there is one, sits on it)
        attn_output, context_attn_output = block.attn(
            hidden_states=norm_hidden_states, encoder_hidden_states=norm_encoder_hidden_states,
            attention_mask=call["attention_mask"], image_rotary_emb=call["freqs_cis"])

        # 3. Modulation and residual connection
        hidden_states = GATED_RESIDUAL(site, hidden_states, gate_msa.unsqueeze(1), attn_output)
        encoder_hidden_states = GATED_RESIDUAL(site, encoder_hidden_states, c_gate_msa.unsqueeze(1),
                                               context_attn_output)
        norm_hidden_states = MODULATE(site, block.norm2(hidden_states), scale_mlp[:, None], shift_mlp[:, None])
        norm_encoder_hidden_states = MODULATE(site, block.norm2_context(encoder_hidden_states),
                                              c_scale_mlp[:, None], c_shift_mlp[:, None])

        # 4. Feed-forward
        ff_output = block.ff(norm_hidden_states)
        context_ff_output = block.ff_context(norm_encoder_hidden_states)
        hidden_states = GATED_RESIDUAL(site, hidden_states, gate_mlp.unsqueeze(1), ff_output)
        encoder_hidden_states = GATED_RESIDUAL(site, encoder_hidden_states, c_gate_mlp.unsqueeze(1),
                                               context_ff_output)
        return hidden_states, encoder_hidden_states


FUSED_BLOCK = HunyuanVideo15FusedBlock()
