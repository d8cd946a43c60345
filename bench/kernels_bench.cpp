// Google Benchmark suite for the kernels, at BERT-base shapes (seq 128).
// Run with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset (see docs/performance.md).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

namespace tessera::kernels {
namespace {

std::vector<float> random_vec(size_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

void BM_LinearF32(benchmark::State& st) {
  const int64_t m = st.range(0), k = st.range(1), n = st.range(2);
  set_blas_threads(1);
  auto x = random_vec(m * k), w = random_vec(n * k), b = random_vec(n);
  std::vector<float> y(m * n);
  LinearArgs a;
  a.x = x.data(); a.m = m; a.k = k; a.ldx = k; a.w = w.data(); a.n = n; a.ldw = k; a.bias = b.data();
  a.y = y.data(); a.ldy = n;
  for (auto _ : st) {
    linear_f32(nullptr, a);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_LinearF32)->Args({128, 768, 2304})->Args({128, 768, 3072})->Args({128, 3072, 768})->Args({1, 768, 3072})
    ->Args({64, 768, 768})->Args({64, 768, 3072})->Args({32, 768, 768});

// One cblas_sgemm for the whole product: what linear_f32's stripes for few
// rows (64 and 32 here, Voltage on 2 and 4 devices) are measured against.
void BM_OneProductF32(benchmark::State& st) {
  const int64_t m = st.range(0), k = st.range(1), n = st.range(2);
  set_blas_threads(1);
  auto x = random_vec(m * k), w = random_vec(n * k);
  std::vector<float> y(m * n);
  for (auto _ : st) {
    gemm_f32(false, true, m, n, k, 1.0f, x.data(), k, w.data(), k, 0.0f, y.data(), n);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_OneProductF32)->Args({64, 768, 768})->Args({64, 768, 3072})->Args({32, 768, 768});

void BM_GeluErf(benchmark::State& st) {
  auto x = random_vec(static_cast<size_t>(st.range(0)));
  for (auto _ : st) {
    auto y = x;
    activation_f32(y.data(), static_cast<int64_t>(y.size()), Activation::kGeluErf);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetItemsProcessed(st.iterations() * st.range(0));
}
BENCHMARK(BM_GeluErf)->Arg(128 * 3072);

void BM_LayerNorm(benchmark::State& st) {
  const int64_t rows = 128, cols = 768;
  auto x = random_vec(rows * cols), g = random_vec(cols), b = random_vec(cols);
  std::vector<float> y(x.size());
  for (auto _ : st) {
    layernorm_f32(x.data(), y.data(), rows, cols, g.data(), b.data(), 1e-12f);
    benchmark::DoNotOptimize(y.data());
  }
}
BENCHMARK(BM_LayerNorm);

void BM_SoftmaxRows(benchmark::State& st) {
  auto x = random_vec(12 * 128 * 128);
  for (auto _ : st) {
    auto y = x;
    softmax_rows_f32(y.data(), 12 * 128, 128);
    benchmark::DoNotOptimize(y.data());
  }
}
BENCHMARK(BM_SoftmaxRows);

void BM_Attention(benchmark::State& st) {
  const int64_t n = st.range(0), heads = 12, hd = 64, W = heads * hd;
  set_blas_threads(1);
  auto qkv = random_vec(n * 3 * W);
  std::vector<float> out(n * W), scratch(attention_scratch_floats(n, n, heads));
  AttentionArgs a;
  a.q = qkv.data(); a.ldq = 3 * W; a.k = qkv.data() + W; a.ldk = 3 * W; a.v = qkv.data() + 2 * W; a.ldv = 3 * W;
  a.out = out.data(); a.ldo = W; a.n_q = n; a.n_kv = n; a.heads = heads; a.head_dim = hd; a.scale = 0.125f;
  a.causal = st.range(1) != 0;
  for (auto _ : st) {
    attention_f32(nullptr, a, scratch.data(), static_cast<int64_t>(scratch.size()));
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_Attention)->Args({128, 0})->Args({128, 1})->Args({512, 0});

}  // namespace
}  // namespace tessera::kernels
