"""PyTorch implementation of Sol-Attn: the reference and the CPU path.

Cost is block-sparse: per head it builds the proxy logits S = c*Q*kc^T ([T, N]) and then, for each
(head, query block) "item", gathers only that item's exact key blocks. Items are sorted by their
exact-block count and processed in chunks of similar count (padding slots masked to -inf), so work
falls with the exact fraction; items whose every block is exact skip the gather and, in fp32/fp64,
use the fused SDPA kernel directly (same math, no approximate part). The chunk loop works in
workspaces allocated once per call (gathers with index_select(out=), GEMMs with baddbmm into them).

Per row, exact keys (logits c*q.k) and approximate blocks (logits s_j = S[row, j]) share one
softmax: numerator sum_k p_k v_k + sum_j p_j vc_j, denominator sum_k p_k + sum_j p_j len_j. This is
exactly the rank-1 correction of sol_attn.md (vc_j stays the stored SUM, len_j multiplies the
denominator). In fp32/fp64 the approximate part of every row is one [BH, Tp, N] @ [BH, N, D] GEMM
taken with the row's max over approximate blocks, merged with the exact part by the usual
log-sum-exp rescaling; for bf16/fp16 it stays in the chunk loop, evaluated with the row's final max
(not a running one), and p is rounded to the input dtype before both P.V products; matmuls run on
fp32 upcasts (exact emulation of "half inputs, fp32 accumulation"), which is also the fast path on
CPUs without half matmul units.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .options import BLOCK
from .routing import LOG2E, acc_dtype, block_lengths, num_blocks, sink_block_range, summaries, thresholds

# Target number of gathered key blocks per chunk (chunk size = TARGET // exact count, capped).
_CHUNK_TARGET_BLOCKS = 64
_MAX_ITEMS_PER_CHUNK = 64
# Rows per dense chunk for all-exact items (bounds the [rows, T] score buffer of the half path).
_DENSE_ROWS = 512
# Heads per pass are limited so that the proxy-logit buffers ([heads, T, N]) stay below this many elements.
_MAX_ROUTE_ELEMS = 1 << 26


def route(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start, qh=None):
    """Routing for q, k, v [B, T, H, D]: returns (exact [B, H, N, N] bool, S [B, H, Tp, N], kc, vc).

    S holds the per-row proxy logits c*q.kc_j (log2 domain, acc dtype; rows >= T are zero rows).
    qh, if given, is q already as [B*H, Tp, D] in acc dtype, zero padded (saves a copy).
    The route score r[i, j] is the mean of S over the valid rows of query block i."""
    b, t, h, d = q.shape
    n = num_blocks(t)
    acc = acc_dtype(q.dtype)
    c = scale * LOG2E
    kc, vc, qbar = summaries(q, k, v)
    if qh is not None:
        qa = qh.view(b, h, n * BLOCK, d)
    else:
        qa = q.permute(0, 2, 1, 3).to(acc)
        if n * BLOCK != t:
            qa = F.pad(qa, (0, 0, 0, n * BLOCK - t))
    s = torch.matmul(qa, kc.to(acc).transpose(-1, -2)).mul_(c)  # [B, H, Tp, N]
    lens = block_lengths(t, q.device).to(acc)
    r = s.view(b, h, n, BLOCK, n).sum(3) / lens[:, None]
    thr = thresholds(qbar, kc, c, tau, thresh_type)
    exact = r > thr[..., None]
    ar = torch.arange(n, device=q.device)
    exact |= ((ar[:, None] - ar[None, :]).abs() <= 1)
    lo, hi = sink_block_range(t, sink_tokens, sink_start)
    if hi >= lo:
        exact[..., lo : hi + 1] = True
    return exact, s, kc, vc


def sol_attn_torch(q, k, v, scale: float, tau: float, thresh_type: str, sink_tokens: int, sink_start):
    """Sol-Attn forward for q, k, v [B, T, H, D]. Returns (out [B, T, H, D] in the input dtype, exact
    pair counts per head [H] int64).

    Batch items run one at a time (so no item's chunking or padding can depend on another: outputs are
    bitwise independent of the other items), and heads in chunks that bound the [heads, T, N] buffers."""
    b, t, h, d = q.shape
    per = max(1, _MAX_ROUTE_ELEMS // (num_blocks(t) * BLOCK * num_blocks(t)))
    if b == 1 and h <= per:
        return _sol_attn_torch(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start)
    out = torch.empty_like(q)
    pairs = torch.zeros(h, dtype=torch.int64, device=q.device)
    for bi in range(b):
        for h0 in range(0, h, per):
            sl = (slice(bi, bi + 1), slice(None), slice(h0, h0 + per))
            o, p = _sol_attn_torch(q[sl], k[sl], v[sl], scale, tau, thresh_type, sink_tokens, sink_start)
            out[sl] = o
            pairs[h0 : h0 + per] += p
    return out, pairs


def _sol_attn_torch(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
    b, t, h, d = q.shape
    dt = q.dtype
    acc = acc_dtype(dt)
    half = acc != dt and dt != torch.float32
    n = num_blocks(t)
    tp = n * BLOCK
    bh = b * h
    c = scale * LOG2E
    dev = q.device

    def heads(x):  # [B, T, H, D] -> [BH, Tp, D] in acc dtype, zero padded
        x = x.permute(0, 2, 1, 3).to(acc).reshape(bh, t, d)
        return F.pad(x, (0, 0, 0, tp - t)) if tp != t else x.contiguous()

    qh, kh, vh = heads(q), heads(k), heads(v)
    exact, s, kc, vc = route(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start, qh=qh)
    counts = exact.sum(-1)  # [B, H, N]
    exact_pairs = counts.sum((0, 2))
    out = torch.empty(bh * n, BLOCK, d, dtype=acc, device=dev)
    rnd = (lambda x: x.to(dt).to(acc)) if half else (lambda x: x)
    lens = block_lengths(t, dev).to(acc)
    last_len = t - (n - 1) * BLOCK
    tok_pad_last = torch.arange(BLOCK, device=dev) >= last_len  # invalid key tokens of block N-1

    cnt = counts.reshape(bh * n)
    order = torch.argsort(cnt, descending=True, stable=True)
    cnt_sorted = cnt[order].tolist()
    n_items = bh * n
    n_full = sum(1 for x in cnt_sorted if x == n)

    # 0) fp32/fp64: the rank-1 terms of every row at once, as [BH, Tp, N] @ [BH, N, D] with the row's max over
    # approximate blocks (ma); the chunk loop rescales them by exp2(ma - m) once the exact logits are known.
    # Half inputs round p to the input dtype relative to the row's final max, so they stay in the loop.
    approx = None
    if n_full < n_items and not half:
        sm = s.view(bh * n, BLOCK, n).masked_fill_(exact.view(bh * n, 1, n), float("-inf"))
        ma = sm.amax(-1, keepdim=True)  # -inf (then NaN rows) only for all-exact items, which skip this
        pa = sm.sub_(ma).exp2_()
        torch.bmm(pa.view(bh, tp, n), vc.to(acc).reshape(bh, n, d), out=out.view(bh, tp, d))
        approx = torch.cat((ma.view(bh * n, BLOCK), (pa @ lens[:, None]).view(bh * n, BLOCK)), 1)  # ma | den

    # 1) items whose key blocks are all exact: plain attention over the T valid keys, no gather.
    if n_full:
        full = order[:n_full]
        for head in torch.unique(full // n).tolist():
            blocks = full[full // n == head]
            rows = qh.view(bh * n, BLOCK, d)[blocks].reshape(-1, d)
            kk, vv = kh[head, :t], vh[head, :t]
            if not half:
                o = F.scaled_dot_product_attention(
                    rows[None, None], kk[None, None], vv[None, None], scale=scale
                )[0, 0]
            else:
                o = torch.empty_like(rows)
                for r0 in range(0, rows.shape[0], _DENSE_ROWS):
                    sc = (rows[r0 : r0 + _DENSE_ROWS] @ kk.T).mul_(c)
                    p = torch.exp2(sc - sc.amax(-1, keepdim=True))
                    o[r0 : r0 + _DENSE_ROWS] = (rnd(p) @ vv) / p.sum(-1, keepdim=True)
            out[blocks] = o.view(-1, BLOCK, d)

    # 2) the other items: gathered exact blocks + rank-1 corrections, chunked by exact count.
    if n_full < n_items:
        _sparse_items(order[n_full:], cnt_sorted[n_full:], exact.reshape(bh * n, n), s.reshape(bh * n, BLOCK * n),
                      qh.view(bh * n, BLOCK * d), kh.view(bh * n, BLOCK * d), vh.view(bh * n, BLOCK * d),
                      vc.to(acc).reshape(bh, n * d), out.view(bh * n, BLOCK * d), n, c, rnd, lens,
                      tok_pad_last if last_len != BLOCK else None, approx)

    o = out.view(b, h, tp, d)[:, :, :t].permute(0, 2, 1, 3).to(dt)
    return o.contiguous(), exact_pairs


def _sparse_items(items, cnts, exact, sflat, qflat, kflat, vflat, vc, outflat, n, c, rnd, lens, tok_pad_last,
                  approx):
    """Items (flat head*N + query block ids, sorted by exact count `cnts`, descending) that have some
    approximate blocks. Per chunk of similar count: gather the exact key/value blocks (padding slots take
    non-exact blocks and are masked), one softmax per row over the real keys plus one entry per
    approximate block. Every per-chunk tensor lives in a workspace allocated once per call: fresh
    multi-MB allocations page-fault on every chunk (the gathers ran ~3x slower)."""
    d = qflat.shape[1] // BLOCK
    acc, dev = qflat.dtype, qflat.device
    plan = []  # (start, items, key blocks)
    pos, n_items = 0, len(cnts)
    while pos < n_items:
        e = cnts[pos]
        p = max(1, min(_MAX_ITEMS_PER_CHUNK, _CHUNK_TARGET_BLOCKS // e, n_items - pos))
        plan.append((pos, p, e))
        pos += p
    max_pe = max(p * e for _, p, e in plan)
    max_p = max(p for _, p, _ in plan)
    kbuf = torch.empty(max_pe * BLOCK * d, dtype=acc, device=dev)
    vbuf = torch.empty_like(kbuf)
    sebuf = torch.empty(max_pe * BLOCK * BLOCK, dtype=acc, device=dev)
    qbuf = torch.empty(max_p * BLOCK * d, dtype=acc, device=dev)
    nbuf = torch.empty_like(qbuf)
    sabuf = torch.empty(max_p * BLOCK * n, dtype=acc, device=dev) if approx is None else None
    ex = exact[items]  # [I, N]
    block_idx = torch.argsort((~ex).to(torch.int8), dim=-1, stable=True)  # exact blocks first, ascending
    head = items // n
    rows_all = head[:, None] * n + block_idx  # flat key-block ids, exact ones first
    has_last = ex[:, n - 1].tolist() if tok_pad_last is not None else None
    for pos, p, e in plan:
        sl = slice(pos, pos + p)
        it = items[sl]
        rows = rows_all[sl, :e].reshape(-1)  # slots past an item's count hold non-exact blocks (masked)
        kg = torch.index_select(kflat, 0, rows, out=kbuf[: p * e * BLOCK * d].view(p * e, BLOCK * d))
        vg = torch.index_select(vflat, 0, rows, out=vbuf[: p * e * BLOCK * d].view(p * e, BLOCK * d))
        qg = torch.index_select(qflat, 0, it, out=qbuf[: p * BLOCK * d].view(p, BLOCK * d)).view(p, BLOCK, d)
        se = sebuf[: p * e * BLOCK * BLOCK].view(p, BLOCK, e * BLOCK)
        kT = kg.view(p, e * BLOCK, d).transpose(1, 2)
        pad = cnts[pos + p - 1] != e  # counts are sorted: the last item has the fewest exact blocks
        tail = has_last is not None and any(has_last[sl])
        if pad or tail:  # -inf bias for padding slots and keys past T, added inside the GEMM (beta=1)
            bias = torch.zeros((p, e, BLOCK), dtype=acc, device=dev)
            if pad:
                slot = torch.arange(e, device=dev) >= torch.tensor(cnts[sl], device=dev)[:, None]
                bias.masked_fill_(slot[:, :, None], float("-inf"))
            if tail:
                bias.masked_fill_((rows_all[sl, :e] == head[sl, None] * n + n - 1)[:, :, None] & tok_pad_last,
                                  float("-inf"))
            torch.baddbmm(bias.view(p, 1, e * BLOCK), qg, kT, alpha=c, out=se)
        else:
            se.baddbmm_(qg, kT, beta=0, alpha=c)
        nb = nbuf[: p * BLOCK * d].view(p, BLOCK, d)
        if approx is not None:  # rank-1 terms precomputed in outflat with the row max ma over approximate blocks
            md = torch.index_select(approx, 0, it).view(p, 2, BLOCK, 1)
            ma, da = md[:, 0], md[:, 1]
            m = torch.maximum(se.amax(-1, keepdim=True), ma)
            pe = se.sub_(m).exp2_()
            w = ma.sub_(m).exp2_()
            den = pe.sum(-1, keepdim=True).addcmul_(w, da)
            num = torch.index_select(outflat, 0, it, out=nb.view(p, BLOCK * d)).view(p, BLOCK, d).mul_(w)
            num.baddbmm_(pe, vg.view(p, e * BLOCK, d)).div_(den)
        else:
            sa = torch.index_select(sflat, 0, it, out=sabuf[: p * BLOCK * n].view(p, BLOCK * n)).view(p, BLOCK, n)
            sa.masked_fill_(ex[sl, None, :], float("-inf"))  # exact blocks are computed exactly instead
            m = torch.maximum(se.amax(-1, keepdim=True), sa.amax(-1, keepdim=True))
            pe = se.sub_(m).exp2_()
            pa = sa.sub_(m).exp2_()
            den = pe.sum(-1, keepdim=True).add_(pa @ lens[:, None])
            num = torch.bmm(rnd(pe), vg.view(p, e * BLOCK, d), out=nb)
            num.baddbmm_(rnd(pa), torch.index_select(vc, 0, head[sl]).view(p, n, d)).div_(den)
        outflat.index_copy_(0, it, num.view(p, BLOCK * d))
