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
    case WeightType::kQ4_K: return "q4_k";
    case WeightType::kQ6_K: return "q6_k";
  }
  return "?";
}

core::Result<WeightType> parse_weight_type(const std::string& s) {
  for (WeightType t : {WeightType::kF32, WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K, WeightType::kQ6_K})
    if (s == weight_type_name(t)) return t;
  return core::invalid_argument("unknown weight type '" + s + "' (f32, q8_0, q4_0, q4_k or q6_k)");
}

int64_t block_elems(WeightType t) {
  switch (t) {
    case WeightType::kF32: return 1;
    case WeightType::kQ8_0:
    case WeightType::kQ4_0: return kQuantBlock;
    case WeightType::kQ4_K:
    case WeightType::kQ6_K: return kSuperBlock;
  }
  return 1;
}

size_t block_bytes(WeightType t) {
  switch (t) {
    case WeightType::kF32: return 4;
    case WeightType::kQ8_0: return 2 + 32;
    case WeightType::kQ4_0: return 2 + 16;
    case WeightType::kQ4_K: return 2 + 2 + 12 + 128;
    case WeightType::kQ6_K: return 128 + 64 + 16 + 2;
  }
  return 0;
}

bool holds(WeightType t, int64_t k) { return t == WeightType::kF32 || (k > 0 && k % block_elems(t) == 0); }

size_t row_bytes(WeightType t, int64_t k) {
  if (!holds(t, k) || t == WeightType::kF32) return static_cast<size_t>(k) * sizeof(float);
  return static_cast<size_t>(k / block_elems(t)) * block_bytes(t);
}

size_t input_row_bytes(WeightType t, int64_t k) {
  if (t == WeightType::kQ4_K || t == WeightType::kQ6_K) return static_cast<size_t>(k / kSuperBlock) * kQ8KBytes;
  return static_cast<size_t>(k / kQuantBlock) * 34;
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

// llama.cpp's nearest_int: to nearest, ties to even.
int nearest(float x) { return static_cast<int>(std::nearbyint(x)); }

// Q4_K sub-block j's 6-bit scale and min from the 12 packed bytes
// (llama.cpp's get_scale_min_k4).
void q4k_scale_min(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// One Q4_K super-block: each sub-block of 32 from its min to its max
// (min clamped to <= 0), scales and mins to 6 bits under F16 super-scales.
void quantize_q4_k(const float* x, uint8_t* out) {
  float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.0f, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * j + l]), hi = std::max(hi, x[32 * j + l]);
    scale[j] = (hi - lo) / 15.0f;
    min[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, min[j]);
  }
  const float is = max_scale > 0 ? 63.0f / max_scale : 0.0f, im = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t* s = out + 4;
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, nearest(is * scale[j])), lm = std::min(63, nearest(im * min[j]));
    if (j < 4) {
      s[j] = static_cast<uint8_t>(ls);
      s[j + 4] = static_cast<uint8_t>(lm);
    } else {
      s[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      s[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  put_scale(out, max_scale / 63.0f);
  put_scale(out + 2, max_min / 63.0f);
  const float d = get_scale(out), dmin = get_scale(out + 2);
  uint8_t n[256];
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    q4k_scale_min(j, s, sc, m);
    const float dj = d * static_cast<float>(sc), mj = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l)
      n[32 * j + l] = static_cast<uint8_t>(dj == 0.0f ? 0 : std::clamp(nearest((x[32 * j + l] + mj) / dj), 0, 15));
  }
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) out[16 + 32 * c + l] = static_cast<uint8_t>(n[64 * c + l] | (n[64 * c + 32 + l] << 4));
}

// Q6_K's weight index w (0..255) as (ql byte, its nibble shift, qh byte, its shift).
struct Q6Pos {
  int ql, ql_shift, qh, qh_shift;
};
Q6Pos q6k_pos(int w) {
  const int h = w / 128, r = w % 128, quarter = r / 32, l = r % 32;
  return {64 * h + l + (quarter & 1) * 32, (quarter >> 1) * 4, 128 + 32 * h + l, 2 * quarter};
}

