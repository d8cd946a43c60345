// Kernels against scalar references, written as tables of cases.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/fast_math.h"
#include "kernels/gemm.h"

namespace tessera::kernels {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

TEST(FastMathTest, MatchesLibm) {
  for (float x = -20.0f; x <= 20.0f; x += 0.013f) {
    EXPECT_NEAR(fast_erf(x), std::erf(x), 5e-7f) << x;
    EXPECT_NEAR(fast_tanh(x), std::tanh(x), 3e-7f) << x;
  }
  for (float x = -80.0f; x <= 80.0f; x += 0.037f) EXPECT_NEAR(fast_exp(x) / std::exp(x), 1.0f, 4e-7f) << x;
  EXPECT_EQ(fast_exp(-1000.0f) < 1e-37f, true);
}

struct ActCase {
  Activation act;
  double (*ref)(double);
};

double gelu_erf_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
double tanh_ref(double x) { return std::tanh(x); }

// Every element counted once, whatever the length (whole chunks of 64):
// small integers, so any order of the adds gives the scalar sum exactly.
TEST(StreamSumTest, MatchesScalarReference) {
  for (const int64_t n : {0, 64, 128, 64 * 37}) {
    std::vector<float> x(static_cast<size_t>(n));
    double ref = 0;
    for (int64_t i = 0; i < n; ++i) ref += x[static_cast<size_t>(i)] = static_cast<float>(i % 13 - 6);
    EXPECT_EQ(stream_sum_f32(x.data(), n), static_cast<float>(ref)) << n;
  }
}

TEST(ActivationTest, MatchesScalarReference) {
  const ActCase cases[] = {{Activation::kGeluErf, gelu_erf_ref}, {Activation::kGeluTanh, gelu_tanh_ref}, {Activation::kTanh, tanh_ref}};
  for (const auto& c : cases) {
    auto x = random_vec(1001, 3, 3.0f);
    auto y = x;
    activation_f32(y.data(), static_cast<int64_t>(y.size()), c.act);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], c.ref(x[i]), 1e-6 * (1 + std::fabs(x[i]))) << i;
  }
}

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
};

TEST(GemmTest, MatchesScalarReference) {
  const GemmCase cases[] = {{1, 1, 1, false, false}, {7, 5, 3, false, true}, {33, 17, 64, true, false},
                            {16, 40, 9, true, true},  {0, 4, 4, false, false}, {3, 4, 0, false, true}};
  for (const auto& c : cases) {
    auto a = random_vec(static_cast<size_t>(c.m * c.k), 1);
    auto b = random_vec(static_cast<size_t>(c.k * c.n), 2);
    std::vector<float> got(static_cast<size_t>(c.m * c.n), 5.0f);
    const int64_t lda = c.ta ? c.m : c.k, ldb = c.tb ? c.k : c.n;
    gemm_f32(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.data(), std::max<int64_t>(lda, 1), b.data(), std::max<int64_t>(ldb, 1),
             0.0f, got.data(), std::max<int64_t>(c.n, 1));
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double want = 0.0;
        for (int64_t p = 0; p < c.k; ++p)
          want += static_cast<double>(c.ta ? a[p * lda + i] : a[i * lda + p]) * (c.tb ? b[j * ldb + p] : b[p * ldb + j]);
        EXPECT_NEAR(got[i * c.n + j], want, 1e-4) << c.m << "x" << c.n << "x" << c.k;
      }
  }
}

