// Quantized weights (kernels/quant.h): the block formats against values
// worked out by hand (llama.cpp's layout), the reference quantiser's error
// bounds, every instruction set's kernels against the scalar reference, and
// the packed layer on quantized weights against a double-precision product
// with the dequantized matrix, on both row-count paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/packed_linear.h"
#include "kernels/quant.h"

namespace tessera::kernels {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512})
    if (isa_supported(i)) out.push_back(i);
  return out;
}

const WeightType kTypes[] = {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_K, WeightType::kQ6_K};

// An input row as t's dot kernels see it, widened to F32 (the generic set's
// rounding, itself checked against the reference below).
std::vector<float> rounded_input(WeightType t, const float* x, int64_t k) {
  std::vector<float> out(static_cast<size_t>(k));
  round_input_for(quant_ops(Isa::kGeneric), t, x, k, out.data());
  return out;
}

TEST(QuantFormat, Q8_0BlockAsLlamaCppLaysItOut) {
  // 0, 1, ..., 31 scaled by 0.5: amax 15.5, d = 15.5 / 127, q = round(x / d).
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = 0.5f * static_cast<float>(j);
  uint8_t b[34];
  quantize_row_ref(WeightType::kQ8_0, x.data(), 32, b);
  uint16_t h;
  std::memcpy(&h, b, 2);
  EXPECT_EQ(h, core::f32_to_f16(15.5f / 127.0f));
  for (int j = 0; j < 32; ++j)
    EXPECT_EQ(static_cast<int8_t>(b[2 + j]), static_cast<int>(std::lround(0.5 * j / (15.5 / 127.0)))) << j;
  EXPECT_EQ(static_cast<int8_t>(b[2 + 31]), 127);
}

TEST(QuantFormat, Q4_0BlockAsLlamaCppLaysItOut) {
  // Largest magnitude -8 (negative): d = -8 / -8 = 1, so n = x + 8 exactly;
  // weight j in byte j's low nibble, weight j + 16 in its high one.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = static_cast<float>(j % 16) - 8.0f;
  uint8_t b[18];
  quantize_row_ref(WeightType::kQ4_0, x.data(), 32, b);
  uint16_t h;
  std::memcpy(&h, b, 2);
  EXPECT_EQ(core::f16_to_f32(h), 1.0f);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b[2 + j], static_cast<uint8_t>(j | (j << 4))) << j;
  std::vector<float> back(32);
  dequantize_row_ref(WeightType::kQ4_0, b, 32, back.data());
  EXPECT_EQ(back, x);
}

TEST(QuantFormat, Q4_KBlockAsLlamaCppLaysItOut) {
  // d = 1, dmin = 0.5; sub-block j < 4: scale j + 1, min j (bytes j and
  // j + 4); j >= 4: scale 17 + j, min 20 + j, low 4 bits in byte j + 4 and
  // the high 2 bits in the top of bytes j - 4 (scale) and j (min).
  std::vector<uint8_t> b(144, 0);
  const uint16_t one = core::f32_to_f16(1.0f), half = core::f32_to_f16(0.5f);
  std::memcpy(b.data(), &one, 2);
  std::memcpy(b.data() + 2, &half, 2);
  int sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = j < 4 ? j + 1 : 17 + j;
    mn[j] = j < 4 ? j : 20 + j;
    uint8_t* s = b.data() + 4;
    if (j < 4) {
      s[j] = static_cast<uint8_t>(sc[j]);
      s[j + 4] = static_cast<uint8_t>(mn[j]);
    } else {
      s[j + 4] = static_cast<uint8_t>((sc[j] & 15) | ((mn[j] & 15) << 4));
      s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
    }
  }
  // Weight w: n = w % 16. Chunk c of 64: byte 16 + 32c + l holds weight
  // 64c + l in its low nibble and 64c + 32 + l in its high one.
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) b[static_cast<size_t>(16 + 32 * c + l)] = static_cast<uint8_t>((l % 16) | (((32 + l) % 16) << 4));
  std::vector<float> y(256);
  dequantize_row_ref(WeightType::kQ4_K, b.data(), 256, y.data());
  for (int w = 0; w < 256; ++w)
    EXPECT_EQ(y[static_cast<size_t>(w)], static_cast<float>(sc[w / 32] * (w % 16)) - 0.5f * static_cast<float>(mn[w / 32])) << w;
}

