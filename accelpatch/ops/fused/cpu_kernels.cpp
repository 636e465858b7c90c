// CPU kernels of the lossless fused ops (accelpatch/ops/fused/cpu.py drives them through ctypes).
//
// Each kernel reproduces an eager chain of accelpatch/ops/fused/reference.py bit for bit: bf16/fp16 values are
// widened to float, every op is computed in float and rounded back to the storage dtype, exactly where eager
// stores a tensor; mixed bf16 x float chains run in float (or double) and round only at the store, and
// double -> bf16 goes through float as c10 does. The rounding is c10's own (its headers are included), and the file
// must be compiled with -ffp-contract=off -fno-fast-math: a contracted FMA would round differently from eager.
//
// Iteration spaces are at most 4-D; each tensor comes with 4 element strides (0 = broadcast), so any layout
// works. The innermost dimension gets a unit-stride path the compiler can vectorise.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace {

using i64 = int64_t;
using bf16 = c10::BFloat16;
using f16 = c10::Half;

inline float widen(float v) { return v; }
inline float widen(bf16 v) { return static_cast<float>(v); }
inline float widen(f16 v) { return static_cast<float>(v); }

template <class T> inline T narrow(float v);
template <> inline float narrow<float>(float v) { return v; }
template <> inline bf16 narrow<bf16>(float v) { return bf16(v); }
template <> inline f16 narrow<f16>(float v) { return f16(v); }

// double -> storage dtype the way eager's copy does it: to float first (c10 has no double constructor).
template <class T> inline T narrow_double(double v) { return narrow<T>(static_cast<float>(v)); }

inline bf16 from_bits(uint16_t b) { return bf16(b, bf16::from_bits()); }

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

// An element-wise op on NT tensors (tensor 0 is the output): `f(i, p0, p1, ...)` computes element i of a row
// whose pointers are given; called with unit strides where every tensor's innermost stride is 1.
template <class Out, class In1, class In2, class In3, class F>
inline void elementwise3(Out* out, const In1* x, const In2* y, const In3* z, const i64* size, const i64* st, F f) {
  const i64 n = size[3];
  if (unit_inner<4>(st)) {
    for_rows<4>(size, st, [&](const i64* off) {
      Out* __restrict o = out + off[0];
      const In1* __restrict a = x + off[1];
      const In2* __restrict b = y + off[2];
      const In3* __restrict c = z + off[3];
      for (i64 i = 0; i < n; ++i) o[i] = f(a[i], b[i], c[i]);
    });
  } else {
    const i64 s0 = st[3], s1 = st[7], s2 = st[11], s3 = st[15];
    for_rows<4>(size, st, [&](const i64* off) {
      Out* o = out + off[0];
      const In1* a = x + off[1];
      const In2* b = y + off[2];
      const In3* c = z + off[3];
      for (i64 i = 0; i < n; ++i) o[i * s0] = f(a[i * s1], b[i * s2], c[i * s3]);
    });
  }
}

