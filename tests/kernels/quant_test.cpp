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

const WeightType kTypes[] = {WeightType::kQ8_0, WeightType::kQ4_0};

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

TEST(QuantFormat, ErrorWithinHalfAStep) {
  const auto x = random_vec(32 * 64, 7);
  for (WeightType t : kTypes) {
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
    for (int64_t k : {8, 64, 96}) {  // 32 rows into the panel form: element (r, c) at c * 32 + r
      const auto rows = random_vec(static_cast<size_t>(32 * k), 30);
      std::vector<float> panel(rows.size(), -1.0f);
      ops.rows_to_panel(rows.data(), k, panel.data());
      for (int64_t r = 0; r < 32; ++r)
        for (int64_t c = 0; c < k; ++c)
          ASSERT_EQ(panel[static_cast<size_t>(c * 32 + r)], rows[static_cast<size_t>(r * k + c)]) << isa_name(isa) << " " << r << "," << c;
    }
    for (WeightType t : kTypes) {
      for (int64_t nb : {1, 2, 5, 24}) {
        const int64_t k = nb * 32;
        std::vector<uint8_t> q(row_bytes(t, k));
        quantize_row_ref(t, random_vec(static_cast<size_t>(k), 11 + static_cast<uint32_t>(nb)).data(), k, q.data());
        std::vector<float> ref(static_cast<size_t>(k)), got(static_cast<size_t>(k));
        dequantize_row_ref(t, q.data(), k, ref.data());
        (t == WeightType::kQ8_0 ? ops.dequant_q8_0 : ops.dequant_q4_0)(q.data(), nb, got.data());
        EXPECT_EQ(got, ref) << isa_name(isa) << " " << weight_type_name(t) << " nb=" << nb;
        for (int64_t m = 1; m <= kQuantDotRows; ++m) {
          // Input rows as Q8_0 blocks, 2 bytes apart beyond their length.
          const size_t ldq = row_bytes(WeightType::kQ8_0, k) + 2;
          const auto x = random_vec(static_cast<size_t>(m * k), 5 + static_cast<uint32_t>(m));
          std::vector<uint8_t> xq(static_cast<size_t>(m) * ldq);
          for (int64_t i = 0; i < m; ++i) quantize_input_ref(x.data() + i * k, k, xq.data() + i * ldq);
          std::vector<float> out(static_cast<size_t>(m), -1.0f);
          (t == WeightType::kQ8_0 ? ops.dot_q8_0 : ops.dot_q4_0)(q.data(), 0, 1, nb, xq.data(), m, ldq, out.data(), 1);
          // Several weight rows at once (tiles of 4 and 2 and the rest): row r of a
          // 7-row matrix is the same row, again.
          std::vector<uint8_t> seven;
          for (int r = 0; r < 7; ++r) seven.insert(seven.end(), q.begin(), q.end());
          std::vector<float> many(static_cast<size_t>(m * 7), -1.0f);
          (t == WeightType::kQ8_0 ? ops.dot_q8_0 : ops.dot_q4_0)(seven.data(), q.size(), 7, nb, xq.data(), m, ldq, many.data(), 7);
          for (int64_t i = 0; i < m; ++i)
            for (int r = 0; r < 7; ++r) EXPECT_EQ(many[static_cast<size_t>(i * 7 + r)], out[static_cast<size_t>(i)]) << r;
          for (int64_t i = 0; i < m; ++i) {
            const float r = dot_row_ref(t, q.data(), nb, xq.data() + i * ldq);
            // Against the widened blocks in double: the same products.
            std::vector<float> xr(static_cast<size_t>(k));
            dequantize_row_ref(WeightType::kQ8_0, xq.data() + i * ldq, k, xr.data());
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
    std::vector<uint8_t> q(row_bytes(WeightType::kQ8_0, kk));
    quantize_input_ref(x.data() + i * ldx, kk, q.data());
    dequantize_row_ref(WeightType::kQ8_0, q.data(), kk, xr.data() + i * ldx);
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
        check({1, 70, 64, 0, 64, false, Activation::kNone}, t, path, tp);
        check({5, 100, 128, 32, 96, true, Activation::kGeluErf}, t, path, tp);
        check({8, 300, 256, 0, 256, false, Activation::kGeluErf}, t, path, tp);
        check({9, 70, 96, 0, 96, false, Activation::kNone}, t, path, tp);
        check({45, 130, 256, 64, 192, true, Activation::kNone}, t, path, tp);
        check({70, 33, 512, 0, 512, false, Activation::kGeluErf}, t, path, tp);
      }
    }
}

TEST(QuantPackedLinear, FromBlocksAndMatmulRows) {
  const int64_t n = 40, k = 96, m = 3;
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
