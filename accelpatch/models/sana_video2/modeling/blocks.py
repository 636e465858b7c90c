"""SANA-Video 2.0's layers: :class:`SanaVideo2Block` (one layer's attention and MLP sub-layers, each returning its
delta for the model's Attention Residuals), its :class:`SwiGLU` MLP, the AdaLN modulation (:func:`modulate`, per
frame too) and the :class:`FinalLayer` back to latent channels. Parameter names mirror the original checkpoint keys.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from accelpatch.models.sana_video2.modeling.attention import (SanaVideo2CrossAttention, SanaVideo2LinearAttention,
                                                              SanaVideo2SoftmaxAttention)

__all__ = ["SOFTMAX", "LINEAR", "modulate", "SwiGLU", "SanaVideo2Block", "FinalLayer"]

SOFTMAX, LINEAR = "softmax", "linear"


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


def _per_frame(x: torch.Tensor, table_rows: torch.Tensor, frames: Optional[int]) -> torch.Tensor:
    """Apply one modulation row ``table_rows`` ([B, 1, C], or [B, F, 1, C] per frame) to tokens ``x`` [B, N, C]."""
    if frames is None:
        return x * table_rows
    batch, tokens, width = x.shape
    return (x.reshape(batch, frames, tokens // frames, width) * table_rows).reshape(batch, tokens, width)


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden)
        self.up_proj = nn.Linear(width, hidden)
        self.down_proj = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SanaVideo2Block(nn.Module):
    """One layer: the attention sub-layer (modulated self-attention, gated, then cross-attention on h + a; returns
    a + c) and the MLP sub-layer (modulated, gated SwiGLU). Each returns its delta: the residual stream is the
    model's Attention Residuals, not an addition here."""

    def __init__(self, hidden_size: int, num_heads: int, attention_type: str, *, linear_head_dim: int,
                 softmax_head_dim: int, mlp_ratio: float, qk_norm: bool, cross_norm: bool, norm_eps: float,
                 fp32_attention: bool) -> None:
        super().__init__()
        self.attention_type = attention_type
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        attention_cls, head_dim = ((SanaVideo2SoftmaxAttention, softmax_head_dim) if attention_type == SOFTMAX
                                   else (SanaVideo2LinearAttention, linear_head_dim))
        self.attn = attention_cls(hidden_size, head_dim, qk_norm=qk_norm, norm_eps=norm_eps,
                                  fp32_attention=fp32_attention)
        self.cross_attn = SanaVideo2CrossAttention(hidden_size, num_heads, qk_norm=cross_norm)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = SwiGLU(hidden_size, int(hidden_size * mlp_ratio))
        self.scale_shift_table = nn.Parameter(torch.randn(6, hidden_size) / hidden_size ** 0.5)

    def _modulation(self, timestep_emb: torch.Tensor) -> tuple[Optional[int], tuple[torch.Tensor, ...]]:
        """(frames or None, the six rows shift/scale/gate × msa/mlp) from t0 [B, 6C] or [B, 1, F, 6C]."""
        batch, width = timestep_emb.shape[0], self.scale_shift_table.shape[1]
        if timestep_emb.dim() == 2:
            return None, (self.scale_shift_table[None] + timestep_emb.reshape(batch, 6, width)).chunk(6, dim=1)
        frames = timestep_emb.shape[2]
        rows = self.scale_shift_table[None, None] + timestep_emb.reshape(batch, frames, 6, width)
        return frames, rows.chunk(6, dim=2)

    def _modulated(self, norm: nn.Module, x: torch.Tensor, shift, scale, frames: Optional[int]) -> torch.Tensor:
        if frames is None:
            return modulate(norm(x), shift, scale)
        batch, tokens, width = x.shape
        grouped = norm(x).reshape(batch, frames, tokens // frames, width)
        return modulate(grouped, shift, scale).reshape(batch, tokens, width)

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, timestep_emb: torch.Tensor,
                encoder_attention_mask: Optional[torch.Tensor], rotary_emb: Optional[torch.Tensor],
                sublayer: str) -> torch.Tensor:
        """The delta of one sub-layer (``sublayer`` is "attention" or "mlp") for its mixed input."""
        frames, (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp) = self._modulation(timestep_emb)
        if sublayer == "attention":
            attn_in = self._modulated(self.norm1, hidden_states, shift_msa, scale_msa, frames)
            attn_delta = _per_frame(self.attn(attn_in, rotary_emb), gate_msa, frames)
            cross_delta = self.cross_attn(hidden_states + attn_delta, encoder_hidden_states, encoder_attention_mask)
            return attn_delta + cross_delta
        if sublayer == "mlp":
            mlp_in = self._modulated(self.norm2, hidden_states, shift_mlp, scale_mlp, frames)
            return _per_frame(self.mlp(mlp_in), gate_mlp, frames)
        raise ValueError(f"sublayer must be 'attention' or 'mlp', got {sublayer!r}")


class FinalLayer(nn.Module):
    """LayerNorm (no affine), shift/scale from ``t`` (not t0) and a linear map back to latent channels."""

    def __init__(self, hidden_size: int, patch_elements: int, out_channels: int) -> None:
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_elements * out_channels)
        self.scale_shift_table = nn.Parameter(torch.randn(2, hidden_size) / hidden_size ** 0.5)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 2:
            shift, scale = (self.scale_shift_table[None] + t[:, None]).chunk(2, dim=1)
            return self.linear(modulate(self.norm_final(x), shift, scale))
        batch, tokens, width = x.shape
        frames = t.shape[2]
        shift, scale = (self.scale_shift_table[None, None] + t.transpose(1, 2)).chunk(2, dim=2)
        x = modulate(self.norm_final(x).reshape(batch, frames, tokens // frames, width), shift, scale)
        return self.linear(x.reshape(batch, tokens, width))