// One row times B or B^T with a row stride wider than B, alpha, and beta
// 0 over a y holding NaN (it is overwritten) or 0.5 (it is scaled and added).
TEST(GemvTest, MatchesScalarReference) {
  struct Case { int64_t n, k; bool tb; float beta; };
  const Case cases[] = {{9, 8, true, 0.0f}, {8, 37, false, 0.0f}, {64, 190, true, 0.5f}, {5, 3, false, 0.5f},
                        {4, 0, true, 0.5f}, {0, 4, false, 0.0f}};
  for (const auto& c : cases) {
    const int64_t ldb = (c.tb ? c.k : c.n) + 3;
    const auto x = random_vec(static_cast<size_t>(c.k), 3);
    const auto b = random_vec(static_cast<size_t>((c.tb ? c.n : c.k) * ldb + 1), 4);
    std::vector<float> y(static_cast<size_t>(c.n), c.beta == 0.0f ? std::nanf("") : 0.5f);
    gemv_f32(c.tb, c.n, c.k, 0.75f, x.data(), b.data(), ldb, c.beta, y.data());
    for (int64_t j = 0; j < c.n; ++j) {
      double want = c.beta == 0.0f ? 0.0 : 0.5 * c.beta;
      for (int64_t p = 0; p < c.k; ++p) want += 0.75 * x[p] * (c.tb ? b[j * ldb + p] : b[p * ldb + j]);
      EXPECT_NEAR(y[j], want, 1e-4) << c.n << "x" << c.k << (c.tb ? " B^T" : " B");
    }
  }
}

TEST(LinearTest, FusedEpilogueEqualsSeparateSteps) {
  const int64_t m = 9, k = 12, n = 7;
  auto x = random_vec(m * k, 4), w = random_vec(n * k, 5), b = random_vec(n, 6), r = random_vec(m * n, 7);
  std::vector<float> y(m * n);
  core::ThreadPool pool(2);
  LinearArgs a;
  a.x = x.data(); a.m = m; a.k = k; a.ldx = k; a.w = w.data(); a.n = n; a.ldw = k;
  a.bias = b.data(); a.act = Activation::kGeluErf; a.residual = r.data(); a.ldr = n; a.y = y.data(); a.ldy = n;
  linear_f32(&pool, a);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = b[j];
      for (int64_t p = 0; p < k; ++p) acc += static_cast<double>(x[i * k + p]) * w[j * k + p];
      EXPECT_NEAR(y[i * n + j], gelu_erf_ref(acc) + r[i * n + j], 1e-4);
    }
}

// A linear_f32 case with padded rows everywhere: y starts at 7 (its padding
// must stay), and the reference is x W^T + b in double precision.
struct StridedLinear {
  int64_t m, k, n, ldx, ldw, ldy;
  std::vector<float> x, w, b, y;
  LinearArgs args;
  StridedLinear(int64_t rows, int64_t in, int64_t out, uint32_t seed)
      : m(rows), k(in), n(out), ldx(in + 3), ldw(in + 1), ldy(out + 2), x(random_vec(m * ldx, seed)),
        w(random_vec(n * ldw, seed + 1)), b(random_vec(n, seed + 2)), y(m * ldy, 7.0f) {
    args.x = x.data(); args.m = m; args.k = k; args.ldx = ldx; args.w = w.data(); args.n = n; args.ldw = ldw;
    args.bias = b.data(); args.y = y.data(); args.ldy = ldy;
  }
  double reference(int64_t i, int64_t j) const {
    double acc = b[j];
    for (int64_t p = 0; p < k; ++p) acc += static_cast<double>(x[i * ldx + p]) * w[j * ldw + p];
    return acc;
  }
  bool padding_untouched() const {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = n; j < ldy; ++j)
        if (y[i * ldy + j] != 7.0f) return false;
    return true;
  }
};

// Wide inputs (k >= 3072) take the transposed-output path; strided rows too.
TEST(LinearTest, WideInputWithStridesEqualsReference) {
  for (const int64_t m : {1, 5, 33}) {
    StridedLinear t(m, 3072, 6, 11);
    linear_f32(nullptr, t.args);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < t.n; ++j) EXPECT_NEAR(t.y[i * t.ldy + j], t.reference(i, j), 2e-3) << m << " " << i << " " << j;
    EXPECT_TRUE(t.padding_untouched()) << m;
  }
}

