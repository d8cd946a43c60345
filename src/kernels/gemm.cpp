#include "kernels/gemm.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <vector>

#include "core/device_speed.h"
#include "core/check.h"
#include "kernels/flop_count.h"

namespace tessera::kernels {

void set_blas_threads(int threads) {
  // On the libxsmm path the dense layers and attention heads run on Tessera's
  // pool; OpenBLAS (the products inside one head) stays on one thread, as its
  // idle workers would spin against the pool's threads for the cores.
  if (gemm_path() == GemmPath::kLibxsmm) threads = 1;
  openblas_set_num_threads(threads < 1 ? 1 : threads);
}
int blas_threads() { return openblas_get_num_threads(); }

std::string blas_core_name() { return openblas_get_corename(); }

std::string better_blas_core() {
  const std::string core = blas_core_name();
  if (core != "Prescott" && core != "Core2" && core != "Nehalem") return "";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

void reexec_with_better_blas_core(char** argv, int threads) {
  if (std::getenv("TESSERA_KEEP_BLAS_CORE") != nullptr) return;
  bool changed = false;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::string core = better_blas_core();
    if (!core.empty()) {
      ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
      changed = true;
    }
  }
  if (threads > 0 && std::getenv("OPENBLAS_NUM_THREADS") == nullptr && threads < openblas_get_num_threads()) {
    ::setenv("OPENBLAS_NUM_THREADS", std::to_string(threads).c_str(), 1);
    changed = true;
  }
  if (changed) ::execv("/proc/self/exe", argv);  // on failure, go on as we are
}

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(m >= 0 && n >= 0 && k >= 0);
  TESSERA_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: C = beta * C (and exactly 0 when beta is 0, whatever C held)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  count_flops(2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda > 0 ? lda : 1), b, static_cast<blasint>(ldb > 0 ? ldb : 1), beta, c,
              static_cast<blasint>(ldc > 0 ? ldc : 1));
}

void gemv_f32(bool trans_b, int64_t n, int64_t k, float alpha, const float* x, const float* b, int64_t ldb, float beta,
              float* y) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(n >= 0 && k >= 0 && ldb >= (trans_b ? k : n));
  if (n == 0) return;
  if (beta == 0.0f) std::fill(y, y + n, 0.0f);  // exactly 0 whatever y held (NaN included), as gemm_f32
  if (k == 0) {
    if (beta != 0.0f)
      for (int64_t j = 0; j < n; ++j) y[j] *= beta;
    return;
  }
  count_flops(2.0 * static_cast<double>(n) * static_cast<double>(k));
  // Row-major B^T (trans_b: B is [n, k]) is gemv's NoTrans over n rows of k.
  if (trans_b)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(n), static_cast<blasint>(k), alpha, b,
                static_cast<blasint>(ldb), x, 1, beta, y, 1);
  else
    cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<blasint>(k), static_cast<blasint>(n), alpha, b,
                static_cast<blasint>(ldb), x, 1, beta, y, 1);
}

namespace {
// From this input width on, linear_f32 lets OpenBLAS pack W as its B operand
// (bench: 2560 gains nothing, 3072 and 4096 gain 5-17%).
constexpr int64_t kWideInput = 3072;
// From this many outputs on, W is multiplied in blocks of kOutputBlock rows
// (768x3072 at 64 and 128 rows: 6-8% faster; 1536 and 2304 outputs: 1-3%).
constexpr int64_t kWideOutput = 3072;
constexpr int64_t kOutputBlock = 768;
// Rows for which stripes on the small-matrix kernel beat one packed product
// (bench, k = 768: 64 rows 3-9% faster, 43 and 32 rows 12-15%; 128 rows: no
// gain, since packing W is then spread over enough rows).
constexpr int64_t kSmallRowsMin = 16;
constexpr int64_t kSmallRowsMax = 64;

// y = x W^T one stripe of outputs at a time.
void linear_in_stripes(const LinearArgs& a, int64_t stripe) {
  for (int64_t j = 0; j < a.n; j += stripe)
    gemm_f32(false, true, a.m, std::min(stripe, a.n - j), a.k, 1.0f, a.x, a.ldx, a.w + j * a.ldw, a.ldw, 0.0f, a.y + j,
             a.ldy);
}
}  // namespace

int64_t small_kernel_stripe(int64_t m, int64_t k) {
  if (m < kSmallRowsMin || m > kSmallRowsMax || k < 32) return 0;
  int64_t stripe = 0;
  for (int64_t s = 16; s * m <= 1200 && s * m * k <= 1000000; s += 16) stripe = s;
  return stripe;
}

