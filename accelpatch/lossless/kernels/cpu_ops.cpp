// The CPU kernels of cpu_kernels.cpp as typed torch.library ops (namespace accelpatch_cpu; another name where the
// library is built with -DACCELPATCH_CPU_NAMESPACE=..., as a test's second build is).
//
// Each op takes tensors, never addresses: the dispatcher checks the schema (a wrong argument count or type raises),
// a tensor subclass reaches its own __torch_dispatch__ instead of this code, meta and fake tensors reach the fake
// implementations registered in accelpatch/ops/fused/cpu_build.py. Here every tensor is checked before a pointer is
// taken: a CPU tensor with storage, strided, not quantized, no lazy negation or conjugation, the dtype the kernel
// reads, and every element the iteration plan (sizes and element strides computed in cpu.py) can reach inside its
// storage. So a wrong plan raises RuntimeError instead of corrupting memory. Outputs are preallocated by the caller
// (in eager's layouts) and written in place: the ops mutate them and return nothing.
#include <torch/library.h>

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "cpu_kernels.h"

#ifndef ACCELPATCH_CPU_NAMESPACE
#define ACCELPATCH_CPU_NAMESPACE accelpatch_cpu
#endif

namespace {

namespace k = accelpatch_kernels;
using k::Dt;
using k::i64;

Dt dt(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return Dt::f32;
    case at::kBFloat16: return Dt::bf16;
    case at::kHalf: return Dt::f16;
    case at::kDouble: return Dt::f64;
    default: return Dt::other;
  }
}

// A tensor whose memory the kernels may address directly.
void check_plain(const at::Tensor& t, const char* op, const char* what) {
  TORCH_CHECK(t.defined(), op, ": ", what, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), op, ": ", what, " must be a CPU tensor, not on ", t.device());
  TORCH_CHECK(t.layout() == at::kStrided, op, ": ", what, " must be strided, not ", t.layout());
  TORCH_CHECK(!t.is_quantized(), op, ": ", what, " must not be quantized");
  TORCH_CHECK(!t.is_neg() && !t.is_conj(), op, ": ", what, " is a lazily negated or conjugated view");
  TORCH_CHECK(t.has_storage() && (t.numel() == 0 || t.data_ptr() != nullptr), op, ": ", what, " has no storage");
}

void check_dtype(const at::Tensor& t, at::ScalarType want, const char* op, const char* what) {
  TORCH_CHECK(t.scalar_type() == want, op, ": ", what, " must be ", want, ", not ", t.scalar_type());
}

// Every element at sum_d i_d * st[d] (i_d < size[d], d < 4) plus `extra` lies inside t's storage, in elements of
// `bytes` bytes counted from t's first element. Nothing is reached where a size is 0.
void check_span(const at::Tensor& t, const i64 (&size)[4], const i64* st, i64 extra, i64 bytes, const char* op,
                const char* what) {
  check_plain(t, op, what);
  i64 last = extra;
  for (int d = 0; d < 4; ++d) {
    TORCH_CHECK(size[d] >= 0 && st[d] >= 0, op, ": negative size or stride in the plan of ", what);
    if (size[d] == 0) return;
    last += (size[d] - 1) * st[d];
  }
  const auto* base = static_cast<const char*>(t.storage().data());
  const i64 before = static_cast<const char*>(t.data_ptr()) - base;
  const i64 room = (static_cast<i64>(t.storage().nbytes()) - before) / bytes;
  TORCH_CHECK(before >= 0 && last < room, op, ": the plan reaches element ", last, " of ", what, ", whose storage holds ",
              room, " from its first element");
}

void check_plan(at::IntArrayRef size, at::IntArrayRef strides, i64 sizes, i64 tensors, const char* op) {
  TORCH_CHECK(static_cast<i64>(size.size()) == sizes, op, ": the plan has ", size.size(), " sizes, not ", sizes);
  TORCH_CHECK(static_cast<i64>(strides.size()) == 4 * tensors, op, ": the plan has ", strides.size(),
              " strides, not 4 for each of ", tensors, " tensors");
}

// An element-wise op's tensors (output first) over a 4-D plan: tensor t's element (a, b, c, d) at
// a * st[4t] + b * st[4t + 1] + c * st[4t + 2] + d * st[4t + 3].
void check_elementwise(std::initializer_list<const at::Tensor*> ts, at::IntArrayRef size, at::IntArrayRef strides,
                       const char* op) {
  check_plan(size, strides, 4, static_cast<i64>(ts.size()), op);
  const i64 s[4] = {size[0], size[1], size[2], size[3]};
  int i = 0;
  for (const at::Tensor* t : ts) {
    const std::string what = i == 0 ? "the output" : "input " + std::to_string(i);
    check_span(*t, s, strides.data() + 4 * i, 0, static_cast<i64>(t->element_size()), op, what.c_str());
    ++i;
  }
}

