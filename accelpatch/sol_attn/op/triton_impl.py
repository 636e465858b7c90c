"""Triton Sol-Attn kernel (CUDA; CPU through TRITON_INTERPRET=1 for tests).

One program per (query block, batch*head, kv split) runs one online-softmax pass over its key range.
Key blocks are visited in route groups of GROUP blocks: one GEMM S = c*Q*kc_g^T gives both the route
scores (column means over valid rows) and the per-row proxy logits; the group's approximate blocks are
folded in at once (acc += exp2(S - m) . vc, l += exp2(S - m) . len), then the group's exact blocks, in
ascending order, run as normal flash tiles on the real K, V in sub-tiles of BLOCK_N keys. That loop runs over
the compacted list of exact blocks (no branch in its body, addresses a function of the loop index), which is what
lets Triton's software pipeliner issue the next sub-tile's loads (cp.async) during this one's math; a loop over
all GROUP blocks with an `if exact:` body is never pipelined. fp32 running max / sum / accumulator;
probabilities are rounded to the input dtype before both P.V products. Block summaries and thresholds come from
the host (routing.py), shared with the PyTorch implementation. Tiles (BLOCK_N, num_stages, GROUP, warps) come
from the resource model of the target (resources.py).

kv_splits: the route groups are split into kv_splits contiguous ranges (one program each) whose partial
(acc, m, l) are merged on the host through their log-sum-exp. Rule: each split must own at least one
route group, so the effective split count is min(kv_splits, number of groups); it changes speed only.
In the interpreter, tl.dot on bf16 is broken (triton#11584), so tiles are upcast to fp32 in-kernel
(UPCAST) after the same roundings; GROUP defaults to 32 on CUDA and 2 when interpreting.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from accelpatch.sol_attn.op import resources
from accelpatch.sol_attn.op.options import BLOCK
from accelpatch.sol_attn.op.routing import LOG2E, num_blocks, sink_block_range, summaries, thresholds


@triton.jit
def _sol_attn_fwd(
    Q, K, V, KC, VC, THR, OUT, ACC_PART, M_PART, L_PART, COUNTS,
    stride_b, stride_t, stride_h,
    T, H, N, NUM_GROUPS, GROUPS_PER_SPLIT, TP,
    c, sink_lo, sink_hi,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
    PARTIAL: tl.constexpr, UPCAST: tl.constexpr,
):
    i = tl.program_id(0)
    bh = tl.program_id(1)
    split = tl.program_id(2)
    BH = tl.num_programs(1)
    b = bh // H
    h = bh % H
    in_ty = OUT.dtype.element_ty

    SUB: tl.constexpr = BLOCK_M // BLOCK_N  # key sub-tiles per 64-block
    offs64 = tl.arange(0, BLOCK_M).to(tl.int64)  # row/column offsets feed int64 pointer arithmetic
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    dcol = tl.arange(0, BLOCK_D)
    d_ok = dcol < D
    rows = i * BLOCK_M + offs64
    row_ok = rows < T
    base = b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    q = tl.load(Q + base + rows[:, None] * stride_t + dcol[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    len_i = tl.sum(row_ok.to(tl.float32), 0)
    thr = tl.load(THR + bh * N + i)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    cnt = tl.full([], 0, tl.int32)
    garange = tl.arange(0, GROUP)
    g0 = split * GROUPS_PER_SPLIT
    g1 = tl.minimum(g0 + GROUPS_PER_SPLIT, NUM_GROUPS)
    for g in range(g0, g1):
        jg = g * GROUP + garange
        j_ok = jg < N
        sum_off = (bh * N + jg)[:, None] * D + dcol[None, :]
        sum_mask = j_ok[:, None] & d_ok[None, :]
        kc = tl.load(KC + sum_off, mask=sum_mask, other=0.0)
        vc = tl.load(VC + sum_off, mask=sum_mask, other=0.0)
        if UPCAST:
            kc = kc.to(tl.float32)
            vc = vc.to(tl.float32)
        s = tl.dot(q, tl.trans(kc), input_precision="ieee") * c  # [BLOCK_M, GROUP] proxy logits (log2)
        r = tl.sum(tl.where(row_ok[:, None], s, 0.0), 0) / len_i  # route scores
        ex = (r > thr) | (tl.abs(jg - i) <= 1) | ((jg >= sink_lo) & (jg <= sink_hi))
        ex = ex & j_ok
        ap = (ex == 0) & j_ok
        # rank-1 corrections of the group's approximate blocks
        len_j = tl.minimum(T - jg * BLOCK_M, BLOCK_M).to(tl.float32)
        sa = tl.where(ap[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(sa, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(sa - m_safe[:, None])
        l = l * alpha + tl.sum(p * len_j[None, :], 1)
        pr = p.to(in_ty)
        if UPCAST:
            pr = pr.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pr, vc, input_precision="ieee")
        m = m_new
        # exact blocks of the group, compacted (the e-th exact block is jg[pos == e]) and taken in sub-tiles of
        # BLOCK_N keys: one loop without branches, whose loads depend on the loop index only, so Triton's software
        # pipeliner can prefetch the next tile (cp.async) while this one is computed
        ex_i = ex.to(tl.int32)
        pos = tl.cumsum(ex_i, 0) - ex_i
        n_ex = tl.sum(ex_i, 0)
        cnt += n_ex
        for e in tl.range(0, n_ex * SUB):
            j = tl.sum(tl.where(ex & (pos == e // SUB), jg, 0), 0)
            cols = j.to(tl.int64) * BLOCK_M + (e % SUB) * BLOCK_N + offs_n
            c_ok = cols < T
            kv_off = base + cols[:, None] * stride_t + dcol[None, :]
            kv_mask = c_ok[:, None] & d_ok[None, :]
            kt = tl.load(K + kv_off, mask=kv_mask, other=0.0)
            vt = tl.load(V + kv_off, mask=kv_mask, other=0.0)
            if UPCAST:
                kt = kt.to(tl.float32)
                vt = vt.to(tl.float32)
            s2 = tl.dot(q, tl.trans(kt), input_precision="ieee") * c
            s2 = tl.where(c_ok[None, :], s2, float("-inf"))
            m2 = tl.maximum(m, tl.max(s2, 1))
            alpha2 = tl.exp2(m - m2)
            p2 = tl.exp2(s2 - m2[:, None])
            l = l * alpha2 + tl.sum(p2, 1)
            p2r = p2.to(in_ty)
            if UPCAST:
                p2r = p2r.to(tl.float32)
            acc = acc * alpha2[:, None] + tl.dot(p2r, vt, input_precision="ieee")
            m = m2
    tl.store(COUNTS + (split * BH + bh) * N + i, cnt)
    if not PARTIAL:
        out = acc / l[:, None]
        tl.store(OUT + base + rows[:, None] * stride_t + dcol[None, :], out.to(in_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
    else:
        prow = (split * BH + bh) * TP + rows
        tl.store(ACC_PART + prow[:, None] * BLOCK_D + dcol[None, :], acc)
        tl.store(M_PART + prow, m)
        tl.store(L_PART + prow, l)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def target_arch(device: torch.device) -> int | None:
    """The architecture the kernel is compiled for: q's CUDA device; None in the interpreter (no limits); else
    Triton's active target (what an ahead-of-time inspection with a stand-in driver reports)."""
    if device.type == "cuda":
        return resources.device_arch(device)
    if interpreting():
        return None
    return triton.runtime.driver.active.get_current_target().arch