TEST(QuantFormat, Q6_KBlockAsLlamaCppLaysItOut) {
  // d = 0.25, scale of sub-block j (16 weights) j - 8. In each half of 128:
  // weight l (l < 32) in ql[l]'s low nibble and qh[l] bits 0-1, l + 32 in
  // ql[l + 32] low and bits 2-3, l + 64 in ql[l] high and bits 4-5, l + 96
  // in ql[l + 32] high and bits 6-7; the value is n - 32.
  std::vector<uint8_t> b(210, 0);
  const uint16_t quarter = core::f32_to_f16(0.25f);
  std::memcpy(b.data() + 208, &quarter, 2);
  for (int j = 0; j < 16; ++j) b[static_cast<size_t>(192 + j)] = static_cast<uint8_t>(static_cast<int8_t>(j - 8));
  auto n_of = [](int w) { return (w * 7) % 64; };
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const int n1 = n_of(128 * h + l), n2 = n_of(128 * h + l + 32), n3 = n_of(128 * h + l + 64), n4 = n_of(128 * h + l + 96);
      b[static_cast<size_t>(64 * h + l)] = static_cast<uint8_t>((n1 & 15) | ((n3 & 15) << 4));
      b[static_cast<size_t>(64 * h + l + 32)] = static_cast<uint8_t>((n2 & 15) | ((n4 & 15) << 4));
      b[static_cast<size_t>(128 + 32 * h + l)] = static_cast<uint8_t>((n1 >> 4) | ((n2 >> 4) << 2) | ((n3 >> 4) << 4) | ((n4 >> 4) << 6));
    }
  std::vector<float> y(256);
  dequantize_row_ref(WeightType::kQ6_K, b.data(), 256, y.data());
  for (int w = 0; w < 256; ++w)
    EXPECT_EQ(y[static_cast<size_t>(w)], 0.25f * static_cast<float>(w / 16 - 8) * static_cast<float>(n_of(w) - 32)) << w;
}

TEST(QuantFormat, Q8_KInputsAsLlamaCppRoundsThem) {
  // The value of largest magnitude (here negative) maps to -127... and so
  // d = 1 / (-127 / max); bsums are the sums of 16.
  std::vector<float> x(256);
  for (int j = 0; j < 256; ++j) x[static_cast<size_t>(j)] = static_cast<float>(j % 50) * 0.1f;
  x[77] = -10.0f;
  uint8_t q[kQ8KBytes];
  quantize_input_q8_k(x.data(), 256, q);
  float d;
  std::memcpy(&d, q + kQ8KD, 4);
  EXPECT_EQ(d, 1.0f / (-127.0f / -10.0f));
  EXPECT_EQ(static_cast<int8_t>(q[kQ8KQs + 77]), -127);
  for (int j = 0; j < 256; ++j)
    EXPECT_EQ(static_cast<int8_t>(q[kQ8KQs + j]), static_cast<int>(std::nearbyint(x[static_cast<size_t>(j)] * (-127.0f / -10.0f)))) << j;
  for (int g = 0; g < 16; ++g) {
    int s = 0;
    for (int l = 0; l < 16; ++l) s += static_cast<int8_t>(q[kQ8KQs + 16 * g + l]);
    int16_t got;
    std::memcpy(&got, q + kQ8KSums16 + 2 * g, 2);
    EXPECT_EQ(got, s) << g;
  }
  for (int g = 0; g < 8; ++g) {  // and of 32, for Q4_K's sub-blocks
    int s = 0;
    for (int l = 0; l < 32; ++l) s += static_cast<int8_t>(q[kQ8KQs + 32 * g + l]);
    int16_t got;
    std::memcpy(&got, q + kQ8KSums32 + 2 * g, 2);
    EXPECT_EQ(got, s) << g;
  }
}

