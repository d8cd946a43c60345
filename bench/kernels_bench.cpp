// Google Benchmark suite for the kernels, at BERT-base shapes (seq 128).
// Run with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset (see docs/performance.md).
#include <benchmark/benchmark.h>
#include <libxsmm.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "core/memory.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/packed_linear.h"
#include "kernels/simd.h"

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

// The packed dense layer, one thread: range(3) = 0 libxsmm, 1 OpenBLAS fallback.
void BM_PackedLinear(benchmark::State& st) {
  const int64_t m = st.range(0), k = st.range(1), n = st.range(2);
  const GemmPath path = st.range(3) == 0 ? gemm_path() : GemmPath::kOpenBlas;
  set_blas_threads(1);
  auto x = random_vec(m * k), w = random_vec(n * k), b = random_vec(n);
  const WeightSource src{w.data(), n, k, 1};
  const PackedLinear pw = PackedLinear::pack(std::span<const WeightSource>(&src, 1), k, path);
  std::vector<float> y(m * n);
  PackedLinearArgs a;
  a.x = x.data(); a.m = m; a.ldx = k; a.w = &pw; a.bias = b.data(); a.y = y.data(); a.ldy = n;
  for (auto _ : st) {
    packed_linear_f32(nullptr, a);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel(gemm_path_name(path));
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_PackedLinear)
    ->ArgsProduct({{128}, {768}, {2304, 768, 3072}, {0, 1}})->ArgsProduct({{128}, {3072}, {768}, {0, 1}})
    ->ArgsProduct({{64, 32}, {768}, {768, 3072}, {0, 1}})
    ->ArgsProduct({{1}, {768}, {2304, 768, 3072, 50257}, {0, 1}})->ArgsProduct({{1}, {3072}, {768}, {0, 1}});

// How the panel height (range 3) and the row tile (range 4) were chosen:
// libxsmm kernels over panels of that many weight rows, tiles of that many x rows.
void BM_PanelChoice(benchmark::State& st) {
  const int64_t m = st.range(0), k = st.range(1), n = st.range(2), P = st.range(3), T = st.range(4);
  const int64_t np = (n + P - 1) / P;
  auto x = random_vec(m * k), w = random_vec(np * P * k);
  std::vector<float> y(m * n);
  const float alpha = 1.0f, beta = 0.0f;
  const int flags = LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  const libxsmm_blasint lda = P, ldb = k, ldc = n;
  for (auto _ : st) {
    for (int64_t m0 = 0; m0 < m; m0 += T) {
      const libxsmm_blasint rows = std::min(T, m - m0);
      auto fn = libxsmm_smmdispatch(P, rows, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
      if (fn == nullptr) { st.SkipWithError("no kernel"); return; }
      for (int64_t p = 0; p < np; ++p) fn(w.data() + p * P * k, x.data() + m0 * k, y.data() + m0 * n + p * P);
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_PanelChoice)->ArgsProduct({{128, 64}, {768}, {2304}, {16, 32, 48, 64}, {16, 32, 64}})
    ->ArgsProduct({{128}, {3072}, {768}, {16, 32, 48, 64}, {16, 32, 64}})->ArgsProduct({{1}, {768}, {3072}, {16, 32, 48, 64}, {1}});

// The core's peak for the floor table: one libxsmm kernel (32 x 32 x 256)
// on operands that stay in L1/L2, over and over.
void BM_LibxsmmPeak(benchmark::State& st) {
  const libxsmm_blasint m = 32, n = 32, k = 256;
  auto a = random_vec(m * k), b = random_vec(k * n);
  std::vector<float> c(m * n);
  const float alpha = 1.0f, beta = 1.0f;
  auto fn = libxsmm_smmdispatch(m, n, k, &m, &k, &m, &alpha, &beta, nullptr, nullptr);
  if (fn == nullptr) { st.SkipWithError("no kernel"); return; }
  for (auto _ : st) {
    for (int i = 0; i < 64; ++i) fn(a.data(), b.data(), c.data());
    benchmark::DoNotOptimize(c.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(64 * 2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_LibxsmmPeak);

// The streaming read bandwidth of range(1) threads, each reading its part
// of a buffer of range(0) MiB (at least 4x the last-level cache): the decode
// floor's denominator at that many threads. Four vector sums of 64 bytes
// each: until 2026-11-29 this was one thread's loop of 16 float sums that GCC
// left scalar, bound by its adds at 22 GB/s where a read of vectors ran at
// 29-31 (AMD EPYC VM), so every floor before then was too slow. The buffer is
// allocated as packed weights are (core::alloc_large).
void BM_StreamRead(benchmark::State& st) {
  const size_t n = static_cast<size_t>(st.range(0)) << 18;  // floats
  const int threads = static_cast<int>(st.range(1));
  const auto large = core::alloc_large(n * sizeof(float));
  float* const buf = reinterpret_cast<float*>(large.get());
  std::fill(buf, buf + n, 1.0f);
  auto read = [&](size_t b, size_t e) {
    benchmark::DoNotOptimize(kernels::stream_sum_f32(buf + b, static_cast<int64_t>(e - b)));
  };
  const size_t part = n / static_cast<size_t>(threads) / 64 * 64;
  for (auto _ : st) {
    std::vector<std::thread> others;
    for (int t = 1; t < threads; ++t) others.emplace_back(read, t * part, t + 1 == threads ? n : (t + 1) * part);
    read(0, part);
    for (auto& t : others) t.join();
  }
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(n) * 4, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_StreamRead)->ArgsProduct({{512}, {1, 2, 4, 8}})->UseRealTime()->Unit(benchmark::kMillisecond);

// A decode step's quantized product: `rows` input rows against a [n, k]
// matrix in block type t, one thread, read from memory: 64 matrices of 4-16
// MB in turn, so no matrix stays in cache; or, `cached`, one matrix read
// again and again (it stays in L2 or L3): the kernel's compute rate without
// DRAM. GB/s counts the weight bytes.
void quant_decode(benchmark::State& st, WeightType t, int64_t k, int64_t n, bool cached, int64_t rows) {
  const auto w = random_vec(static_cast<size_t>(n * k));
  const WeightSource src{w.data(), n, k, 1};
  const PackedLinear one = PackedLinear::pack(std::span<const WeightSource>(&src, 1), k, gemm_path(), {}, t);
  const int copies = cached ? 1 : static_cast<int>(std::max<int64_t>(4, (256LL << 20) / static_cast<int64_t>(one.nbytes())));
  std::vector<PackedLinear> mats(static_cast<size_t>(copies), one);
  for (auto& m : mats) m = PackedLinear::from_blocks(t, one.row_blocks(0), n, k);
  const auto x = random_vec(static_cast<size_t>(rows * k));
  std::vector<float> y(static_cast<size_t>(rows * n));
  size_t i = 0;
  for (auto _ : st) {
    PackedLinearArgs a;
    a.x = x.data(), a.m = rows, a.ldx = k, a.w = &mats[i++ % mats.size()], a.y = y.data(), a.ldy = n;
    packed_linear_f32(nullptr, a);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(one.nbytes()), benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
}

// range 0: 1 q8_0, 2 q4_0, 3 q4_k, 4 q6_k; range 1: k; range 2: n; range 3: 1 cached.
void BM_QuantDecode(benchmark::State& st) {
  quant_decode(st, static_cast<WeightType>(st.range(0)), st.range(1), st.range(2), st.range(3) == 1, 1);
}
BENCHMARK(BM_QuantDecode)
    ->Args({1, 2048, 2048, 0})->Args({2, 2048, 2048, 0})->Args({3, 2048, 2048, 0})->Args({4, 2048, 2048, 0})
    ->Args({3, 768, 3072, 0})->Args({4, 768, 3072, 0})->Args({3, 1024, 2048, 0})->Args({3, 1536, 2048, 0})->Args({3, 4096, 1024, 0})
    ->Args({1, 2048, 256, 1})->Args({1, 2048, 2048, 1})->Args({3, 2048, 256, 1})->Args({3, 2048, 2048, 1})->Args({4, 2048, 2048, 1})
    // GPT-2's products in Q8_0 (attn, fc, proj, the tied head); the 1B shape's head in Q6_K
    ->Args({1, 768, 2304, 0})->Args({1, 768, 3072, 0})->Args({1, 3072, 768, 0})->Args({1, 768, 50257, 0})->Args({4, 2048, 16384, 0});

// A batched decode step (serve --max-batch): range 3 input rows against the
// [n, k] matrix from memory (range 0-2 as above). Time per row falls while
// the weights' bytes bound the step, and stays while the kernel's compute does.
void BM_QuantDecodeRows(benchmark::State& st) {
  quant_decode(st, static_cast<WeightType>(st.range(0)), st.range(1), st.range(2), false, st.range(3));
}
BENCHMARK(BM_QuantDecodeRows)->ArgsProduct({{1, 3, 4}, {2048}, {2048}, {1, 2, 3, 4, 8}});

// A prefill's product: 128 input rows against a [n, k] matrix (range 1-2) in
// block type range 0 (0 f32, 1 q8_0, 3 q4_k, 4 q6_k), on `pool` (null: one
// thread). Quantized weights are widened to F32 a panel at a time, then
// multiplied as F32's are: the ratio of the two types' times is that
// widening's cost.
void quant_prefill(benchmark::State& st, core::ThreadPool* pool) {
  const auto t = static_cast<WeightType>(st.range(0));
  const int64_t k = st.range(1), n = st.range(2), rows = 128;
  const auto w = random_vec(static_cast<size_t>(n * k));
  const WeightSource src{w.data(), n, k, 1};
  const PackedLinear mat = PackedLinear::pack(std::span<const WeightSource>(&src, 1), k, gemm_path(), {}, t);
  const auto x = random_vec(static_cast<size_t>(rows * k));
  std::vector<float> y(static_cast<size_t>(rows * n));
  for (auto _ : st) {
    PackedLinearArgs a;
    a.x = x.data(), a.m = rows, a.ldx = k, a.w = &mat, a.y = y.data(), a.ldy = n;
    packed_linear_f32(pool, a);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(rows * n * k), benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

void BM_QuantPrefill(benchmark::State& st) { quant_prefill(st, nullptr); }
BENCHMARK(BM_QuantPrefill)->ArgsProduct({{0, 1}, {768}, {2304, 3072}})->Args({0, 3072, 768})->Args({1, 3072, 768})
    ->ArgsProduct({{0, 1, 3, 4}, {2048}, {8192}})->ArgsProduct({{0, 1, 3, 4}, {8192}, {2048}})  // the 1B shape's MLP
    ->Unit(benchmark::kMillisecond);

// The same product on a pool of THREADS (range 3), as a multi-threaded
// prefill runs it: the quantized panels are widened by the thread that
// multiplies them.
void BM_QuantPrefillThreads(benchmark::State& st) {
  core::ThreadPool pool(static_cast<int>(st.range(3)));
  quant_prefill(st, &pool);
}
BENCHMARK(BM_QuantPrefillThreads)->ArgsProduct({{0, 1, 3, 4}, {2048}, {8192}, {2}})->ArgsProduct({{0, 1, 3, 4}, {8192}, {2048}, {2}})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

// The row kernels on each instruction set (range 1: 0 generic, 1 AVX2, 2 AVX-512).
void BM_GeluErfIsa(benchmark::State& st) {
  const Isa isa = static_cast<Isa>(st.range(1));
  if (!isa_supported(isa)) { st.SkipWithError("not on this CPU"); return; }
  auto x = random_vec(static_cast<size_t>(st.range(0)));
  for (auto _ : st) {
    auto y = x;
    math_ops(isa).gelu_erf(y.data(), static_cast<int64_t>(y.size()));
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel(isa_name(isa));
  st.SetItemsProcessed(st.iterations() * st.range(0));
}
BENCHMARK(BM_GeluErfIsa)->ArgsProduct({{128 * 3072}, {0, 1, 2}});

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
