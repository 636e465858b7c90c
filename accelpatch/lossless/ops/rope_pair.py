"""``rope_pair``: interleaved RoPE of query and key in one pass, in their dtype (Wan's self-attention)."""
from __future__ import annotations

import torch

from accelpatch.lossless.kernels import cpu, triton_kernels as triton
from accelpatch.lossless.kernels.reference import rotary_interleaved
from accelpatch.lossless.verify import FusedOp, one_at_a_time, register


def rope_pair(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """:func:`~accelpatch.lossless.kernels.reference.rotary_interleaved` of ``[B, N, H, D]`` query and key with one
    pair of tables (Wan's self-attention: ``WanAttnProcessor``'s ``apply_rotary_emb`` on each), in the query's
    dtype."""
    return rotary_interleaved(query, freqs_cos, freqs_sin), rotary_interleaved(key, freqs_cos, freqs_sin)


ROPE_PAIR = register(FusedOp(
    "rope_pair", rope_pair,
    "interleaved RoPE of query and key in one pass, in their dtype (Wan's self-attention)",
    parts=one_at_a_time(rotary_interleaved)))


def _why_cpu(query, key, freqs_cos, freqs_sin):
    return cpu.why_rope("rope_pair", query, key, freqs_cos, freqs_sin)


@ROPE_PAIR.kernel(cpu.LIBRARY, unsupported=_why_cpu)
def rope_pair_cpu(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """The chain in one pass over query and key: relu_rope_pair's rotation loops without the ReLU, stored in the
    query's dtype."""
    return cpu.plain_rope(ROPE_PAIR, False, (query, key, freqs_cos, freqs_sin))


def _why_cuda(query, key, freqs_cos, freqs_sin):
    return triton.why_rope(query, key, freqs_cos, freqs_sin, relu=False)


@ROPE_PAIR.kernel(triton.LIBRARY, unsupported=_why_cuda)
def rope_pair_cuda(query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor):
    """Interleaved RoPE of query and key in one launch, in their dtype."""
    return triton.plain_rope(rope_pair, (query, key, freqs_cos, freqs_sin), per_channel=False)


@cpu.known_answers
def _known_answers(inputs: dict) -> list:
    q, cos, sin = inputs["q"], inputs["cos"], inputs["sin"]
    return [(rope_pair, (q, q.flip(1), cos, sin), lambda a: cpu.rope_plan(a, rope_pair),
             lambda lib, a, o, size, st: lib.rope(*a, *o, size, st, False))]
