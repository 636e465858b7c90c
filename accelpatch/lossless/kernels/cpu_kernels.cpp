// CPU kernels of the lossless fused ops (accelpatch/ops/fused/cpu.py calls them as the torch.library ops of
// cpu_ops.cpp, which check every argument; the entry points are declared in cpu_kernels.h).
//
// Each kernel reproduces an eager chain of accelpatch/ops/fused/reference.py bit for bit: bf16/fp16 values are
// widened to float, every op is computed in float and rounded back to the storage dtype, exactly where eager
// stores a tensor; mixed bf16 x float chains run in float (or double) and round only at the store, and
// double -> bf16 goes through float as c10 does. The fp16 rounding is c10's own (its headers are included), the bf16
// one c10's formula in vectorisable form (checked against c10's on all 2^32 floats by check_bf16_rounding). The
// file must be compiled with -ffp-contract=off -fno-fast-math: a contracted FMA would round differently from eager
// (and gcc's vectoriser contracts some patterns even so: see Rotate below; cpu.py's self-check guards against it).
//
// Iteration spaces are at most 4-D; each tensor comes with 4 element strides (0 = broadcast), so any layout
// works. The innermost dimension gets a unit-stride path the compiler can vectorise.
#include "cpu_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using accelpatch_kernels::i64;

// float -> bf16 round-to-nearest-even, NaN to 0x7FC0: c10's round_to_nearest_even (BFloat16.h) written with a
// select instead of its branch, so that loops of it vectorise. check_bf16_rounding compares it with c10's on any
// range of float bit patterns (the tests run all 2^32).
inline uint32_t bf16_rounded_f32_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  const uint32_t rounded = (u + UINT32_C(0x7FFF) + ((u >> 16) & 1u)) & UINT32_C(0xFFFF0000);
  return v != v ? UINT32_C(0x7FC00000) : rounded;
}

