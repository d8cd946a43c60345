#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/dtype.h"

namespace tessera::kernels {

namespace generic { const QuantOps& quant(); }
#if defined(__x86_64__)
namespace avx2 { const QuantOps& quant(); }
namespace avx512 { const QuantOps& quant(); }
#endif

const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::kF32: return "f32";
    case WeightType::kQ8_0: return "q8_0";
    case WeightType::kQ4_0: return "q4_0";
  }
  return "?";
}

core::Result<WeightType> parse_weight_type(const std::string& s) {
  for (WeightType t : {WeightType::kF32, WeightType::kQ8_0, WeightType::kQ4_0})
    if (s == weight_type_name(t)) return t;
  return core::invalid_argument("unknown weight type '" + s + "' (f32, q8_0 or q4_0)");
}

size_t block_bytes(WeightType t) {
  switch (t) {
    case WeightType::kF32: return 4;
    case WeightType::kQ8_0: return 2 + 32;
    case WeightType::kQ4_0: return 2 + 16;
  }
  return 0;
}

bool holds(WeightType t, int64_t k) { return t == WeightType::kF32 || (k > 0 && k % kQuantBlock == 0); }

size_t row_bytes(WeightType t, int64_t k) {
  if (!holds(t, k) || t == WeightType::kF32) return static_cast<size_t>(k) * sizeof(float);
  return static_cast<size_t>(k / kQuantBlock) * block_bytes(t);
}

namespace {

void put_scale(uint8_t* b, float d) {
  const uint16_t h = core::f32_to_f16(d);
  std::memcpy(b, &h, 2);
}

float get_scale(const uint8_t* b) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  return core::f16_to_f32(h);
}

}  // namespace

void quantize_row_ref(WeightType t, const float* x, int64_t k, uint8_t* out) {
  TESSERA_CHECK(t != WeightType::kF32 && k % kQuantBlock == 0);
  const size_t bb = block_bytes(t);
  for (int64_t b = 0; b < k / kQuantBlock; ++b, x += kQuantBlock, out += bb) {
    if (t == WeightType::kQ8_0) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      put_scale(out, d);
      for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
    } else {
      // The value of largest magnitude maps to -8, so its sign is kept.
      float amax = 0.0f, max = 0.0f;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
      const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      put_scale(out, d);
      for (int j = 0; j < 16; ++j) {
        const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
        const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
        out[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

void dequantize_row_ref(WeightType t, const uint8_t* q, int64_t k, float* out) {
  TESSERA_CHECK(t != WeightType::kF32 && k % kQuantBlock == 0);
  const size_t bb = block_bytes(t);
  for (int64_t b = 0; b < k / kQuantBlock; ++b, q += bb, out += kQuantBlock) {
    const float d = get_scale(q);
    if (t == WeightType::kQ8_0) {
      for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(q[2 + j]));
    } else {
      for (int j = 0; j < 16; ++j) {
        out[j] = d * static_cast<float>((q[2 + j] & 15) - 8);
        out[j + 16] = d * static_cast<float>((q[2 + j] >> 4) - 8);
      }
    }
  }
}

float dot_row_ref(WeightType t, const uint8_t* w, int64_t nb, const uint8_t* xq) {
  TESSERA_CHECK(t != WeightType::kF32);
  float sum = 0.0f;
  const size_t bb = block_bytes(t);
  for (int64_t b = 0; b < nb; ++b, w += bb, xq += 34) {
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) {
      const int wq = t == WeightType::kQ8_0 ? static_cast<int8_t>(w[2 + j])
                                            : (j < 16 ? (w[2 + j] & 15) : (w[2 + j - 16] >> 4)) - 8;
      s += wq * static_cast<int8_t>(xq[2 + j]);
    }
    sum += static_cast<float>(s) * (get_scale(w) * get_scale(xq));
  }
  return sum;
}

void quantize_input_ref(const float* x, int64_t k, uint8_t* out) {
  TESSERA_CHECK(k % kQuantBlock == 0);
  for (int64_t b = 0; b < k / kQuantBlock; ++b, x += kQuantBlock, out += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    put_scale(out, d);
    for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(x[j] * id)));
  }
}

const QuantOps& quant_ops(Isa isa) {
  TESSERA_CHECK_MSG(isa_supported(isa), "instruction set " << isa_name(isa) << " not supported by this CPU");
#if defined(__x86_64__)
  if (isa == Isa::kAvx512) return avx512::quant();
  if (isa == Isa::kAvx2) return avx2::quant();
#endif
  return generic::quant();
}

}  // namespace tessera::kernels
