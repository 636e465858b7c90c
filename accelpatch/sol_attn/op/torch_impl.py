"""PyTorch implementation of Sol-Attn: the reference and the CPU path.

Cost is block-sparse: per head it builds the proxy logits S = c*Q*kc^T ([T, N]) and then, for each
(head, query block) "item", gathers only that item's exact key blocks. Items whose every block is exact
skip the gather and, in fp32/fp64, use the fused SDPA kernel directly (same math, no approximate part).

Per row, exact keys (logits c*q.k) and approximate blocks (logits s_j = S[row, j]) share one softmax:
numerator sum_k p_k v_k + sum_j p_j vc_j, denominator sum_k p_k + sum_j p_j len_j. This is exactly the
rank-1 correction of sol_attn.md (vc_j is the stored SUM, len_j multiplies the denominator).

fp32/fp64 (`_sol_attn_full_precision`): the approximate blocks of an item are N extra "keys" of its
softmax, with logit s_j + log2(len_j) and value vc_j / len_j (the same terms: p_j len_j in the
denominator, p_j len_j * vc_j / len_j = p_j vc_j in the numerator; exact blocks masked). Per item the
logits are kept transposed, S^T = [exact keys; N proxy keys] x 64 query rows, so a range of key blocks is
a contiguous row range: one amax / exp2 / sum over all of them, no running max, no merge step. Items are
taken head by head, sorted by exact count: many exact blocks -> one item at a time, its K (then V)
blocks gathered into one workspace (in pieces when larger than _PIECE_BYTES), q read and out written in
place through views built once per head and count; few -> p items of similar count batched (padding slots
masked). Workspaces are allocated once per call.

bf16/fp16 (`_sol_attn_half`): p is rounded to the input dtype before both P.V products, relative to
the row's final max; items are chunked by exact count, the approximate part [rows, N] @ vc per chunk.
Matmuls run on fp32 upcasts (exact emulation of "half inputs, fp32 accumulation"), which is also the
fast path on CPUs without half matmul units.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from accelpatch.sol_attn.op.options import BLOCK
from accelpatch.sol_attn.op.routing import LOG2E, acc_dtype, block_lengths, num_blocks, sink_block_range, summaries, thresholds

# bf16/fp16: target number of gathered key blocks per chunk (chunk size = TARGET // exact count, capped).
_CHUNK_TARGET_BLOCKS = 64
_MAX_ITEMS_PER_CHUNK = 64
# fp32/fp64: bytes of K (or V) blocks gathered per piece of a one-item chunk (bounds the workspace; larger
# pieces mean fewer, larger GEMMs) and of all items of a batched chunk (items with fewer exact blocks than
# that run batched). Tuned on a 2-core AVX-512 CPU, T = 8192/16384, D = 128/256, one thread: flat within
# ~2% for pieces of 1-16 MiB and batches of 0.5-2 MiB.
_PIECE_BYTES = 1 << 22
_BATCH_BYTES = 1 << 20
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
    one = _sol_attn_full_precision if q.dtype in (torch.float32, torch.float64) else _sol_attn_half
    if b == 1 and h <= per:
        return one(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start)
    out = torch.empty_like(q)
    pairs = torch.zeros(h, dtype=torch.int64, device=q.device)
    for bi in range(b):
        for h0 in range(0, h, per):
            sl = (slice(bi, bi + 1), slice(None), slice(h0, h0 + per))
            o, p = one(q[sl], k[sl], v[sl], scale, tau, thresh_type, sink_tokens, sink_start)
            out[sl] = o
            pairs[h0 : h0 + per] += p
    return out, pairs


def _heads(x, acc, tp):
    """[1, T, H, D] -> [H, Tp, D] in acc dtype, contiguous, zero padded to Tp rows."""
    _, t, h, d = x.shape
    x = x[0].transpose(0, 1).to(acc)
    return F.pad(x, (0, 0, 0, tp - t)) if tp != t else x.contiguous()


def _exact_block_order(items, exact, n):
    """For items (flat head*N + query block ids): their exact mask [I, N] and the flat key-block ids [I, N]
    of each item's blocks, exact ones first in ascending order, then the others."""
    ex = exact[items]
    block_idx = torch.argsort((~ex).to(torch.int8), dim=-1, stable=True)
    return ex, (items // n)[:, None] * n + block_idx


def _sol_attn_full_precision(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
    """fp32/fp64, one batch item q, k, v [1, T, H, D] -> (out [1, T, H, D], exact pairs per head [H]).

    q is read and out written in the caller's [T, H, D] layout (strided views per head and block); K and V
    are copied once into block-major [H*N, 64*D] so that a gather of key blocks copies contiguous rows."""
    _, t, h, d = q.shape
    acc = q.dtype
    n = num_blocks(t)
    tp = n * BLOCK
    c = scale * LOG2E
    dev = q.device

    exact, s, kc, vc = route(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start)
    counts = exact.sum(-1)  # [1, H, N]
    exact_pairs = counts.sum((0, 2))
    kh, vh = _heads(k, acc, tp), _heads(v, acc, tp)
    qb = (q[0] if tp == t else F.pad(q[0], (0, 0, 0, 0, 0, tp - t))).view(n, BLOCK, h, d)
    out = torch.empty(1, tp, h, d, dtype=acc, device=dev)
    ob = out[0].view(n, BLOCK, h, d)
    lens = block_lengths(t, dev).to(acc)
    last_len = t - (n - 1) * BLOCK

    # head by head, exact count descending (so a batched chunk never mixes heads and pads little)
    cnt = counts.reshape(h * n)
    order = torch.argsort((n - cnt) + (torch.arange(h * n, device=dev) // n) * (n + 1), stable=True)
    cnt_sorted = cnt[order].tolist()
    full = [i for i, x in enumerate(cnt_sorted) if x == n]
    if full:  # items whose key blocks are all exact: plain attention over the T valid keys, no gather
        full = order[full]
        for head in torch.unique(full // n).tolist():
            blocks = full[full // n == head] - head * n
            o = F.scaled_dot_product_attention(qb[blocks, :, head].reshape(1, 1, -1, d), kh[None, None, head, :t],
                                               vh[None, None, head, :t], scale=scale)
            ob[blocks, :, head] = o.view(-1, BLOCK, d)
    if len(full) < h * n:
        sparse = [i for i, x in enumerate(cnt_sorted) if x != n]
        _sparse_items_full_precision(
            order[sparse], [cnt_sorted[i] for i in sparse], exact.reshape(h * n, n), s.view(h * n, BLOCK, n),
            torch.log2(lens), qb, kh.view(h * n, BLOCK * d), vh.view(h * n, BLOCK * d),
            (vc[0].to(acc) / lens[:, None]).contiguous(), ob, n, c, last_len if last_len != BLOCK else None)
    return (out if tp == t else out[:, :t].clone()), exact_pairs


def _sparse_items_full_precision(items, cnts, exact, s, lbias, qb, kflat, vflat, vmean, ob, n, c, last_len):
    """fp32/fp64 items (flat head*N + query block ids) with some approximate blocks, grouped by head and
    sorted by exact count `cnts` (descending) within a head. s: proxy logits [H*N, 64, N]; lbias: log2(len_j)
    [N]; qb, ob: q and out as [N, 64, H, D]; kflat, vflat: block-major K, V [H*N, 64*D]; vmean: vc_j / len_j
    [H, N, D]; last_len: valid tokens of block N-1 when it is short, else None.

    Per item the transposed logits S^T [e*64 + N, 64] hold c*K_exact.q (exact keys) then s_j + log2(len_j)
    (proxy keys, -inf for exact blocks); p = exp2(S^T - max) over both; out = (P_exact^T V_exact +
    P_proxy^T vmean) / sum(p). One item at a time when it has many exact blocks (its K, then V, blocks gathered
    in pieces of _PIECE_BYTES into one workspace); p items of similar count at once otherwise."""
    d = kflat.shape[1] // BLOCK
    acc, dev = kflat.dtype, kflat.device
    esz = kflat.element_size()
    piece = max(1, _PIECE_BYTES // (BLOCK * d * esz))  # key blocks per gathered piece of a one-item chunk
    batch_blocks = max(1, _BATCH_BYTES // (BLOCK * d * esz))  # key blocks of a batched chunk
    heads_l = (items // n).tolist()
    plan = []  # (start, items, exact count e)
    pos, n_items = 0, len(cnts)
    while pos < n_items:
        e = cnts[pos]
        p = max(1, min(_MAX_ITEMS_PER_CHUNK, batch_blocks // e, n_items - pos))
        while heads_l[pos + p - 1] != heads_l[pos]:
            p -= 1
        plan.append((pos, p, e))
        pos += p
    kbuf = torch.empty(max(min(e, piece) if p == 1 else p * e for _, p, e in plan) * BLOCK * d, dtype=acc,
                       device=dev)
    sebuf = torch.empty(max(p * (e * BLOCK + n) for _, p, e in plan) * BLOCK, dtype=acc, device=dev)
    max_p = max(p for _, p, _ in plan)
    qbuf = torch.empty(max_p * BLOCK * d, dtype=acc, device=dev)
    nbuf = torch.empty_like(qbuf)
    ex, rows_all = _exact_block_order(items, exact, n)
    items_l = items.tolist()
    has_last = ex[:, n - 1].tolist() if last_len is not None else None
    lb = lbias[:, None]
    sflat = s.view(-1, BLOCK * n)
    # one-item chunks: views built once (per head, per exact count), so the per-item work is ~a dozen kernels
    sT, exn = s.transpose(1, 2), ex[:, :, None]
    num1 = nbuf[: BLOCK * d].view(BLOCK, d)
    den1 = torch.empty(BLOCK, 1, dtype=acc, device=dev)
    per_head, per_count = {}, {}
    for pos, p, e in plan:
        hd = heads_l[pos]
        le = e * BLOCK
        if p == 1:
            if hd not in per_head:
                per_head[hd] = (qb[:, :, hd], ob[:, :, hd], vmean[hd])
            qbh, obh, vmh = per_head[hd]
            if e not in per_count:
                w = -(-e // -(-e // piece))  # blocks per piece, balanced
                st = sebuf[: (le + n) * BLOCK].view(le + n, BLOCK)  # S^T: [exact keys + proxy keys, query rows]
                pieces = [(a, min(e, a + w), st[a * BLOCK : min(e, a + w) * BLOCK],
                           kbuf[: (min(e, a + w) - a) * BLOCK * d].view(min(e, a + w) - a, BLOCK * d))
                          for a in range(0, e, w)]
                pieces = [(a, b, sp, kb, kb.view(-1, d), sp.T) for a, b, sp, kb in pieces]
                per_count[e] = (st, st[le:], st[le:].T, pieces)
            st, sp_proxy, pT_proxy, pieces = per_count[e]
            i = items_l[pos]
            loc = i - hd * n
            rows = rows_all[pos]
            torch.add(sT[i], lb, out=sp_proxy).masked_fill_(exn[pos], float("-inf"))
            qT = qbh[loc].T  # q read in place (a strided GEMM operand), not copied first
            for a, b, sp, kb, kb2, _ in pieces:
                torch.index_select(kflat, 0, rows[a:b], out=kb)
                torch.addmm(sp, kb2, qT, beta=0, alpha=c, out=sp)
            if has_last is not None and has_last[pos]:  # block N-1 is the last exact block: keys >= T
                st[(e - 1) * BLOCK + last_len : le].fill_(float("-inf"))
            pe = st.sub_(st.amax(0)).exp2_()
            torch.sum(pe, 0, out=den1.view(BLOCK))
            torch.mm(pT_proxy, vmh, out=num1)
            for a, b, _, kb, kb2, pT in pieces:
                torch.index_select(vflat, 0, rows[a:b], out=kb)
                num1.addmm_(pT, kb2)
            torch.div(num1, den1, out=obh[loc])
            continue
        sl = slice(pos, pos + p)
        it = items[sl]
        loc = it - hd * n  # query blocks within the head
        rows = rows_all[sl, :e].reshape(-1)  # slots past an item's count hold non-exact blocks (masked below)
        st = sebuf[: p * (le + n) * BLOCK].view(p, le + n, BLOCK)  # S^T per item
        torch.add(torch.index_select(sflat, 0, it).view(p, BLOCK, n).transpose(1, 2), lb, out=st[:, le:])
        st[:, le:].masked_fill_(ex[sl, :, None], float("-inf"))
        qT = torch.index_select(qb[:, :, hd], 0, loc, out=qbuf[: p * BLOCK * d].view(p, BLOCK, d)).transpose(1, 2)
        kg = torch.index_select(kflat, 0, rows, out=kbuf[: p * le * d].view(p * e, BLOCK * d))
        st[:, :le].baddbmm_(kg.view(p, le, d), qT, beta=0, alpha=c)
        pad = cnts[pos + p - 1] != e  # counts are sorted: the last item has the fewest exact blocks
        tail = has_last is not None and any(has_last[sl])
        if pad or tail:  # padding slots and keys past T take -inf
            mask = torch.zeros((p, e, BLOCK), dtype=torch.bool, device=dev)
            if pad:
                mask |= (torch.arange(e, device=dev) >= torch.tensor(cnts[sl], device=dev)[:, None])[:, :, None]
            if tail:
                mask |= (rows.view(p, e) == hd * n + n - 1)[:, :, None] & (torch.arange(BLOCK, device=dev) >= last_len)
            st[:, :le].masked_fill_(mask.view(p, le, 1), float("-inf"))
        m = st.amax(1, keepdim=True)
        pe = st.sub_(m).exp2_()
        den = pe.sum(1)[..., None]  # [p, rows, 1]
        num = torch.bmm(pe[:, le:].transpose(1, 2), vmean[hd].expand(p, n, d), out=nbuf[: p * BLOCK * d].view(
            p, BLOCK, d))
        vg = torch.index_select(vflat, 0, rows, out=kbuf[: p * le * d].view(p * e, BLOCK * d))
        num.baddbmm_(pe[:, :le].transpose(1, 2), vg.view(p, le, d)).div_(den)
        ob[:, :, hd].index_copy_(0, loc, num)


def _sol_attn_half(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start):
    """bf16/fp16, one batch item q, k, v [1, T, H, D] -> (out [1, T, H, D], exact pairs per head [H])."""
    b, t, h, d = q.shape
    dt = q.dtype
    acc = acc_dtype(dt)
    n = num_blocks(t)
    tp = n * BLOCK
    bh = b * h
    c = scale * LOG2E
    dev = q.device

    qh, kh, vh = (_heads(x, acc, tp) for x in (q, k, v))
    exact, s, kc, vc = route(q, k, v, scale, tau, thresh_type, sink_tokens, sink_start, qh=qh)
    counts = exact.sum(-1)  # [B, H, N]
    exact_pairs = counts.sum((0, 2))
    out = torch.empty(bh * n, BLOCK, d, dtype=acc, device=dev)
    rnd = lambda x: x.to(dt).to(acc)  # noqa: E731
    lens = block_lengths(t, dev).to(acc)
    last_len = t - (n - 1) * BLOCK
    tok_pad_last = torch.arange(BLOCK, device=dev) >= last_len  # invalid key tokens of block N-1

    cnt = counts.reshape(bh * n)
    order = torch.argsort(cnt, descending=True, stable=True)
    cnt_sorted = cnt[order].tolist()
    n_items = bh * n
    n_full = sum(1 for x in cnt_sorted if x == n)

    # 1) items whose key blocks are all exact: plain attention over the T valid keys, no gather.
    if n_full:
        full = order[:n_full]
        for head in torch.unique(full // n).tolist():
            blocks = full[full // n == head]
            rows = qh.view(bh * n, BLOCK, d)[blocks].reshape(-1, d)
            kk, vv = kh[head, :t], vh[head, :t]
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
                      tok_pad_last if last_len != BLOCK else None)

    o = out.view(b, h, tp, d)[:, :, :t].permute(0, 2, 1, 3).to(dt)
    return o.contiguous(), exact_pairs


def _sparse_items(items, cnts, exact, sflat, qflat, kflat, vflat, vc, outflat, n, c, rnd, lens, tok_pad_last):
    """bf16/fp16 items (flat head*N + query block ids, sorted by exact count `cnts`, descending) that have
    some approximate blocks. Per chunk of similar count: gather the exact key/value blocks (padding slots
    take non-exact blocks and are masked), one softmax per row over the real keys plus one entry per
    approximate block, evaluated with the row's final max; p rounded to the input dtype before both P.V
    products. Every per-chunk tensor lives in a workspace allocated once per call: fresh multi-MB
    allocations page-fault on every chunk (the gathers ran ~3x slower)."""
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
    sabuf = torch.empty(max_p * BLOCK * n, dtype=acc, device=dev)
    ex, rows_all = _exact_block_order(items, exact, n)  # exact blocks first, ascending
    head = items // n
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
        sa = torch.index_select(sflat, 0, it, out=sabuf[: p * BLOCK * n].view(p, BLOCK * n)).view(p, BLOCK, n)
        sa.masked_fill_(ex[sl, None, :], float("-inf"))  # exact blocks are computed exactly instead
        m = torch.maximum(se.amax(-1, keepdim=True), sa.amax(-1, keepdim=True))
        pe = se.sub_(m).exp2_()
        pa = sa.sub_(m).exp2_()
        den = pe.sum(-1, keepdim=True).add_(pa @ lens[:, None])
        num = torch.bmm(rnd(pe), vg.view(p, e * BLOCK, d), out=nb)
        num.baddbmm_(rnd(pa), torch.index_select(vc, 0, head[sl]).view(p, n, d)).div_(den)
        outflat.index_copy_(0, it, num.view(p, BLOCK * d))
