"""The Triton kernels of the lossless fused ops (imported only by triton_kernels, on first use).

Every kernel replays its eager chain op by op: loads are widened exactly to fp32 (fp64 where eager promotes to
fp64), each op is one IEEE fp32/fp64 operation, and the result is rounded to the storage dtype wherever eager stores
an intermediate (after EVERY bf16/fp16 op; mixed bf16 x fp32 chains only at the final store; fp64 -> bf16 through
fp32, as c10 has no double constructor). The wrappers launch with enable_fp_fusion=False so no mul+add becomes an
FMA (eager never contracts across kernels; the one exception is an fma eager's build has inside one op, the
complex128 multiply: written out as tl.fma only where the probe, complex_mul, found it). No division, exp or
libdevice call is used (bf16 SiLU/sigmoid/ReLU are table gathers), so there is no approximate instruction and
nothing to flush denormals.

bf16 rounding and widening are written in integer arithmetic (`_bf16_bits`, `_widen_bits`) instead of `.to()`:
the result is the same round-to-nearest-even on the GPU, but Triton's interpreter (which the tests run) truncates in
`.to(tl.bfloat16)` and mishandles subnormals, so `.to()` would make the CPU tests meaningless. fp16 and fp64->fp32
use `.to()` (RTNE on both the GPU and numpy).
Element-wise kernels see every operand broadcast to the output's shape as 4-D (size, stride) pairs, with the
output's fastest dim last (triton_kernels._plan); one program covers BLOCK elements of one row of that dim.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _bf16_bits(v):
    """fp32 -> the int16 bits of bf16(v), round to nearest even (NaN stays a quiet NaN of the same sign)."""
    u = v.to(tl.int32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = tl.where(v != v, (u >> 16) | 0x40, r)
    return r.to(tl.int16)


@triton.jit
def _widen_bits(b):
    """int16 bf16 bits -> the exact fp32 value."""
    return (b.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _widen(x):
    """A loaded value as fp32 (fp64 stays fp64); exact."""
    if x.dtype == tl.bfloat16:
        return _widen_bits(x.to(tl.int16, bitcast=True))
    elif x.dtype == tl.float64:
        return x
    else:
        return x.to(tl.float32)


@triton.jit
def _narrow(v, DT: tl.constexpr):
    """fp32/fp64 `v` rounded (RTNE) into dtype DT, ready to store; fp64 reaches bf16/fp16 through fp32."""
    if DT == tl.bfloat16:
        return _bf16_bits(v.to(tl.float32)).to(tl.bfloat16, bitcast=True)
    elif DT == tl.float16:
        return v.to(tl.float32).to(tl.float16)
    elif DT == tl.float64:
        return v.to(tl.float64)
    else:
        return v.to(tl.float32)


@triton.jit
def _round(v, DT: tl.constexpr):
    """fp32 `v` rounded to DT and widened back: what eager stores between two ops of a DT chain."""
    if DT == tl.bfloat16:
        return _widen_bits(_bf16_bits(v))
    elif DT == tl.float16:
        return v.to(tl.float16).to(tl.float32)
    else:
        return v


@triton.jit
def _gather_bf16(TABLE, x):
    """`TABLE[bits(x)]` for a bf16 `x`: an exact eager bf16 unary op (tables.unary_table)."""
    idx = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return tl.load(TABLE + idx)


@triton.jit
def _tile(size1, size2, size3, BLOCK: tl.constexpr):
    """(i0, i1, i2, cols, mask) of this program: row (i0, i1, i2) of the 4-D iteration space, BLOCK of its last dim
    (int64, so no offset overflows)."""
    pid = tl.program_id(0).to(tl.int64)
    n_blk = tl.cdiv(size3, BLOCK)
    row = pid // n_blk
    cols = (pid % n_blk) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    i2 = row % size2
    row = row // size2
    return row // size1, row % size1, i2, cols, cols < size3


@triton.jit
def _at(P, i0, i1, i2, cols, s0, s1, s2, s3):
    return P + (i0 * s0 + i1 * s1 + i2 * s2) + cols * s3


@triton.jit
def _modulate_kernel(OUT, X, SCALE, SHIFT, size1, size2, size3,
                     o0, o1, o2, o3, x0, x1, x2, x3, a0, a1, a2, a3, b0, b1, b2, b3, BLOCK: tl.constexpr):
    """out = x * (1 + scale) + shift, rounded to the dtype after each of the three ops."""
    DT: tl.constexpr = OUT.dtype.element_ty
    i0, i1, i2, cols, mask = _tile(size1, size2, size3, BLOCK)
    x = _widen(tl.load(_at(X, i0, i1, i2, cols, x0, x1, x2, x3), mask=mask))
    scale = _widen(tl.load(_at(SCALE, i0, i1, i2, cols, a0, a1, a2, a3), mask=mask))
    shift = _widen(tl.load(_at(SHIFT, i0, i1, i2, cols, b0, b1, b2, b3), mask=mask))
    one = _round(scale + 1.0, DT)
    prod = _round(x * one, DT)
    tl.store(_at(OUT, i0, i1, i2, cols, o0, o1, o2, o3), _narrow(prod + shift, DT), mask=mask)


@triton.jit
def _gated_residual_kernel(OUT, R, G, X, size1, size2, size3,
                           o0, o1, o2, o3, r0, r1, r2, r3, g0, g1, g2, g3, x0, x1, x2, x3, BLOCK: tl.constexpr):
    """out = residual + gate * x: the product rounded to the dtype, then the sum."""
    DT: tl.constexpr = OUT.dtype.element_ty
    i0, i1, i2, cols, mask = _tile(size1, size2, size3, BLOCK)
    r = _widen(tl.load(_at(R, i0, i1, i2, cols, r0, r1, r2, r3), mask=mask))
    g = _widen(tl.load(_at(G, i0, i1, i2, cols, g0, g1, g2, g3), mask=mask))
    x = _widen(tl.load(_at(X, i0, i1, i2, cols, x0, x1, x2, x3), mask=mask))
    prod = _round(g * x, DT)
    tl.store(_at(OUT, i0, i1, i2, cols, o0, o1, o2, o3), _narrow(r + prod, DT), mask=mask)


@triton.jit
def _silu_kernel(OUT, X, TABLE, size1, size2, size3, o0, o1, o2, o3, x0, x1, x2, x3, BLOCK: tl.constexpr):
    """bf16 SiLU as a gather from eager's own table."""
    i0, i1, i2, cols, mask = _tile(size1, size2, size3, BLOCK)
    x = tl.load(_at(X, i0, i1, i2, cols, x0, x1, x2, x3), mask=mask)
    tl.store(_at(OUT, i0, i1, i2, cols, o0, o1, o2, o3), _gather_bf16(TABLE, x), mask=mask)


