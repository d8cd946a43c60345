// OpenBLAS: the products of two activations, the fallback of the packed dense
// layers (kernels/packed_linear.h) and dense layers on raw weights.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/packed_linear.h"

namespace tessera::kernels {

// Threads OpenBLAS may use for one call (process-wide setting); always 1 on
// the libxsmm path (gemm_path()), where the pool does the threading.
void set_blas_threads(int threads);
int blas_threads();
// The kernel family OpenBLAS picked at load time (e.g. "SkylakeX").
std::string blas_core_name();
// Debian's OpenBLAS 0.3.21 does not recognise CPUs released after it and
// falls back to its generic "Prescott" kernels (4x slower here). When that
// happened and the CPU has AVX-512 (or AVX2), returns the core to request
// through OPENBLAS_CORETYPE; otherwise an empty string.
std::string better_blas_core();
// OpenBLAS reads its environment once, when it is loaded. This sets, and
// restarts the process (execv of /proc/self/exe) once to apply:
// - OPENBLAS_CORETYPE, to correct the fallback above;
// - OPENBLAS_NUM_THREADS=threads when `threads` > 0: otherwise OpenBLAS keeps
//   an idle worker per core that spins in sched_yield, which steals the CPU
//   from the other devices emulated on the same machine.
// A user's own OPENBLAS_* variables, or TESSERA_KEEP_BLAS_CORE=1, always win.
void reexec_with_better_blas_core(char** argv, int threads = 0);

// C[m,n] = alpha * op(A) op(B) + beta * C, row-major, with checks.
void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// y[n] = alpha * x op(B) + beta * y for one row x (row-major B, [k, n], or
// [n, k] when trans_b), with checks. OpenBLAS's sgemm packs both operands
// even for one row; its gemv reads B as it lies (a decode step's attention:
// one query row against a head's cache).
void gemv_f32(bool trans_b, int64_t n, int64_t k, float alpha, const float* x, const float* b, int64_t ldb, float beta,
              float* y);

// OpenBLAS's AVX-512 cores (SkylakeX, Cooperlake, SapphireRapids) have a
// small-matrix kernel that packs neither operand. linear_f32 uses it for few
// rows: it multiplies W in stripes of this many outputs, each product small
// enough for that kernel (in the column-major TN form a row-major x W^T
// becomes: stripe * m <= 1200, stripe * m * k <= 10^6, k >= 32). 0 = one
// product as usual (rows outside [16, 64], k below 32, or k too long for a
// stripe of 16).
int64_t small_kernel_stripe(int64_t m, int64_t k);
// Whether the loaded OpenBLAS core has that kernel.
bool blas_has_small_kernel();

// A dense layer in Hugging Face's layout: W is [n, k] (out, in), given either
// raw (w, ldw) or packed (packed: its output rows [packed_row0, packed_row0 + n)).
struct LinearArgs {
  const float* x = nullptr;  // [m, k], row stride ldx
  int64_t m = 0, k = 0, ldx = 0;
  const float* w = nullptr;  // [n, k], row stride ldw
  int64_t n = 0, ldw = 0;
  const PackedLinear* packed = nullptr;  // when set, w and ldw are not read
  int64_t packed_row0 = 0;
  const float* bias = nullptr;      // [n] or null
  Activation act = Activation::kNone;
  const float* residual = nullptr;  // [m, n] added after the activation, or null
  int64_t ldr = 0;
  float* y = nullptr;  // [m, n], row stride ldy
  int64_t ldy = 0;
};

// y = act(x W^T + bias) + residual; the epilogue is one pass over y.
void linear_f32(core::ThreadPool* pool, const LinearArgs& args);

// The dense case: x [n, w.dim(1)], y and residual [n, w.dim(0)], packed rows;
// an empty bias tensor means no bias.
void linear_rows_f32(core::ThreadPool* pool, const float* x, int64_t n, const core::Tensor& w, const core::Tensor& bias,
                     Activation act, const float* residual, float* y);
// The same on packed weights (the model's dense layers).
void linear_rows_f32(core::ThreadPool* pool, const float* x, int64_t n, const PackedLinear& w, const core::Tensor& bias,
                     Activation act, const float* residual, float* y);

}  // namespace tessera::kernels