template <class Out, class In1, class In2, class F>
inline void elementwise2(Out* out, const In1* x, const In2* y, const i64* size, const i64* st, F f) {
  const i64 n = size[3];
  if (unit_inner<3>(st)) {
    for_rows<3>(size, st, [&](const i64* off) {
      Out* __restrict o = out + off[0];
      const In1* __restrict a = x + off[1];
      const In2* __restrict b = y + off[2];
      for (i64 i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
    });
  } else {
    const i64 s0 = st[3], s1 = st[7], s2 = st[11];
    for_rows<3>(size, st, [&](const i64* off) {
      Out* o = out + off[0];
      const In1* a = x + off[1];
      const In2* b = y + off[2];
      for (i64 i = 0; i < n; ++i) o[i * s0] = f(a[i * s1], b[i * s2]);
    });
  }
}

template <class Out, class In1, class F>
inline void elementwise1(Out* out, const In1* x, const i64* size, const i64* st, F f) {
  const i64 n = size[3];
  if (unit_inner<2>(st)) {
    for_rows<2>(size, st, [&](const i64* off) {
      Out* __restrict o = out + off[0];
      const In1* __restrict a = x + off[1];
      for (i64 i = 0; i < n; ++i) o[i] = f(a[i]);
    });
  } else {
    const i64 s0 = st[3], s1 = st[7];
    for_rows<2>(size, st, [&](const i64* off) {
      Out* o = out + off[0];
      const In1* a = x + off[1];
      for (i64 i = 0; i < n; ++i) o[i * s0] = f(a[i * s1]);
    });
  }
}

// x * (1 + scale) + shift, each of the three ops rounded to T.
template <class T>
void modulate(T* out, const T* x, const T* scale, const T* shift, const i64* size, const i64* st) {
  elementwise3(out, x, scale, shift, size, st, [](T a, T s, T h) {
    const T one_plus = narrow<T>(1.0f + widen(s));
    const T prod = narrow<T>(widen(a) * widen(one_plus));
    return narrow<T>(widen(prod) + widen(h));
  });
}

// residual + gate * x, the product rounded to T, then the sum.
template <class T>
void gated_residual(T* out, const T* residual, const T* gate, const T* x, const i64* size, const i64* st) {
  elementwise3(out, residual, gate, x, size, st, [](T r, T g, T a) {
    const T prod = narrow<T>(widen(g) * widen(a));
    return narrow<T>(widen(r) + widen(prod));
  });
}

// float32 x * z, rounded once to T (the cast of the product).
template <class T>
void scale_to(T* out, const float* x, const float* z, const i64* size, const i64* st) {
  elementwise2(out, x, z, size, st, [](float a, float b) { return narrow<T>(a * b); });
}

// ---- ReLU + interleaved RoPE on a query/key pair --------------------------------------------------------------

// F.relu of float32: negative values (and -denormals) to +0, -0.0 and NaN kept (what eager's clamp_min gives).
inline float relu(float v, const uint16_t*) { return v < 0.0f ? 0.0f : v; }
// F.relu of bf16: eager's own result, looked up in its 65,536-entry table.
inline bf16 relu(bf16 v, const uint16_t* table) { return from_bits(table[v.x]); }

// The rotated values of a pair (a, b) = (x[2i], x[2i+1]) with c = cos[2i], s = sin[2i+1], stored in Q, at the
// promoted dtype of Q and W as eager runs `x1 * cos - x2 * sin` (even) and `x1 * sin + x2 * cos` (odd).
//
// GCC's vectoriser fuses an interleaved mul/sub/add group into vfmaddsub even under -ffp-contract=off (measured
// with gcc 12: 58 fused instructions in this file when the even and odd values were computed side by side). So
// even and odd values are never computed in one loop: the unit-stride path computes each in its own loop (every
// lane the same op, which the vectoriser leaves unfused) and interleaves afterwards; the strided path passes every
// product through a volatile, which no compiler can contract across.
template <class Q, class W>
struct Rotate {  // a float chain: Q float with W float or bf16, or Q bf16 with W float
  template <class Keep>
  static inline Q even(Q a, Q b, W c, W s, Keep keep) { return narrow<Q>(keep(widen(a) * widen(c)) - keep(widen(b) * widen(s))); }
  template <class Keep>
  static inline Q odd(Q a, Q b, W c, W s, Keep keep) { return narrow<Q>(keep(widen(a) * widen(s)) + keep(widen(b) * widen(c))); }
};
template <>
struct Rotate<bf16, bf16> {  // a bf16 chain: every product, the difference and the sum rounded to bf16
  static inline float mul(bf16 x, bf16 y) { return widen(narrow<bf16>(widen(x) * widen(y))); }
  template <class Keep>
  static inline bf16 even(bf16 a, bf16 b, bf16 c, bf16 s, Keep) { return narrow<bf16>(mul(a, c) - mul(b, s)); }
  template <class Keep>
  static inline bf16 odd(bf16 a, bf16 b, bf16 c, bf16 s, Keep) { return narrow<bf16>(mul(a, s) + mul(b, c)); }
};
template <class Q>
struct Rotate<Q, double> {  // a double chain, rounded double -> float (-> bf16) at the store
  template <class Keep>
  static inline Q even(Q a, Q b, double c, double s, Keep keep) {
    return narrow_double<Q>(keep(double(widen(a)) * c) - keep(double(widen(b)) * s));
  }
  template <class Keep>
  static inline Q odd(Q a, Q b, double c, double s, Keep keep) {
    return narrow_double<Q>(keep(double(widen(a)) * s) + keep(double(widen(b)) * c));
  }
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

// Rotates `pairs` pairs of the unit-stride row y into float z, with tables c (even entries) and s (odd entries).
template <class Q, class W>
inline void rotate_row(const Q* __restrict y, const W* __restrict c, const W* __restrict s, float* __restrict z,
                       i64 pairs) {
  Q ev[kBlock], od[kBlock];
  for (i64 p0 = 0; p0 < pairs; p0 += kBlock) {
    const i64 m = pairs - p0 < kBlock ? pairs - p0 : kBlock;
    const Q* yb = y + 2 * p0;
    const W* cb = c + 2 * p0;
    const W* sb = s + 2 * p0;
    for (i64 j = 0; j < m; ++j) ev[j] = Rotate<Q, W>::even(yb[2 * j], yb[2 * j + 1], cb[2 * j], sb[2 * j + 1], Pass());
    for (i64 j = 0; j < m; ++j) od[j] = Rotate<Q, W>::odd(yb[2 * j], yb[2 * j + 1], cb[2 * j], sb[2 * j + 1], Pass());
    float* zb = z + 2 * p0;
    for (i64 j = 0; j < m; ++j) {
      zb[2 * j] = widen(ev[j]);
      zb[2 * j + 1] = widen(od[j]);
    }
  }
}

// Tensors: 0 query, 1 key, 2 cos, 3 sin, 4 relu(query), 5 relu(key), 6 rotated query (float), 7 rotated key.
// size = (B, N, H, D/2); st[4 * t + 3] is tensor t's stride along D: pair p sits at 2p and 2p + 1 times it.
template <class Q, class W>
void relu_rope(const Q* q, const Q* k, const W* cosv, const W* sinv, Q* rq, Q* rk, float* oq, float* ok,
               const uint16_t* relu_table, const i64* size, const i64* st) {
  const i64 pairs = size[3];
  if (unit_inner<8>(st)) {
    for_rows<8>(size, st, [&](const i64* off) {
      const Q* __restrict xq = q + off[0];
      const Q* __restrict xk = k + off[1];
      Q* __restrict yq = rq + off[4];
      Q* __restrict yk = rk + off[5];
      for (i64 i = 0; i < 2 * pairs; ++i) {
        yq[i] = relu(xq[i], relu_table);
        yk[i] = relu(xk[i], relu_table);
      }
      rotate_row(yq, cosv + off[2], sinv + off[3], oq + off[6], pairs);
      rotate_row(yk, cosv + off[2], sinv + off[3], ok + off[7], pairs);
    });
  } else {
    i64 s[8];
    for (int t = 0; t < 8; ++t) s[t] = st[4 * t + 3];
    for_rows<8>(size, st, [&](const i64* off) {
      for (i64 p = 0; p < pairs; ++p) {
        const i64 e = 2 * p, o = 2 * p + 1;
        const W cp = cosv[off[2] + e * s[2]], sp = sinv[off[3] + o * s[3]];
        const Q a = relu(q[off[0] + e * s[0]], relu_table), b = relu(q[off[0] + o * s[0]], relu_table);
        const Q ka = relu(k[off[1] + e * s[1]], relu_table), kb = relu(k[off[1] + o * s[1]], relu_table);
        rq[off[4] + e * s[4]] = a;
        rq[off[4] + o * s[4]] = b;
        rk[off[5] + e * s[5]] = ka;
        rk[off[5] + o * s[5]] = kb;
        oq[off[6] + e * s[6]] = widen(Rotate<Q, W>::even(a, b, cp, sp, Opaque()));
        oq[off[6] + o * s[6]] = widen(Rotate<Q, W>::odd(a, b, cp, sp, Opaque()));
        ok[off[7] + e * s[7]] = widen(Rotate<Q, W>::even(ka, kb, cp, sp, Opaque()));
        ok[off[7] + o * s[7]] = widen(Rotate<Q, W>::odd(ka, kb, cp, sp, Opaque()));
      }
    });
  }
}

}  // namespace

#define AP_EXPORT extern "C" __attribute__((visibility("default")))

// ---- exported entry points (names: op _ dtype(s)); every pointer points at element 0 of its tensor ----------

#define AP_TERNARY(op, name, T)                                                                           \
  AP_EXPORT void ap_##op##_##name(void* out, const void* a, const void* b, const void* c, const i64* size, \
                                  const i64* st) {                                                        \
    op<T>(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b),                       \
          static_cast<const T*>(c), size, st);                                                            \
  }
