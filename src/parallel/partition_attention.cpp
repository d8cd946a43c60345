// Partitioned attention (Voltage's Algorithm 1): the attention output of a
// block of rows, by Eq. (3) or by the reordered Eq. (8).
#include "parallel/partition_attention.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"

namespace tessera::parallel {

int64_t partition_attention_scratch(int64_t n, int64_t f, int64_t p, int64_t qkv_width) {
  // qkv [n, qkv_width] (Eq. 8: q, T, U [p,f] each, p <= n), then scores [p,n]
  return n * std::max(3 * f, qkv_width) + p * n;
}

namespace {
// Columns [col0, col0 + cols) of Q|K|V for rows [r0, r0 + count) into y (row stride ldy).
void project_rows(const PartitionAttention& a, int64_t r0, int64_t count, int64_t col0, int64_t cols, float* y,
                  int64_t ldy) {
  const int64_t f = a.f;
  TESSERA_CHECK(r0 >= 0 && count >= 0 && r0 + count <= a.n && col0 >= 0 && cols >= 0 && col0 + cols <= a.qkv_width());
  if (count == 0 || cols == 0) return;
  kernels::LinearArgs la;
  la.x = a.x + r0 * f; la.m = count; la.k = f; la.ldx = f;
  la.w = a.w_qkv == nullptr ? nullptr : a.w_qkv + col0 * f; la.n = cols; la.ldw = f;
  la.packed = a.packed_qkv; la.packed_row0 = col0;
  la.bias = a.b_qkv ? a.b_qkv + col0 : nullptr;
  la.y = y; la.ldy = ldy;
  kernels::linear_f32(nullptr, la);
  if (!a.position) return;
  if (col0 == 0 && cols > 0) a.position(y, ldy, r0, count, false);  // the Q block
  if (col0 <= a.qw() && a.qw() < col0 + cols) a.position(y + (a.qw() - col0), ldy, r0, count, true);  // the K block
}
}  // namespace

void partition_project_f32(const PartitionAttention& a, int64_t r0, int64_t count, int64_t col0, int64_t cols,
                           float* qkv) {
  project_rows(a, r0, count, col0, cols, qkv + r0 * a.qkv_width() + col0, a.qkv_width());
}

void partition_attention_f32(const PartitionAttention& a, bool eq8, float* scratch) {
  const int64_t p = a.rows.size(), f = a.f, hd = a.head_dim;
  if (p == 0) return;
  if (!eq8) {
    const int64_t qw = a.qw(), kvw = a.kvw(), ld = a.qkv_width();
    const float* qkv = a.qkv;
    if (qkv == nullptr) {
      partition_project_f32(a, a.rows.begin, p, 0, qw, scratch);
      partition_project_f32(a, 0, a.n, qw, 2 * kvw, scratch);
      qkv = scratch;
    }
    kernels::AttentionArgs at;
    at.q = qkv + a.rows.begin * ld; at.ldq = ld; at.k = qkv + qw; at.ldk = ld; at.v = qkv + qw + kvw;
    at.ldv = ld; at.out = a.out; at.ldo = qw;
    at.n_q = p; at.n_kv = a.n; at.heads = a.heads; at.head_dim = hd; at.scale = a.scale;
    at.causal = a.causal; at.q_pos0 = a.rows.begin; at.kv_group = a.kv_group;
    kernels::attention_f32(nullptr, at, scratch + a.n * std::max(3 * f, ld), p * a.n);
    return;
  }
  // Eq. (8) never forms K, so nothing can rotate or normalise it: plain
  // multi-head layers only (Voltage chooses Eq. 3 for the others).
  TESSERA_CHECK(!a.position && a.kv_group <= 1 && a.qw() == f && a.kvw() == f);
  // Eq. (8) needs Q of this device's rows only.
  float* q = scratch;         // [p, f]
  project_rows(a, a.rows.begin, p, 0, f, q, f);
  const float* qv = q;
  float* t = q + p * f;       // [p, f]
  float* u = t + p * f;       // [p, f]
  float* s = u + p * f;       // [p, n]
  for (int64_t h = 0; h < a.heads; ++h) {
    const int64_t k0 = f + h * hd, v0 = 2 * f + h * hd;  // W_K's and W_V's rows of head h, [hd, f] each
    if (a.packed_qkv != nullptr) {
      a.packed_qkv->matmul_rows(qv + h * hd, p, f, k0, k0 + hd, t, f);
    } else {
      kernels::gemm_f32(false, false, p, f, hd, 1.0f, qv + h * hd, f, a.w_qkv + k0 * f, f, 0.0f, t, f);
    }
    kernels::gemm_f32(false, true, p, a.n, f, a.scale, t, f, a.x, f, 0.0f, s, a.n);
    kernels::attention_softmax_rows_f32(s, p, a.n, a.causal, a.rows.begin, 0);
    kernels::gemm_f32(false, false, p, f, a.n, 1.0f, s, a.n, a.x, f, 0.0f, u, f);
    kernels::LinearArgs lv;  // (S x) W_V^T for head h
    lv.x = u; lv.m = p; lv.k = f; lv.ldx = f; lv.n = hd; lv.ldw = f; lv.y = a.out + h * hd; lv.ldy = f;
    lv.w = a.w_qkv == nullptr ? nullptr : a.w_qkv + v0 * f;
    lv.packed = a.packed_qkv; lv.packed_row0 = v0;
    kernels::linear_f32(nullptr, lv);
    if (a.b_qkv != nullptr) {
      const float* bv = a.b_qkv + 2 * f + h * hd;
      for (int64_t i = 0; i < p; ++i)
        for (int64_t e = 0; e < hd; ++e) a.out[i * f + h * hd + e] += bv[e];
    }
  }
}

}  // namespace tessera::parallel
