#include "kernels/weighted_attention.h"

#include <algorithm>

#include "core/device_speed.h"
#include "core/check.h"
#include "kernels/fast_math.h"
#include "kernels/gemm.h"

namespace tessera::kernels {

int64_t weighted_attention_scratch_floats(int64_t n_q, int64_t n_kv) { return n_q * n_kv + n_kv; }

namespace {

constexpr int kLanes = 16;  // independent accumulators, so the sums vectorise

// Scores of one row -> weights, for keys with weight w[j] (count, or 0 when
// the query may not see the key). Branch-free loops that the compiler
// vectorises; returns false when no key has a positive weight.
bool weighted_softmax_row(float* row, int64_t n, const float* w) {
  constexpr float kNone = -3.0e38f;
  float lane_max[kLanes];
  for (float& m : lane_max) m = kNone;
  int64_t j = 0;
  // The max over weighted keys only: a masked key may score far higher and
  // would underflow every exponential that counts.
  for (; j + kLanes <= n; j += kLanes)
    for (int e = 0; e < kLanes; ++e) {
      const float r = row[j + e], g = w[j + e];
      const float v = g > 0.0f ? r : kNone;
      lane_max[e] = lane_max[e] > v ? lane_max[e] : v;
    }
  float mx = kNone;
  for (; j < n; ++j) mx = std::max(mx, w[j] > 0.0f ? row[j] : kNone);
  for (float m : lane_max) mx = std::max(mx, m);
  if (mx == kNone) return false;
  // fast_exp clamps, so a masked key's term is a finite value times 0.
  for (j = 0; j < n; ++j) row[j] = w[j] * fast_exp(row[j] - mx);
  float lane_sum[kLanes] = {};
  for (j = 0; j + kLanes <= n; j += kLanes)
    for (int e = 0; e < kLanes; ++e) lane_sum[e] += row[j + e];
  float sum = 0.0f;
  for (; j < n; ++j) sum += row[j];
  for (float a : lane_sum) sum += a;
  if (!(sum > 0.0f)) return false;
  const float inv = 1.0f / sum;
  for (j = 0; j < n; ++j) row[j] *= inv;
  return true;
}

}  // namespace

void weighted_softmax_rows_f32(float* scores, int64_t rows, int64_t n_kv, const float* counts, bool causal,
                               int64_t q_pos0, const int64_t* key_pos, int64_t kv_pos0, float* w) {
  TESSERA_CHECK(rows >= 0 && n_kv >= 0 && (scores != nullptr || rows * n_kv == 0));
  TESSERA_CHECK(w != nullptr || n_kv == 0);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * n_kv;
    const int64_t qp = q_pos0 + r;
    if (causal || r == 0) {  // without the causal rule every row has the same weights
      for (int64_t j = 0; j < n_kv; ++j) {
        const int64_t kp = key_pos ? key_pos[j] : kv_pos0 + j;
        w[j] = !causal || kp <= qp ? (counts ? counts[j] : 1.0f) : 0.0f;
      }
    }
    if (!weighted_softmax_row(row, n_kv, w)) std::fill(row, row + n_kv, 0.0f);
  }
}

void weighted_attention_f32(core::ThreadPool* pool, const WeightedAttentionArgs& a, float* scratch,
                            int64_t scratch_floats) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(a.n_q >= 0 && a.n_kv >= 0 && a.heads > 0 && a.head_dim > 0);
  const int64_t width = a.heads * a.head_dim;
  TESSERA_CHECK(a.ldq >= width && a.ldk >= width && a.ldv >= width && a.ldo >= width);
  if (a.n_q == 0) return;
  if (a.n_kv == 0) {
    for (int64_t i = 0; i < a.n_q; ++i) std::fill(a.out + i * a.ldo, a.out + i * a.ldo + width, 0.0f);
    return;
  }
  TESSERA_CHECK_MSG(scratch != nullptr && scratch_floats >= weighted_attention_scratch_floats(a.n_q, a.n_kv),
                    "weighted attention scratch too small");
  float* weights = scratch + a.n_q * a.n_kv;
  if (a.counts != nullptr)
    for (int64_t j = 0; j < a.n_kv; ++j) TESSERA_CHECK_MSG(a.counts[j] >= 0.0f, "negative key count at " << j);
  // Heads one after another with BLAS's own threads, as in attention_f32.
  for (int64_t h = 0; h < a.heads; ++h) {
    const int64_t col = h * a.head_dim;
    gemm_f32(false, true, a.n_q, a.n_kv, a.head_dim, a.scale, a.q + col, a.ldq, a.k + col, a.ldk, 0.0f, scratch,
             a.n_kv);
    weighted_softmax_rows_f32(scratch, a.n_q, a.n_kv, a.counts, a.causal, a.q_pos0, a.key_pos, a.kv_pos0, weights);
    gemm_f32(false, false, a.n_q, a.head_dim, a.n_kv, 1.0f, scratch, a.n_kv, a.v + col, a.ldv, 0.0f, a.out + col,
             a.ldo);
  }
}

}  // namespace tessera::kernels
