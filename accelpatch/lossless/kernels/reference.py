"""The eager chains the lossless fusions replace, written exactly as the models' code computes them.

Each function is the reference of one fused op in this package (same arguments, same outputs, same dtypes and
strides). A fused implementation is admitted only where it reproduces these bit for bit; the first-sight check
(accelpatch.lossless.verify) compares against these very functions. They restate diffusers' code (op for op, so the
rounding after every op, the type promotions and the output layouts are the same); tests compare them with the
models' own forwards.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


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


def rope_pair(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """:func:`rotary_interleaved` of ``[B, N, H, D]`` query and key with one pair of tables (Wan's self-attention:
    ``WanAttnProcessor``'s ``apply_rotary_emb`` on each), in the query's dtype."""
    return rotary_interleaved(query, freqs_cos, freqs_sin), rotary_interleaved(key, freqs_cos, freqs_sin)


def rope_pair_per_channel(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Interleaved real RoPE of query and key as diffusers' ``apply_rotary_emb(use_real=True,
    use_real_unbind_dim=-1)`` applies it (HunyuanVideo 1.5's joint attention, ``[B, N, H, D]`` with ``[1, N, 1, D]``
    float32 tables; LTX-2's ``apply_interleaved_rotary_emb`` is the same chain on ``[B, S, C]``): ``x_rotated`` =
    pairs (-x[2i+1], x[2i]), then ``x.float() * cos + x_rotated.float() * sin`` with every channel reading its OWN
    table entry (cos[2i] and cos[2i+1] both used), in float32 (float64 with float64 tables), stored in ``x``'s
    dtype. (The one-tensor chain is nested, so that every module-level function here is a fused op or its part.)"""
    def rotate(x: torch.Tensor) -> torch.Tensor:
        x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(-2)
        return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)

    return rotate(query), rotate(key)


def rope_split_pair(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """LTX-2.3's split RoPE of query and key (diffusers ``transformer_ltx2.apply_split_rotary_emb`` on each, the
    processors' ``rope_type == "split"``): the last dim in two halves (x1, x2), ``x.float() * cos`` then
    ``first.addcmul_(-sin, x2)`` and ``second.addcmul_(sin, x1)`` in float32 (a product rounded, then the sum), one
    table entry per pair shared by both halves, cast back to x's dtype. 3-D ``[B, T, C]`` x with ``[B, H, T, D/2]``
    tables is rotated per head (x viewed as [B, H, T, D] and back to [B, T, C]); any other x with tables of its
    rank, over its whole last dim. Restated op for op, layouts included (tests compare it with diffusers')."""
    def rotate(x: torch.Tensor) -> torch.Tensor:
        x_dtype = x.dtype
        needs_reshape = False
        if x.ndim != 4 and cos.ndim == 4:
            b, h, t, _ = cos.shape
            x = x.reshape(b, t, h, -1).swapaxes(1, 2)
            needs_reshape = True
        last = x.shape[-1]
        if last % 2 != 0:
            raise ValueError(f"Expected x.shape[-1] to be even for split rotary, got {last}.")
        r = last // 2
        split_x = x.reshape(*x.shape[:-1], 2, r).float()
        first_x = split_x[..., :1, :]
        second_x = split_x[..., 1:, :]
        cos_u = cos.unsqueeze(-2)
        sin_u = sin.unsqueeze(-2)
        out = split_x * cos_u
        first_out = out[..., :1, :]
        second_out = out[..., 1:, :]
        first_out.addcmul_(-sin_u, second_x)
        second_out.addcmul_(sin_u, first_x)
        out = out.reshape(*out.shape[:-2], last)
        if needs_reshape:
            out = out.swapaxes(1, 2).reshape(b, t, -1)
        return out.to(dtype=x_dtype)

    return rotate(query), rotate(key)


def relu_rope_pair(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """SANA-Video's linear-attention prologue on ``[B, N, H, D]`` query and key: ReLU, then RoPE of each, the
    rotated pair upcast to float32 as the processor does after permuting (``.float()`` keeps the layout).
    Returns ``(relu(query), relu(key), rotated query as float32, rotated key as float32)``."""
    query = F.relu(query)
    key = F.relu(key)
    return query, key, rotary_interleaved(query, freqs_cos, freqs_sin).float(), \
        rotary_interleaved(key, freqs_cos, freqs_sin).float()


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """AdaLN modulation of a normalised ``x``: ``x * (1 + scale) + shift`` (three ops, each rounded)."""
    return x * (1 + scale) + shift


def gated_residual(residual: torch.Tensor, gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The gated residual add of DiT blocks: ``residual + gate * x`` (the product rounded, then the sum)."""
    return residual + gate * x


def silu(x: torch.Tensor) -> torch.Tensor:
    """``F.silu`` (``nn.SiLU``)."""
    return F.silu(x)


def glu_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """GLUMB's gate: ``x * silu(gate)`` (the SiLU rounded, then the product)."""
    return x * F.silu(gate)


def scale_to_tokens(x: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SANA-Video's linear-attention epilogue: ``[B, H, D, N]`` float32 ``x`` times the normaliser ``z``
    (``[B, H, 1, N]``), as ``[B, N, H*D]`` tokens in ``dtype``. The result is the transposed (N-minor) view the
    reference hands to ``to_out[0]``; its layout matters there (a biased Linear rounds differently on it)."""
    return (x * z).flatten(1, 2).transpose(1, 2).to(dtype)


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


def rotate_half_pair(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """:func:`rotate_half` of ``[B, S, H, D]`` query and key with one pair of ``[S, R]`` tables."""
    return rotate_half(query, cos, sin), rotate_half(key, cos, sin)


def rotary_complex(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """SANA-Video 2.0's RoPE (``accelpatch.models.sana_video2.modeling.attention.apply_rope``): adjacent channel pairs of
    ``x`` [B, N, H, D] times the complex128 ``freqs`` [N, D/2] in float64, back in ``x``'s dtype."""
    rotated = torch.view_as_complex(x.to(torch.float64).unflatten(-1, (-1, 2))) * freqs[None, :, None, :]
    return torch.view_as_real(rotated).flatten(-2).type_as(x)


def rotary_complex_pair(query: torch.Tensor, key: torch.Tensor, freqs: torch.Tensor):
    """:func:`rotary_complex` of query and key with one table."""
    return rotary_complex(query, freqs), rotary_complex(key, freqs)


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """A sigmoid gate: ``x * sigmoid(gate)`` (the sigmoid rounded, then the product); SANA-Video 2.0's output gate
    and its linear attention's key gate ``β``, where ``gate`` broadcasts over the head dim."""
    return x * torch.sigmoid(gate)


def pointwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """A 1x1 convolution as ``nn.Conv2d`` with stride 1, no padding, dilation 1 and one group runs it (GLUMB's
    ``conv_inverted`` and ``conv_point``)."""
    return F.conv2d(x, weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``nn.Linear``'s call: ``F.linear(x, weight, bias)`` (SANA-Video's attention projections)."""
    return F.linear(x, weight, bias)