// Many outputs (n >= 3072) are computed in blocks; the last one is partial.
TEST(LinearTest, ManyOutputsInBlocksEqualReference) {
  const int64_t m = 3, k = 5, n = 3072 + 100, ldy = n + 4;
  auto x = random_vec(m * k, 14), w = random_vec(n * k, 15), b = random_vec(n, 16), r = random_vec(m * n, 17);
  std::vector<float> y(m * ldy, 7.0f);
  LinearArgs a;
  a.x = x.data(); a.m = m; a.k = k; a.ldx = k; a.w = w.data(); a.n = n; a.ldw = k;
  a.bias = b.data(); a.residual = r.data(); a.ldr = n; a.y = y.data(); a.ldy = ldy;
  linear_f32(nullptr, a);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = b[j];
      for (int64_t p = 0; p < k; ++p) acc += static_cast<double>(x[i * k + p]) * w[j * k + p];
      ASSERT_NEAR(y[i * ldy + j], acc + r[i * n + j], 1e-4) << i << " " << j;
    }
    for (int64_t j = n; j < ldy; ++j) EXPECT_EQ(y[i * ldy + j], 7.0f);
  }
}

// Few rows go in stripes of outputs on OpenBLAS's small-matrix kernel (where
// the core has one): stripes obey that kernel's limits, and results with a
// partial last stripe and strides equal the reference either way.
TEST(LinearTest, StripeWidthsFollowTheSmallKernelLimits) {
  EXPECT_EQ(small_kernel_stripe(64, 768), 16);  // 16 * 64 = 1024 <= 1200
  EXPECT_EQ(small_kernel_stripe(32, 768), 32);
  EXPECT_EQ(small_kernel_stripe(43, 768), 16);
  EXPECT_EQ(small_kernel_stripe(16, 768), 64);  // 64 * 16 * 768 = 786432 <= 10^6
  EXPECT_EQ(small_kernel_stripe(128, 768), 0);  // rows enough to spread packing over
  EXPECT_EQ(small_kernel_stripe(8, 768), 0);
  EXPECT_EQ(small_kernel_stripe(64, 16), 0);    // k below 32
  EXPECT_EQ(small_kernel_stripe(64, 1536), 0);  // 16 * 64 * 1536 > 10^6
  for (int64_t m = 16; m <= 64; ++m)
    for (const int64_t k : {32, 768, 1000}) {
      const int64_t s = small_kernel_stripe(m, k);
      if (s == 0) continue;
      EXPECT_EQ(s % 16, 0);
      EXPECT_LE(s * m, 1200);
      EXPECT_LE(s * m * k, 1000000);
    }
}

TEST(LinearTest, FewRowsInStripesEqualReference) {
  const int threads = blas_threads();
  set_blas_threads(1);  // the stripes are for one BLAS thread
  for (const int64_t m : {16, 40, 64}) {
    StridedLinear t(m, 96, 100, 21);  // 100 outputs: the last stripe is partial
    t.args.act = Activation::kGeluErf;
    linear_f32(nullptr, t.args);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < t.n; ++j) {
        const double z = t.reference(i, j), gelu = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
        EXPECT_NEAR(t.y[i * t.ldy + j], gelu, 1e-4) << m << " " << i << " " << j;
      }
    EXPECT_TRUE(t.padding_untouched()) << m;
  }
  set_blas_threads(threads);
}

TEST(LayerNormTest, MatchesScalarReference) {
  for (int64_t cols : {1, 5, 16, 64, 100}) {
    const int64_t rows = 3;
    auto x = random_vec(rows * cols, 8, 2.0f), g = random_vec(cols, 9), be = random_vec(cols, 10);
    std::vector<float> y(x.size());
    layernorm_f32(x.data(), y.data(), rows, cols, g.data(), be.data(), 1e-5f);
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c];
      mean /= cols;
      for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
      var /= cols;
      for (int64_t c = 0; c < cols; ++c)
        EXPECT_NEAR(y[r * cols + c], (x[r * cols + c] - mean) / std::sqrt(var + 1e-5) * g[c] + be[c], 1e-4);
    }
  }
}

