// Packed dense layers against cblas_sgemm plus a double-precision epilogue,
// on both GEMM paths; the vectorised row kernels of every instruction set
// this CPU has against libm.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/packed_linear.h"
#include "kernels/simd.h"

namespace tessera::kernels {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

double act_ref(double v, Activation act) {
  switch (act) {
    case Activation::kNone: return v;
    case Activation::kGeluErf: return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    case Activation::kGeluTanh: return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case Activation::kTanh: return std::tanh(v);
    case Activation::kRelu: return v > 0 ? v : 0;
  }
  return v;
}

struct Case {
  int64_t m, n, k, ldx_pad, ldy_pad;
  bool bias;
  Activation act;
  bool residual;
};

// y = act(x W^T + b) + r by cblas_sgemm and a double epilogue, vs the packed layer.
void check_case(const Case& c, GemmPath path, core::ThreadPool* pool, int64_t row0 = 0, int64_t n_total = -1) {
  const int64_t N = n_total < 0 ? c.n : n_total;  // the packed matrix; the layer uses rows [row0, row0 + n)
  const int64_t ldx = c.k + c.ldx_pad, ldy = c.n + c.ldy_pad, ldr = c.n + 3;
  auto x = random_vec(static_cast<size_t>(std::max<int64_t>(c.m * ldx, 1)), 1);
  auto w = random_vec(static_cast<size_t>(N * c.k), 2, 0.1f);
  auto b = random_vec(static_cast<size_t>(N), 3);
  auto r = random_vec(static_cast<size_t>(std::max<int64_t>(c.m * ldr, 1)), 4);
  const float sentinel = 12345.0f;
  std::vector<float> y(static_cast<size_t>(std::max<int64_t>(c.m * ldy, 1)), sentinel), ref(y.size(), 0.0f);
  if (c.m > 0 && c.k > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(c.m), static_cast<int>(c.n),
                static_cast<int>(c.k), 1.0f, x.data(), static_cast<int>(ldx), w.data() + row0 * c.k,
                static_cast<int>(c.k), 0.0f, ref.data(), static_cast<int>(ldy));
  const WeightSource src{w.data(), N, c.k, 1};
  const PackedLinear packed = PackedLinear::pack(std::span<const WeightSource>(&src, 1), c.k, path);
  ASSERT_EQ(packed.path(), path);
  LinearArgs a;
  a.x = x.data(); a.m = c.m; a.k = c.k; a.ldx = ldx; a.n = c.n; a.packed = &packed; a.packed_row0 = row0;
  a.bias = c.bias ? b.data() + row0 : nullptr; a.act = c.act;
  a.residual = c.residual ? r.data() : nullptr; a.ldr = ldr; a.y = y.data(); a.ldy = ldy;
  linear_f32(pool, a);
  double max_err = 0.0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double v = ref[static_cast<size_t>(i * ldy + j)] + (c.bias ? b[static_cast<size_t>(row0 + j)] : 0.0);
      v = act_ref(v, c.act) + (c.residual ? r[static_cast<size_t>(i * ldr + j)] : 0.0);
      max_err = std::max(max_err, std::abs(v - y[static_cast<size_t>(i * ldy + j)]));
    }
    // The row padding is never written (the last panel has its own kernel).
    for (int64_t j = c.n; j < ldy; ++j) ASSERT_EQ(y[static_cast<size_t>(i * ldy + j)], sentinel) << i << "," << j;
  }
  EXPECT_LT(max_err, 2e-5) << "m=" << c.m << " n=" << c.n << " k=" << c.k << " path=" << gemm_path_name(path)
                           << " row0=" << row0;
}

std::vector<GemmPath> paths() {
  std::vector<GemmPath> p{GemmPath::kOpenBlas};
  if (gemm_path() == GemmPath::kLibxsmm) p.push_back(GemmPath::kLibxsmm);
  return p;
}