TEST(QuantFormat, KQuantsErrorWithinAStep) {
  const auto x = random_vec(256 * 8, 17);
  for (WeightType t : {WeightType::kQ4_K, WeightType::kQ6_K}) {
    std::vector<uint8_t> q(row_bytes(t, 256 * 8));
    quantize_row_ref(t, x.data(), 256 * 8, q.data());
    std::vector<float> back(x.size());
    dequantize_row_ref(t, q.data(), 256 * 8, back.data());
    const int64_t sub = t == WeightType::kQ4_K ? 32 : 16;
    for (size_t s = 0; s < x.size() / static_cast<size_t>(sub); ++s) {
      float lo = 0, hi = 0, amax = 0;
      for (int64_t j = 0; j < sub; ++j) {
        const float v = x[s * static_cast<size_t>(sub) + static_cast<size_t>(j)];
        lo = std::min(lo, v), hi = std::max(hi, v), amax = std::max(amax, std::fabs(v));
      }
      // One step of the sub-block, plus the 6-bit (8-bit) rounding of its
      // scale against the block's largest one (at most amax over the block).
      const float step = t == WeightType::kQ4_K ? (hi - lo) / 15.0f : amax / 32.0f;
      for (int64_t j = 0; j < sub; ++j) {
        const size_t i = s * static_cast<size_t>(sub) + static_cast<size_t>(j);
        EXPECT_LE(std::fabs(back[i] - x[i]), step + 0.08f) << weight_type_name(t) << " " << i;
      }
    }
    double err = 0, mag = 0;
    for (size_t i = 0; i < x.size(); ++i) err += (back[i] - x[i]) * (back[i] - x[i]), mag += x[i] * x[i];
    EXPECT_LT(std::sqrt(err / mag), t == WeightType::kQ4_K ? 0.15 : 0.04) << weight_type_name(t);
  }
  EXPECT_EQ(row_bytes(WeightType::kQ4_K, 512), 288u);
  EXPECT_EQ(row_bytes(WeightType::kQ6_K, 256), 210u);
  EXPECT_FALSE(holds(WeightType::kQ4_K, 128));
  EXPECT_EQ(input_row_bytes(WeightType::kQ6_K, 512), 2 * kQ8KBytes);
}

TEST(QuantFormat, ErrorWithinHalfAStep) {
  const auto x = random_vec(32 * 64, 7);
  for (WeightType t : {WeightType::kQ8_0, WeightType::kQ4_0}) {
    std::vector<uint8_t> q(row_bytes(t, 32 * 64));
    quantize_row_ref(t, x.data(), 32 * 64, q.data());
    std::vector<float> back(x.size());
    dequantize_row_ref(t, q.data(), 32 * 64, back.data());
    for (size_t b = 0; b < 64; ++b) {
      float amax = 0;
      for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      // One step is amax / 127 (Q8_0) or amax / 8 (Q4_0); the f16 scale adds
      // a relative 2^-11 of the value. Q4_0 maps the extreme to -8, so the
      // other sign reaches only +7: up to a whole step there.
      const float step = t == WeightType::kQ8_0 ? amax / 127.0f : amax / 8.0f;
      const float bound = (t == WeightType::kQ8_0 ? 0.5f : 1.0f) * step + amax * 1e-3f;
      for (size_t j = 0; j < 32; ++j) EXPECT_LE(std::fabs(back[b * 32 + j] - x[b * 32 + j]), bound) << weight_type_name(t);
    }
  }
  EXPECT_EQ(row_bytes(WeightType::kQ8_0, 64), 68u);
  EXPECT_EQ(row_bytes(WeightType::kQ4_0, 64), 36u);
  EXPECT_EQ(row_bytes(WeightType::kQ8_0, 40), 160u);  // not a whole block: F32
  EXPECT_FALSE(holds(WeightType::kQ4_0, 48));
}