TEST(SoftmaxTest, RowsSumToOneAndMatchReference) {
  for (int64_t cols : {1, 3, 17, 128}) {
    auto x = random_vec(2 * cols, 11, 5.0f);
    auto y = x;
    softmax_rows_f32(y.data(), 2, cols);
    for (int64_t r = 0; r < 2; ++r) {
      double mx = -1e30, sum = 0;
      for (int64_t c = 0; c < cols; ++c) mx = std::max<double>(mx, x[r * cols + c]);
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(x[r * cols + c] - mx);
      for (int64_t c = 0; c < cols; ++c) EXPECT_NEAR(y[r * cols + c], std::exp(x[r * cols + c] - mx) / sum, 1e-6);
    }
  }
}

// Straightforward attention in double for one configuration.
std::vector<double> attention_ref(const AttentionArgs& a) {
  const int64_t W = a.heads * a.head_dim;
  std::vector<double> out(static_cast<size_t>(a.n_q * W), 0.0);
  for (int64_t h = 0; h < a.heads; ++h)
    for (int64_t i = 0; i < a.n_q; ++i) {
      std::vector<double> s(static_cast<size_t>(a.n_kv));
      double mx = -1e300;
      for (int64_t j = 0; j < a.n_kv; ++j) {
        const bool visible = !a.causal || a.kv_pos0 + j <= a.q_pos0 + i;
        double d = 0;
        for (int64_t e = 0; e < a.head_dim; ++e) d += a.q[i * a.ldq + h * a.head_dim + e] * a.k[j * a.ldk + h * a.head_dim + e];
        s[j] = visible ? d * a.scale : -1e300;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (auto& v : s) sum += v = (v <= -1e299 ? 0.0 : std::exp(v - mx));
      if (sum == 0.0) continue;  // no visible key: the row stays zero
      for (int64_t j = 0; j < a.n_kv; ++j)
        for (int64_t e = 0; e < a.head_dim; ++e)
          out[i * W + h * a.head_dim + e] += s[j] / sum * a.v[j * a.ldv + h * a.head_dim + e];
    }
  return out;
}

struct AttnCase {
  int64_t n_q, n_kv, heads, head_dim;
  bool causal;
  int64_t q_pos0, kv_pos0;
  int64_t scratch_heads;  // scratch for this many heads (tests grouping)
};

TEST(AttentionTest, MatchesReferenceForStridedInputs) {
  const AttnCase cases[] = {{5, 5, 2, 4, false, 0, 0, 2}, {7, 7, 4, 8, true, 0, 0, 4},  {3, 10, 3, 5, true, 7, 0, 1},
                            {1, 9, 2, 8, true, 8, 0, 2},  {4, 6, 2, 3, false, 0, 0, 1}, {6, 4, 2, 4, true, 2, 3, 2}};
  core::ThreadPool pool(2);
  for (const auto& c : cases) {
    const int64_t W = c.heads * c.head_dim;
    // Q, K, V interleaved in one buffer with row stride 3W, as after a fused QKV GEMM.
    auto qkv = random_vec(static_cast<size_t>(std::max(c.n_q, c.n_kv) * 3 * W), 12);
    std::vector<float> out(static_cast<size_t>(c.n_q * W));
    AttentionArgs a;
    a.q = qkv.data(); a.ldq = 3 * W; a.k = qkv.data() + W; a.ldk = 3 * W; a.v = qkv.data() + 2 * W; a.ldv = 3 * W;
    a.out = out.data(); a.ldo = W; a.n_q = c.n_q; a.n_kv = c.n_kv; a.heads = c.heads; a.head_dim = c.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)); a.causal = c.causal; a.q_pos0 = c.q_pos0; a.kv_pos0 = c.kv_pos0;
    std::vector<float> scratch(static_cast<size_t>(c.n_q * c.n_kv * c.scratch_heads));
    attention_f32(&pool, a, scratch.data(), static_cast<int64_t>(scratch.size()));
    const auto want = attention_ref(a);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5) << i;
  }
}