@triton.jit
def _glu_gate_kernel(OUT, X, G, TABLE, size1, size2, size3,
                     o0, o1, o2, o3, x0, x1, x2, x3, g0, g1, g2, g3, BLOCK: tl.constexpr):
    """bf16 x * f(gate), f from eager's table (already bf16): SiLU for glu_gate, sigmoid for sigmoid_gate; the
    product rounded once."""
    i0, i1, i2, cols, mask = _tile(size1, size2, size3, BLOCK)
    x = _widen(tl.load(_at(X, i0, i1, i2, cols, x0, x1, x2, x3), mask=mask))
    g = tl.load(_at(G, i0, i1, i2, cols, g0, g1, g2, g3), mask=mask)
    s = _widen(_gather_bf16(TABLE, g))
    tl.store(_at(OUT, i0, i1, i2, cols, o0, o1, o2, o3), _narrow(x * s, tl.bfloat16), mask=mask)


@triton.jit
def _scale_cast_kernel(OUT, X, Z, size1, size2, size3,
                       o0, o1, o2, o3, x0, x1, x2, x3, z0, z1, z2, z3, BLOCK: tl.constexpr):
    """out = dtype(x * z): one fp32 product (z widened exactly), rounded once into the output dtype."""
    i0, i1, i2, cols, mask = _tile(size1, size2, size3, BLOCK)
    x = _widen(tl.load(_at(X, i0, i1, i2, cols, x0, x1, x2, x3), mask=mask))
    z = _widen(tl.load(_at(Z, i0, i1, i2, cols, z0, z1, z2, z3), mask=mask))
    tl.store(_at(OUT, i0, i1, i2, cols, o0, o1, o2, o3), _narrow(x * z, OUT.dtype.element_ty), mask=mask)