inline float f32_from_bits(uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// A storage dtype: S is how an element is stored, load widens it to float exactly, store rounds a float to it,
// round gives the float value of that rounding (the value eager reads back after it stored an intermediate).
template <class T> struct Io;
template <> struct Io<float> {
  using S = float;
  static inline float load(float v) { return v; }
  static inline float store(float v) { return v; }
  static inline float round(float v) { return v; }
};
struct BF16 {};
template <> struct Io<BF16> {
  using S = uint16_t;
  static inline float load(uint16_t v) { return f32_from_bits(uint32_t(v) << 16); }
  static inline uint16_t store(float v) { return static_cast<uint16_t>(bf16_rounded_f32_bits(v) >> 16); }
  static inline float round(float v) { return f32_from_bits(bf16_rounded_f32_bits(v)); }
};
struct F16 {};
template <> struct Io<F16> {  // c10's own conversions (fp16 is not on the models' hot paths)
  using S = uint16_t;
  static inline float load(uint16_t v) { return static_cast<float>(c10::Half(v, c10::Half::from_bits())); }
  static inline uint16_t store(float v) { return c10::Half(v).x; }
  static inline float round(float v) { return load(store(v)); }
};

// Walks the three outer dimensions of a 4-D space and hands each innermost row to `row` with the NT base offsets.
template <int NT, class Row>
inline void for_rows(const i64* size, const i64* st, Row&& row) {
  for (i64 a = 0; a < size[0]; ++a)
    for (i64 b = 0; b < size[1]; ++b)
      for (i64 c = 0; c < size[2]; ++c) {
        i64 off[NT];
        for (int t = 0; t < NT; ++t) off[t] = a * st[4 * t] + b * st[4 * t + 1] + c * st[4 * t + 2];
        row(off);
      }
}

template <int NT>
inline bool unit_inner(const i64* st) {
  for (int t = 0; t < NT; ++t)
    if (st[4 * t + 3] != 1) return false;
  return true;
}

// An element-wise op on NT tensors (tensor 0 is the output): `f(a, b, ...)` computes one output element from the
// input elements. Unit-stride rows go to functions of restrict pointers (the form in which gcc vectorises best,
// measured). Where some tensor is not unit-stride along the innermost dim (a transposed residual, a broadcast), the
// rows are cut into chunks of kChunk elements (128: a gather at a stride of 448 floats cycles through only 16 of
// L1's 64 sets, so 256-element chunks no longer stayed in L1 and ran slower, measured): each strided input chunk is gathered into a small buffer, the chunk
// is computed by the same unit-stride row function, and a strided output chunk is scattered. The chunk loop runs
// outside the third dim, so a tensor that is unit-stride along that dim (the transposed one) is read cache line by
// cache line while its lines stay in L1 (a [1, 320, 448] bf16 gated residual on a transposed residual: the old
// element-by-element strided loop took 1447 us here, eager 320; now see benchmarks/bench_fused_cpu.py).
template <class Out, class In1, class In2, class In3, class F>
static void row3(Out* __restrict o, const In1* __restrict a, const In2* __restrict b, const In3* __restrict c, i64 n,
                 F f) {
  for (i64 i = 0; i < n; ++i) o[i] = f(a[i], b[i], c[i]);
}
template <class Out, class In1, class In2, class F>
static void row2(Out* __restrict o, const In1* __restrict a, const In2* __restrict b, i64 n, F f) {
  for (i64 i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
}
template <class Out, class In1, class F>
static void row1(Out* __restrict o, const In1* __restrict a, i64 n, F f) {
  for (i64 i = 0; i < n; ++i) o[i] = f(a[i]);
}

constexpr i64 kChunk = 128;

// `p` itself where the stride is 1, else its m elements at stride s copied into buf.
template <class T>
inline const T* gathered(const T* p, i64 s, i64 m, T* __restrict buf) {
  if (s == 1) return p;
  if (s == 0) {
    for (i64 i = 0; i < m; ++i) buf[i] = p[0];
  } else {
    for (i64 i = 0; i < m; ++i) buf[i] = p[i * s];
  }
  return buf;
}

template <class T>
inline void scatter(T* p, i64 s, i64 m, const T* __restrict buf) {
  for (i64 i = 0; i < m; ++i) p[i * s] = buf[i];
}

// Calls row(off, m) for every chunk of up to kChunk innermost elements, chunks outside the third dim; off holds the
// NT offsets of the chunk's first element.
template <int NT, class Chunk>
inline void for_chunks(const i64* size, const i64* st, Chunk&& chunk) {
  for (i64 a = 0; a < size[0]; ++a)
    for (i64 b = 0; b < size[1]; ++b)
      for (i64 i0 = 0; i0 < size[3]; i0 += kChunk) {
        const i64 m = size[3] - i0 < kChunk ? size[3] - i0 : kChunk;
        for (i64 c = 0; c < size[2]; ++c) {
          i64 off[NT];
          for (int t = 0; t < NT; ++t)
            off[t] = a * st[4 * t] + b * st[4 * t + 1] + c * st[4 * t + 2] + i0 * st[4 * t + 3];
          chunk(off, m);
        }
      }
}

template <class Out, class In1, class In2, class In3, class F>
inline void elementwise3(Out* out, const In1* x, const In2* y, const In3* z, const i64* size, const i64* st, F f) {
  const i64 n = size[3];
  if (unit_inner<4>(st)) {
    for_rows<4>(size, st, [&](const i64* off) { row3(out + off[0], x + off[1], y + off[2], z + off[3], n, f); });
    return;
  }
  Out ob[kChunk];
  In1 b1[kChunk];
  In2 b2[kChunk];
  In3 b3[kChunk];
  for_chunks<4>(size, st, [&](const i64* off, i64 m) {
    Out* o = st[3] == 1 ? out + off[0] : ob;
    row3(o, gathered(x + off[1], st[7], m, b1), gathered(y + off[2], st[11], m, b2),
         gathered(z + off[3], st[15], m, b3), m, f);
    if (st[3] != 1) scatter(out + off[0], st[3], m, ob);
  });
}

template <class Out, class In1, class In2, class F>
inline void elementwise2(Out* out, const In1* x, const In2* y, const i64* size, const i64* st, F f) {
  const i64 n = size[3];
  if (unit_inner<3>(st)) {
    for_rows<3>(size, st, [&](const i64* off) { row2(out + off[0], x + off[1], y + off[2], n, f); });
    return;
  }
  Out ob[kChunk];
  In1 b1[kChunk];
  In2 b2[kChunk];
  for_chunks<3>(size, st, [&](const i64* off, i64 m) {
    Out* o = st[3] == 1 ? out + off[0] : ob;
    row2(o, gathered(x + off[1], st[7], m, b1), gathered(y + off[2], st[11], m, b2), m, f);
    if (st[3] != 1) scatter(out + off[0], st[3], m, ob);
  });
}

template <class Out, class In1, class F>
inline void elementwise1(Out* out, const In1* x, const i64* size, const i64* st, F f) {
  const i64 n = size[3];
  if (unit_inner<2>(st)) {
    for_rows<2>(size, st, [&](const i64* off) { row1(out + off[0], x + off[1], n, f); });
    return;
  }
  Out ob[kChunk];
  In1 b1[kChunk];
  for_chunks<2>(size, st, [&](const i64* off, i64 m) {
    Out* o = st[3] == 1 ? out + off[0] : ob;
    row1(o, gathered(x + off[1], st[7], m, b1), m, f);
    if (st[3] != 1) scatter(out + off[0], st[3], m, ob);
  });
}

// x * (1 + scale) + shift, each of the three ops rounded to T. Where consecutive rows share their scale row (AdaLN's
// [B, 1, C] rows), 1 + scale is computed once per row of scale rather than once per element.
template <class T, class S = typename Io<T>::S>
void modulate(S* out, const S* x, const S* scale, const S* shift, const i64* size, const i64* st) {
  using IO = Io<T>;
  const i64 n = size[3];
  if (!unit_inner<4>(st) || st[4 * 2 + 2] != 0 || size[2] < 2) {
    elementwise3(out, x, scale, shift, size, st, [](S a, S s, S h) {
      const float one_plus = IO::round(1.0f + IO::load(s));
      const float prod = IO::round(IO::load(a) * one_plus);
      return IO::store(prod + IO::load(h));
    });
    return;
  }
  std::vector<float> one_plus(static_cast<size_t>(n));
  const S* cached = nullptr;
  for_rows<4>(size, st, [&](const i64* off) {
    S* __restrict o = out + off[0];
    const S* __restrict a = x + off[1];
    const S* __restrict h = shift + off[3];
    float* __restrict op = one_plus.data();
    if (scale + off[2] != cached) {
      cached = scale + off[2];
      const S* __restrict s = cached;
      for (i64 i = 0; i < n; ++i) op[i] = IO::round(1.0f + IO::load(s[i]));
    }
    for (i64 i = 0; i < n; ++i) o[i] = IO::store(IO::round(IO::load(a[i]) * op[i]) + IO::load(h[i]));
  });
}

// residual + gate * x, the product rounded to T, then the sum.
template <class T, class S = typename Io<T>::S>
void gated_residual(S* out, const S* residual, const S* gate, const S* x, const i64* size, const i64* st) {
  using IO = Io<T>;
  elementwise3(out, residual, gate, x, size, st, [](S r, S g, S a) {
    const float prod = IO::round(IO::load(g) * IO::load(a));
    return IO::store(IO::load(r) + prod);
  });
}

// float32 x * z, rounded once to T (the cast of the product). z is stored as Z (bf16, fp16 or float32): eager's
// x * z promotes to float32, widening z exactly.
template <class T, class Z, class S = typename Io<T>::S, class ZS = typename Io<Z>::S>
void scale_to(S* out, const float* x, const ZS* z, const i64* size, const i64* st) {
  elementwise2(out, x, z, size, st, [](float a, ZS b) { return Io<T>::store(a * Io<Z>::load(b)); });
}

// ---- ReLU + interleaved RoPE on a query/key pair --------------------------------------------------------------

// F.relu of float32: negative values (and -denormals) to +0, -0.0 and NaN kept (what eager's clamp_min gives).
inline float relu(float v, const uint16_t*) { return v < 0.0f ? 0.0f : v; }
// F.relu of bf16, by one of two policies. ByTable: eager's own result, looked up in its 65,536-entry table.
// ByFormula: negative non-NaN values below -0.0 (bits 0x8001..0xFF80) to +0, everything else kept; it vectorises,
// and the Python side uses it only after relu_bf16_formula wrote it for all 65,536 inputs and that matched the
// table (NaN as NaN).
inline uint16_t relu_formula(uint16_t v) { return (v > 0x8000u && v <= 0xFF80u) ? uint16_t(0) : v; }
struct ByTable {
  const uint16_t* table;
  inline uint16_t operator()(uint16_t v) const { return table[v]; }
  inline float operator()(float v) const { return relu(v, nullptr); }
};
struct ByFormula {
  inline uint16_t operator()(uint16_t v) const { return relu_formula(v); }
  inline float operator()(float v) const { return relu(v, nullptr); }
};

// The rotated values of a pair (a, b) = (x[2i], x[2i+1]) with c = cos[2i], s = sin[2i+1], at the promoted dtype of
// Q and W as eager runs `x1 * cos - x2 * sin` (even) and `x1 * sin + x2 * cos` (odd), as the float value of the
// result stored in Q (the rotated outputs are float32 copies of it).
//
// GCC's vectoriser fuses an interleaved mul/sub/add group into vfmaddsub even under -ffp-contract=off (measured
// with gcc 12: 58 fused instructions in this file when the even and odd values were computed side by side). So
// even and odd values are never computed in one loop: the unit-stride path computes each in its own loop (every
// lane the same op, which the vectoriser leaves unfused) and interleaves afterwards; the strided path passes every
// product through a volatile, which no compiler can contract across.
template <class Q, class W>
struct Rotate {  // a float chain: Q float with W float or bf16, or Q bf16 with W float
  template <class Keep>
  static inline float even(float a, float b, float c, float s, Keep keep) {
    return Io<Q>::round(keep(a * c) - keep(b * s));
  }
  template <class Keep>
  static inline float odd(float a, float b, float c, float s, Keep keep) {
    return Io<Q>::round(keep(a * s) + keep(b * c));
  }
};
template <>
struct Rotate<BF16, BF16> {  // a bf16 chain: every product, the difference and the sum rounded to bf16
  using IO = Io<BF16>;
  template <class Keep>
  static inline float even(float a, float b, float c, float s, Keep) {
    return IO::round(IO::round(a * c) - IO::round(b * s));
  }
  template <class Keep>
  static inline float odd(float a, float b, float c, float s, Keep) {
    return IO::round(IO::round(a * s) + IO::round(b * c));
  }
};
template <class Q>
struct Rotate<Q, double> {  // a double chain, rounded double -> float (-> bf16) at the store, as c10 converts
  template <class Keep>
  static inline float even(float a, float b, double c, double s, Keep keep) {
    return Io<Q>::round(static_cast<float>(keep(double(a) * c) - keep(double(b) * s)));
  }
  template <class Keep>
  static inline float odd(float a, float b, double c, double s, Keep keep) {
    return Io<Q>::round(static_cast<float>(keep(double(a) * s) + keep(double(b) * c)));
  }
};

// How a RoPE table element is read: bf16 and float widen to float, double stays double.
template <class W> struct Table {
  using S = typename Io<W>::S;
  static inline float load(S v) { return Io<W>::load(v); }
};
template <> struct Table<double> {
  using S = double;
  static inline double load(double v) { return v; }
};

struct Pass {  // the unit-stride loops: the value as it is
  template <class T>
  inline T operator()(T v) const { return v; }
};
struct Opaque {  // the strided loop: a value the compiler must materialise, so nothing is contracted across it
  template <class T>
  inline T operator()(T v) const {
    volatile T kept = v;
    return kept;
  }
};

constexpr i64 kBlock = 64;  // pairs per block of the unit-stride path

// A rotated value (already the float value of its rounding to Q) as a Z element: float32 as it is (relu_rope's
// float32 copies), or stored in Q (rope's outputs in the query's dtype; storing a value exactly representable in Q
// is exact).
template <class Q, class Z>
inline Z put(float v) {
  if constexpr (std::is_same<Z, float>::value) {
    return v;
  } else {
    return Io<Q>::store(v);
  }
}

// Which table entries a pair reads and the dtype its chain runs in. Paired (Wan, SANA-Video): both outputs of pair
// (2i, 2i+1) read cos[2i] and sin[2i+1], the chain in the dtype x and the tables promote to. PerChannel
// (HunyuanVideo 1.5, LTX-2: x.float() * cos + x_rotated.float() * sin): output 2i reads cos[2i] and sin[2i], output
// 2i+1 cos[2i+1] and sin[2i+1], the chain in float32 (float64 with float64 tables) whatever x's dtype.
struct Paired {
  static constexpr i64 even_sin = 1, odd_cos = 0;
  template <class Q> using Chain = Q;
};
struct PerChannel {
  static constexpr i64 even_sin = 0, odd_cos = 1;
  template <class Q> using Chain = float;
};

// Rotates `pairs` pairs of the unit-stride row y into z (float, or the query's storage type), with tables c and s
// read as mode M says.
template <class Q, class W, class Z = float, class M = Paired, class QS = typename Io<Q>::S,
          class WS = typename Table<W>::S>
inline void rotate_row(const QS* __restrict y, const WS* __restrict c, const WS* __restrict s, Z* __restrict z,
                       i64 pairs) {
  using R = Rotate<typename M::template Chain<Q>, W>;
  float ev[kBlock], od[kBlock];
  for (i64 p0 = 0; p0 < pairs; p0 += kBlock) {
    const i64 m = pairs - p0 < kBlock ? pairs - p0 : kBlock;
    const QS* yb = y + 2 * p0;
    const WS* cb = c + 2 * p0;
    const WS* sb = s + 2 * p0;
    for (i64 j = 0; j < m; ++j)
      ev[j] = R::even(Io<Q>::load(yb[2 * j]), Io<Q>::load(yb[2 * j + 1]), Table<W>::load(cb[2 * j]),
                      Table<W>::load(sb[2 * j + M::even_sin]), Pass());
    for (i64 j = 0; j < m; ++j)
      od[j] = R::odd(Io<Q>::load(yb[2 * j]), Io<Q>::load(yb[2 * j + 1]), Table<W>::load(cb[2 * j + M::odd_cos]),
                     Table<W>::load(sb[2 * j + 1]), Pass());
    Z* zb = z + 2 * p0;
    for (i64 j = 0; j < m; ++j) {
      zb[2 * j] = put<Q, Z>(ev[j]);
      zb[2 * j + 1] = put<Q, Z>(od[j]);
    }
  }
}

// Tensors: 0 query, 1 key, 2 cos, 3 sin, 4 relu(query), 5 relu(key), 6 rotated query (float), 7 rotated key.
// size = (B, N, H, D/2); st[4 * t + 3] is tensor t's stride along D: pair p sits at 2p and 2p + 1 times it.
template <class Q, class W, class Relu, class QS = typename Io<Q>::S, class WS = typename Table<W>::S>
void relu_rope(const QS* q, const QS* k, const WS* cosv, const WS* sinv, QS* rq, QS* rk, float* oq, float* ok,
               Relu relu, const i64* size, const i64* st) {
  const i64 pairs = size[3];
  if (unit_inner<8>(st)) {
    for_rows<8>(size, st, [&](const i64* off) {
      const QS* __restrict xq = q + off[0];
      const QS* __restrict xk = k + off[1];
      QS* __restrict yq = rq + off[4];
      QS* __restrict yk = rk + off[5];
      for (i64 i = 0; i < 2 * pairs; ++i) {
        yq[i] = relu(xq[i]);
        yk[i] = relu(xk[i]);
      }
      rotate_row<Q, W>(yq, cosv + off[2], sinv + off[3], oq + off[6], pairs);
      rotate_row<Q, W>(yk, cosv + off[2], sinv + off[3], ok + off[7], pairs);
    });
  } else {
    i64 s[8];
    for (int t = 0; t < 8; ++t) s[t] = st[4 * t + 3];
    for_rows<8>(size, st, [&](const i64* off) {
      for (i64 p = 0; p < pairs; ++p) {
        const i64 e = 2 * p, o = 2 * p + 1;
        const auto cp = Table<W>::load(cosv[off[2] + e * s[2]]);
        const auto sp = Table<W>::load(sinv[off[3] + o * s[3]]);
        const QS a = relu(q[off[0] + e * s[0]]), b = relu(q[off[0] + o * s[0]]);
        const QS ka = relu(k[off[1] + e * s[1]]), kb = relu(k[off[1] + o * s[1]]);
        rq[off[4] + e * s[4]] = a;
        rq[off[4] + o * s[4]] = b;
        rk[off[5] + e * s[5]] = ka;
        rk[off[5] + o * s[5]] = kb;
        const float fa = Io<Q>::load(a), fb = Io<Q>::load(b), fka = Io<Q>::load(ka), fkb = Io<Q>::load(kb);
        oq[off[6] + e * s[6]] = Rotate<Q, W>::even(fa, fb, cp, sp, Opaque());
        oq[off[6] + o * s[6]] = Rotate<Q, W>::odd(fa, fb, cp, sp, Opaque());
        ok[off[7] + e * s[7]] = Rotate<Q, W>::even(fka, fkb, cp, sp, Opaque());
        ok[off[7] + o * s[7]] = Rotate<Q, W>::odd(fka, fkb, cp, sp, Opaque());
      }
    });
  }
}

// Interleaved RoPE of a query/key pair without the ReLU (Wan's self-attention with M = Paired; HunyuanVideo 1.5's
// and LTX-2's with M = PerChannel): relu_rope's rotation loops, the results stored in the query's dtype. Tensors:
// 0 query, 1 key, 2 cos, 3 sin, 4 rotated query, 5 rotated key; size = (B, N, H, D/2) and strides as for relu_rope.
template <class Q, class W, class M = Paired, class QS = typename Io<Q>::S, class WS = typename Table<W>::S>
void rope(const QS* q, const QS* k, const WS* cosv, const WS* sinv, QS* oq, QS* ok, const i64* size, const i64* st) {
  using R = Rotate<typename M::template Chain<Q>, W>;
  const i64 pairs = size[3];
  if (unit_inner<6>(st)) {
    for_rows<6>(size, st, [&](const i64* off) {
      rotate_row<Q, W, QS, M>(q + off[0], cosv + off[2], sinv + off[3], oq + off[4], pairs);
      rotate_row<Q, W, QS, M>(k + off[1], cosv + off[2], sinv + off[3], ok + off[5], pairs);
    });
  } else {
    i64 s[6];
    for (int t = 0; t < 6; ++t) s[t] = st[4 * t + 3];
    for_rows<6>(size, st, [&](const i64* off) {
      for (i64 p = 0; p < pairs; ++p) {
        const i64 e = 2 * p, o = 2 * p + 1;
        const auto ce = Table<W>::load(cosv[off[2] + e * s[2]]);
        const auto so = Table<W>::load(sinv[off[3] + o * s[3]]);
        const auto se = Table<W>::load(sinv[off[3] + (e + M::even_sin) * s[3]]);
        const auto co = Table<W>::load(cosv[off[2] + (e + M::odd_cos) * s[2]]);
        const float a = Io<Q>::load(q[off[0] + e * s[0]]), b = Io<Q>::load(q[off[0] + o * s[0]]);
        const float ka = Io<Q>::load(k[off[1] + e * s[1]]), kb = Io<Q>::load(k[off[1] + o * s[1]]);
        oq[off[4] + e * s[4]] = Io<Q>::store(R::even(a, b, ce, se, Opaque()));
        oq[off[4] + o * s[4]] = Io<Q>::store(R::odd(a, b, co, so, Opaque()));
        ok[off[5] + e * s[5]] = Io<Q>::store(R::even(ka, kb, ce, se, Opaque()));
        ok[off[5] + o * s[5]] = Io<Q>::store(R::odd(ka, kb, co, so, Opaque()));
      }
    });
  }
}

// ---- rotate-half RoPE on a query/key pair: MiniMax-H3's, and LTX-2.3's split RoPE ------------------------------

// The rounding policies of the rotate-half loops: how x * c + rotated * s becomes the float value stored in Q.
// InQ (MiniMax-H3: cos.to(x.dtype), products and the sum in x's dtype): each product rounded to Q, the sum
// rounded by the store. SplitMulAdd / SplitFma (LTX-2.3's apply_split_rotary_emb: x.float() * cos, then
// addcmul_(+-sin, partner) in float32, cast to Q): the product x * c rounded to float, then the sum with
// rotated * s as eager's addcmul_ computes it: that product rounded first (SplitMulAdd) or kept exact in an fma
// (SplitFma: this CPU's eager addcmul_, probed by accelpatch.ops.fused.addcmul). The explicit std::fma is the only
// contraction; -ffp-contract=off keeps the rest apart.
struct InQ {
  static constexpr bool split = false;
  template <class Q>
  static inline float sum(float x, float c, float y, float s) { return Io<Q>::round(x * c) + Io<Q>::round(y * s); }
};
struct SplitMulAdd {
  static constexpr bool split = true;
  template <class Q>
  static inline float sum(float x, float c, float y, float s) { return x * c + y * s; }
};
struct SplitFma {
  static constexpr bool split = true;
  template <class Q>
  static inline float sum(float x, float c, float y, float s) { return std::fma(y, s, x * c); }
};

// One row of D channels: the first 2 * half rotated by halves (out[i] = x[i] * c_lo[i] + (-x[i + half]) * s_lo[i],
// out[i + half] = x[i + half] * c_hi[i] + x[i] * s_hi[i]) as policy P rounds, stored in Q; the rest copied bit for
// bit (MiniMax's cat). MiniMax's tables hold an entry per channel (c_hi = c_lo + half), the split RoPE's one per
// pair (c_hi = c_lo). Each half in its own loop: every lane does the same ops, nothing the vectoriser could fuse.
template <class Q, class P, class QS = typename Io<Q>::S>
static void rotate_half_row(QS* __restrict o, const QS* __restrict x, const float* __restrict c_lo,
                            const float* __restrict c_hi, const float* __restrict s_lo,
                            const float* __restrict s_hi, i64 half, i64 d) {
  using IO = Io<Q>;
  for (i64 i = 0; i < half; ++i)
    o[i] = IO::store(P::template sum<Q>(IO::load(x[i]), c_lo[i], -IO::load(x[i + half]), s_lo[i]));
  for (i64 i = 0; i < half; ++i)
    o[i + half] = IO::store(P::template sum<Q>(IO::load(x[i + half]), c_hi[i], IO::load(x[i]), s_hi[i]));
  for (i64 i = 2 * half; i < d; ++i) o[i] = x[i];
}

// size = (B, S, H, D, R, table rows); st = query, key, cos, sin, out query, out key: 4 element strides each, along
// (B, S, H, D) for x and (B, S, H, table entry) for the tables; the outputs have unit stride along D. A row whose
// x is strided along D is gathered first. InQ (MiniMax): [rows, R] tables (rows 1 or S, strides along B and H 0)
// rounded to Q once per call. Split policies: each (b, s, h) reads its own row of R / 2 entries, float32 as it is
// where unit-stride, else widened into a buffer.
template <class Q, class W, class P, class QS = typename Io<Q>::S, class WS = typename Io<W>::S>
void rotate_half(const QS* q, const QS* k, const WS* cosv, const WS* sinv, QS* oq, QS* ok, const i64* size,
                 const i64* st) {
  const i64 d = size[3], r = size[4], rows = size[5], half = r / 2;
  const i64* sc = st + 8;
  const i64* ss = st + 12;
  const i64 kept = P::split ? half : rows * r;
  std::vector<float> ct(static_cast<size_t>(kept)), sn(static_cast<size_t>(kept));
  if constexpr (!P::split) {
    for (i64 t = 0; t < rows; ++t)
      for (i64 j = 0; j < r; ++j) {
        ct[t * r + j] = Io<Q>::round(Io<W>::load(cosv[t * sc[1] + j * sc[3]]));
        sn[t * r + j] = Io<Q>::round(Io<W>::load(sinv[t * ss[1] + j * ss[3]]));
      }
  }
  std::vector<QS> buf(static_cast<size_t>(d));
  const QS* xs[2] = {q, k};
  QS* os[2] = {oq, ok};
  for (i64 b = 0; b < size[0]; ++b)
    for (i64 p = 0; p < size[1]; ++p)
      for (i64 h = 0; h < size[2]; ++h) {
        const float *c_lo, *c_hi, *s_lo, *s_hi;
        if constexpr (P::split) {
          const WS* cr = cosv + b * sc[0] + p * sc[1] + h * sc[2];
          const WS* sr = sinv + b * ss[0] + p * ss[1] + h * ss[2];
          if constexpr (std::is_same<W, float>::value) {
            c_lo = cr;
            s_lo = sr;
            if (sc[3] != 1) {
              for (i64 j = 0; j < half; ++j) ct[j] = cr[j * sc[3]];
              c_lo = ct.data();
            }
            if (ss[3] != 1) {
              for (i64 j = 0; j < half; ++j) sn[j] = sr[j * ss[3]];
              s_lo = sn.data();
            }
          } else {
            for (i64 j = 0; j < half; ++j) ct[j] = Io<W>::load(cr[j * sc[3]]);
            for (i64 j = 0; j < half; ++j) sn[j] = Io<W>::load(sr[j * ss[3]]);
            c_lo = ct.data();
            s_lo = sn.data();
          }
          c_hi = c_lo;
          s_hi = s_lo;
        } else {
          c_lo = ct.data() + (rows == 1 ? 0 : p) * r;
          s_lo = sn.data() + (rows == 1 ? 0 : p) * r;
          c_hi = c_lo + half;
          s_hi = s_lo + half;
        }
        for (int t = 0; t < 2; ++t) {
          const i64* sx = st + 4 * t;
          const i64* so = st + 16 + 4 * t;
          const QS* x = xs[t] + b * sx[0] + p * sx[1] + h * sx[2];
          if (sx[3] != 1) {
            for (i64 i = 0; i < d; ++i) buf[i] = x[i * sx[3]];
            x = buf.data();
          }
          rotate_half_row<Q, P>(os[t] + b * so[0] + p * so[1] + h * so[2], x, c_lo, c_hi, s_lo, s_hi, half, d);
        }
      }
}

// ---- SANA-Video 2.0's complex RoPE on a query/key pair ---------------------------------------------------------

// x's dtype to and from double as eager converts: widening is exact; narrowing goes double -> float (-> bf16), c10
// having no direct double -> bf16 rounding.
template <class Q> struct Wide {
  using S = typename Io<Q>::S;
  static inline double load(S v) { return static_cast<double>(Io<Q>::load(v)); }
  static inline S store(double v) { return Io<Q>::store(static_cast<float>(v)); }
};
template <> struct Wide<double> {
  using S = double;
  static inline double load(double v) { return v; }
  static inline double store(double v) { return v; }
};

// The factors of one token's row of complex128 values f (re, im interleaved) in the form complex_row uses:
// c = (re, re) and s = (-im, im) per pair.
static void complex_factors(const double* __restrict f, double* __restrict c, double* __restrict s, i64 pairs) {
  for (i64 j = 0; j < pairs; ++j) {
    c[2 * j] = f[2 * j];
    c[2 * j + 1] = f[2 * j];
    s[2 * j] = -f[2 * j + 1];
    s[2 * j + 1] = f[2 * j + 1];
  }
}

// Pairs of a unit-stride row times complex factors: eager's complex multiply (a + bi)(c + di) = (ac - bd) +
// (ad + bc)i with every product and the sum/difference rounded in double, computed as ac + b(-d) and bc + ad
// (bit for bit the same: a product's rounding is symmetric and x - y is x + (-y)). So every lane does the same
// mul, mul, add, and the vectoriser has no mul/sub/add group to fuse into vfmaddsub (which gcc 12 does even under
// -ffp-contract=off). Widened in one unit-stride loop, narrowed in another.
template <class Q, class QS = typename Wide<Q>::S>
static void complex_row(QS* __restrict o, const QS* __restrict x, const double* __restrict c,
                        const double* __restrict s, i64 pairs) {
  using W = Wide<Q>;
  double xd[2 * kBlock], yd[2 * kBlock];
  for (i64 p0 = 0; p0 < pairs; p0 += kBlock) {
    const i64 m = pairs - p0 < kBlock ? pairs - p0 : kBlock;
    const QS* xb = x + 2 * p0;
    const double* cb = c + 2 * p0;
    const double* sb = s + 2 * p0;
    for (i64 i = 0; i < 2 * m; ++i) xd[i] = W::load(xb[i]);
    for (i64 j = 0; j < m; ++j) {
      yd[2 * j] = xd[2 * j] * cb[2 * j] + xd[2 * j + 1] * sb[2 * j];
      yd[2 * j + 1] = xd[2 * j + 1] * cb[2 * j + 1] + xd[2 * j] * sb[2 * j + 1];
    }
    QS* ob = o + 2 * p0;
    for (i64 i = 0; i < 2 * m; ++i) ob[i] = W::store(yd[i]);
  }
}

// Tensors: 0 query, 1 key, 2 freqs (as doubles: element stride 2 per complex step, imaginary part at +1), 3 out
// query, 4 out key. size = (three outer dims in the outputs' memory order, D/2); st[4 * t + 3] is tensor t's
// stride along D (per pair for freqs): pair p of x sits at 2p and 2p + 1 times it.
template <class Q, class QS = typename Wide<Q>::S>
void rotary_complex(const QS* q, const QS* k, const double* f, QS* oq, QS* ok, const i64* size, const i64* st) {
  using W = Wide<Q>;
  const i64 pairs = size[3];
  const bool unit = st[3] == 1 && st[7] == 1 && st[11] == 2 && st[15] == 1 && st[19] == 1;
  std::vector<double> factors(unit ? static_cast<size_t>(4 * pairs) : 0);
  const double* factored = nullptr;  // the table row `factors` holds
  for_rows<5>(size, st, [&](const i64* off) {
    if (unit) {
      double* c = factors.data();
      double* s = c + 2 * pairs;
      if (f + off[2] != factored) {
        factored = f + off[2];
        complex_factors(factored, c, s, pairs);
      }
      complex_row<Q>(oq + off[3], q + off[0], c, s, pairs);
      complex_row<Q>(ok + off[4], k + off[1], c, s, pairs);
      return;
    }
    const QS* xs[2] = {q + off[0], k + off[1]};
    QS* os[2] = {oq + off[3], ok + off[4]};
    const double* fr = f + off[2];
    const Opaque keep;
    for (int t = 0; t < 2; ++t) {
      const i64 sx = st[4 * t + 3], so = st[4 * (3 + t) + 3];
      for (i64 p = 0; p < pairs; ++p) {
        const double a = W::load(xs[t][2 * p * sx]), b = W::load(xs[t][(2 * p + 1) * sx]);
        const double c = fr[p * st[11]], d = fr[p * st[11] + 1];
        os[t][2 * p * so] = W::store(keep(a * c) - keep(b * d));
        os[t][(2 * p + 1) * so] = W::store(keep(a * d) + keep(b * c));
      }
    }
  });
}

// The bf16 tables of table_bf16 and glu_gate_bf16 hold each 16-bit result zero-extended to 32 bits (256 KiB): a
// 32-bit table lets the loop vectorise around the lookups (1.6x faster than 16-bit lookups, measured here).
// Unit-stride rows of those two ops, as functions of restrict pointers: in this form gcc vectorises the loop
// around the 32-bit lookups (measured: SiLU of [5, 2240, 8, 8] 313 -> 230 us against the same loop in a lambda).
void lookup_row(uint16_t* __restrict o, const uint16_t* __restrict a, const uint32_t* __restrict t, i64 n) {
  for (i64 i = 0; i < n; ++i) o[i] = static_cast<uint16_t>(t[a[i]]);
}
void glu_row(uint16_t* __restrict o, const uint16_t* __restrict a, const uint16_t* __restrict g,
             const uint32_t* __restrict t, i64 n) {
  using IO = Io<BF16>;
  for (i64 i = 0; i < n; ++i) o[i] = IO::store(IO::load(a[i]) * IO::load(static_cast<uint16_t>(t[g[i]])));
}

}  // namespace

// ---- the entry points (cpu_kernels.h): each picks the instantiation for its dtypes, false where there is none --

namespace accelpatch_kernels {

namespace {

template <class... Ts> struct Types {};
template <class T> constexpr Dt dt_of();
template <> constexpr Dt dt_of<float>() { return Dt::f32; }
template <> constexpr Dt dt_of<BF16>() { return Dt::bf16; }
template <> constexpr Dt dt_of<F16>() { return Dt::f16; }
template <> constexpr Dt dt_of<double>() { return Dt::f64; }

// Calls f with a value of the kernel type (float, BF16, F16, double) among Ts whose dtype is t; false for none.
template <class... Ts, class F>
bool with_type(Dt t, Types<Ts...>, F&& f) {
  bool done = false;
  ((!done && t == dt_of<Ts>() ? (f(Ts{}), done = true) : false), ...);
  return done;
}

using Floats = Types<float, BF16, F16>;

// Calls f with values of the kernel types of q and w (the activations' and the tables' dtypes) among QTypes and
// WTypes; false where either is not among them.
template <class QTypes, class WTypes, class F>
bool with_pair(Dt q, Dt w, QTypes qs, WTypes ws, F&& f) {
  bool done = false;
  with_type(q, qs, [&](auto qtag) { done = with_type(w, ws, [&](auto wtag) { f(qtag, wtag); }); });
  return done;
}

}  // namespace

bool modulate(Dt t, void* out, const void* x, const void* scale, const void* shift, const i64* size, const i64* st) {
  return with_type(t, Floats{}, [&](auto tag) {
    using T = decltype(tag);
    using S = typename Io<T>::S;
    ::modulate<T>(static_cast<S*>(out), static_cast<const S*>(x), static_cast<const S*>(scale),
                  static_cast<const S*>(shift), size, st);
  });
}

bool gated_residual(Dt t, void* out, const void* residual, const void* gate, const void* x, const i64* size,
                    const i64* st) {
  return with_type(t, Floats{}, [&](auto tag) {
    using T = decltype(tag);
    using S = typename Io<T>::S;
    ::gated_residual<T>(static_cast<S*>(out), static_cast<const S*>(residual), static_cast<const S*>(gate),
                        static_cast<const S*>(x), size, st);
  });
}

bool scale_to(Dt ot, Dt zt, void* out, const float* x, const void* z, const i64* size, const i64* st) {
  return with_pair(ot, zt, Types<BF16, F16>{}, Floats{}, [&](auto otag, auto ztag) {
    using T = decltype(otag);
    using Z = decltype(ztag);
    ::scale_to<T, Z>(static_cast<uint16_t*>(out), x, static_cast<const typename Io<Z>::S*>(z), size, st);
  });
}

void table_bf16(uint16_t* out, const uint16_t* x, const uint32_t* table, const i64* size, const i64* st) {
  if (!unit_inner<2>(st)) {
    elementwise1(out, x, size, st, [table](uint16_t v) { return static_cast<uint16_t>(table[v]); });
    return;
  }
  const i64 n = size[3];
  for_rows<2>(size, st, [&](const i64* off) { lookup_row(out + off[0], x + off[1], table, n); });
}

void glu_gate_bf16(uint16_t* out, const uint16_t* x, const uint16_t* gate, const uint32_t* table, const i64* size,
                   const i64* st) {
  using IO = Io<BF16>;
  if (!unit_inner<3>(st)) {
    elementwise2(out, x, gate, size, st, [table](uint16_t a, uint16_t g) {
      return IO::store(IO::load(a) * IO::load(static_cast<uint16_t>(table[g])));
    });
    return;
  }
  const i64 n = size[3];
  for_rows<3>(size, st, [&](const i64* off) { glu_row(out + off[0], x + off[1], gate + off[2], table, n); });
}

// The pointers of a q/k pair kernel's tensors as its types: query, key, cos, sin, then the two outputs in Q.
template <class Q, class W, class QS = typename Io<Q>::S, class WS = typename Table<W>::S>
auto pair_args(const void* qp, const void* kp, const void* c, const void* s, void* oq, void* ok) {
  return std::make_tuple(static_cast<const QS*>(qp), static_cast<const QS*>(kp), static_cast<const WS*>(c),
                         static_cast<const WS*>(s), static_cast<QS*>(oq), static_cast<QS*>(ok));
}

bool relu_rope(Dt q, Dt w, const void* qp, const void* kp, const void* c, const void* s, void* rq, void* rk,
               float* oq, float* ok, const uint16_t* table, const i64* size, const i64* st) {
  return with_pair(q, w, Types<BF16, float>{}, Types<BF16, float, double>{}, [&](auto qtag, auto wtag) {
    using Q = decltype(qtag);
    using W = decltype(wtag);
    const auto args = std::tuple_cat(pair_args<Q, W>(qp, kp, c, s, rq, rk), std::make_tuple(oq, ok));
    if (table)
      std::apply([&](auto... a) { ::relu_rope<Q, W>(a..., ByTable{table}, size, st); }, args);
    else
      std::apply([&](auto... a) { ::relu_rope<Q, W>(a..., ByFormula{}, size, st); }, args);
  });
}

bool rope(Dt q, Dt w, bool per_channel, const void* qp, const void* kp, const void* c, const void* s, void* oq,
          void* ok, const i64* size, const i64* st) {
  return with_pair(q, w, Types<BF16, float>{}, Types<BF16, float, double>{}, [&](auto qtag, auto wtag) {
    using Q = decltype(qtag);
    using W = decltype(wtag);
    const auto args = std::tuple_cat(pair_args<Q, W>(qp, kp, c, s, oq, ok), std::make_tuple(size, st));
    if (per_channel)
      std::apply(::rope<Q, W, PerChannel>, args);
    else
      std::apply(::rope<Q, W, Paired>, args);
  });
}

bool rotate_half(Dt q, Dt w, RotateHalf policy, const void* qp, const void* kp, const void* c, const void* s, void* oq,
                 void* ok, const i64* size, const i64* st) {
  // the instantiations the models need: MiniMax-H3's bf16/fp16/float32 activations with float32 or bf16 tables;
  // the split RoPE's likewise, but fp16 activations with float32 tables only
  if (policy != RotateHalf::in_q && q == Dt::f16 && w != Dt::f32) return false;
  return with_pair(q, w, Floats{}, Types<float, BF16>{}, [&](auto qtag, auto wtag) {
    using Q = decltype(qtag);
    using W = decltype(wtag);
    const auto args = std::tuple_cat(pair_args<Q, W>(qp, kp, c, s, oq, ok), std::make_tuple(size, st));
    switch (policy) {
      case RotateHalf::in_q: std::apply(::rotate_half<Q, W, InQ>, args); break;
      case RotateHalf::split_mul_add: std::apply(::rotate_half<Q, W, SplitMulAdd>, args); break;
      case RotateHalf::split_fma: std::apply(::rotate_half<Q, W, SplitFma>, args); break;
    }
  });
}

bool rotary_complex(Dt q, const void* qp, const void* kp, const double* f, void* oq, void* ok, const i64* size,
                    const i64* st) {
  return with_type(q, Types<BF16, float, double>{}, [&](auto qtag) {
    using Q = decltype(qtag);
    using QS = typename Wide<Q>::S;
    ::rotary_complex<Q>(static_cast<const QS*>(qp), static_cast<const QS*>(kp), f, static_cast<QS*>(oq),
                        static_cast<QS*>(ok), size, st);
  });
}

void relu_bf16_formula(uint16_t* out) {
  for (uint32_t i = 0; i < 65536u; ++i) out[i] = relu_formula(static_cast<uint16_t>(i));
}

i64 check_bf16_rounding(uint32_t first, i64 count) {
  i64 differ = 0;
  for (i64 i = 0; i < count; ++i) {
    const uint32_t u = first + static_cast<uint32_t>(i);
    const float v = f32_from_bits(u);
    const uint16_t mine = Io<BF16>::store(v), theirs = c10::BFloat16(v).x;
    const bool both_nan = (mine & 0x7FFF) > 0x7F80 && (theirs & 0x7FFF) > 0x7F80;
    differ += (mine != theirs && !both_nan) ? 1 : 0;
  }
  return differ;
}

}  // namespace accelpatch_kernels
