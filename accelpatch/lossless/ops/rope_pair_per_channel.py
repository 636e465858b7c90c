"""``rope_pair_per_channel``: interleaved RoPE of query and key in one pass, each channel its own table entry,
float32 products (HunyuanVideo 1.5's joint attention, LTX-2's interleaved RoPE)."""
from __future__ import annotations

import torch

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.verify import FusedOp, one_at_a_time, register


def rope_pair_per_channel(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Interleaved real RoPE of query and key as diffusers' ``apply_rotary_emb(use_real=True,
    use_real_unbind_dim=-1)`` applies it (HunyuanVideo 1.5's joint attention, ``[B, N, H, D]`` with ``[1, N, 1, D]``
    float32 tables; LTX-2's ``apply_interleaved_rotary_emb`` is the same chain on ``[B, S, C]``): ``x_rotated`` =
    pairs (-x[2i+1], x[2i]), then ``x.float() * cos + x_rotated.float() * sin`` with every channel reading its OWN
    table entry (cos[2i] and cos[2i+1] both used), in float32 (float64 with float64 tables), stored in ``x``'s
    dtype."""
    return _rotate(query, cos, sin), _rotate(key, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One of :func:`rope_pair_per_channel`'s pair."""
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(-2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


ROPE_PAIR_PER_CHANNEL = register(FusedOp(
    "rope_pair_per_channel", rope_pair_per_channel,
    "interleaved RoPE of query and key in one pass, each channel its own cos/sin entry, float32 products "
    "(HunyuanVideo 1.5's joint attention, LTX-2's interleaved RoPE)", parts=one_at_a_time(_rotate)))


def _why_cpu(query, key, cos, sin):
    return cpu.why_rope("rope_pair_per_channel", query, key, cos, sin)


@ROPE_PAIR_PER_CHANNEL.kernel(cpu.LIBRARY, unsupported=_why_cpu)
def rope_pair_per_channel_cpu(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The chain in one pass over query and key: rope_pair's loops reading each channel's own table entries, the
    chain in float32 (float64 with float64 tables), stored in the query's dtype."""
    return cpu.plain_rope(ROPE_PAIR_PER_CHANNEL, True, (query, key, cos, sin))


def _why_cuda(query, key, cos, sin):
    return triton.why_rope(query, key, cos, sin, relu=False)


@ROPE_PAIR_PER_CHANNEL.kernel(triton.LIBRARY, unsupported=_why_cuda)
def rope_pair_per_channel_cuda(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Interleaved RoPE of query and key in one launch, each channel its own table entry, float32 chain."""
    return triton.plain_rope(rope_pair_per_channel, (query, key, cos, sin), per_channel=True)


@cpu.known_answers
def _known_answers(inputs: dict) -> list:
    q, cos, sin = inputs["q"], inputs["cos"], inputs["sin"]
    plan = lambda a: cpu.rope_plan(a, rope_pair_per_channel)  # noqa: E731
    call = lambda lib, a, o, size, st: lib.rope(*a, *o, size, st, True)  # noqa: E731
    return [(rope_pair_per_channel, (q, q.flip(1), cos, sin), plan, call),
            (rope_pair_per_channel, (q.bfloat16(), q.flip(1).bfloat16(), cos, sin), plan, call)]