AP_TERNARY(modulate, f32, float)
AP_TERNARY(modulate, bf16, bf16)
AP_TERNARY(modulate, f16, f16)
AP_TERNARY(gated_residual, f32, float)
AP_TERNARY(gated_residual, bf16, bf16)
AP_TERNARY(gated_residual, f16, f16)

AP_EXPORT void ap_scale_to_bf16(void* out, const float* x, const float* z, const i64* size, const i64* st) {
  scale_to<bf16>(static_cast<bf16*>(out), x, z, size, st);
}
AP_EXPORT void ap_scale_to_f16(void* out, const float* x, const float* z, const i64* size, const i64* st) {
  scale_to<f16>(static_cast<f16*>(out), x, z, size, st);
}

// A bf16 unary op by its table (SiLU): out = table[bits(x)].
AP_EXPORT void ap_table_bf16(uint16_t* out, const uint16_t* x, const uint16_t* table, const i64* size,
                             const i64* st) {
  elementwise1(out, x, size, st, [table](uint16_t v) { return table[v]; });
}

// GLUMB's gate x * silu(gate) in bf16: the SiLU from its table, the product rounded.
AP_EXPORT void ap_glu_gate_bf16(void* out, const void* x, const void* gate, const uint16_t* table, const i64* size,
                                const i64* st) {
  elementwise2(static_cast<bf16*>(out), static_cast<const bf16*>(x), static_cast<const uint16_t*>(gate), size, st,
               [table](bf16 a, uint16_t g) { return narrow<bf16>(widen(a) * widen(from_bits(table[g]))); });
}