@triton.jit
def _relu_bf16_or_fp32(TABLE, x, NEG_ZERO_KEEPS_SIGN: tl.constexpr):
    """Eager ReLU: bf16 by table gather; fp32 as clamp_min(x, 0) (NaN kept, negatives to +0, -0 as the device's
    eager kernel leaves it, probed by the wrapper)."""
    if x.dtype == tl.bfloat16:
        return _gather_bf16(TABLE, x)
    else:
        keep = (x > 0.0) | (x != x)
        if NEG_ZERO_KEEPS_SIGN:
            keep = keep | (x == 0.0)
        return tl.where(keep, x, 0.0)


@triton.jit
def _rotate(x1, x2, c, s, MODE: tl.constexpr):
    """(x1*c - x2*s, x1*s + x2*c) at the chain's dtype, MODE 0 / 1 / 2 = bf16 / fp32 / fp64
    (triton_kernels._ROPE_MODES): bf16 rounds after every op, fp32 and fp64 are one IEEE op each."""
    if MODE == 0:
        o1 = _round(_round(x1 * c, tl.bfloat16) - _round(x2 * s, tl.bfloat16), tl.bfloat16)
        o2 = _round(_round(x1 * s, tl.bfloat16) + _round(x2 * c, tl.bfloat16), tl.bfloat16)
    elif MODE == 1:
        o1 = x1 * c - x2 * s
        o2 = x1 * s + x2 * c
    else:
        x1 = x1.to(tl.float64)
        x2 = x2.to(tl.float64)
        o1 = x1 * c - x2 * s
        o2 = x1 * s + x2 * c
    return o1, o2


@triton.jit
def _relu_rope_one(IN, RELU, ROT, TABLE, base_in, base_relu, base_rot, s_in, s_relu, s_rot, pair, mask2, c1, s1,
                   c2, s2, MODE: tl.constexpr, NEG_ZERO_KEEPS_SIGN: tl.constexpr, APPLY_RELU: tl.constexpr,
                   PER_CHANNEL: tl.constexpr):
    """relu_rope_pair's query or key (APPLY_RELU: ReLU stored, the rotation stored as float32), or rope_pair's
    (no ReLU, RELU unused, the rotation stored in the input's dtype); PER_CHANNEL: rope_pair_per_channel's, the
    even output from (c1, s1) and the odd one from (c2, s2)."""
    DT: tl.constexpr = IN.dtype.element_ty
    x = tl.load(IN + base_in + pair * s_in, mask=mask2)
    if APPLY_RELU:
        r = _relu_bf16_or_fp32(TABLE, x, NEG_ZERO_KEEPS_SIGN)
        tl.store(RELU + base_relu + pair * s_relu, r, mask=mask2)
    else:
        r = x
    x1, x2 = tl.split(_widen(r))
    if PER_CHANNEL:  # output 2i from (cos, sin)[2i], output 2i+1 from (cos, sin)[2i+1]
        o1, _ = _rotate(x1, x2, c1, s1, MODE)
        _, o2 = _rotate(x1, x2, c2, s2, MODE)
    else:  # both from cos[2i] and sin[2i+1] (c1 is c2, s1 is s2)
        o1, o2 = _rotate(x1, x2, c1, s1, MODE)
    rot = _narrow(tl.join(o1, o2), DT)  # stored into the input's dtype by the reference
    if APPLY_RELU:
        rot = _widen(rot)  # then .float()
    tl.store(ROT + base_rot + pair * s_rot, rot, mask=mask2)