TEST(PackedLinearTest, MatchesCblasForEveryRowCountStrideAndEpilogue) {
  core::ThreadPool pool(2);
  const Activation acts[] = {Activation::kNone, Activation::kGeluErf, Activation::kGeluTanh, Activation::kTanh};
  for (GemmPath path : paths())
    for (int64_t m : {1, 3, 16, 17, 64, 128, 200})
      for (int e = 0; e < 8; ++e) {
        // N = 100: three full panels and a last one of 4 rows; padded strides.
        const Case c{m, 100, 72, e % 2 ? 5 : 0, e % 3 ? 7 : 0, (e & 1) != 0, acts[e % 4], (e & 4) != 0};
        check_case(c, path, e % 2 ? &pool : nullptr);
      }
}

TEST(PackedLinearTest, OddShapesAndOutputRowRanges) {
  core::ThreadPool pool(2);
  for (GemmPath path : paths()) {
    for (const Case& c : {Case{5, 1, 1, 0, 0, true, Activation::kNone, false}, Case{7, 31, 33, 1, 1, true, Activation::kGeluErf, true},
                          Case{33, 33, 768, 0, 2, false, Activation::kNone, true}, Case{2, 65, 3, 0, 0, true, Activation::kTanh, false},
                          Case{40, 96, 200, 0, 0, true, Activation::kGeluTanh, true}})
      check_case(c, path, &pool);
    // A view of output rows [row0, row0 + n), starting inside a panel and ending inside another.
    check_case(Case{17, 50, 40, 2, 3, true, Activation::kGeluErf, true}, path, &pool, 13, 100);
    check_case(Case{64, 64, 40, 0, 0, true, Activation::kNone, false}, path, &pool, 32, 128);
    check_case(Case{3, 0, 40, 0, 0, false, Activation::kNone, false}, path, &pool, 10, 20);
  }
}

TEST(PackedLinearTest, BothPathsAgreeAndLayoutsRoundTrip) {
  const int64_t n = 77, k = 45;
  auto w = random_vec(static_cast<size_t>(n * k), 5);
  // The same matrix given as Linear rows and as a Conv1D [k, n] (transposed).
  std::vector<float> wt(w.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) wt[static_cast<size_t>(c * n + r)] = w[static_cast<size_t>(r * k + c)];
  const WeightSource lin{w.data(), n, k, 1}, conv{wt.data(), n, 1, n};
  for (GemmPath path : paths()) {
    const PackedLinear a = PackedLinear::pack(std::span<const WeightSource>(&lin, 1), k, path);
    const PackedLinear b = PackedLinear::pack(std::span<const WeightSource>(&conv, 1), k, path);
    const core::Tensor ua = a.unpack(), ub = b.unpack();
    for (int64_t i = 0; i < n * k; ++i) {
      ASSERT_EQ(ua.f32()[i], w[static_cast<size_t>(i)]);
      ASSERT_EQ(ub.f32()[i], w[static_cast<size_t>(i)]);
    }
    std::vector<float> row(static_cast<size_t>(k));
    a.out_rows(40, 70).copy_row(5, row.data());  // row 45
    for (int64_t c = 0; c < k; ++c) ASSERT_EQ(row[static_cast<size_t>(c)], w[static_cast<size_t>(45 * k + c)]);
    ASSERT_EQ(a.at(76, 44), w.back());
    // C = A . W[r0:r1, :] (not transposed), against cblas.
    const int64_t m = 6, r0 = 20, r1 = 67;
    auto am = random_vec(static_cast<size_t>(m * (r1 - r0)), 6);
    std::vector<float> cm(static_cast<size_t>(m * k)), ref(cm.size());
    a.matmul_rows(am.data(), m, r1 - r0, r0, r1, cm.data(), k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, r1 - r0, 1.0f, am.data(), r1 - r0,
                w.data() + r0 * k, k, 0.0f, ref.data(), k);
    for (size_t i = 0; i < cm.size(); ++i) EXPECT_NEAR(cm[i], ref[i], 1e-4f);
  }
  // The libxsmm path against the OpenBLAS fallback on a BERT-sized layer.
  if (gemm_path() == GemmPath::kLibxsmm) {
    const int64_t m = 128, nn = 768, kk = 768;
    auto x = random_vec(static_cast<size_t>(m * kk), 7), big = random_vec(static_cast<size_t>(nn * kk), 8, 0.05f);
    auto bias = random_vec(static_cast<size_t>(nn), 9);
    const core::Tensor bt = core::Tensor::from_f32({nn}, bias);
    std::vector<float> y1(static_cast<size_t>(m * nn)), y2(y1.size());
    const WeightSource src{big.data(), nn, kk, 1};
    const PackedLinear p1 = PackedLinear::pack(std::span<const WeightSource>(&src, 1), kk, GemmPath::kLibxsmm);
    const PackedLinear p2 = PackedLinear::pack(std::span<const WeightSource>(&src, 1), kk, GemmPath::kOpenBlas);
    core::ThreadPool pool(2);
    linear_rows_f32(&pool, x.data(), m, p1, bt, Activation::kGeluErf, nullptr, y1.data());
    linear_rows_f32(&pool, x.data(), m, p2, bt, Activation::kGeluErf, nullptr, y2.data());
    double max_err = 0.0;
    for (size_t i = 0; i < y1.size(); ++i) max_err = std::max(max_err, static_cast<double>(std::abs(y1[i] - y2[i])));
    EXPECT_LT(max_err, 1e-5);
  }
}

