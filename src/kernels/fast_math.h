// Branch-free float approximations that the compiler vectorises; the
// libm versions do not, and GELU/softmax would otherwise cost more than
// the GEMMs around them. Accuracy is checked against libm in the tests.
#pragma once

#include <bit>
#include <cstdint>

namespace tessera::kernels {

// e^x, relative error ~2e-7 on [-87, 88]; clamps outside.
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round to nearest by the 1.5 * 2^23 trick: vectorises, unlike floorf.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return p * scale;
}

// erf(x) by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7).
inline float fast_erf(float x) {
  const float sign = x < 0.0f ? -1.0f : 1.0f;
  const float a = x * sign;
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float y = 1.061405429f;
  y = y * t - 1.453152027f;
  y = y * t + 1.421413741f;
  y = y * t - 0.284496736f;
  y = y * t + 0.254829592f;
  y = 1.0f - y * t * fast_exp(-a * a);
  return sign * y;
}

// tanh(x) = 1 - 2 / (e^{2x} + 1); absolute error ~1e-7.
inline float fast_tanh(float x) { return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f); }

}  // namespace tessera::kernels
