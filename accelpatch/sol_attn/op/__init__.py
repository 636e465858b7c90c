"""Sol-Attn: block-sparse video attention with rank-1 corrections. Keys are summarised per 64-token block; a key
block whose proxy score beats the query block's threshold (mean plus tau standard deviations), a neighbouring block
or a sink block is attended exactly, every other one through its summary, as one rank-1 term (routing.py).

Public entry points `sol_attn` (BTHD) and `sol_attn_varlen` (packed THD + cu_seqlens), drop-in for the
upstream `sol_attn` package plus `impl` and `return_stats`. Arguments are validated here (errors name
the argument); inputs are made contiguous at this boundary; the work runs in the custom ops of
custom_op.py, which pick the PyTorch, Triton or upstream implementation (dispatch.py). Both ops
have an autograd formula (backward.py: gradients with the routing held fixed, recomputed in PyTorch).
"""
from __future__ import annotations

import torch

from accelpatch.sol_attn.op.options import SolAttnStats, validate_max_seqlen, validate_options, validate_qkv, validate_sink
from accelpatch.sol_attn.op.routing import num_blocks

__all__ = ["sol_attn", "sol_attn_varlen", "SolAttnStats"]


def _ops():
    from accelpatch.sol_attn.op import custom_op  # noqa: F401, PLC0415  (registers the ops on first use)

    return torch.ops.accelpatch


def sol_attn(q, k, v, *, scale=None, tau=1.0, thresh_type="diag", kv_splits=1, sink_tokens=0, sink_start=None,
             impl="auto", return_stats=False):
    """Sol-Attn over q, k, v [B, T, H, D] (same shape and dtype; fp32, bf16, fp16, or fp64 on impl='torch').

    scale: softmax scale, default D**-0.5. tau: threshold in standard deviations (higher = fewer exact
    blocks; -1e9 = dense). thresh_type: "diag" or "exact". kv_splits: 1, 2 or 4 (Triton speed only).
    sink_tokens / sink_start: key range made always exact; sink_start None = suffix of sink_tokens tokens; the
    range must lie inside the sequence (sink_start + sink_tokens <= T), else ValueError.
    The same sink applies to every batch item. impl: "auto", "torch", "triton" or "upstream".
    Returns the output [B, T, H, D] in the input dtype, or (out, SolAttnStats) with return_stats=True.
    Batch items never mix. Differentiable w.r.t. q, k, v: the backward (backward.py) gives the
    gradient of this output with the routing held fixed (it is piecewise constant); no double backward.
    """
    validate_qkv(q, k, v, 4, "[B, T, H, D]")
    scale = validate_options(scale=scale, tau=tau, thresh_type=thresh_type, kv_splits=kv_splits,
                             sink_tokens=sink_tokens, sink_start=sink_start, impl=impl, head_dim=q.shape[-1])
    validate_sink(sink_tokens, sink_start, q.shape[1])
    out, pairs = _ops().sol_attn(q.contiguous(), k.contiguous(), v.contiguous(), scale, float(tau), thresh_type,
                                 int(kv_splits), int(sink_tokens), None if sink_start is None else int(sink_start),
                                 impl, bool(return_stats))
    if not return_stats:
        return out
    return out, SolAttnStats(exact_pairs=pairs, total_pairs=q.shape[0] * num_blocks(q.shape[1]) ** 2)


def sol_attn_varlen(q, k, v, cu_seqlens, max_seqlen, *, scale=None, tau=1.0, thresh_type="diag", kv_splits=1,
                    sink_tokens=0, sink_start=None, impl="auto", return_stats=False):
    """Sol-Attn over packed sequences q, k, v [T, H, D]; segment s is rows cu_seqlens[s]:cu_seqlens[s+1].

    Each segment is attended independently (no attention across segments): its 64-blocks start at the
    segment start, and sink_start / sink_tokens are applied per segment, relative to the segment start
    (sink_start None = the last sink_tokens tokens of each segment), clipped to a segment shorter than it;
    it must fit in max_seqlen. Empty segments are allowed. max_seqlen (any integer: int, numpy.int64)
    must be >= the longest segment. Other options as in `sol_attn`. Stats count pairs over
    all segments (total_pairs = sum over segments of N_s**2 per head). Differentiable like `sol_attn`,
    segment by segment (empty segments get zero grads).
    """
    validate_qkv(q, k, v, 3, "[T, H, D]")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (
            torch.int32, torch.int64):
        raise TypeError("cu_seqlens must be a 1-D int32 or int64 tensor of segment boundaries")
    max_seqlen = validate_max_seqlen(max_seqlen)
    scale = validate_options(scale=scale, tau=tau, thresh_type=thresh_type, kv_splits=kv_splits,
                             sink_tokens=sink_tokens, sink_start=sink_start, impl=impl, head_dim=q.shape[-1])
    validate_sink(sink_tokens, sink_start, max_seqlen, "max_seqlen")
    out, pairs, total = _ops().sol_attn_varlen(
        q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens, max_seqlen, scale, float(tau), thresh_type,
        int(kv_splits), int(sink_tokens), None if sink_start is None else int(sink_start), impl, bool(return_stats))
    if not return_stats:
        return out
    return out, SolAttnStats(exact_pairs=pairs, total_pairs=total)