// A product split by input columns, summed over calls as the columns
// arrive (bp's original layer does this), equals the whole product, on both
// paths, with strides, an output-row view and an epilogue on the last call.
TEST(PackedLinearTest, ColumnRangesAccumulateToTheWholeProduct) {
  core::ThreadPool pool(2);
  const int64_t N = 100, k = 80, m = 37, ldx = k + 3, ldy = 70 + 5, row0 = 13, n = 70;
  auto x = random_vec(static_cast<size_t>(m * ldx), 11);
  auto w = random_vec(static_cast<size_t>(N * k), 12, 0.1f);
  auto b = random_vec(static_cast<size_t>(N), 13);
  std::vector<float> ref(static_cast<size_t>(m * ldy), 0.0f);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data(), ldx, w.data() + row0 * k, k, 0.0f,
              ref.data(), ldy);
  const WeightSource src{w.data(), N, k, 1};
  for (GemmPath path : paths()) {
    const PackedLinear packed = PackedLinear::pack(std::span<const WeightSource>(&src, 1), k, path);
    const PackedLinear view = packed.out_rows(row0, row0 + n);
    for (core::ThreadPool* p : {static_cast<core::ThreadPool*>(nullptr), &pool}) {
      std::vector<float> y(ref.size(), 777.0f);
      // Columns in the order [40, 64), [0, 40), [64, 80), the bias with the last.
      const int64_t ranges[][2] = {{40, 64}, {0, 40}, {64, 80}};
      for (int i = 0; i < 3; ++i) {
        PackedLinearArgs a;
        a.x = x.data() + ranges[i][0]; a.m = m; a.ldx = ldx; a.w = &view; a.y = y.data(); a.ldy = ldy;
        a.k0 = ranges[i][0]; a.k1 = ranges[i][1]; a.accumulate = i > 0;
        if (i == 2) a.bias = b.data() + row0;
        packed_linear_f32(p, a);
      }
      double max_err = 0.0;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j)
          max_err = std::max(max_err, std::abs(static_cast<double>(ref[static_cast<size_t>(r * ldy + j)]) +
                                               b[static_cast<size_t>(row0 + j)] - y[static_cast<size_t>(r * ldy + j)]));
      EXPECT_LT(max_err, 2e-5) << gemm_path_name(path);
      for (int64_t r = 0; r < m; ++r) EXPECT_EQ(y[static_cast<size_t>(r * ldy + n)], 777.0f);  // padding untouched
    }
  }
}

TEST(PackedLinearTest, TesseraGemmEnvironmentPicksThePath) {
  // gemm_path() is decided once per process; CI runs this binary (and the
  // model label) with TESSERA_GEMM=openblas too.
  const char* env = std::getenv("TESSERA_GEMM");
  if (env != nullptr && std::string(env) == "openblas") {
    EXPECT_EQ(gemm_path(), GemmPath::kOpenBlas);
  } else {
#if defined(__x86_64__)
    if (isa_supported(Isa::kAvx2)) {
      EXPECT_EQ(gemm_path(), GemmPath::kLibxsmm);
    }
#endif
  }
  const PackedLinear w = PackedLinear::pack(core::Tensor::zeros_f32({3, 4}));
  EXPECT_EQ(w.path(), gemm_path());
}

