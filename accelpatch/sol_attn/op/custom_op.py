"""torch.library custom ops `accelpatch::sol_attn` and `accelpatch::sol_attn_varlen`, and their backward.

Registering the forward as an opaque custom op with a fake (meta) implementation lets torch.compile
trace through a call site without a graph break (the kernels, Python loops and host syncs inside
stay out of the graph). Both forward ops have an autograd formula (torch.library.register_autograd)
whose backward is itself an opaque custom op, `accelpatch::sol_attn_backward` /
`accelpatch::sol_attn_varlen_backward` (math in backward.py: gradients with the routing held fixed),
so AOTAutograd can trace a training graph through them too. The forward saves q, k, v and the scalar
options; the `pairs` / stats outputs are integer and non-differentiable. No double backward.
"""
from __future__ import annotations

from typing import Optional

import torch

from accelpatch.sol_attn.op import dispatch


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


@torch.library.custom_op("accelpatch::sol_attn_backward", mutates_args=())
def sol_attn_backward_op(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, tau: float,
    thresh_type: str, sink_tokens: int, sink_start: Optional[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from accelpatch.sol_attn.op.backward import sol_attn_backward  # noqa: PLC0415

    return sol_attn_backward(grad_out, q, k, v, scale, tau, thresh_type, sink_tokens, sink_start)


@sol_attn_backward_op.register_fake
def _sol_attn_backward_fake(grad_out, q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op("accelpatch::sol_attn_varlen_backward", mutates_args=())
def sol_attn_varlen_backward_op(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
    scale: float, tau: float, thresh_type: str, sink_tokens: int, sink_start: Optional[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from accelpatch.sol_attn.op.backward import sol_attn_varlen_backward  # noqa: PLC0415

    return sol_attn_varlen_backward(grad_out, q, k, v, cu_seqlens, scale, tau, thresh_type, sink_tokens,
                                    sink_start)


@sol_attn_varlen_backward_op.register_fake
def _sol_attn_varlen_backward_fake(grad_out, q, k, v, cu_seqlens, scale, tau, thresh_type, sink_tokens,
                                   sink_start):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, scale, tau, thresh_type, _kv_splits, sink_tokens, sink_start = inputs[:9]
    ctx.save_for_backward(q, k, v)
    ctx.options = (scale, tau, thresh_type, sink_tokens, sink_start)


def _backward(ctx, grad_out, _grad_pairs):
    q, k, v = ctx.saved_tensors
    dq, dk, dv = sol_attn_backward_op(grad_out, q, k, v, *ctx.options)
    return (dq, dk, dv) + (None,) * 8


def _setup_context_varlen(ctx, inputs, output):
    q, k, v, cu_seqlens, _max_seqlen, scale, tau, thresh_type, _kv_splits, sink_tokens, sink_start = inputs[:11]
    ctx.save_for_backward(q, k, v, cu_seqlens)
    ctx.options = (scale, tau, thresh_type, sink_tokens, sink_start)


def _backward_varlen(ctx, grad_out, _grad_pairs, _grad_total):
    q, k, v, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = sol_attn_varlen_backward_op(grad_out, q, k, v, cu_seqlens, *ctx.options)
    return (dq, dk, dv) + (None,) * 10


torch.library.register_autograd("accelpatch::sol_attn", _backward, setup_context=_setup_context)
torch.library.register_autograd("accelpatch::sol_attn_varlen", _backward_varlen, setup_context=_setup_context_varlen)
