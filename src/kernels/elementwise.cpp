#include "kernels/elementwise.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/thread_pool.h"
#include "kernels/fast_math.h"

namespace tessera::kernels {

namespace {

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;

void gelu_erf_row(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.0f + fast_erf(x[i] * kSqrtHalf));
}

void gelu_tanh_row(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + fast_tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
}

void tanh_row(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = fast_tanh(x[i]);
}

// Reductions with 16 independent lanes: without -ffast-math the compiler
// will not reorder a single accumulator, and these loops would stay scalar.
constexpr int kLanes = 16;

float sum_f32(const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  float s = 0.0f;
  for (; i < n; ++i) s += x[i];
  for (float a : acc) s += a;
  return s;
}

float max_f32(const float* x, int64_t n) {
  float acc[kLanes];
  for (float& a : acc) a = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = acc[j] > x[i + j] ? acc[j] : x[i + j];
  float m = x[0];
  for (; i < n; ++i) m = m > x[i] ? m : x[i];
  for (float a : acc) m = m > a ? m : a;
  return m;
}

float sq_dev_sum_f32(const float* x, int64_t n, float mean) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += (x[i + j] - mean) * (x[i + j] - mean);
  float s = 0.0f;
  for (; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  for (float a : acc) s += a;
  return s;
}

}  // namespace

void activation_f32(float* x, int64_t n, Activation act) {
  TESSERA_CHECK(n >= 0 && (x != nullptr || n == 0));
  switch (act) {
    case Activation::kNone: return;
    case Activation::kGeluErf: gelu_erf_row(x, n); return;
    case Activation::kGeluTanh: gelu_tanh_row(x, n); return;
    case Activation::kTanh: tanh_row(x, n); return;
  }
}

void bias_act_residual_f32(float* y, int64_t rows, int64_t cols, int64_t ldy, const float* bias,
                           Activation act, const float* residual, int64_t ldr) {
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
  TESSERA_CHECK(rows >= 0 && cols > 0 && gamma != nullptr && beta != nullptr);
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    float* o = out + r * cols;
    const float mean = sum_f32(in, cols) / static_cast<float>(cols);
    const float var = sq_dev_sum_f32(in, cols, mean) / static_cast<float>(cols);
    const float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t c = 0; c < cols; ++c) o[c] = (in[c] - mean) * inv * gamma[c] + beta[c];
  }
}

void softmax_rows_f32(float* x, int64_t rows, int64_t cols) {
  TESSERA_CHECK(rows >= 0 && cols > 0);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    const float mx = max_f32(row, cols);
    for (int64_t c = 0; c < cols; ++c) row[c] = fast_exp(row[c] - mx);
    const float inv = 1.0f / sum_f32(row, cols);
    for (int64_t c = 0; c < cols; ++c) row[c] *= inv;
  }
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
  if (pool == nullptr) return layernorm_f32(x, out, rows, cols, gamma, beta, eps);
  pool->parallel_for(rows, [&](int64_t b, int64_t e) {
    layernorm_f32(x + b * cols, out + b * cols, e - b, cols, gamma, beta, eps);
  });
}

void bias_act_residual_f32_mt(core::ThreadPool* pool, float* y, int64_t rows, int64_t cols, int64_t ldy,
                              const float* bias, Activation act, const float* residual, int64_t ldr) {
  if (pool == nullptr) return bias_act_residual_f32(y, rows, cols, ldy, bias, act, residual, ldr);
  pool->parallel_for(rows, [&](int64_t b, int64_t e) {
    bias_act_residual_f32(y + b * ldy, e - b, cols, ldy, bias, act,
                          residual == nullptr ? nullptr : residual + b * ldr, ldr);
  });
}

}  // namespace tessera::kernels
