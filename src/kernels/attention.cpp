#include "kernels/attention.h"

#include <algorithm>
#include <limits>
#include <vector>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/device_speed.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

namespace tessera::kernels {

int64_t attention_scratch_floats(int64_t n_q, int64_t n_kv, int64_t heads) { return n_q * n_kv * heads; }

void f16_rows_to_f32(const uint16_t* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * ld_src;
    float* d = dst + r * ld_dst;
    int64_t j = 0;
#if defined(__F16C__)
    for (; j + 8 <= cols; j += 8)
      _mm256_storeu_ps(d + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + j))));
#endif
    for (; j < cols; ++j) d[j] = core::f16_to_f32(s[j]);
  }
}

void f32_rows_to_f16(const float* src, int64_t ld_src, int64_t rows, int64_t cols, uint16_t* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld_src;
    uint16_t* d = dst + r * ld_dst;
    int64_t j = 0;
#if defined(__F16C__)
    for (; j + 8 <= cols; j += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + j), _mm256_cvtps_ph(_mm256_loadu_ps(s + j), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; j < cols; ++j) d[j] = core::f32_to_f16(s[j]);
  }
}

void masked_softmax_row_f32(float* row, int64_t n, int64_t visible_end) {
  TESSERA_CHECK(visible_end >= 1 && visible_end <= n);
  softmax_rows_f32(row, 1, visible_end);
  std::fill(row + visible_end, row + n, 0.0f);
}

void attention_softmax_rows_f32(float* scores, int64_t rows, int64_t n_kv, bool causal, int64_t q_pos0, int64_t kv_pos0) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * n_kv;
    if (!causal) {
      softmax_rows_f32(row, 1, n_kv);
      continue;
    }
    const int64_t visible = std::clamp<int64_t>(q_pos0 + r - kv_pos0 + 1, 0, n_kv);
    if (visible == 0) {  // nothing visible: the row contributes zeros
      std::fill(row, row + n_kv, 0.0f);
      continue;
    }
    masked_softmax_row_f32(row, n_kv, visible);
  }
}

namespace {

void softmax_block(const AttentionArgs& a, float* scores, int64_t row_begin, int64_t row_end) {
  attention_softmax_rows_f32(scores + row_begin * a.n_kv, row_end - row_begin, a.n_kv, a.causal, a.q_pos0 + row_begin,
                             a.kv_pos0);
}

}  // namespace

namespace {

// One head end to end: scores, softmax, weighted values.
void attention_head(const AttentionArgs& a, int64_t head, float* scores) {
  const int64_t col = head * a.head_dim;
  const int64_t g = std::max<int64_t>(a.kv_group, 1);
  const int64_t kv_col = ((a.q_head0 + head) / g - a.q_head0 / g) * a.head_dim;
  const float *k = nullptr, *v = nullptr;
  int64_t ldk = a.ldk, ldv = a.ldv;
  if (a.k_f16 == nullptr) {
    k = a.k + kv_col;
    v = a.v + kv_col;
  } else {  // this head's K and V blocks widened (per thread: heads run in parallel)
    thread_local std::vector<float> kv;
    kv.resize(static_cast<size_t>(2 * a.n_kv * a.head_dim));
    f16_rows_to_f32(a.k_f16 + kv_col, a.ldk, a.n_kv, a.head_dim, kv.data(), a.head_dim);
    f16_rows_to_f32(a.v_f16 + kv_col, a.ldv, a.n_kv, a.head_dim, kv.data() + a.n_kv * a.head_dim, a.head_dim);
    k = kv.data();
    v = kv.data() + a.n_kv * a.head_dim;
    ldk = ldv = a.head_dim;
  }
  if (a.n_q == 1) {  // a decode step: gemv, which packs nothing (sgemm's packing was 6% of a 1B Q8_0 token)
    gemv_f32(true, a.n_kv, a.head_dim, a.scale, a.q + col, k, ldk, 0.0f, scores);
    softmax_block(a, scores, 0, 1);
    gemv_f32(false, a.head_dim, a.n_kv, 1.0f, scores, v, ldv, 0.0f, a.out + col);
    return;
  }
  gemm_f32(false, true, a.n_q, a.n_kv, a.head_dim, a.scale, a.q + col, a.ldq, k, ldk, 0.0f, scores, a.n_kv);
  softmax_block(a, scores, 0, a.n_q);
  gemm_f32(false, false, a.n_q, a.head_dim, a.n_kv, 1.0f, scores, a.n_kv, v, ldv, 0.0f, a.out + col, a.ldo);
}

}  // namespace

void attention_f32(core::ThreadPool* pool, const AttentionArgs& a, float* scratch, int64_t scratch_floats) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(a.n_q >= 0 && a.n_kv >= 0 && a.heads > 0 && a.head_dim > 0);
  const int64_t width = a.heads * a.head_dim;
  TESSERA_CHECK(a.kv_group >= 0 && a.q_head0 >= 0);
  const int64_t g = std::max<int64_t>(a.kv_group, 1);
  const int64_t kv_width = ((a.q_head0 + a.heads - 1) / g - a.q_head0 / g + 1) * a.head_dim;
  TESSERA_CHECK(a.ldq >= width && a.ldk >= kv_width && a.ldv >= kv_width && a.ldo >= width);
  TESSERA_CHECK((a.k_f16 == nullptr) == (a.v_f16 == nullptr));
  if (a.n_q == 0) return;
  if (a.n_kv == 0) {
    for (int64_t i = 0; i < a.n_q; ++i) std::fill(a.out + i * a.ldo, a.out + i * a.ldo + width, 0.0f);
    return;
  }
  const int64_t per_head = a.n_q * a.n_kv;
  TESSERA_CHECK_MSG(scratch != nullptr && scratch_floats >= per_head, "attention scratch too small");
  // With OpenBLAS on one thread (the libxsmm path, see set_blas_threads)
  // heads run in parallel on the pool, each chunk of heads in its own slot.
  // Otherwise heads run one after another with BLAS's own threads: running
  // them on our pool fights OpenBLAS's spinning workers for the cores
  // (measured: 2 threads went from 112 to 218 ms on BERT-base).
  if (pool != nullptr && pool->size() > 1 && blas_threads() == 1 && scratch_floats / per_head >= a.heads) {
    pool->parallel_for(a.heads, [&](int64_t b, int64_t e) {
      for (int64_t h = b; h < e; ++h) attention_head(a, h, scratch + b * per_head);
    });
    return;
  }
  for (int64_t h = 0; h < a.heads; ++h) attention_head(a, h, scratch);
}

}  // namespace tessera::kernels