// One Q6_K super-block: each sub-block of 16 maps its value of largest
// magnitude to -32; the 16 scales to int8 under an F16 super-scale.
void quantize_q6_k(const float* x, uint8_t* out) {
  float scale[16], max_scale = 0.0f, amax_scale = 0.0f;
  for (int j = 0; j < 16; ++j) {
    float amax = 0.0f, max = 0.0f;
    for (int l = 0; l < 16; ++l)
      if (std::fabs(x[16 * j + l]) > amax) amax = std::fabs(x[16 * j + l]), max = x[16 * j + l];
    scale[j] = max / -32.0f;
    if (std::fabs(scale[j]) > amax_scale) amax_scale = std::fabs(scale[j]), max_scale = scale[j];
  }
  std::memset(out, 0, 210);
  int8_t* sc = reinterpret_cast<int8_t*>(out + 192);
  if (amax_scale == 0.0f) return;
  const float is = -128.0f / max_scale;
  for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(std::min(127, nearest(is * scale[j])));
  put_scale(out + 208, 1.0f / is);
  const float d = get_scale(out + 208);
  for (int j = 0; j < 16; ++j) {
    const float dj = d * static_cast<float>(sc[j]);
    for (int l = 0; l < 16; ++l) {
      const int w = 16 * j + l;
      const int n = dj == 0.0f ? 32 : std::clamp(nearest(x[w] / dj), -32, 31) + 32;
      const Q6Pos p = q6k_pos(w);
      out[p.ql] |= static_cast<uint8_t>((n & 0xF) << p.ql_shift);
      out[p.qh] |= static_cast<uint8_t>((n >> 4) << p.qh_shift);
    }
  }
}

// Unscaled pieces of a K-quant block: weight w's integer n and the
// sub-block scale (and Q4_K's min) it is multiplied by.
int q4k_n(const uint8_t* b, int w) {
  const int c = w / 64, l = w % 64;
  const uint8_t q = b[16 + 32 * c + l % 32];
  return l < 32 ? (q & 0xF) : (q >> 4);
}
int q6k_n(const uint8_t* b, int w) {
  const Q6Pos p = q6k_pos(w);
  return (((b[p.ql] >> p.ql_shift) & 0xF) | (((b[p.qh] >> p.qh_shift) & 3) << 4)) - 32;
}

}  // namespace

void quantize_row_ref(WeightType t, const float* x, int64_t k, uint8_t* out) {
  TESSERA_CHECK(t != WeightType::kF32 && k % block_elems(t) == 0);
  if (t == WeightType::kQ4_K || t == WeightType::kQ6_K) {
    for (int64_t b = 0; b < k / kSuperBlock; ++b, x += kSuperBlock, out += block_bytes(t))
      (t == WeightType::kQ4_K ? quantize_q4_k : quantize_q6_k)(x, out);
    return;
  }
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
  TESSERA_CHECK(t != WeightType::kF32 && k % block_elems(t) == 0);
  if (t == WeightType::kQ4_K) {
    for (int64_t b = 0; b < k / kSuperBlock; ++b, q += block_bytes(t), out += kSuperBlock) {
      const float d = get_scale(q), dmin = get_scale(q + 2);
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        q4k_scale_min(j, q + 4, sc, m);
        const float dj = d * static_cast<float>(sc), mj = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) out[32 * j + l] = dj * static_cast<float>(q4k_n(q, 32 * j + l)) - mj;
      }
    }
    return;
  }
  if (t == WeightType::kQ6_K) {
    for (int64_t b = 0; b < k / kSuperBlock; ++b, q += block_bytes(t), out += kSuperBlock) {
      const float d = get_scale(q + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(q + 192);
      for (int w = 0; w < 256; ++w) out[w] = d * static_cast<float>(sc[w / 16]) * static_cast<float>(q6k_n(q, w));
    }
    return;
  }
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
  if (t == WeightType::kQ4_K || t == WeightType::kQ6_K) {
    // Per super-block: d_x * (d_w * sum_j s_j X_j.N_j - dmin * sum_j m_j sum X_j),
    // the sums of X over 16 from the input block's bsums (as llama.cpp).
    for (int64_t b = 0; b < nb; ++b, w += block_bytes(t), xq += kQ8KBytes) {
      float dx;
      std::memcpy(&dx, xq + kQ8KD, 4);
      const int8_t* xs = reinterpret_cast<const int8_t*>(xq + kQ8KQs);
      int16_t bsums[16];
      std::memcpy(bsums, xq + kQ8KSums16, 32);
      int32_t main = 0, mins = 0;
      if (t == WeightType::kQ4_K) {
        for (int j = 0; j < 8; ++j) {
          int sc, m;
          q4k_scale_min(j, w + 4, sc, m);
          int32_t s = 0;
          for (int l = 0; l < 32; ++l) s += q4k_n(w, 32 * j + l) * xs[32 * j + l];
          main += sc * s;
          mins += m * (bsums[2 * j] + bsums[2 * j + 1]);
        }
        sum += dx * get_scale(w) * static_cast<float>(main) - dx * get_scale(w + 2) * static_cast<float>(mins);
      } else {
        const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
        for (int j = 0; j < 16; ++j) {
          int32_t s = 0;
          for (int l = 0; l < 16; ++l) s += q6k_n(w, 16 * j + l) * xs[16 * j + l];
          main += sc[j] * s;
        }
        sum += dx * get_scale(w + 208) * static_cast<float>(main);
      }
    }
    return sum;
  }
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

void quantize_input_q8_k(const float* x, int64_t k, uint8_t* out) {
  TESSERA_CHECK(k % kSuperBlock == 0);
  for (int64_t b = 0; b < k / kSuperBlock; ++b, x += kSuperBlock, out += kQ8KBytes) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
    int8_t q[256] = {};
    float d = 0.0f;
    if (amax != 0.0f) {
      const float iscale = -127.0f / max;
      for (int j = 0; j < 256; ++j) q[j] = static_cast<int8_t>(std::min(127, nearest(iscale * x[j])));
      d = 1.0f / iscale;
    }
    int16_t bsums[16];
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += q[16 * j + l];
      bsums[j] = static_cast<int16_t>(s);
    }
    std::memcpy(out + kQ8KQs, q, 256);
    std::memcpy(out + kQ8KD, &d, 4);
    std::memcpy(out + kQ8KSums16, bsums, 32);
    int16_t sums32[8];
    for (int j = 0; j < 8; ++j) sums32[j] = static_cast<int16_t>(bsums[2 * j] + bsums[2 * j + 1]);
    std::memcpy(out + kQ8KSums32, sums32, 16);
  }
}

