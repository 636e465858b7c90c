"""Backward of Sol-Attn: gradients of the function the forward computes, with the routing held fixed.

Why this works: the routing (which key blocks of each (head, query block) are exact) is a
piecewise-constant decision, so its derivative is zero almost everywhere. With it fixed, Sol-Attn is
plain softmax attention over an augmented key set [K ; kc] with values [V ; vc/len] and an additive
logit bias ln(len_j) on the centroid keys, under a per-(head, query block) mask: exact block -> its
real keys visible, its centroid hidden; approximate block -> real keys hidden, centroid visible
(len_j * exp(s_j) in the denominator, exp(s_j) * vc_j in the numerator, as in torch_impl.py).
The backward recomputes the routing with torch_impl.route() (same slices as the PyTorch forward, so the
same decisions), rebuilds that attention in fp32 (fp64 for fp64 inputs) and applies its vector-Jacobian
product, in chunks of (batch item, head group, query rows) so the score matrix of one chunk stays near
_CHUNK_SCORE_BYTES; k/v grads accumulate across query chunks. The vjp is written out (the standard
softmax-attention backward plus the linear centroid map) instead of taken with autograd: a custom-op
implementation runs under _AutoDispatchBelowAutograd, where autograd records nothing even under
torch.enable_grad(), and torch.func.vjp there breaks under any TorchDispatchMode (FlopCounterMode,
AOTAutograd's runtime wrappers). Tests check it against autograd on `augmented_attention` and gradcheck.

Rounding: kc and vc take the forward's values (stored in the input dtype) and are differentiated as
the exact block mean / sum (straight-through); half-precision forwards also round probabilities
before P.V, which the backward treats as the identity. Grads come back in the input dtype.
For impl="triton" (and "upstream") the routing is recomputed here with torch route(): a block whose
route score ties its threshold to within rounding may be routed differently from the kernel's own
decision, and its gradient is then that of the other routing. No double backward.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from accelpatch.sol_attn.op.options import BLOCK
from accelpatch.sol_attn.op.routing import acc_dtype, block_lengths, num_blocks

# Target size of one chunk's score matrix [heads, rows, T + N] (the vjp holds two of these at once).
# Query rows go in whole 64-blocks, so a chunk is at least [1, 64, T + N] whatever the budget.
_CHUNK_SCORE_BYTES = 16 << 20


def route_for_backward(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
    """Routing of q, k, v [1, T, Hr, D] exactly as the PyTorch forward computes it on the same slice
    (the forward passes its padded acc-dtype copy of q as qh): returns (exact [Hr, N, N], kc, vc [Hr, N, D])."""
    from accelpatch.sol_attn.op.torch_impl import route  # noqa: PLC0415

    _, t, h, d = q.shape
    tp = num_blocks(t) * BLOCK
    qh = q.permute(0, 2, 1, 3).to(acc_dtype(q.dtype)).reshape(h, t, d)
    qh = F.pad(qh, (0, 0, 0, tp - t)) if tp != t else qh.contiguous()
    exact, _, kc, vc = route(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start, qh=qh)
    return exact[0], kc[0], vc[0]


def augment(k, v, kc, vc, lens):
    """Augmented keys [K ; kc] and values [V ; vc/len], [G, T + N, D], from k, v [G, T, D] (acc dtype)
    and the forward's stored summaries kc, vc [G, N, D] (their values, rounding included)."""
    return torch.cat((k, kc.to(k.dtype)), 1), torch.cat((v, vc.to(v.dtype) / lens[:, None]), 1)


def augment_vjp(dka, dva, t, lens):
    """Chain rule through `augment`: (dK, dV) [G, T, D] from (d k_aug, d v_aug) [G, T + N, D].
    kc_j is differentiated as the exact block mean of K and vc_j / len_j as the block mean of V, so
    token t of block j gets 1/len_j of the centroid's grad (straight-through over the rounding)."""
    tok_block = torch.arange(t, device=dka.device) // BLOCK
    dk = dka[:, :t] + (dka[:, t:] / lens[:, None])[:, tok_block]
    dv = dva[:, :t] + (dva[:, t:] / lens[:, None])[:, tok_block]
    return dk, dv


