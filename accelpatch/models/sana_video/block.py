"""SANA-Video's transformer block and its GLUMB feed-forward, restated with their element-wise chains fused.

Both are ``lossless`` fast paths: the restatements follow diffusers' ``SanaVideoTransformerBlock.forward`` and
``GLUMBTempConv.forward`` op for op and call verified fused ops (accelpatch.lossless.verify) for

- the block: both AdaLN modulations (``norm * (1 + scale) + shift``) and both gated residual adds;
- GLUMB: the SiLU after the inverted 1x1 conv and the GLU gate ``x * silu(gate)`` (bf16: exact tables of the
  device's own SiLU; other dtypes run diffusers' ops). The convolutions, norms and attention stay diffusers' own.

A module whose class, norm or activation is not the one restated declines at ``apply``, naming what differs.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.lossless.inplace import output_may_be_kept
from accelpatch.lossless.ops import GATED_RESIDUAL, GLU_GATE, MODULATE, SILU, SILU_INPLACE
from accelpatch.low_memory.chunked import CHUNKED, chunk_rows
from accelpatch.low_memory.feature import memory_mode
from accelpatch.core.gate import QualityGatedFusion
from accelpatch.core.outcomes import NotApplicable
from accelpatch.core.sites import FusedOpsPath, Site, bind_call, restated_class_mismatch
from accelpatch.core.tiers import Tier

BLOCK_FUSION = QualityGatedFusion.named("sana_video_fused_block", Tier.LOSSLESS)
GLUMB_FUSION = QualityGatedFusion.named("sana_video_fused_glumb", Tier.LOSSLESS)

_SANA = "diffusers.models.transformers.transformer_sana_video:"

_BLOCK_ARGUMENTS = ("hidden_states", "attention_mask", "encoder_hidden_states", "encoder_attention_mask",
                    "timestep", "frames", "height", "width", "rotary_emb")


def _diffusers_class(name: str) -> type:
    from diffusers.models.transformers import transformer_sana_video

    return getattr(transformer_sana_video, name)


def _class_mismatch(site: Site, name: str) -> Optional[str]:
    return restated_class_mismatch(site, _diffusers_class(name))


class SanaVideoFusedBlock(FusedOpsPath):
    fusion = BLOCK_FUSION
    description = "block with its AdaLN modulations and gated residual adds fused (bit-exact)"
    fused_ops = (MODULATE, GATED_RESIDUAL)
    restates = (_SANA + "SanaVideoTransformerBlock.forward",)

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        mismatch = _class_mismatch(site, "SanaVideoTransformerBlock")
        if mismatch is None and not isinstance(module.norm1, torch.nn.LayerNorm):
            mismatch = f"norm1 is {type(module.norm1).__name__}, not the LayerNorm restated"
        return mismatch

    def run(self, block: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        call = bind_call(args, kwargs, _BLOCK_ARGUMENTS)
        hidden_states, timestep = call["hidden_states"], call["timestep"]
        frames, height, width = call["frames"], call["height"], call["width"]
        batch_size = hidden_states.shape[0]

        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            block.scale_shift_table[None, None] + timestep.reshape(batch_size, timestep.shape[1], 6, -1)
        ).unbind(dim=2)

        norm_hidden_states = MODULATE(site, block.norm1(hidden_states), scale_msa, shift_msa)
        norm_hidden_states = norm_hidden_states.to(hidden_states.dtype)

        attn_output = block.attn1(norm_hidden_states, rotary_emb=call["rotary_emb"])
        hidden_states = GATED_RESIDUAL(site, hidden_states, gate_msa, attn_output)

        if block.attn2 is not None:
            attn_output = block.attn2(hidden_states, encoder_hidden_states=call["encoder_hidden_states"],
                                      attention_mask=call["encoder_attention_mask"])
            hidden_states = attn_output + hidden_states

        norm_hidden_states = MODULATE(site, block.norm2(hidden_states), scale_mlp, shift_mlp)
        norm_hidden_states = norm_hidden_states.unflatten(1, (frames, height, width))
        ff_output = block.ff(norm_hidden_states).flatten(1, 3)
        return GATED_RESIDUAL(site, hidden_states, gate_mlp, ff_output)


class SanaVideoFusedGLUMB(FusedOpsPath):
    fusion = GLUMB_FUSION
    description = "GLUMB feed-forward with its SiLU and GLU gate fused (bit-exact, bf16)"
    fused_ops = (SILU, SILU_INPLACE, GLU_GATE, CHUNKED)
    restates = (_SANA + "GLUMBTempConv.forward",)
    policy_reasons = ("activations are torch.float32: GLUMB's fused chains are bfloat16 tables",
                      "activations are torch.float16: GLUMB's fused chains are bfloat16 tables")

    def mount_reject_reason(self, module: torch.nn.Module, site: Site) -> Optional[str]:
        mismatch = _class_mismatch(site, "GLUMBTempConv")
        if mismatch is None and type(module.nonlinearity) is not torch.nn.SiLU:
            mismatch = f"its nonlinearity is {type(module.nonlinearity).__name__}, not the SiLU restated"
        return mismatch

    def run(self, ff: torch.nn.Module, site: Site, args: tuple, kwargs: dict):
        hidden_states = bind_call(args, kwargs, ("hidden_states",))["hidden_states"]
        if hidden_states.dtype != torch.bfloat16 and memory_mode(site.model) is None:
            return NotApplicable(f"activations are {hidden_states.dtype}: GLUMB's fused chains are bfloat16 tables")
        if ff.residual_connection:
            residual = hidden_states
        batch_size, num_frames, height, width, num_channels = hidden_states.shape
        # the spatial part, frame by frame: whole, or in chunks of frames under memory="low" (chunk_rows; its fused
        # ops run their chains outside bfloat16)
        hidden_states = chunk_rows(site, glumb_spatial, ff,
                                   hidden_states.view(batch_size * num_frames, height, width, num_channels),
                                   dim=0, per_item=height * width,
                                   calls=(ff.conv_inverted, ff.conv_depth, ff.conv_point))

        hidden_states_temporal = hidden_states.view(batch_size, num_frames, num_channels, height * width).permute(
            0, 2, 1, 3)
        del hidden_states

        hidden_states = hidden_states_temporal + ff.conv_temp(hidden_states_temporal)
        hidden_states = hidden_states.permute(0, 2, 3, 1).view(batch_size, num_frames, height, width, num_channels)

        if ff.norm_type == "rms_norm":
            hidden_states = ff.norm(hidden_states.movedim(1, -1)).movedim(-1, 1)
        if ff.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states


def glumb_spatial(site: Site, ff: torch.nn.Module, frames: torch.Tensor) -> torch.Tensor:
    """GLUMB's per-frame part on (frames, height, width, channels): the inverted 1x1 convolution, its SiLU (in
    place: nothing else holds the convolution's output, unless a hook saw it), the depthwise 3x3 convolution, the
    GLU gate and the pointwise convolution, each frame on its own (so it runs in chunks of frames too)."""
    hidden_states = frames.permute(0, 3, 1, 2)
    silu = SILU if output_may_be_kept(ff.conv_inverted) else SILU_INPLACE
    hidden_states = silu(site, ff.conv_inverted(hidden_states))
    hidden_states = ff.conv_depth(hidden_states)
    hidden_states, gate = torch.chunk(hidden_states, 2, dim=1)
    hidden_states = GLU_GATE(site, hidden_states, gate)
    del gate
    return ff.conv_point(hidden_states)


FUSED_BLOCK = SanaVideoFusedBlock()
FUSED_GLUMB = SanaVideoFusedGLUMB()
