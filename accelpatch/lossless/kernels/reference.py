"""The one-tensor chains several lossless fused ops' reference chains are built of, written exactly as the models'
code computes them (op for op, so the rounding after every op, the type promotions and the output layouts are the
same); tests compare them with the models' own functions.

Each op's own reference chain is in its file, ``accelpatch/lossless/ops/<name>.py``: a fused kernel is admitted only
where it reproduces that chain bit for bit (:mod:`accelpatch.lossless.verify`).
"""
from __future__ import annotations

import torch


def rotary_interleaved(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """Interleaved real RoPE as diffusers' ``SanaLinearAttnProcessor3_0`` applies it: pairs (2i, 2i+1), products at
    the promoted dtype of ``x`` and the tables, stored back into ``x``'s dtype."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """MiniMax-H3's RoPE (diffusers ``transformer_minimax_h3._apply_rotary_emb``): the leading ``cos.shape[-1]``
    channels of each head rotated by halves with the tables cast to ``x``'s dtype, the rest passed through."""
    rotary_dim = cos.shape[-1]
    x_rotary = x[..., :rotary_dim]
    x_pass = x[..., rotary_dim:]
    cos = cos.to(x.dtype)[None, :, None, :]
    sin = sin.to(x.dtype)[None, :, None, :]
    x1, x2 = x_rotary.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    x_rotary = x_rotary * cos + rotated * sin
    return torch.cat((x_rotary, x_pass), dim=-1).contiguous()


def rotary_complex(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """SANA-Video 2.0's RoPE (``accelpatch.models.sana_video2.modeling.attention.apply_rope``): adjacent channel pairs of
    ``x`` [B, N, H, D] times the complex128 ``freqs`` [N, D/2] in float64, back in ``x``'s dtype."""
    rotated = torch.view_as_complex(x.to(torch.float64).unflatten(-1, (-1, 2))) * freqs[None, :, None, :]
    return torch.view_as_real(rotated).flatten(-2).type_as(x)