TEST(QuantKernels, EveryInstructionSetMatchesTheScalarReference) {
  for (Isa isa : isas()) {
    const QuantOps& ops = quant_ops(isa);
    for (int64_t k : {32, 96, 256}) {  // inputs: the same blocks as the reference, bit for bit
      auto x = random_vec(static_cast<size_t>(k), 40 + static_cast<uint32_t>(k));
      x[3] = 0.0f;
      std::fill(x.begin() + 32, x.begin() + 64 <= x.end() ? x.begin() + 64 : x.end(), 0.0f);  // an all-zero block
      std::vector<uint8_t> want(row_bytes(WeightType::kQ8_0, k)), got(want.size());
      quantize_input_ref(x.data(), k, want.data());
      ops.quantize_input(x.data(), k, got.data());
      EXPECT_EQ(got, want) << isa_name(isa) << " k=" << k;
      std::vector<float> widened(static_cast<size_t>(k)), rounded(static_cast<size_t>(k));
      dequantize_row_ref(WeightType::kQ8_0, want.data(), k, widened.data());
      ops.round_input(x.data(), k, rounded.data());
      EXPECT_EQ(rounded, widened) << isa_name(isa) << " k=" << k;
    }
    for (int64_t k : {8, 64, 96}) {  // 32 rows (stride k + 16) into the panel form: element (r, c) at c * 32 + r
      const int64_t ld = k + 16;
      const auto rows = random_vec(static_cast<size_t>(32 * ld), 30);
      std::vector<float> panel(static_cast<size_t>(32 * k) + 32, -1.0f);
      ops.rows_to_panel(rows.data(), ld, k, panel.data());
      for (int64_t r = 0; r < 32; ++r)
        for (int64_t c = 0; c < k; ++c)
          ASSERT_EQ(panel[static_cast<size_t>(c * 32 + r)], rows[static_cast<size_t>(r * ld + c)]) << isa_name(isa) << " " << r << "," << c;
      for (size_t i = static_cast<size_t>(32 * k); i < panel.size(); ++i) ASSERT_EQ(panel[i], -1.0f) << "written past the panel";
    }
    for (WeightType t : kTypes) {  // 32 rows (a padded stride) straight into the panel form
      const QuantPanelFn to_panel = panel_fn(ops, t);
      if (isa != Isa::kGeneric) {
        EXPECT_NE(to_panel, nullptr) << isa_name(isa) << " widens " << weight_type_name(t) << " panels in one pass";
      }
      if (to_panel == nullptr) continue;
      for (int64_t nb : {1, 3, 12}) {
        const int64_t k = nb * block_elems(t);
        // The last row ends the buffer, so that ASan sees a read past its blocks.
        const size_t ldw = row_bytes(t, k) + 2 * block_bytes(t) + 5;
        std::vector<uint8_t> q(31 * ldw + row_bytes(t, k), 0x5a);
        std::vector<float> ref(static_cast<size_t>(32 * k)), rows(static_cast<size_t>(32 * k)), want(ref.size());
        for (int64_t r = 0; r < 32; ++r) {
          auto x = random_vec(static_cast<size_t>(k), 200 + static_cast<uint32_t>(r), 1.0f + static_cast<float>(r));
          if (r == 7) std::fill(x.begin(), x.end(), 1e-4f);  // scales that are f16 subnormals
          if (r == 9) std::fill(x.begin(), x.begin() + 32, 0.0f);  // an all-zero block
          quantize_row_ref(t, x.data(), k, q.data() + r * ldw);
          dequantize_row_ref(t, q.data() + r * ldw, k, ref.data() + r * k);
          dequant_fn(ops, t)(q.data() + r * ldw, nb, rows.data() + r * k);
        }
        ops.rows_to_panel(rows.data(), k, k, want.data());  // the two-step path, bit for bit
        std::vector<float> panel(static_cast<size_t>(32 * k) + 32, -1.0f);
        to_panel(q.data(), ldw, nb, panel.data());
        for (int64_t r = 0; r < 32; ++r) {
          // Near the reference to within rounding of the row's largest weight
          // (Q4_K's d * s * n - dmin * m may be fused in the kernels only).
          float row_max = 0.0f;
          for (int64_t c = 0; c < k; ++c) row_max = std::max(row_max, std::fabs(ref[static_cast<size_t>(r * k + c)]));
          for (int64_t c = 0; c < k; ++c) {
            const size_t at = static_cast<size_t>(c * 32 + r);
            ASSERT_EQ(panel[at], want[at]) << isa_name(isa) << " " << weight_type_name(t) << " nb=" << nb << " " << r << "," << c;
            ASSERT_NEAR(panel[at], ref[static_cast<size_t>(r * k + c)], 1e-6f * (1.0f + row_max))
                << isa_name(isa) << " " << weight_type_name(t) << " nb=" << nb << " " << r << "," << c;
          }
        }
        for (size_t i = static_cast<size_t>(32 * k); i < panel.size(); ++i) ASSERT_EQ(panel[i], -1.0f) << "written past the panel";
      }
    }
    for (int64_t k : {256, 512}) {  // Q8_K rounding: the same widened, by every set
      const auto x = random_vec(static_cast<size_t>(k), 50 + static_cast<uint32_t>(k));
      std::vector<float> a(static_cast<size_t>(k)), b(static_cast<size_t>(k));
      round_input_for(ops, WeightType::kQ4_K, x.data(), k, a.data());
      round_input_q8_k(x.data(), k, b.data());
      EXPECT_EQ(a, b);
    }
    for (WeightType t : kTypes) {
      const int64_t be = block_elems(t);
      for (int64_t nb : {1, 2, 5, 24, 37}) {  // 24 and 37: the one-row form's groups of 16 and 8 blocks, and a tail
        if (be > 32 && nb >= 24) continue;  // enough K-quant blocks at 5
        const int64_t k = nb * be;
        std::vector<uint8_t> q(row_bytes(t, k));
        quantize_row_ref(t, random_vec(static_cast<size_t>(k), 11 + static_cast<uint32_t>(nb)).data(), k, q.data());
        std::vector<float> ref(static_cast<size_t>(k)), got(static_cast<size_t>(k));
        dequantize_row_ref(t, q.data(), k, ref.data());
        dequant_fn(ops, t)(q.data(), nb, got.data());
        if (be == 32) {
          EXPECT_EQ(got, ref) << isa_name(isa) << " " << weight_type_name(t) << " nb=" << nb;
        } else {  // d * s * n - dmin * m may be one fused multiply-add here
          for (size_t c = 0; c < got.size(); ++c)
            ASSERT_NEAR(got[c], ref[c], 1e-6f * (1.0f + std::fabs(ref[c]))) << isa_name(isa) << " " << weight_type_name(t) << " " << c;
        }
        // Seven different rows, for the row tiles below.
        std::vector<uint8_t> distinct(7 * q.size());
        for (int r = 0; r < 7; ++r)
          quantize_row_ref(t, random_vec(static_cast<size_t>(k), 60 + static_cast<uint32_t>(r)).data(), k,
                           distinct.data() + r * q.size());
        for (int64_t m = 1; m <= kQuantDotRows; ++m) {
          // Input rows in t's input blocks, 2 bytes apart beyond their length.
          const size_t ldq = input_row_bytes(t, k) + 2;
          const auto x = random_vec(static_cast<size_t>(m * k), 5 + static_cast<uint32_t>(m));
          std::vector<uint8_t> xq(static_cast<size_t>(m) * ldq);
          for (int64_t i = 0; i < m; ++i) {
            if (be == 32) quantize_input_ref(x.data() + i * k, k, xq.data() + i * ldq);
            else quantize_input_q8_k(x.data() + i * k, k, xq.data() + i * ldq);
          }
          std::vector<float> out(static_cast<size_t>(m), -1.0f);
          dot_fn(ops, t)(q.data(), 0, 1, nb, xq.data(), m, ldq, out.data(), 1);
          // Several weight rows at once (tiles of 4 and 2 and the rest): row r of a
          // 7-row matrix is the same row, again.
          std::vector<uint8_t> seven;
          for (int r = 0; r < 7; ++r) seven.insert(seven.end(), q.begin(), q.end());
          std::vector<float> many(static_cast<size_t>(m * 7), -1.0f);
          dot_fn(ops, t)(seven.data(), q.size(), 7, nb, xq.data(), m, ldq, many.data(), 7);
          for (int64_t i = 0; i < m; ++i)
            for (int r = 0; r < 7; ++r) EXPECT_EQ(many[static_cast<size_t>(i * 7 + r)], out[static_cast<size_t>(i)]) << r;
          // Seven different rows: each row of the tiles keeps its own scales
          // (the same bits as that row alone).
          std::vector<float> tiled(static_cast<size_t>(m * 7), -1.0f), own(static_cast<size_t>(m), -1.0f);
          dot_fn(ops, t)(distinct.data(), q.size(), 7, nb, xq.data(), m, ldq, tiled.data(), 7);
          for (int r = 0; r < 7; ++r) {
            dot_fn(ops, t)(distinct.data() + r * q.size(), 0, 1, nb, xq.data(), m, ldq, own.data(), 1);
            for (int64_t i = 0; i < m; ++i)
              EXPECT_EQ(tiled[static_cast<size_t>(i * 7 + r)], own[static_cast<size_t>(i)])
                  << isa_name(isa) << " " << weight_type_name(t) << " m=" << m << " row " << r;
          }
          // Each input row alone gives the same bits as with the others (a
          // batched decode step equals each sequence's own step).
          for (int64_t i = 0; i < m; ++i) {
            float alone = -1.0f;
            dot_fn(ops, t)(q.data(), 0, 1, nb, xq.data() + i * ldq, 1, ldq, &alone, 1);
            EXPECT_EQ(alone, out[static_cast<size_t>(i)]) << isa_name(isa) << " " << weight_type_name(t) << " m=" << m << " row " << i;
          }
          for (int64_t i = 0; i < m; ++i) {
            const float r = dot_row_ref(t, q.data(), nb, xq.data() + i * ldq);
            // Against the widened blocks in double: the same products.
            const std::vector<float> xr = rounded_input(t, x.data() + i * k, k);
            double want = 0, scale = 0;
            for (int64_t c = 0; c < k; ++c) {
              want += static_cast<double>(ref[static_cast<size_t>(c)]) * xr[static_cast<size_t>(c)];
              scale += std::fabs(static_cast<double>(ref[static_cast<size_t>(c)]) * xr[static_cast<size_t>(c)]);
            }
            EXPECT_NEAR(out[static_cast<size_t>(i)], r, 1e-5 * scale + 1e-6)
                << isa_name(isa) << " " << weight_type_name(t) << " nb=" << nb << " m=" << m << " row " << i;
            EXPECT_NEAR(r, want, 1e-5 * scale + 1e-6) << weight_type_name(t) << " reference against double";
          }
        }
      }
    }
  }
}

