// The entry points of the CPU kernels (cpu_kernels.cpp) that the torch.library ops (cpu_ops.cpp) call.
//
// cpu_kernels.cpp needs only c10's BFloat16/Half headers; cpu_ops.cpp holds everything that includes torch's
// headers (schemas, argument checks). The two are compiled apart, in parallel, into one library. Each entry point
// picks the template instantiation for the dtypes it is given and returns false where it has none: the op then
// raises, naming what it takes. Pointers point at element 0 of their tensor; every size and stride is in elements.
#pragma once

#include <cstdint>

namespace accelpatch_kernels {

using i64 = int64_t;

// The storage dtypes the kernels know.
enum class Dt : int { f32, bf16, f16, f64, other };

// The rounding policy of the rotate-half loops: MiniMax-H3's (in the activations' dtype) and LTX-2.3's split RoPE
// (float32, the second product added by a rounded multiply and an add, or by an fma: the device's addcmul_ form).
enum class RotateHalf : int { in_q = 0, split_mul_add = 1, split_fma = 2 };

// x * (1 + scale) + shift / residual + gate * x: four tensors of dtype t; size[4], st[16] (out first).
bool modulate(Dt t, void* out, const void* x, const void* scale, const void* shift, const i64* size, const i64* st);
bool gated_residual(Dt t, void* out, const void* residual, const void* gate, const void* x, const i64* size,
                    const i64* st);
// float32 x times z (of dtype zt) rounded once to ot (bf16 or fp16); size[4], st[12] (out, x, z).
bool scale_to(Dt ot, Dt zt, void* out, const float* x, const void* z, const i64* size, const i64* st);
// A bf16 unary op by its 65,536-entry table (16-bit results zero-extended to 32 bits); size[4], st[8].
void table_bf16(uint16_t* out, const uint16_t* x, const uint32_t* table, const i64* size, const i64* st);
// x * table(gate) in bf16; size[4], st[12] (out, x, gate).
void glu_gate_bf16(uint16_t* out, const uint16_t* x, const uint16_t* gate, const uint32_t* table, const i64* size,
                   const i64* st);
// ReLU + interleaved RoPE: q, k, cos, sin, relu(q), relu(k), rotated q, k (float32); table: eager's bf16 ReLU table
// or null (the checked formula; float32 needs none). size = (B, N, H, D/2), st[32].
bool relu_rope(Dt q, Dt w, const void* qp, const void* kp, const void* c, const void* s, void* rq, void* rk,
               float* oq, float* ok, const uint16_t* table, const i64* size, const i64* st);
// Interleaved RoPE, paired or per-channel tables: q, k, cos, sin, rotated q, k; size = (B, N, H, D/2), st[24].
bool rope(Dt q, Dt w, bool per_channel, const void* qp, const void* kp, const void* c, const void* s, void* oq,
          void* ok, const i64* size, const i64* st);
// Rotate-half RoPE: size = (B, S, H, D, R, table rows), st[24] (q, k, cos, sin, outputs).
bool rotate_half(Dt q, Dt w, RotateHalf policy, const void* qp, const void* kp, const void* c, const void* s, void* oq,
                 void* ok, const i64* size, const i64* st);
// Complex128 RoPE: q, k, the table as doubles (re, im interleaved), rotated q, k; size = (outer 3, D/2), st[20].
bool rotary_complex(Dt q, const void* qp, const void* kp, const double* f, void* oq, void* ok, const i64* size,
                    const i64* st);
// The formula bf16 ReLU of every bf16 bit pattern: out[i] = relu(bits i), 65,536 entries.
void relu_bf16_formula(uint16_t* out);
// How many float bit patterns first .. first + count - 1 this file's bf16 rounding gives other bits than c10's.
i64 check_bf16_rounding(uint32_t first, i64 count);

}  // namespace accelpatch_kernels