void check_table(const at::Tensor& table, at::ScalarType want, const char* op) {
  check_plain(table, op, "the table");
  check_dtype(table, want, op, "the table");
  TORCH_CHECK(table.is_contiguous() && table.numel() == 65536, op, ": the table must be 65,536 contiguous entries");
}

void modulate(const at::Tensor& out, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& shift,
              at::IntArrayRef size, at::IntArrayRef strides) {
  constexpr const char* op = "modulate";
  check_elementwise({&out, &x, &scale, &shift}, size, strides, op);
  for (const at::Tensor* t : {&x, &scale, &shift}) check_dtype(*t, out.scalar_type(), op, "an input");
  TORCH_CHECK(k::modulate(dt(out), out.data_ptr(), x.data_ptr(), scale.data_ptr(), shift.data_ptr(), size.data(),
                          strides.data()),
              op, " takes float32, bf16 or fp16 tensors, not ", out.scalar_type());
}

void gated_residual(const at::Tensor& out, const at::Tensor& residual, const at::Tensor& gate, const at::Tensor& x,
                    at::IntArrayRef size, at::IntArrayRef strides) {
  constexpr const char* op = "gated_residual";
  check_elementwise({&out, &residual, &gate, &x}, size, strides, op);
  for (const at::Tensor* t : {&residual, &gate, &x}) check_dtype(*t, out.scalar_type(), op, "an input");
  TORCH_CHECK(k::gated_residual(dt(out), out.data_ptr(), residual.data_ptr(), gate.data_ptr(), x.data_ptr(),
                                size.data(), strides.data()),
              op, " takes float32, bf16 or fp16 tensors, not ", out.scalar_type());
}

void scale_to(const at::Tensor& out, const at::Tensor& x, const at::Tensor& z, at::IntArrayRef size,
              at::IntArrayRef strides) {
  constexpr const char* op = "scale_to";
  check_elementwise({&out, &x, &z}, size, strides, op);
  check_dtype(x, at::kFloat, op, "x");
  TORCH_CHECK(k::scale_to(dt(out), dt(z), out.data_ptr(), x.data_ptr<float>(), z.data_ptr(), size.data(),
                          strides.data()),
              op, " writes bf16 or fp16 from a bf16, fp16 or float32 z, not ", out.scalar_type(), " from ",
              z.scalar_type());
}

void table_bf16(const at::Tensor& out, const at::Tensor& x, const at::Tensor& table, at::IntArrayRef size,
                at::IntArrayRef strides) {
  constexpr const char* op = "table_bf16";
  check_elementwise({&out, &x}, size, strides, op);
  check_dtype(out, at::kBFloat16, op, "the output");
  check_dtype(x, at::kBFloat16, op, "x");
  check_table(table, at::kInt, op);
  k::table_bf16(static_cast<uint16_t*>(out.data_ptr()), static_cast<const uint16_t*>(x.data_ptr()),
                static_cast<const uint32_t*>(table.data_ptr()), size.data(), strides.data());
}

void glu_gate_bf16(const at::Tensor& out, const at::Tensor& x, const at::Tensor& gate, const at::Tensor& table,
                   at::IntArrayRef size, at::IntArrayRef strides) {
  constexpr const char* op = "glu_gate_bf16";
  check_elementwise({&out, &x, &gate}, size, strides, op);
  for (const at::Tensor* t : {&out, &x, &gate}) check_dtype(*t, at::kBFloat16, op, "a tensor");
  check_table(table, at::kInt, op);
  k::glu_gate_bf16(static_cast<uint16_t*>(out.data_ptr()), static_cast<const uint16_t*>(x.data_ptr()),
                   static_cast<const uint16_t*>(gate.data_ptr()), static_cast<const uint32_t*>(table.data_ptr()),
                   size.data(), strides.data());
}

// The pair kernels' plan: size (B, N, H, D/2); tensor t's element 2p + e of row (b, n, h) at
// b * st[0] + n * st[1] + h * st[2] + (2p + e) * st[3].
void check_pairs(std::initializer_list<const at::Tensor*> ts, at::IntArrayRef size, at::IntArrayRef strides,
                 const char* op) {
  check_plan(size, strides, 4, static_cast<i64>(ts.size()), op);
  const i64 s[4] = {size[0], size[1], size[2], 2 * size[3]};
  int i = 0;
  for (const at::Tensor* t : ts) {
    const std::string what = "tensor " + std::to_string(i);
    check_span(*t, s, strides.data() + 4 * i, 0, static_cast<i64>(t->element_size()), op, what.c_str());
    ++i;
  }
}

void check_same(std::initializer_list<const at::Tensor*> ts, const at::Tensor& like, const char* op) {
  for (const at::Tensor* t : ts) check_dtype(*t, like.scalar_type(), op, "a tensor");
}