// y = act(round(x) deq(W)[:, k0:k1]^T + b) + r (+ y before, with accumulate),
// in double, x's rows rounded to Q8_0 blocks as the layer rounds them.
struct Case {
  int64_t m, n, k, k0, k1;
  bool accumulate;
  Activation act;
};

void check(const Case& c, WeightType t, GemmPath path, core::ThreadPool* pool) {
  const int64_t kk = c.k1 - c.k0, ldx = kk + 5, ldy = c.n + 2;
  const auto w = random_vec(static_cast<size_t>(c.n * c.k), 2, 0.1f);
  const auto x = random_vec(static_cast<size_t>(c.m * ldx), 3);
  const auto b = random_vec(static_cast<size_t>(c.n), 4);
  const auto r = random_vec(static_cast<size_t>(c.m * ldy), 6);
  const WeightSource src{w.data(), c.n, c.k, 1};
  const PackedLinear p = PackedLinear::pack(std::span<const WeightSource>(&src, 1), c.k, path, {}, t);
  ASSERT_TRUE(p.quantized());
  ASSERT_EQ(p.nbytes(), static_cast<size_t>(c.n) * row_bytes(t, c.k));
  std::vector<float> deq(static_cast<size_t>(c.n * c.k));
  for (int64_t i = 0; i < c.n; ++i) dequantize_row_ref(t, p.row_blocks(i), c.k, deq.data() + i * c.k);
  std::vector<float> xr(x.size());
  for (int64_t i = 0; i < c.m; ++i) {  // the reference's blocks, widened
    const std::vector<float> v = rounded_input(t, x.data() + i * ldx, kk);
    std::copy(v.begin(), v.end(), xr.begin() + i * ldx);
  }
  std::vector<float> y0 = random_vec(static_cast<size_t>(c.m * ldy), 9), y = y0;
  PackedLinearArgs a;
  a.x = x.data(); a.m = c.m; a.ldx = ldx; a.w = &p; a.bias = b.data(); a.act = c.act;
  a.residual = r.data(); a.ldr = ldy; a.y = y.data(); a.ldy = ldy; a.k0 = c.k0; a.k1 = c.k1; a.accumulate = c.accumulate;
  packed_linear_f32(pool, a);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double s = c.accumulate ? y0[static_cast<size_t>(i * ldy + j)] : 0.0, mag = std::fabs(s);
      for (int64_t q = 0; q < kk; ++q) {
        const double v = static_cast<double>(xr[static_cast<size_t>(i * ldx + q)]) * deq[static_cast<size_t>(j * c.k + c.k0 + q)];
        s += v;
        mag += std::fabs(v);
      }
      s += b[static_cast<size_t>(j)];
      double want = c.act == Activation::kGeluErf ? 0.5 * s * (1.0 + std::erf(s / std::sqrt(2.0))) : s;
      want += r[static_cast<size_t>(i * ldy + j)];
      EXPECT_NEAR(y[static_cast<size_t>(i * ldy + j)], want, 2e-5 * (mag + 1.0))
          << weight_type_name(t) << " m=" << c.m << " n=" << c.n << " k=" << c.k << " [" << c.k0 << "," << c.k1 << ")";
    }
  // Row access and views read the same blocks.
  std::vector<float> row(static_cast<size_t>(c.k));
  p.copy_row(c.n - 1, row.data());
  EXPECT_EQ(0, std::memcmp(row.data(), deq.data() + (c.n - 1) * c.k, row.size() * sizeof(float)));
  EXPECT_EQ(p.at(c.n / 2, c.k - 1), deq[static_cast<size_t>((c.n / 2) * c.k + c.k - 1)]);
  const PackedLinear v = p.out_rows(1, c.n);
  EXPECT_EQ(v.at(0, 3), deq[static_cast<size_t>(c.k + 3)]);
}

