"""SANA-Video 2.0's lossless fast paths: its block and both self-attention kinds with their chains fused.

- ``blocks.N`` (``SanaVideo2Block``): both AdaLN modulations ``norm(x) * (1 + scale) + shift`` (per frame too)
  and the SwiGLU gate ``silu(gate_proj(x)) * up_proj(x)`` as verified fused ops; the projections, the sub-layer
  bookkeeping, the per-frame gates and the Block Attention Residuals stay the model's own.
- ``blocks.N.attn``: the anchor and the gated linear attention processors with the complex128 RoPE of q and k
  (float64 products, then float64 → float32 → dtype, as ``type_as`` rounds) as one fused op, and the sigmoid
  output gate as another, passed to the model's own
  ``anchor_qkv`` / ``anchor_output`` / ``gated_linear_attention`` (the ``high`` paths stacked above pass them too).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from accelpatch.lossless.ops import GLU_GATE, MODULATE, ROTARY_COMPLEX_PAIR, SIGMOID_GATE
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.sites import FusedOpsPath, Site, bind_call, restated_class_mismatch
from accelpatch.core.tiers import Tier

BLOCK_FUSION = QualityGatedFusion.named("sana_video2_fused_block", Tier.LOSSLESS)
ANCHOR_FUSION = QualityGatedFusion.named("sana_video2_fused_softmax_attention", Tier.LOSSLESS)
LINEAR_FUSION = QualityGatedFusion.named("sana_video2_fused_linear_attention", Tier.LOSSLESS)


def rope_pair(site: Site):
    """The fused RoPE of q and k for the model's attention functions (their ``rope_pair`` argument)."""
    return functools.partial(ROTARY_COMPLEX_PAIR, site)


def sigmoid_gate(site: Site):
    """The fused sigmoid gate for the model's attention functions (their ``gate`` argument)."""
    return functools.partial(SIGMOID_GATE, site)


def anchor_attention(site: Site, attn: torch.nn.Module, hidden_states: torch.Tensor, query, key, value, *,
                     upcast: bool) -> torch.Tensor:
    """The anchor processor's attention and tail on q, k, v in the activations' dtype (``upcast``: the release's
    FP32 core, as the lossless path runs it; the BF16 path passes False): the model's ``anchor_core`` (diffusers'
    dispatcher with the processor's backend and parallel config), then the gate and projection."""
    from accelpatch.models.sana_video2.modeling.attention import anchor_core, anchor_output

    out = anchor_core(attn.processor, query, key, value, upcast=upcast)
    return anchor_output(attn, out, hidden_states, sigmoid_gate(site))


def _modulated(site: Site, norm: torch.nn.Module, x: torch.Tensor, shift, scale, frames: Optional[int]):
    """``SanaVideo2Block._modulated`` with the modulation fused."""
    if frames is None:
        return MODULATE(site, norm(x), scale, shift)
    batch, tokens, width = x.shape
    grouped = norm(x).reshape(batch, frames, tokens // frames, width)
    return MODULATE(site, grouped, scale, shift).reshape(batch, tokens, width)


class SanaVideo2FusedBlock(FusedOpsPath):
    fusion = BLOCK_FUSION
    description = "block with its AdaLN modulations and SwiGLU gate fused (bit-exact)"
    fused_ops = (MODULATE, GLU_GATE)

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        from accelpatch.models.sana_video2.modeling.blocks import SanaVideo2Block, SwiGLU

        mismatch = restated_class_mismatch(site, SanaVideo2Block, owner="")
        if mismatch is not None:
            return mismatch
        if type(module.mlp) is not SwiGLU:
            return f"its mlp is {type(module.mlp).__name__}, not the SwiGLU restated"
        return None

    def run(self, block: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        from accelpatch.models.sana_video2.modeling.blocks import _per_frame

        call = bind_call(args, kwargs, ("hidden_states", "encoder_hidden_states", "timestep_emb",
                                        "encoder_attention_mask", "rotary_emb", "sublayer"))
        hidden_states, sublayer = call["hidden_states"], call["sublayer"]
        if sublayer not in ("attention", "mlp"):
            raise ValueError(f"sublayer must be 'attention' or 'mlp', got {sublayer!r}")
        frames, (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp) = block._modulation(
            call["timestep_emb"])
        if sublayer == "attention":
            attn_in = _modulated(site, block.norm1, hidden_states, shift_msa, scale_msa, frames)
            attn_delta = _per_frame(block.attn(attn_in, call["rotary_emb"]), gate_msa, frames)
            cross_delta = block.cross_attn(hidden_states + attn_delta, call["encoder_hidden_states"],
                                           call["encoder_attention_mask"])
            return attn_delta + cross_delta
        mlp_in = _modulated(site, block.norm2, hidden_states, shift_mlp, scale_mlp, frames)
        mlp = block.mlp
        if GLU_GATE.outside_policy(site, mlp_in):  # not bf16: the model's own SwiGLU, which frees gate_proj's
            return _per_frame(mlp(mlp_in), gate_mlp, frames)  # output before up_proj runs (one tensor less)
        gated = GLU_GATE(site, mlp.up_proj(mlp_in), mlp.gate_proj(mlp_in))
        return _per_frame(mlp.down_proj(gated), gate_mlp, frames)


class SanaVideo2FusedAnchor(FusedOpsPath):
    fusion = ANCHOR_FUSION
    description = "anchor attention with the q/k complex RoPE fused (bit-exact)"
    fused_ops = (ROTARY_COMPLEX_PAIR, SIGMOID_GATE)

    def expected_processor(self) -> type:
        from accelpatch.models.sana_video2.modeling.attention import SanaVideo2SoftmaxAttnProcessor

        return SanaVideo2SoftmaxAttnProcessor

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        from accelpatch.models.sana_video2.modeling.attention import anchor_qkv

        call = bind_call(args, kwargs, ("hidden_states", "rotary_emb"))
        hidden_states = call["hidden_states"]
        query, key, value = anchor_qkv(attn, hidden_states, call["rotary_emb"], rope_pair(site))
        return anchor_attention(site, attn, hidden_states, query, key, value, upcast=attn.fp32_attention)


class SanaVideo2FusedLinear(FusedOpsPath):
    fusion = LINEAR_FUSION
    description = "gated linear attention with the q/k complex RoPE fused (bit-exact)"
    fused_ops = (ROTARY_COMPLEX_PAIR, SIGMOID_GATE)

    def expected_processor(self) -> type:
        from accelpatch.models.sana_video2.modeling.attention import SanaVideo2LinearAttnProcessor

        return SanaVideo2LinearAttnProcessor

    def run(self, attn: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        from accelpatch.models.sana_video2.modeling.attention import gated_linear_attention
        from accelpatch.parallel.sequence import processor_shards

        call = bind_call(args, kwargs, ("hidden_states", "rotary_emb"))
        return gated_linear_attention(attn, call["hidden_states"], call["rotary_emb"], rope_pair=rope_pair(site),
                                      gate=sigmoid_gate(site), shards=processor_shards(attn.processor))


FUSED_BLOCK = SanaVideo2FusedBlock()
FUSED_ANCHOR = SanaVideo2FusedAnchor()
FUSED_LINEAR = SanaVideo2FusedLinear()