#define AP_ROPE(qname, Q, wname, W)                                                                              \
  AP_EXPORT void ap_relu_rope_##qname##_##wname(const void* q, const void* k, const void* c, const void* s,     \
                                                void* rq, void* rk, float* oq, float* ok, const uint16_t* table, \
                                                const i64* size, const i64* st) {                                \
    relu_rope<Q, W>(static_cast<const Q*>(q), static_cast<const Q*>(k), static_cast<const W*>(c),               \
                    static_cast<const W*>(s), static_cast<Q*>(rq), static_cast<Q*>(rk), oq, ok, table, size, st); \
  }
AP_ROPE(bf16, bf16, bf16, bf16)
AP_ROPE(bf16, bf16, f32, float)
AP_ROPE(bf16, bf16, f64, double)
AP_ROPE(f32, float, bf16, bf16)
AP_ROPE(f32, float, f32, float)
AP_ROPE(f32, float, f64, double)

// The float -> bf16 / fp16 rounding these kernels use, exported so tests can check it on chosen floats.
AP_EXPORT void ap_round_f32(const float* x, uint16_t* bf, uint16_t* hf, i64 n) {
  for (i64 i = 0; i < n; ++i) {
    bf[i] = narrow<bf16>(x[i]).x;
    hf[i] = narrow<f16>(x[i]).x;
  }
}

// A version tag the loader checks, so a stale cached library is never used with a newer Python side.
AP_EXPORT int ap_abi_version() { return 1; }