def routing_bias(exact_rows, t, lens):
    """Additive logit bias [G, NB, T + N] for query blocks whose routing rows are exact_rows [G, NB, N]:
    0 on visible real keys, ln(len_j) on visible centroids, -inf on hidden keys."""
    tok_block = torch.arange(t, device=exact_rows.device) // BLOCK
    zero = torch.zeros((), dtype=lens.dtype, device=lens.device)
    ninf = torch.full((), float("-inf"), dtype=lens.dtype, device=lens.device)
    real = torch.where(exact_rows[..., tok_block], zero, ninf)
    cent = torch.where(exact_rows, ninf, lens.log())
    return torch.cat((real, cent), -1)


def augmented_attention(q, k_aug, v_aug, bias, scale):
    """Softmax attention of q [G, R, D] (R a multiple of 64) over k_aug, v_aug [G, T + N, D] with the
    per-query-block bias [G, R/64, T + N]. Returns [G, R, D]."""
    return torch.matmul(_probs(q, k_aug, bias, scale), v_aug)


def _probs(q, k_aug, bias, scale):
    g, r, _ = q.shape
    s = torch.matmul(q, k_aug.transpose(-1, -2)).mul_(scale)
    s = s.view(g, r // BLOCK, BLOCK, -1).add_(bias[:, :, None, :])
    return torch.softmax(s, -1).view(g, r, -1)


def augmented_attention_vjp(q, k_aug, v_aug, bias, scale, grad_out):
    """(dq, dk_aug, dv_aug) of `augmented_attention` for the cotangent grad_out [G, R, D]: P is
    recomputed, then dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q."""
    p = _probs(q, k_aug, bias, scale)
    dv = torch.matmul(p.transpose(-1, -2), grad_out)
    delta = (grad_out * torch.matmul(p, v_aug)).sum(-1, keepdim=True)
    ds = torch.matmul(grad_out, v_aug.transpose(-1, -2)).sub_(delta).mul_(p)
    del p
    dq = torch.matmul(ds, k_aug).mul_(scale)
    dk = torch.matmul(ds.transpose(-1, -2), q).mul_(scale)
    return dq, dk, dv


def _route_passes(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
    """Yield (slice, exact, kc, vc) over the slices the PyTorch forward routes separately: one batch
    item at a time, heads in passes of torch_impl._MAX_ROUTE_ELEMS (same inputs, same decisions)."""
    from accelpatch.sol_attn.op import torch_impl  # noqa: PLC0415

    b, t, h, _ = q.shape
    n = num_blocks(t)
    per = max(1, torch_impl._MAX_ROUTE_ELEMS // (n * BLOCK * n))
    for bi in range(b):
        for h0 in range(0, h, per):
            sl = (slice(bi, bi + 1), slice(None), slice(h0, h0 + per))
            yield (sl, *route_for_backward(q[sl], k[sl], v[sl], scale, tau, thresh_type, sink_tokens, sink_start))


def sol_attn_augmented(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
    """The forward through the augmented-key formulation, unchunked (for tests and checks):
    q, k, v [B, T, H, D] -> output [B, T, H, D] in the accumulation dtype."""
    t = q.shape[1]
    acc = acc_dtype(q.dtype)
    lens = block_lengths(t, q.device).to(acc)
    tp = lens.shape[0] * BLOCK
    out = torch.empty(q.shape, dtype=acc, device=q.device)
    for sl, exact, kc, vc in _route_passes(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
        qh, kh, vh = (_heads(x[sl][0], acc) for x in (q, k, v))
        ka, va = augment(kh, vh, kc, vc, lens)
        o = augmented_attention(F.pad(qh, (0, 0, 0, tp - t)), ka, va, routing_bias(exact, t, lens), scale)
        out[sl] = o[:, :t].permute(1, 0, 2)[None]
    return out


def _heads(x, acc):
    """[T, H, D] -> [H, T, D] in acc dtype."""
    return x.permute(1, 0, 2).to(acc)


def _chunking(t, n, h, itemsize):
    """(heads per group, query rows per chunk) for a score budget of _CHUNK_SCORE_BYTES."""
    tp = n * BLOCK
    rows = max(1, _CHUNK_SCORE_BYTES // (itemsize * (t + n)))
    if rows >= tp:
        return max(1, min(h, rows // tp)), tp
    return 1, max(BLOCK, rows // BLOCK * BLOCK)


def _item_grads(go, q, k, v, exact, kc, vc, scale):
    """Grads for one batch item and route head group: go, q, k, v [T, Hr, D]; exact [Hr, N, N];
    kc, vc [Hr, N, D]. Returns dq, dk, dv [Hr, T, D] in the accumulation dtype."""
    t, hr, d = q.shape
    acc = acc_dtype(q.dtype)
    lens = block_lengths(t, q.device).to(acc)
    n = lens.shape[0]
    tp = n * BLOCK
    qh = F.pad(_heads(q, acc), (0, 0, 0, tp - t))
    gh = F.pad(_heads(go, acc), (0, 0, 0, tp - t))
    kh, vh = _heads(k, acc), _heads(v, acc)
    dq = torch.empty(hr, tp, d, dtype=acc, device=q.device)
    dk = torch.empty(hr, t, d, dtype=acc, device=q.device)
    dv = torch.empty_like(dk)
    hg, rows = _chunking(t, n, hr, torch.finfo(acc).bits // 8)
    for h0 in range(0, hr, hg):
        hs = slice(h0, h0 + hg)
        ka, va = augment(kh[hs], vh[hs], kc[hs], vc[hs], lens)
        dka = torch.zeros_like(ka)
        dva = torch.zeros_like(va)
        for r0 in range(0, tp, rows):
            r1 = min(tp, r0 + rows)
            bias = routing_bias(exact[hs, r0 // BLOCK : r1 // BLOCK], t, lens)
            gq, gka, gva = augmented_attention_vjp(qh[hs, r0:r1], ka, va, bias, scale, gh[hs, r0:r1])
            dq[hs, r0:r1] = gq
            dka += gka
            dva += gva
        dk[hs], dv[hs] = augment_vjp(dka, dva, t, lens)
    return dq[:, :t], dk, dv


def sol_attn_backward(grad_out, q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
    """(dq, dk, dv) of sol_attn for q, k, v, grad_out [B, T, H, D]; grads in the input dtype, laid out
    like q, k, v. Routed per batch item and head pass exactly as sol_attn_torch routes them."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for sl, exact, kc, vc in _route_passes(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
        gq, gk, gv = _item_grads(grad_out[sl][0], q[sl][0], k[sl][0], v[sl][0], exact, kc, vc, scale)
        for dst, src in ((dq, gq), (dk, gk), (dv, gv)):
            dst[sl] = src.permute(1, 0, 2)[None]
    return dq, dk, dv


def sol_attn_varlen_backward(grad_out, q, k, v, cu_seqlens, scale, tau, thresh_type, sink_tokens, sink_start):
    """(dq, dk, dv) of sol_attn_varlen for packed q, k, v, grad_out [T, H, D]: each segment is
    differentiated on its own (as dispatch.run_varlen attends it: blocks and sink counted from the
    segment start); empty segments own no rows and are skipped."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    cu = [int(x) for x in cu_seqlens.tolist()]
    for a, e in zip(cu, cu[1:]):
        if e == a:
            continue
        gq, gk, gv = sol_attn_backward(grad_out[None, a:e], q[None, a:e], k[None, a:e], v[None, a:e], scale, tau,
                                       thresh_type, sink_tokens, sink_start)
        dq[a:e], dk[a:e], dv[a:e] = gq[0], gk[0], gv[0]
    return dq, dk, dv
