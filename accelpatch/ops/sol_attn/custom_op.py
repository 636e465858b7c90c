"""torch.library custom ops `accelpatch::sol_attn` and `accelpatch::sol_attn_varlen`.

Registering the forward as an opaque custom op with a fake (meta) implementation lets torch.compile
trace through a call site without a graph break (the kernels, Python loops and host syncs inside
stay out of the graph). Forward only: no autograd formula is registered.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import dispatch


@torch.library.custom_op("accelpatch::sol_attn", mutates_args=())
def sol_attn_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, tau: float, thresh_type: str, kv_splits: int,
    sink_tokens: int, sink_start: Optional[int], impl: str, want_stats: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return dispatch.run_dense_batch(q, k, v, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start, impl,
                                    want_stats)


@sol_attn_op.register_fake
def _sol_attn_fake(q, k, v, scale, tau, thresh_type, kv_splits, sink_tokens, sink_start, impl, want_stats):
    return torch.empty_like(q), q.new_empty((q.shape[2],), dtype=torch.int64)


@torch.library.custom_op("accelpatch::sol_attn_varlen", mutates_args=())
def sol_attn_varlen_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, scale: float,
    tau: float, thresh_type: str, kv_splits: int, sink_tokens: int, sink_start: Optional[int], impl: str,
    want_stats: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dispatch.run_varlen(q, k, v, cu_seqlens, max_seqlen, scale, tau, thresh_type, kv_splits, sink_tokens,
                               sink_start, impl, want_stats)


@sol_attn_varlen_op.register_fake
def _sol_attn_varlen_fake(q, k, v, cu_seqlens, max_seqlen, scale, tau, thresh_type, kv_splits, sink_tokens,
                          sink_start, impl, want_stats):
    return (torch.empty_like(q), q.new_empty((q.shape[1],), dtype=torch.int64),
            torch.empty((), dtype=torch.int64))