def sol_attn_triton(q, k, v, scale: float, tau: float, thresh_type: str, sink_tokens: int, sink_start,
                    kv_splits: int = 1, group: int | None = None, tiles: resources.Tiles | None = None):
    """Sol-Attn forward for contiguous q, k, v [B, T, H, D] (fp32, bf16, fp16). Returns (out, exact pairs
    per head [H] int64). Tiles come from the resource model for the target (resources.choose_tiles, which raises
    TilesDoNotFit with the reason when none fits); `tiles` overrides them and `group` the route-group size in
    64-blocks (default: the tiles' on CUDA, 2 when interpreting)."""
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"sol_attn impl='triton' supports float32, bfloat16 and float16, got {q.dtype}")
    b, t, h, d = q.shape
    n = num_blocks(t)
    tp = n * BLOCK
    bh = b * h
    interp = interpreting()
    if tiles is None:
        tiles = resources.choose_tiles(q.dtype, d, target_arch(q.device))
    if group is None:
        group = 2 if interp else tiles.group
    num_groups = -(-n // group)
    splits = max(1, min(int(kv_splits), num_groups))
    groups_per_split = -(-num_groups // splits)
    splits = -(-num_groups // groups_per_split)  # drop splits that would own no group

    c = scale * LOG2E
    kc, vc, qbar = summaries(q, k, v)
    thr = thresholds(qbar, kc, c, tau, thresh_type).float().contiguous()
    kc, vc = kc.contiguous(), vc.contiguous()
    lo, hi = sink_block_range(t, sink_tokens, sink_start)

    out = torch.empty_like(q)
    block_d = tiles.block_d
    counts = torch.empty(splits, bh, n, dtype=torch.int32, device=q.device)
    if splits > 1:
        acc_part = torch.empty(splits, bh, tp, block_d, dtype=torch.float32, device=q.device)
        m_part = torch.empty(splits, bh, tp, dtype=torch.float32, device=q.device)
        l_part = torch.empty_like(m_part)
    else:
        acc_part = m_part = l_part = out  # unused
    _sol_attn_fwd[(n, bh, splits)](
        q, k, v, kc, vc, thr, out, acc_part, m_part, l_part, counts,
        q.stride(0), q.stride(1), q.stride(2),
        t, h, n, num_groups, groups_per_split, tp,
        c, lo, hi,
        D=d, BLOCK_D=block_d, BLOCK_M=BLOCK, BLOCK_N=tiles.block_n, GROUP=group, PARTIAL=splits > 1, UPCAST=interp,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    if splits > 1:
        mx = m_part.amax(0)
        w = torch.exp2(m_part - mx)  # empty splits have m = -inf -> weight 0
        num = (w[..., None] * acc_part).sum(0)
        den = (w * l_part).sum(0)
        o = (num / den[..., None])[:, :t, :d].reshape(b, h, t, d).permute(0, 2, 1, 3)
        out.copy_(o)
    pairs = counts.sum((0, 2), dtype=torch.int64).view(b, h).sum(0)
    return out, pairs
