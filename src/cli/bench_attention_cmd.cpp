// `tessera bench-attention`: Voltage Fig. 6. Isolated multi-head attention:
// the speed-up of computing P = N/K output rows over the full output, with
// the naive order (Eq. 3) and with the order Theorem 2 picks.
#include <algorithm>
#include <functional>
#include <cstdio>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "core/stats.h"
#include "core/io.h"
#include "core/tensor.h"
#include "kernels/gemm.h"
#include "parallel/partition_attention.h"

namespace tessera::cli {

namespace {

double median_ms(int reps, const std::function<void()>& fn) {
  std::vector<double> ms;
  fn();  // warm-up
  for (int i = 0; i < reps; ++i) {
    core::Timer t;
    fn();
    ms.push_back(t.ms());
  }
  return core::median(ms);
}

int bench_attention(int reps, int max_k) {
  kernels::set_blas_threads(1);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::printf("| H | F_H | N | K | P | naive speed-up | adaptive speed-up | order |\n|---|---|---|---|---|---|---|---|\n");
  const int64_t shapes[][2] = {{16, 64}, {8, 128}, {4, 256}};
  for (const auto& hs : shapes) {
    const int64_t h = hs[0], fh = hs[1], f = h * fh;
    core::Tensor w = core::Tensor::zeros_f32({3 * f, f});
    for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = nd(rng);
    for (int64_t n : {100, 200, 300}) {
      core::Tensor x = core::Tensor::zeros_f32({n, f}), out = core::Tensor::zeros_f32({n, f});
      for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = nd(rng);
      core::Tensor scratch = core::Tensor::zeros_f32({parallel::partition_attention_scratch(n, f, n)});
      auto time_rows = [&](int64_t p, bool eq8) {
        parallel::PartitionAttention a;
        a.x = x.f32(); a.n = n; a.f = f; a.heads = h; a.head_dim = fh; a.rows = {0, p};
        a.w_qkv = w.f32(); a.scale = 1.0f / 8; a.out = out.f32();
        return median_ms(reps, [&] { parallel::partition_attention_f32(a, eq8, scratch.f32()); });
      };
      const double full = time_rows(n, false);
      for (int k = 1; k <= max_k; ++k) {
        const int64_t p = (n + k - 1) / k;
        const bool eq8 = parallel::voltage_prefers_eq8(p, n, f, fh);
        const double naive = time_rows(p, false);
        const double adaptive = eq8 ? time_rows(p, true) : naive;
        std::printf("| %lld | %lld | %lld | %d | %lld | %.2f | %.2f | %s |\n", static_cast<long long>(h),
                    static_cast<long long>(fh), static_cast<long long>(n), k, static_cast<long long>(p), full / naive,
                    full / adaptive, eq8 ? "Eq. 8" : "Eq. 3");
      }
    }
  }
  return 0;
}

}  // namespace

void add_bench_attention(CLI::App& app) {
  auto reps = std::make_shared<int>(15);
  auto max_k = std::make_shared<int>(8);
  CLI::App* cmd = app.add_subcommand("bench-attention", "Voltage Fig. 6: partitioned attention speed-up table (markdown)");
  cmd->add_option("--reps", *reps, "timed repetitions per point")->capture_default_str();
  cmd->add_option("--max-devices", *max_k, "K = 1..this")->capture_default_str();
  cmd->callback([reps, max_k] { throw CLI::RuntimeError(bench_attention(*reps, *max_k)); });
}

}  // namespace tessera::cli