std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512})
    if (isa_supported(i)) out.push_back(i);
  return out;
}

// A dense sweep of [-10, 10] (about 2.6 million points, every float step of
// 2^-17), lengths that leave every tail size.
std::vector<float> sweep() {
  std::vector<float> v;
  for (double x = -10.0; x <= 10.0; x += 1.0 / 131072) v.push_back(static_cast<float>(x));
  v.push_back(10.0f);
  return v;
}

TEST(SimdMathTest, GeluAndTanhWithin1e6OfLibmOnEveryInstructionSet) {
  const std::vector<float> xs = sweep();
  for (Isa isa : isas()) {
    const MathOps& ops = math_ops(isa);
    struct Fn {
      const char* name;
      void (*f)(float*, int64_t);
      Activation act;
    };
    for (const Fn& fn : {Fn{"gelu_erf", ops.gelu_erf, Activation::kGeluErf}, Fn{"gelu_tanh", ops.gelu_tanh, Activation::kGeluTanh},
                         Fn{"tanh", ops.tanh, Activation::kTanh}}) {
      std::vector<float> y = xs;
      fn.f(y.data(), static_cast<int64_t>(y.size()) - 3);  // a tail of odd length, then 3 untouched
      double max_err = 0.0;
      for (size_t i = 0; i + 3 < y.size(); ++i) max_err = std::max(max_err, std::abs(y[i] - act_ref(xs[i], fn.act)));
      EXPECT_LE(max_err, 1e-6) << fn.name << " on " << isa_name(isa);
      for (size_t i = y.size() - 3; i < y.size(); ++i) EXPECT_EQ(y[i], xs[i]);
    }
  }
}

TEST(SimdMathTest, SoftmaxAndLayerNormWithin1e6OnEveryInstructionSet) {
  for (Isa isa : isas()) {
    const MathOps& ops = math_ops(isa);
    double soft_err = 0.0, ln_err = 0.0;
    for (int64_t n : {1, 7, 16, 31, 128, 200, 768, 1025}) {
      // Rows sweeping [-10, 10] (shifted per length), as scores and activations.
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = -10.0f + 20.0f * static_cast<float>((i * 37 + n) % n) / static_cast<float>(n);
      std::vector<float> s = x;
      ops.softmax_row(s.data(), n);
      double mx = -1e30, sum = 0.0;
      for (float v : x) mx = std::max(mx, static_cast<double>(v));
      for (float v : x) sum += std::exp(v - mx);
      for (int64_t i = 0; i < n; ++i)
        soft_err = std::max(soft_err, std::abs(s[static_cast<size_t>(i)] - std::exp(x[static_cast<size_t>(i)] - mx) / sum));
      auto g = random_vec(static_cast<size_t>(n), 11), b = random_vec(static_cast<size_t>(n), 12);
      std::vector<float> o(static_cast<size_t>(n));
      ops.layernorm_row(x.data(), o.data(), n, g.data(), b.data(), 1e-12f);
      double mean = 0.0, var = 0.0;
      for (float v : x) mean += v;
      mean /= static_cast<double>(n);
      for (float v : x) var += (v - mean) * (v - mean);
      var /= static_cast<double>(n);
      for (int64_t i = 0; i < n; ++i) {
        const size_t j = static_cast<size_t>(i);
        const double want = (x[j] - mean) / std::sqrt(var + 1e-12) * g[j] + b[j];
        ln_err = std::max(ln_err, std::abs(o[j] - want));
      }
    }
    EXPECT_LE(soft_err, 1e-6) << "softmax on " << isa_name(isa);
    EXPECT_LE(ln_err, 1e-6) << "layernorm on " << isa_name(isa);
  }
}

}  // namespace
}  // namespace tessera::kernels
