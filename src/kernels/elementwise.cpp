#include "kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/device_speed.h"
#include "core/check.h"
#include "core/thread_pool.h"
#include "kernels/simd.h"

namespace tessera::kernels {

float stream_sum_f32(const float* x, int64_t n) {
  typedef float v16 __attribute__((vector_size(64)));
  v16 acc[4] = {};
  for (int64_t i = 0; i + 64 <= n; i += 64)
    for (int j = 0; j < 4; ++j) {
      v16 v;
      std::memcpy(&v, x + i + 16 * j, sizeof v);
      acc[j] += v;
    }
  const v16 all = acc[0] + acc[1] + acc[2] + acc[3];
  float sum = 0;
  for (int j = 0; j < 16; ++j) sum += all[j];
  return sum;
}

void activation_f32(float* x, int64_t n, Activation act) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(n >= 0 && (x != nullptr || n == 0));
  switch (act) {
    case Activation::kNone: return;
    case Activation::kGeluErf: math_ops().gelu_erf(x, n); return;
    case Activation::kGeluTanh: math_ops().gelu_tanh(x, n); return;
    case Activation::kTanh: math_ops().tanh(x, n); return;
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
      return;
  }
}

void bias_act_residual_f32(float* y, int64_t rows, int64_t cols, int64_t ldy, const float* bias,
                           Activation act, const float* residual, int64_t ldr) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(rows >= 0 && cols >= 0 && ldy >= cols);
  TESSERA_CHECK(residual == nullptr || ldr >= cols);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * ldy;
    if (bias != nullptr)
      for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
    activation_f32(row, cols, act);
    if (residual != nullptr) {
      const float* res = residual + r * ldr;
      for (int64_t c = 0; c < cols; ++c) row[c] += res[c];
    }
  }
}

void layernorm_f32(const float* x, float* out, int64_t rows, int64_t cols, const float* gamma,
                   const float* beta, float eps) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(rows >= 0 && cols > 0 && gamma != nullptr && beta != nullptr);
  const MathOps& ops = math_ops();
  for (int64_t r = 0; r < rows; ++r) ops.layernorm_row(x + r * cols, out + r * cols, cols, gamma, beta, eps);
}

void softmax_rows_f32(float* x, int64_t rows, int64_t cols) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(rows >= 0 && cols > 0);
  const MathOps& ops = math_ops();
  for (int64_t r = 0; r < rows; ++r) ops.softmax_row(x + r * cols, cols);
}

int64_t argmax_f32(const float* x, int64_t n) {
  TESSERA_CHECK(n > 0);
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

void layernorm_f32_mt(core::ThreadPool* pool, const float* x, float* out, int64_t rows, int64_t cols,
                      const float* gamma, const float* beta, float eps) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  if (pool == nullptr) return layernorm_f32(x, out, rows, cols, gamma, beta, eps);
  pool->parallel_for(rows, [&](int64_t b, int64_t e) {
    layernorm_f32(x + b * cols, out + b * cols, e - b, cols, gamma, beta, eps);
  });
}

void bias_act_residual_f32_mt(core::ThreadPool* pool, float* y, int64_t rows, int64_t cols, int64_t ldy,
                              const float* bias, Activation act, const float* residual, int64_t ldr) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  if (pool == nullptr) return bias_act_residual_f32(y, rows, cols, ldy, bias, act, residual, ldr);
  pool->parallel_for(rows, [&](int64_t b, int64_t e) {
    bias_act_residual_f32(y + b * ldy, e - b, cols, ldy, bias, act,
                          residual == nullptr ? nullptr : residual + b * ldr, ldr);
  });
}

}  // namespace tessera::kernels