TEST(QuantPackedLinear, MatchesTheDequantizedProductOnEveryPath) {
  core::ThreadPool pool(2);
  for (WeightType t : kTypes)
    for (GemmPath path : {GemmPath::kLibxsmm, GemmPath::kOpenBlas}) {
      if (path == GemmPath::kLibxsmm && gemm_path() != GemmPath::kLibxsmm) continue;
      for (core::ThreadPool* tp : {static_cast<core::ThreadPool*>(nullptr), &pool}) {
        if (block_elems(t) == kSuperBlock) {  // rows of whole super-blocks
          check({1, 70, 512, 0, 512, false, Activation::kNone}, t, path, tp);
          check({1, 70, 768, 256, 768, true, Activation::kNone}, t, path, tp);  // one row on a column range
          check({5, 100, 768, 256, 768, true, Activation::kGeluErf}, t, path, tp);
          check({8, 40, 256, 0, 256, false, Activation::kGeluErf}, t, path, tp);
          check({9, 70, 512, 0, 512, false, Activation::kNone}, t, path, tp);
          check({45, 130, 768, 256, 512, true, Activation::kNone}, t, path, tp);
          check({3, 1100, 256, 0, 256, false, Activation::kNone}, t, path, tp);  // kernel calls of 16 panels and a part
          continue;
        }
        check({1, 70, 64, 0, 64, false, Activation::kNone}, t, path, tp);
        check({5, 100, 128, 32, 96, true, Activation::kGeluErf}, t, path, tp);
        check({8, 300, 256, 0, 256, false, Activation::kGeluErf}, t, path, tp);
        check({9, 70, 96, 0, 96, false, Activation::kNone}, t, path, tp);
        check({45, 130, 256, 64, 192, true, Activation::kNone}, t, path, tp);
        check({70, 33, 512, 0, 512, false, Activation::kGeluErf}, t, path, tp);
        check({1, 1100, 64, 0, 64, true, Activation::kNone}, t, path, tp);  // kernel calls of 16 panels and a part
        check({6, 1100, 96, 32, 96, false, Activation::kNone}, t, path, tp);
      }
    }
}

