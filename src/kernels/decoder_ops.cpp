#include "kernels/decoder_ops.h"

#include <cmath>

#include "core/check.h"
#include "core/device_speed.h"
#include "core/thread_pool.h"

namespace tessera::kernels {

void rmsnorm_f32(const float* x, int64_t ldx, float* out, int64_t ldo, int64_t rows, int64_t cols, const float* gamma,
                 float eps) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(rows >= 0 && cols > 0 && ldx >= cols && ldo >= cols && gamma != nullptr);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* o = out + r * ldo;
    double ss = 0;
    for (int64_t j = 0; j < cols; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(cols) + static_cast<double>(eps)));
    for (int64_t j = 0; j < cols; ++j) o[j] = xr[j] * inv * gamma[j];
  }
}

void rmsnorm_f32_mt(core::ThreadPool* pool, const float* x, int64_t ldx, float* out, int64_t ldo, int64_t rows,
                    int64_t cols, const float* gamma, float eps) {
  if (pool == nullptr || rows < 2) return rmsnorm_f32(x, ldx, out, ldo, rows, cols, gamma, eps);
  pool->parallel_for(rows, [&](int64_t b, int64_t e) {
    rmsnorm_f32(x + b * ldx, ldx, out + b * ldo, ldo, e - b, cols, gamma, eps);
  });
}

void swiglu_f32(core::ThreadPool* pool, const float* gu, int64_t rows, int64_t I, float* out) {
  core::KernelClock clock;
  TESSERA_CHECK(rows >= 0 && I > 0 && gu != nullptr && out != nullptr);
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* g = gu + r * 2 * I;
      const float* u = g + I;
      float* o = out + r * I;
      for (int64_t j = 0; j < I; ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    }
  };
  if (pool == nullptr || rows < 2) return run(0, rows);
  pool->parallel_for(rows, run);
}

void rope_f32(float* x, int64_t ld, int64_t rows, int64_t heads, int64_t head_dim, int64_t pos0, const float* inv_freq) {
  core::KernelClock clock;
  TESSERA_CHECK(rows >= 0 && heads > 0 && head_dim > 0 && head_dim % 2 == 0 && ld >= heads * head_dim && pos0 >= 0);
  const int64_t half = head_dim / 2;
  thread_local std::vector<float> cs;  // cos | sin of one row: no allocation per decode step
  cs.resize(static_cast<size_t>(2 * half));
  for (int64_t r = 0; r < rows; ++r) {
    // The angle as Hugging Face forms it: an fp32 product of position and
    // frequency, then cos and sin.
    const float pos = static_cast<float>(pos0 + r);
    for (int64_t i = 0; i < half; ++i) {
      const float a = pos * inv_freq[i];
      cs[static_cast<size_t>(i)] = std::cos(a);
      cs[static_cast<size_t>(half + i)] = std::sin(a);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + r * ld + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cs[static_cast<size_t>(i)], s = cs[static_cast<size_t>(half + i)];
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace tessera::kernels
