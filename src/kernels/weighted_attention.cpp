#include "kernels/weighted_attention.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/fast_math.h"
#include "kernels/gemm.h"

namespace tessera::kernels {

int64_t weighted_attention_scratch_floats(int64_t n_q, int64_t n_kv) { return n_q * n_kv; }

void weighted_softmax_rows_f32(float* scores, int64_t rows, int64_t n_kv, const float* counts, bool causal,
                               int64_t q_pos0, const int64_t* key_pos, int64_t kv_pos0) {
  TESSERA_CHECK(rows >= 0 && n_kv >= 0 && (scores != nullptr || rows * n_kv == 0));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * n_kv;
    const int64_t qp = q_pos0 + r;
    // Weight of key j: its count when the query may see it, else 0.
    auto weight = [&](int64_t j) {
      const bool visible = !causal || (key_pos ? key_pos[j] : kv_pos0 + j) <= qp;
      return visible ? (counts ? counts[j] : 1.0f) : 0.0f;
    };
    // The max over weighted keys only: a masked key may score far higher and
    // would underflow every exponential that counts.
    float mx = 0.0f;
    bool any = false;
    for (int64_t j = 0; j < n_kv; ++j)
      if (weight(j) > 0.0f && (!any || row[j] > mx)) {
        mx = row[j];
        any = true;
      }
    float sum = 0.0f;
    for (int64_t j = 0; j < n_kv; ++j) {
      // fast_exp clamps, so a masked key's term is a finite value times 0.
      row[j] = weight(j) * fast_exp(row[j] - mx);
      sum += row[j];
    }
    if (!any || !(sum > 0.0f)) {
      std::fill(row, row + n_kv, 0.0f);
      continue;
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n_kv; ++j) row[j] *= inv;
  }
}

void weighted_attention_f32(core::ThreadPool* pool, const WeightedAttentionArgs& a, float* scratch,
                            int64_t scratch_floats) {
  TESSERA_CHECK(a.n_q >= 0 && a.n_kv >= 0 && a.heads > 0 && a.head_dim > 0);
  const int64_t width = a.heads * a.head_dim;
  TESSERA_CHECK(a.ldq >= width && a.ldk >= width && a.ldv >= width && a.ldo >= width);
  if (a.n_q == 0) return;
  if (a.n_kv == 0) {
    for (int64_t i = 0; i < a.n_q; ++i) std::fill(a.out + i * a.ldo, a.out + i * a.ldo + width, 0.0f);
    return;
  }
  TESSERA_CHECK_MSG(scratch != nullptr && scratch_floats >= a.n_q * a.n_kv, "weighted attention scratch too small");
  if (a.counts != nullptr)
    for (int64_t j = 0; j < a.n_kv; ++j) TESSERA_CHECK_MSG(a.counts[j] >= 0.0f, "negative key count at " << j);
  // Heads one after another with BLAS's own threads, as in attention_f32.
  for (int64_t h = 0; h < a.heads; ++h) {
    const int64_t col = h * a.head_dim;
    gemm_f32(false, true, a.n_q, a.n_kv, a.head_dim, a.scale, a.q + col, a.ldq, a.k + col, a.ldk, 0.0f, scratch,
             a.n_kv);
    weighted_softmax_rows_f32(scratch, a.n_q, a.n_kv, a.counts, a.causal, a.q_pos0, a.key_pos, a.kv_pos0);
    gemm_f32(false, false, a.n_q, a.head_dim, a.n_kv, 1.0f, scratch, a.n_kv, a.v + col, a.ldv, 0.0f, a.out + col,
             a.ldo);
  }
}

}  // namespace tessera::kernels