bool blas_has_small_kernel() {
  static const bool has = [] {
    std::string core = blas_core_name();
    std::transform(core.begin(), core.end(), core.begin(), [](unsigned char ch) { return std::tolower(ch); });
    return core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
  }();
  return has;
}

void linear_f32(core::ThreadPool* pool, const LinearArgs& a) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  if (a.packed != nullptr) {
    TESSERA_CHECK(a.k == a.packed->cols() && a.packed_row0 >= 0 && a.n >= 0 && a.packed_row0 + a.n <= a.packed->rows());
    const PackedLinear view = a.packed->out_rows(a.packed_row0, a.packed_row0 + a.n);
    PackedLinearArgs pa;
    pa.x = a.x; pa.m = a.m; pa.ldx = a.ldx; pa.w = &view; pa.bias = a.bias; pa.act = a.act;
    pa.residual = a.residual; pa.ldr = a.ldr; pa.y = a.y; pa.ldy = a.ldy;
    packed_linear_f32(pool, pa);
    return;
  }
  TESSERA_CHECK(a.x != nullptr || a.m == 0);
  TESSERA_CHECK(a.w != nullptr && a.y != nullptr);
  TESSERA_CHECK(a.ldx >= a.k && a.ldw >= a.k && a.ldy >= a.n);
  // The small-matrix kernel runs on one thread only; long inputs keep the
  // W-as-B form below (measured there, not here).
  const bool small = blas_has_small_kernel() && blas_threads() == 1 && a.k < kWideInput;
  const int64_t stripe = small ? small_kernel_stripe(a.m, a.k) : 0;
  if (stripe > 0) {
    linear_in_stripes(a, stripe);
  } else if (a.k >= kWideInput && a.m > 1) {
    // OpenBLAS packs a long-rowed W slowly as its A operand (10-17% slower
    // here at k = 3072 than as B); so compute y^T = W x^T and transpose it.
    thread_local std::vector<float> yt;
    yt.resize(static_cast<size_t>(a.m * a.n));
    gemm_f32(false, true, a.n, a.m, a.k, 1.0f, a.w, a.ldw, a.x, a.ldx, 0.0f, yt.data(), a.m);
    cblas_somatcopy(CblasRowMajor, CblasTrans, static_cast<blasint>(a.n), static_cast<blasint>(a.m), 1.0f, yt.data(),
                    static_cast<blasint>(a.m), a.y, static_cast<blasint>(a.ldy));
  } else if (a.n >= kWideOutput) {
    // Many outputs: OpenBLAS runs 6-8% faster here on blocks of 768 (bench).
    linear_in_stripes(a, kOutputBlock);
  } else {
    gemm_f32(false, true, a.m, a.n, a.k, 1.0f, a.x, a.ldx, a.w, a.ldw, 0.0f, a.y, a.ldy);
  }
  if (a.bias == nullptr && a.act == Activation::kNone && a.residual == nullptr) return;
  bias_act_residual_f32_mt(pool, a.y, a.m, a.n, a.ldy, a.bias, a.act, a.residual, a.ldr);
}

}  // namespace tessera::kernels

namespace tessera::kernels {

void linear_rows_f32(core::ThreadPool* pool, const float* x, int64_t n, const core::Tensor& w, const core::Tensor& bias,
                     Activation act, const float* residual, float* y) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(w.rank() == 2);
  LinearArgs a;
  a.x = x;
  a.m = n;
  a.k = w.dim(1);
  a.ldx = a.k;
  a.w = w.f32();
  a.n = w.dim(0);
  a.ldw = a.k;
  a.bias = bias.empty() ? nullptr : bias.f32();
  a.act = act;
  a.residual = residual;
  a.ldr = a.n;
  a.y = y;
  a.ldy = a.n;
  linear_f32(pool, a);
}

void linear_rows_f32(core::ThreadPool* pool, const float* x, int64_t n, const PackedLinear& w, const core::Tensor& bias,
                     Activation act, const float* residual, float* y) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(bias.empty() || bias.numel() == w.rows());
  PackedLinearArgs a;
  a.x = x; a.m = n; a.ldx = w.cols(); a.w = &w;
  a.bias = bias.empty() ? nullptr : bias.f32();
  a.act = act; a.residual = residual; a.ldr = w.rows(); a.y = y; a.ldy = w.rows();
  packed_linear_f32(pool, a);
}

}  // namespace tessera::kernels