void round_input_q8_k(const float* x, int64_t k, float* out) {
  uint8_t block[kQ8KBytes];
  for (int64_t b = 0; b < k / kSuperBlock; ++b) {
    quantize_input_q8_k(x + b * kSuperBlock, kSuperBlock, block);
    float d;
    std::memcpy(&d, block + kQ8KD, 4);
    for (int j = 0; j < 256; ++j) out[b * kSuperBlock + j] = d * static_cast<float>(static_cast<int8_t>(block[kQ8KQs + j]));
  }
}

void quantize_input_for(WeightType t, const float* x, int64_t k, uint8_t* out) {
  if (t == WeightType::kQ4_K || t == WeightType::kQ6_K) return quantize_input_q8_k(x, k, out);
  quant_ops().quantize_input(x, k, out);
}

QuantDotFn dot_fn(const QuantOps& ops, WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: return ops.dot_q8_0;
    case WeightType::kQ4_0: return ops.dot_q4_0;
    case WeightType::kQ4_K: return ops.dot_q4_K;
    case WeightType::kQ6_K: return ops.dot_q6_K;
    case WeightType::kF32: break;
  }
  TESSERA_CHECK_MSG(false, "no dot kernel for " << weight_type_name(t));
  return nullptr;
}

QuantDequantFn dequant_fn(const QuantOps& ops, WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: return ops.dequant_q8_0;
    case WeightType::kQ4_0: return ops.dequant_q4_0;
    case WeightType::kQ4_K: return ops.dequant_q4_K;
    case WeightType::kQ6_K: return ops.dequant_q6_K;
    case WeightType::kF32: break;
  }
  TESSERA_CHECK_MSG(false, "no dequantizer for " << weight_type_name(t));
  return nullptr;
}

QuantPanelFn panel_fn(const QuantOps& ops, WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: return ops.panel_q8_0;
    case WeightType::kQ4_0: return ops.panel_q4_0;
    case WeightType::kQ4_K: return ops.panel_q4_K;
    case WeightType::kQ6_K: return ops.panel_q6_K;
    case WeightType::kF32: break;
  }
  return nullptr;
}

void round_input_for(const QuantOps& ops, WeightType t, const float* x, int64_t k, float* out) {
  if (t == WeightType::kQ4_K || t == WeightType::kQ6_K) return round_input_q8_k(x, k, out);
  ops.round_input(x, k, out);
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