void relu_rope(const at::Tensor& q, const at::Tensor& k_, const at::Tensor& cos, const at::Tensor& sin,
               const at::Tensor& rq, const at::Tensor& rk, const at::Tensor& oq, const at::Tensor& ok,
               const std::optional<at::Tensor>& table, at::IntArrayRef size, at::IntArrayRef strides) {
  constexpr const char* op = "relu_rope";
  check_pairs({&q, &k_, &cos, &sin, &rq, &rk, &oq, &ok}, size, strides, op);
  check_same({&k_, &rq, &rk}, q, op);
  check_same({&sin}, cos, op);
  check_dtype(oq, at::kFloat, op, "the rotated query");
  check_dtype(ok, at::kFloat, op, "the rotated key");
  const uint16_t* relu = nullptr;
  if (table.has_value()) {
    check_table(*table, at::kBFloat16, op);
    relu = static_cast<const uint16_t*>(table->data_ptr());
  }
  TORCH_CHECK(k::relu_rope(dt(q), dt(cos), q.data_ptr(), k_.data_ptr(), cos.data_ptr(), sin.data_ptr(), rq.data_ptr(),
                           rk.data_ptr(), oq.data_ptr<float>(), ok.data_ptr<float>(), relu, size.data(),
                           strides.data()),
              op, " takes bf16 or float32 query/key and bf16, float32 or float64 tables, not ", q.scalar_type(), "/",
              cos.scalar_type());
}

void rope(const at::Tensor& q, const at::Tensor& k_, const at::Tensor& cos, const at::Tensor& sin,
          const at::Tensor& oq, const at::Tensor& ok, at::IntArrayRef size, at::IntArrayRef strides,
          bool per_channel) {
  constexpr const char* op = "rope";
  check_pairs({&q, &k_, &cos, &sin, &oq, &ok}, size, strides, op);
  check_same({&k_, &oq, &ok}, q, op);
  check_same({&sin}, cos, op);
  TORCH_CHECK(k::rope(dt(q), dt(cos), per_channel, q.data_ptr(), k_.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                      oq.data_ptr(), ok.data_ptr(), size.data(), strides.data()),
              op, " takes bf16 or float32 query/key and bf16, float32 or float64 tables, not ", q.scalar_type(), "/",
              cos.scalar_type());
}

void rotate_half(const at::Tensor& q, const at::Tensor& k_, const at::Tensor& cos, const at::Tensor& sin,
                 const at::Tensor& oq, const at::Tensor& ok, at::IntArrayRef size, at::IntArrayRef strides,
                 int64_t policy) {
  constexpr const char* op = "rotate_half";
  TORCH_CHECK(policy >= 0 && policy <= 2, op, ": policy ", policy, " is none of 0 (in_q), 1 (split_mul_add), 2 "
              "(split_fma)");
  check_plan(size, strides, 6, 6, op);
  const i64 b = size[0], s = size[1], h = size[2], d = size[3], r = size[4], rows = size[5];
  TORCH_CHECK(r >= 0 && r <= d && r % 2 == 0 && rows >= 0, op, ": rotary dim ", r, " must be even and at most ", d);
  // in_q rounds the [rows, R] tables into its own buffer once and indexes it by position: one row for all, or one
  // per position
  TORCH_CHECK(policy != 0 || rows == 1 || rows == s, op, ": in_q takes tables of 1 or ", s, " rows, not ", rows);
  const i64 xs[4] = {b, s, h, d};
  const char* names[6] = {"the query", "the key", "cos", "sin", "the rotated query", "the rotated key"};
  const at::Tensor* ts[6] = {&q, &k_, &cos, &sin, &oq, &ok};
  const bool split = policy != 0;
  // InQ tables: [rows, R] entries t * st[1] + j * st[3]; split tables: a row of R / 2 entries per (b, s, h)
  const i64 table_size[4] = {split ? b : 1, split ? s : rows, split ? h : 1, split ? r / 2 : r};
  for (int t = 0; t < 6; ++t) {
    check_span(*ts[t], (t == 2 || t == 3) ? table_size : xs, strides.data() + 4 * t, 0,
               static_cast<i64>(ts[t]->element_size()), op, names[t]);
  }
  TORCH_CHECK(strides[19] == 1 && strides[23] == 1, op, ": the outputs must be unit-stride along the head dim");
  check_same({&k_, &oq, &ok}, q, op);
  check_same({&sin}, cos, op);
  TORCH_CHECK(k::rotate_half(dt(q), dt(cos), static_cast<k::RotateHalf>(policy), q.data_ptr(), k_.data_ptr(),
                             cos.data_ptr(), sin.data_ptr(), oq.data_ptr(), ok.data_ptr(), size.data(),
                             strides.data()),
              op, " takes bf16, fp16 or float32 query/key and float32 or bf16 tables (float32 for the split policies "
              "on fp16), not ", q.scalar_type(), "/", cos.scalar_type());
}

