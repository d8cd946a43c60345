// Vectorised row kernels (GELU, tanh, softmax, layer norm), compiled once per
// instruction set (AVX-512, AVX2, generic) from one source, simd_math.inc,
// and picked at run time. Tests run every set this CPU has.
#pragma once

#include <cstdint>

namespace tessera::kernels {

enum class Isa { kGeneric, kAvx2, kAvx512 };

struct MathOps {
  void (*gelu_erf)(float* x, int64_t n);
  void (*gelu_tanh)(float* x, int64_t n);
  void (*tanh)(float* x, int64_t n);
  void (*softmax_row)(float* x, int64_t n);  // n >= 1
  void (*layernorm_row)(const float* x, float* out, int64_t n, const float* gamma, const float* beta, float eps);
};

bool isa_supported(Isa isa);
const char* isa_name(Isa isa);
// The widest set this CPU runs (checked once), capped by TESSERA_ISA=avx2|generic.
Isa best_isa();
// The kernels of one set; it must be supported.
const MathOps& math_ops(Isa isa);
inline const MathOps& math_ops() { return math_ops(best_isa()); }

}  // namespace tessera::kernels
