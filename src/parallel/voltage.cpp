// Voltage (position-wise) parallelism: every device holds the whole layer
// input, computes the output rows of its partition, then one AllGather per
// layer; the last layer goes to the terminal only. With plan.overlap (and
// Eq. 3) the AllGather runs as a ring and each arriving block of rows is
// projected to keys and values while the next block travels.
#include "parallel/voltage.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

int64_t partition_attention_scratch(int64_t n, int64_t f, int64_t p) {
  // q [p,f] + max(kv [n,2f] + scores [p,n], T [p,f] + scores [p,n] + U [p,f])
  return p * f + std::max(2 * n * f, 2 * p * f) + p * n;
}

void partition_kv_f32(const PartitionAttention& a, int64_t r0, int64_t count, float* kv) {
  const int64_t f = a.f;
  if (count <= 0) return;
  kernels::LinearArgs la;
  la.x = a.x + r0 * f; la.m = count; la.k = f; la.ldx = f;
  la.w = a.w_qkv + f * f; la.n = 2 * f; la.ldw = f; la.bias = a.b_qkv ? a.b_qkv + f : nullptr;
  la.y = kv + r0 * 2 * f; la.ldy = 2 * f;
  kernels::linear_f32(nullptr, la);
}

void partition_q_f32(const PartitionAttention& a, float* q) {
  const int64_t p = a.rows.size(), f = a.f;
  if (p == 0) return;
  kernels::LinearArgs la;
  la.x = a.x + a.rows.begin * f; la.m = p; la.k = f; la.ldx = f;
  la.w = a.w_qkv; la.n = f; la.ldw = f; la.bias = a.b_qkv; la.y = q; la.ldy = f;
  kernels::linear_f32(nullptr, la);
}

void partition_attention_f32(const PartitionAttention& a, bool eq8, float* scratch) {
  const int64_t p = a.rows.size(), f = a.f, hd = a.head_dim;
  if (p == 0) return;
  float* q = scratch;  // scratch starts with room for Q, used or not
  const float* qv = a.q;
  if (qv == nullptr) {
    partition_q_f32(a, q);
    qv = q;
  }
  if (!eq8) {
    const float* kv = a.kv;
    if (kv == nullptr) {
      partition_kv_f32(a, 0, a.n, q + p * f);
      kv = q + p * f;
    }
    kernels::AttentionArgs at;
    at.q = qv; at.ldq = f; at.k = kv; at.ldk = 2 * f; at.v = kv + f; at.ldv = 2 * f; at.out = a.out; at.ldo = f;
    at.n_q = p; at.n_kv = a.n; at.heads = a.heads; at.head_dim = hd; at.scale = a.scale;
    at.causal = a.causal; at.q_pos0 = a.rows.begin; at.kv_pos0 = 0;
    kernels::attention_f32(nullptr, at, q + p * f + 2 * a.n * f, p * a.n);
    return;
  }
  float* t = q + p * f;       // [p, f]
  float* u = t + p * f;       // [p, f]
  float* s = u + p * f;       // [p, n]
  for (int64_t h = 0; h < a.heads; ++h) {
    const float* wk = a.w_qkv + (f + h * hd) * f;      // [hd, f]
    const float* wv = a.w_qkv + (2 * f + h * hd) * f;  // [hd, f]
    kernels::gemm_f32(false, false, p, f, hd, 1.0f, qv + h * hd, f, wk, f, 0.0f, t, f);
    kernels::gemm_f32(false, true, p, a.n, f, a.scale, t, f, a.x, f, 0.0f, s, a.n);
    kernels::attention_softmax_rows_f32(s, p, a.n, a.causal, a.rows.begin, 0);
    kernels::gemm_f32(false, false, p, f, a.n, 1.0f, s, a.n, a.x, f, 0.0f, u, f);
    kernels::gemm_f32(false, true, p, hd, f, 1.0f, u, f, wv, f, 0.0f, a.out + h * hd, f);
    if (a.b_qkv != nullptr) {
      const float* bv = a.b_qkv + 2 * f + h * hd;
      for (int64_t i = 0; i < p; ++i)
        for (int64_t e = 0; e < hd; ++e) a.out[i * f + h * hd + e] += bv[e];
    }
  }
}