// Block parts of two types (a GGUF fused QKV: Q and K in Q4_K, V in Q6_K)
// stack as ranges of rows, each its own matrix: the product is each range's
// product in its columns of y, bit for bit, on both row-count paths; views
// and row access cross the boundary.
TEST(QuantPackedLinear, StackedBlockTypes) {
  const int64_t k = 512, n1 = 40, n2 = 24, n = n1 + n2;
  const auto w = random_vec(static_cast<size_t>(n * k), 31, 0.2f);
  std::vector<uint8_t> b1(static_cast<size_t>(n1) * row_bytes(WeightType::kQ4_K, k)),
      b2(static_cast<size_t>(n2) * row_bytes(WeightType::kQ6_K, k));
  for (int64_t r = 0; r < n1; ++r)
    quantize_row_ref(WeightType::kQ4_K, w.data() + r * k, k, b1.data() + r * row_bytes(WeightType::kQ4_K, k));
  for (int64_t r = 0; r < n2; ++r)
    quantize_row_ref(WeightType::kQ6_K, w.data() + (n1 + r) * k, k, b2.data() + r * row_bytes(WeightType::kQ6_K, k));
  auto src = [&](const std::vector<uint8_t>& b, int64_t rows, WeightType t) {
    WeightSource s;
    s.rows = rows, s.blocks = b.data(), s.block_type = t, s.block_stride = row_bytes(t, k);
    return s;
  };
  const WeightSource parts[] = {src(b1, n1, WeightType::kQ4_K), src(b2, n2, WeightType::kQ6_K)};
  const PackedLinear p = PackedLinear::pack(parts, k, gemm_path(), {}, WeightType::kQ4_K);
  ASSERT_EQ(p.parts().size(), 2u);
  ASSERT_EQ(p.rows(), n);
  EXPECT_EQ(p.nbytes(), b1.size() + b2.size());
  const PackedLinear a = PackedLinear::from_blocks(WeightType::kQ4_K, b1.data(), n1, k);
  const PackedLinear c = PackedLinear::from_blocks(WeightType::kQ6_K, b2.data(), n2, k);
  core::ThreadPool pool(2);
  for (int64_t m : {3, 20}) {
    const auto x = random_vec(static_cast<size_t>(m * k), 32);
    const auto bias = random_vec(static_cast<size_t>(n), 33);
    const auto res = random_vec(static_cast<size_t>(m * n), 34);
    std::vector<float> y(static_cast<size_t>(m * n)), want(y.size());
    PackedLinearArgs args;
    args.x = x.data(), args.m = m, args.ldx = k, args.w = &p, args.bias = bias.data(), args.act = Activation::kGeluErf;
    args.residual = res.data(), args.ldr = n, args.y = y.data(), args.ldy = n;
    packed_linear_f32(&pool, args);
    PackedLinearArgs one = args;
    one.w = &a, one.y = want.data();
    packed_linear_f32(&pool, one);
    one.w = &c, one.y = want.data() + n1, one.bias = bias.data() + n1, one.residual = res.data() + n1;
    packed_linear_f32(&pool, one);
    EXPECT_EQ(y, want) << "m=" << m;
  }
  std::vector<float> row(static_cast<size_t>(k)), back(static_cast<size_t>(k));
  p.copy_row(n1 + 5, row.data());
  dequantize_row_ref(WeightType::kQ6_K, b2.data() + 5 * row_bytes(WeightType::kQ6_K, k), k, back.data());
  EXPECT_EQ(row, back);
  EXPECT_EQ(p.at(n1 + 5, 7), back[7]);
  const PackedLinear v = p.out_rows(n1 - 2, n1 + 3);  // across the boundary
  ASSERT_EQ(v.rows(), 5);
  EXPECT_EQ(v.at(3, 7), c.at(1, 7));
  EXPECT_EQ(v.at(0, 9), a.at(n1 - 2, 9));
  EXPECT_EQ(p.out_rows(0, 10).parts().size(), 0u);  // within one range: that range
  // C = A . W[r0:r1, :] across the boundary, against the widened rows.
  const auto am = random_vec(static_cast<size_t>(2 * 20), 35);
  std::vector<float> cm(static_cast<size_t>(2 * k));
  p.matmul_rows(am.data(), 2, 20, n1 - 10, n1 + 10, cm.data(), k);
  const core::Tensor full = p.unpack();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double s = 0;
      for (int64_t r = 0; r < 20; ++r) s += static_cast<double>(am[static_cast<size_t>(i * 20 + r)]) * full.f32()[(n1 - 10 + r) * k + j];
      EXPECT_NEAR(cm[static_cast<size_t>(i * k + j)], s, 1e-4);
    }
}