void rotary_complex(const at::Tensor& q, const at::Tensor& k_, const at::Tensor& freqs, const at::Tensor& oq,
                    const at::Tensor& ok, at::IntArrayRef size, at::IntArrayRef strides) {
  constexpr const char* op = "rotary_complex";
  check_plan(size, strides, 4, 5, op);
  const i64 xs[4] = {size[0], size[1], size[2], 2 * size[3]};
  const i64 fs[4] = {size[0], size[1], size[2], size[3]};
  const char* names[5] = {"the query", "the key", "freqs", "the rotated query", "the rotated key"};
  const at::Tensor* ts[5] = {&q, &k_, &freqs, &oq, &ok};
  for (int t = 0; t < 5; ++t) {
    if (t == 2)  // the complex table as doubles: pair p's real part at p * st[3], its imaginary part next
      check_span(freqs, fs, strides.data() + 8, 1, 8, op, names[t]);
    else
      check_span(*ts[t], xs, strides.data() + 4 * t, 0, static_cast<i64>(ts[t]->element_size()), op, names[t]);
  }
  check_dtype(freqs, at::kComplexDouble, op, "freqs");
  check_same({&k_, &oq, &ok}, q, op);
  TORCH_CHECK(k::rotary_complex(dt(q), q.data_ptr(), k_.data_ptr(), static_cast<const double*>(freqs.data_ptr()),
                                oq.data_ptr(), ok.data_ptr(), size.data(), strides.data()),
              op, " takes bf16, float32 or float64 query/key, not ", q.scalar_type());
}

void relu_bf16_formula(const at::Tensor& out) {
  constexpr const char* op = "relu_bf16_formula";
  check_plain(out, op, "the output");
  check_dtype(out, at::kShort, op, "the output");
  TORCH_CHECK(out.is_contiguous() && out.numel() == 65536, op, ": the output must be 65,536 contiguous int16");
  k::relu_bf16_formula(static_cast<uint16_t*>(out.data_ptr()));
}

int64_t check_bf16_rounding(int64_t first, int64_t count) {
  TORCH_CHECK(first >= 0 && count >= 0 && first + count <= (int64_t{1} << 32),
              "check_bf16_rounding: float bit patterns are 0 .. 2^32 - 1");
  return k::check_bf16_rounding(static_cast<uint32_t>(first), count);
}

}  // namespace

TORCH_LIBRARY(ACCELPATCH_CPU_NAMESPACE, m) {
  m.def("modulate(Tensor(a!) out, Tensor x, Tensor scale, Tensor shift, int[] size, int[] strides) -> ()");
  m.def("gated_residual(Tensor(a!) out, Tensor residual, Tensor gate, Tensor x, int[] size, int[] strides) -> ()");
  m.def("scale_to(Tensor(a!) out, Tensor x, Tensor z, int[] size, int[] strides) -> ()");
  m.def("table_bf16(Tensor(a!) out, Tensor x, Tensor table, int[] size, int[] strides) -> ()");
  m.def("glu_gate_bf16(Tensor(a!) out, Tensor x, Tensor gate, Tensor table, int[] size, int[] strides) -> ()");
  m.def("relu_rope(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor(a!) relu_q, Tensor(b!) relu_k, "
        "Tensor(c!) out_q, Tensor(d!) out_k, Tensor? table, int[] size, int[] strides) -> ()");
  m.def("rope(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor(a!) out_q, Tensor(b!) out_k, int[] size, "
        "int[] strides, bool per_channel) -> ()");
  m.def("rotate_half(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor(a!) out_q, Tensor(b!) out_k, int[] size, "
        "int[] strides, int policy) -> ()");
  m.def("rotary_complex(Tensor q, Tensor k, Tensor freqs, Tensor(a!) out_q, Tensor(b!) out_k, int[] size, "
        "int[] strides) -> ()");
  m.def("relu_bf16_formula(Tensor(a!) out) -> ()");
  // no tensor argument, so no backend to dispatch on: one kernel for every key
  m.def("check_bf16_rounding(int first, int count) -> int", &check_bf16_rounding);
}

TORCH_LIBRARY_IMPL(ACCELPATCH_CPU_NAMESPACE, CPU, m) {
  m.impl("modulate", &modulate);
  m.impl("gated_residual", &gated_residual);
  m.impl("scale_to", &scale_to);
  m.impl("table_bf16", &table_bf16);
  m.impl("glu_gate_bf16", &glu_gate_bf16);
  m.impl("relu_rope", &relu_rope);
  m.impl("rope", &rope);
  m.impl("rotate_half", &rotate_half);
  m.impl("rotary_complex", &rotary_complex);
  m.impl("relu_bf16_formula", &relu_bf16_formula);
}