@triton.jit
def _relu_rope_pair_kernel(Q, K, COS, SIN, QR, KR, QROT, KROT, TABLE, N,
                           q0, q1, q2, q3, k0, k1, k2, k3, c0, c1, c2, c3, s0, s1, s2, s3,
                           qr0, qr1, qr2, qr3, kr0, kr1, kr2, kr3, qo0, qo1, qo2, qo3, ko0, ko1, ko2, ko3,
                           H: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr, NEG_ZERO_KEEPS_SIGN: tl.constexpr,
                           BLOCK: tl.constexpr, APPLY_RELU: tl.constexpr = True,
                           PER_CHANNEL: tl.constexpr = False):
    """One token (b, n) per program row, BLOCK (head, pair) slots of it: ReLU and interleaved RoPE of the query and
    the key, sharing the loads of cos (even index) and sin (odd index); without APPLY_RELU, rope_pair (QR, KR and
    TABLE unused); PER_CHANNEL (rope_pair_per_channel, no ReLU): each output reads its own channel's cos and sin.
    """
    P: tl.constexpr = D // 2
    t = tl.program_id(0).to(tl.int64)
    b = t // N
    n = t % N
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = j < H * P
    h = (j // P).to(tl.int64)
    i2 = (2 * (j % P)).to(tl.int64)  # index of the pair's first element
    two = tl.arange(0, 2).to(tl.int64)
    mask2 = mask[:, None] & (two[None, :] < 2)
    pair = i2[:, None] + two[None, :]  # element index within the head
    if PER_CHANNEL:
        ce, co = tl.split(_widen(tl.load(COS + (b * c0 + n * c1 + h * c2)[:, None] + pair * c3, mask=mask2)))
        se, so = tl.split(_widen(tl.load(SIN + (b * s0 + n * s1 + h * s2)[:, None] + pair * s3, mask=mask2)))
    else:
        ce = _widen(tl.load(COS + b * c0 + n * c1 + h * c2 + i2 * c3, mask=mask))
        so = _widen(tl.load(SIN + b * s0 + n * s1 + h * s2 + (i2 + 1) * s3, mask=mask))
        co = ce
        se = so
    _relu_rope_one(Q, QR, QROT, TABLE, (b * q0 + n * q1 + h * q2)[:, None], (b * qr0 + n * qr1 + h * qr2)[:, None],
                   (b * qo0 + n * qo1 + h * qo2)[:, None], q3, qr3, qo3, pair, mask2, ce, se, co, so, MODE,
                   NEG_ZERO_KEEPS_SIGN, APPLY_RELU, PER_CHANNEL)
    _relu_rope_one(K, KR, KROT, TABLE, (b * k0 + n * k1 + h * k2)[:, None], (b * kr0 + n * kr1 + h * kr2)[:, None],
                   (b * ko0 + n * ko1 + h * ko2)[:, None], k3, kr3, ko3, pair, mask2, ce, se, co, so, MODE,
                   NEG_ZERO_KEEPS_SIGN, APPLY_RELU, PER_CHANNEL)


@triton.jit
def _rotate_half_one(IN, OUT, base_in, base_out, s_in, s_out, d, partner, first, rot, mask, c, s,
                     SPLIT: tl.constexpr, FMA: tl.constexpr):
    """One head row of rotate-half RoPE: out[d] = x[d]*cos + rotated[d]*sin for d < R (rotated = -x[d + R/2] in the
    first half, x[d - R/2] in the second); x[d] past R. MiniMax-H3 (not SPLIT): each product and the sum rounded to
    the dtype. SPLIT (LTX-2.3's apply_split_rotary_emb): float32, x*cos rounded, then the second product added as
    the device's eager addcmul_ adds it (FMA: kept exact in an fma, else rounded first), cast at the store."""
    DT: tl.constexpr = OUT.dtype.element_ty
    raw = tl.load(IN + base_in + d * s_in, mask=mask)
    y = _widen(tl.load(IN + base_in + partner * s_in, mask=mask & rot))
    rotated = tl.where(first, -y, y)
    if SPLIT:
        if FMA:
            out = tl.fma(rotated, s, _widen(raw) * c)
        else:
            out = _widen(raw) * c + rotated * s
    else:
        out = _round(_widen(raw) * c, DT) + _round(rotated * s, DT)
    tl.store(OUT + base_out + d * s_out, tl.where(rot, _narrow(out, DT), raw), mask=mask)


@triton.jit
def _rotate_half_pair_kernel(Q, K, COS, SIN, QO, KO, N, q0, q1, q2, q3, k0, k1, k2, k3, c0, c1, c2, c3,
                             s0, s1, s2, s3, qo0, qo1, qo2, qo3, ko0, ko1, ko2, ko3,
                             H: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr,
                             SPLIT: tl.constexpr = False, FMA: tl.constexpr = False):
    """One token (b, n) per program row, BLOCK (head, channel) slots of it: rotate-half RoPE of the leading R
    channels of every head of the query and the key, sharing the table loads; table strides along (b, n, h, entry).
    MiniMax-H3: an entry per channel, rounded to the activations' dtype first (``cos.to(x.dtype)``). SPLIT
    (rope_split_pair, R = D): one float32 entry per pair (channel d and d + D/2 read entry d)."""
    DT: tl.constexpr = QO.dtype.element_ty
    t = tl.program_id(0).to(tl.int64)
    b = t // N
    n = t % N
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = j < H * D
    h = (j // D).to(tl.int64)
    d = (j % D).to(tl.int64)
    rot = d < R
    first = d < R // 2
    partner = tl.where(first, d + R // 2, d - R // 2)
    if SPLIT:
        e = tl.where(first, d, partner)
        c = _widen(tl.load(COS + b * c0 + n * c1 + h * c2 + e * c3, mask=mask))
        s = _widen(tl.load(SIN + b * s0 + n * s1 + h * s2 + e * s3, mask=mask))
    else:
        c = _widen(_narrow(_widen(tl.load(COS + n * c1 + d * c3, mask=mask & rot)), DT))
        s = _widen(_narrow(_widen(tl.load(SIN + n * s1 + d * s3, mask=mask & rot)), DT))
    _rotate_half_one(Q, QO, b * q0 + n * q1 + h * q2, b * qo0 + n * qo1 + h * qo2, q3, qo3, d, partner, first, rot,
                     mask, c, s, SPLIT, FMA)
    _rotate_half_one(K, KO, b * k0 + n * k1 + h * k2, b * ko0 + n * ko1 + h * ko2, k3, ko3, d, partner, first, rot,
                     mask, c, s, SPLIT, FMA)


@triton.jit
def _complex_mul(a, b, c, d, RE_MODE: tl.constexpr, IM_MODE: tl.constexpr):
    """(a + bi)(c + di) in fp64 in the form eager's build uses (complex_mul: 0 every product rounded, 1 an fma on
    the first product, 2 on the second); the fmas are explicit, so fp fusion stays off around them."""
    if RE_MODE == 0:
        re = a * c - b * d
    elif RE_MODE == 1:
        re = tl.fma(a, c, -(b * d))
    else:
        re = tl.fma(-b, d, a * c)
    if IM_MODE == 0:
        im = a * d + b * c
    elif IM_MODE == 1:
        im = tl.fma(a, d, b * c)
    else:
        im = tl.fma(b, c, a * d)
    return re, im


@triton.jit
def _rotary_complex_one(IN, OUT, base_in, base_out, s_in, s_out, pair, mask2, c, d,
                        RE_MODE: tl.constexpr, IM_MODE: tl.constexpr):
    DT: tl.constexpr = OUT.dtype.element_ty
    a, b = tl.split(_widen(tl.load(IN + base_in + pair * s_in, mask=mask2)).to(tl.float64))
    re, im = _complex_mul(a, b, c, d, RE_MODE, IM_MODE)
    tl.store(OUT + base_out + pair * s_out, _narrow(tl.join(re, im), DT), mask=mask2)


@triton.jit
def _rotary_complex_pair_kernel(Q, K, F, QO, KO, N, q0, q1, q2, q3, k0, k1, k2, k3, f0, f1, f2,
                                qo0, qo1, qo2, qo3, ko0, ko1, ko2, ko3,
                                H: tl.constexpr, P: tl.constexpr, RE_MODE: tl.constexpr, IM_MODE: tl.constexpr,
                                BLOCK: tl.constexpr):
    """One token (b, n) per program row, BLOCK (head, pair) slots of it: SANA-Video 2.0's RoPE of the query and the
    key, channel pairs (2i, 2i+1) loaded together, widened exactly to fp64 and multiplied by the complex128 table
    entry (F is its real view; the loads are shared), then rounded fp64 -> fp32 -> dtype as ``type_as`` does."""
    t = tl.program_id(0).to(tl.int64)
    b = t // N
    n = t % N
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = j < H * P
    h = (j // P).to(tl.int64)
    i = (j % P).to(tl.int64)
    two = tl.arange(0, 2).to(tl.int64)
    mask2 = mask[:, None] & (two[None, :] < 2)
    pair = (2 * i)[:, None] + two[None, :]  # the pair's two channels within the head
    c = tl.load(F + n * f0 + i * f1, mask=mask)
    d = tl.load(F + n * f0 + i * f1 + f2, mask=mask)
    _rotary_complex_one(Q, QO, (b * q0 + n * q1 + h * q2)[:, None], (b * qo0 + n * qo1 + h * qo2)[:, None], q3, qo3,
                        pair, mask2, c, d, RE_MODE, IM_MODE)
    _rotary_complex_one(K, KO, (b * k0 + n * k1 + h * k2)[:, None], (b * ko0 + n * ko1 + h * ko2)[:, None], k3, ko3,
                        pair, mask2, c, d, RE_MODE, IM_MODE)


KERNELS = (_relu_rope_pair_kernel, _modulate_kernel, _gated_residual_kernel, _silu_kernel, _glu_gate_kernel,
           _scale_cast_kernel, _rotate_half_pair_kernel, _rotary_complex_pair_kernel)