// F16 rows, both ways, against the scalar conversion of core/dtype.h (the
// reference), at widths that exercise the vector body and the tail.
TEST(HalfRowsTest, MatchTheScalarConversion) {
  for (const int64_t cols : {1, 7, 8, 19, 64}) {
    const int64_t rows = 3, ld = cols + 5;
    auto x = random_vec(static_cast<size_t>(rows * ld), 21, 3.0f);
    x[0] = 65504.0f;  // the largest half
    x[1 % x.size()] = -1e-7f;  // a subnormal
    std::vector<uint16_t> h(static_cast<size_t>(rows * ld), 0xFFFF);
    f32_rows_to_f16(x.data(), ld, rows, cols, h.data(), ld);
    std::vector<float> back(static_cast<size_t>(rows * cols));
    f16_rows_to_f32(h.data(), ld, rows, cols, back.data(), cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        EXPECT_EQ(h[i], core::f32_to_f16(x[i])) << cols << " " << r << "," << c;
        EXPECT_EQ(back[static_cast<size_t>(r * cols + c)], core::f16_to_f32(h[i]));
      }
    for (int64_t r = 0; r < rows; ++r)  // the padding between rows is untouched
      for (int64_t c = cols; c < ld; ++c) EXPECT_EQ(h[static_cast<size_t>(r * ld + c)], 0xFFFF);
  }
}

// Attention over an F16 cache is attention over its values widened: the
// same as the F32 path given the F32 rows the halves hold (grouped heads too).
TEST(AttentionTest, HalfKeysAndValuesEqualTheirWidenedCopy) {
  const int64_t n_q = 1, n_kv = 37, heads = 4, kv_heads = 2, d = 16, W = heads * d, KW = kv_heads * d;
  const auto q = random_vec(static_cast<size_t>(n_q * W), 31);
  const auto kv = random_vec(static_cast<size_t>(n_kv * 2 * KW), 32);
  std::vector<uint16_t> h(kv.size());
  f32_rows_to_f16(kv.data(), 2 * KW, n_kv, 2 * KW, h.data(), 2 * KW);
  std::vector<float> widened(kv.size());
  f16_rows_to_f32(h.data(), 2 * KW, n_kv, 2 * KW, widened.data(), 2 * KW);
  core::ThreadPool pool(2);
  std::vector<float> out32(static_cast<size_t>(n_q * W)), out16(out32.size());
  std::vector<float> scratch(static_cast<size_t>(n_q * n_kv * heads));
  AttentionArgs a;
  a.q = q.data(); a.ldq = W; a.ldk = a.ldv = 2 * KW; a.ldo = W;
  a.n_q = n_q; a.n_kv = n_kv; a.heads = heads; a.head_dim = d; a.kv_group = heads / kv_heads;
  a.scale = 0.25f; a.causal = true; a.q_pos0 = n_kv - 1;
  a.k = widened.data(); a.v = widened.data() + KW; a.out = out32.data();
  attention_f32(&pool, a, scratch.data(), static_cast<int64_t>(scratch.size()));
  a.k = a.v = nullptr;
  a.k_f16 = h.data(); a.v_f16 = h.data() + KW; a.out = out16.data();
  attention_f32(&pool, a, scratch.data(), static_cast<int64_t>(scratch.size()));
  for (size_t i = 0; i < out32.size(); ++i) EXPECT_NEAR(out16[i], out32[i], 1e-6) << i;
}

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  core::ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 5, 1000}) {
    std::vector<int> hits(static_cast<size_t>(n), 0);
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
    });
    for (int h : hits) EXPECT_EQ(h, 1);
  }
}

}  // namespace
}  // namespace tessera::kernels