TEST(QuantPackedLinear, FromBlocksAndMatmulRows) {
  const int64_t n = 40, k = 512, m = 3;
  const auto w = random_vec(static_cast<size_t>(n * k), 21, 0.2f);
  for (WeightType t : kTypes) {
    std::vector<uint8_t> blocks(static_cast<size_t>(n) * row_bytes(t, k));
    for (int64_t r = 0; r < n; ++r) quantize_row_ref(t, w.data() + r * k, k, blocks.data() + r * row_bytes(t, k));
    const PackedLinear p = PackedLinear::from_blocks(t, blocks.data(), n, k);
    const WeightSource src{w.data(), n, k, 1};
    const PackedLinear q = PackedLinear::pack(std::span<const WeightSource>(&src, 1), k, gemm_path(), {}, t);
    EXPECT_EQ(0, std::memcmp(p.row_blocks(0), q.row_blocks(0), blocks.size()));
    // C[m, k] = A[m, r1 - r0] . W[r0:r1, :]
    const auto a = random_vec(static_cast<size_t>(m * 10), 22);
    std::vector<float> c(static_cast<size_t>(m * k));
    p.matmul_rows(a.data(), m, 10, 5, 15, c.data(), k);
    const core::Tensor full = p.unpack();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < k; ++j) {
        double s = 0;
        for (int64_t r = 0; r < 10; ++r) s += static_cast<double>(a[static_cast<size_t>(i * 10 + r)]) * full.f32()[(5 + r) * k + j];
        EXPECT_NEAR(c[static_cast<size_t>(i * k + j)], s, 1e-4);
      }
  }
  // A row length that is not a whole number of blocks stays F32.
  const WeightSource src{w.data(), 4, 40, 1};
  EXPECT_FALSE(PackedLinear::pack(std::span<const WeightSource>(&src, 1), 40, gemm_path(), {}, WeightType::kQ8_0).quantized());
}

}  // namespace
}  // namespace tessera::kernels