Result<Tensor> run_voltage(const model::Transformer& model, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                           core::ThreadPool* pool) {
  const model::ModelConfig& c = model.config();
  const int64_t F = c.hidden;
  const auto rows = split_by_ratio(n, plan.ratios);
  const auto counts = range_sizes(rows);
  const Range me = rows[static_cast<size_t>(sync.rank())];
  const int64_t p = me.size();
  Tensor full = sync.rank() == 0 ? x : Tensor::zeros_f32({n, F});
  Tensor a = Tensor::zeros_f32({n, F}), ctx = Tensor::zeros_f32({p, F}), out = Tensor::zeros_f32({p, F});
  Tensor scratch = Tensor::zeros_f32({partition_attention_scratch(n, F, p)});
  const bool eq8 = plan.adaptive_order && voltage_prefers_eq8(p, n, F, c.head_dim());
  // Eq. (3) with overlap: the ring AllGather hands over each block of rows as
  // it arrives; the device projects it to keys and values (and its own block
  // to queries too) while the next block travels.
  // Which collectives run must not depend on the rank (p and eq8 do).
  const bool ring = plan.overlap;
  const bool early = ring && !eq8 && p > 0;
  Tensor kv = early ? Tensor::zeros_f32({n, 2 * F}) : Tensor();
  Tensor q = early ? Tensor::zeros_f32({p, F}) : Tensor();
  auto layer_attention = [&](int64_t l) {
    const model::LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
    PartitionAttention pa;
    pa.x = a.f32(); pa.n = n; pa.f = F; pa.heads = c.heads; pa.head_dim = c.head_dim(); pa.rows = me;
    pa.w_qkv = w.qkv_w.f32(); pa.b_qkv = w.qkv_b.f32(); pa.scale = model.attention_scale(l);
    pa.causal = c.causal(); pa.out = ctx.f32(); pa.kv = early ? kv.f32() : nullptr;
    pa.q = early ? q.f32() : nullptr;
    return pa;
  };
  // Layer l's attention input for rows [r0, r0 + count) of `full`.
  auto prepare_rows = [&](int64_t l, int64_t r0, int64_t count) {
    if (p == 0 || count == 0) return;
    model.layer_input(l, full.f32() + r0 * F, count, a.f32() + r0 * F, pool);
    if (!early) return;
    partition_kv_f32(layer_attention(l), r0, count, kv.f32());
    if (r0 <= me.begin && me.end <= r0 + count) partition_q_f32(layer_attention(l), q.f32());
  };
  if (ring) {
    // The first distribution in parts, this device's part first.
    TESSERA_RETURN_IF_ERROR(sync.broadcast_rows_overlapped(
        full.f32(), counts, F, 0,
        [&](int owner, const float*, int64_t count) { prepare_rows(0, rows[static_cast<size_t>(owner)].begin, count); }));
  } else {
    TESSERA_RETURN_IF_ERROR(sync.broadcast(full.f32(), n * F, 0));
    prepare_rows(0, 0, n);
  }
  model::Workspace ws;
  for (int64_t l = 0; l < c.layers; ++l) {
    if (p > 0) {
      partition_attention_f32(layer_attention(l), eq8, scratch.f32());
      model.layer_tail(l, full.f32() + me.begin * F, ctx.f32(), p, out.f32(), ws, pool);
    }
    const bool last = l + 1 == c.layers;
    if (!last && ring) {
      TESSERA_RETURN_IF_ERROR(sync.allgather_rows_overlapped(out.f32(), counts, F, [&](int owner, const float* block,
                                                                                      int64_t count) {
        const int64_t r0 = rows[static_cast<size_t>(owner)].begin;
        if (count > 0) std::memcpy(full.f32() + r0 * F, block, static_cast<size_t>(count * F) * sizeof(float));
        prepare_rows(l + 1, r0, count);
      }));
    } else if (!last) {
      TESSERA_RETURN_IF_ERROR(sync.allgather_rows(out.f32(), counts, F, full.f32()));
      prepare_rows(l + 1, 0, n);
    } else {
      TESSERA_RETURN_IF_ERROR(sync.gather_rows(out.f32(), counts, F, sync.rank() == 0 ? full.f32() : nullptr, 0));
    }
  }
  return sync.rank() == 0 ? full : Tensor();
}

}  // namespace tessera::parallel
