// Voltage (position-wise) parallelism: every device holds the whole layer
// input, computes the output rows of its partition, then one AllGather per
// layer; the last layer goes to the terminal only. With plan.overlap (and
// Eq. 3) the AllGather runs as a ring and the blocks of rows are projected to
// keys and values while the next block travels (see run_voltage).
#include "parallel/voltage.h"

#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

int64_t partition_attention_scratch(int64_t n, int64_t f, int64_t p) {
  // qkv [n,3f] (Eq. 8: q, T, U [p,f] each, p <= n), then scores [p,n]
  return 3 * n * f + p * n;
}

namespace {
// Columns [col0, col0 + cols) of Q|K|V for rows [r0, r0 + count) into y (row stride ldy).
void project_rows(const PartitionAttention& a, int64_t r0, int64_t count, int64_t col0, int64_t cols, float* y,
                  int64_t ldy) {
  const int64_t f = a.f;
  TESSERA_CHECK(r0 >= 0 && count >= 0 && r0 + count <= a.n && col0 >= 0 && cols >= 0 && col0 + cols <= 3 * f);
  if (count == 0 || cols == 0) return;
  kernels::LinearArgs la;
  la.x = a.x + r0 * f; la.m = count; la.k = f; la.ldx = f;
  la.w = a.w_qkv == nullptr ? nullptr : a.w_qkv + col0 * f; la.n = cols; la.ldw = f;
  la.packed = a.packed_qkv; la.packed_row0 = col0;
  la.bias = a.b_qkv ? a.b_qkv + col0 : nullptr;
  la.y = y; la.ldy = ldy;
  kernels::linear_f32(nullptr, la);
}
}  // namespace

void partition_project_f32(const PartitionAttention& a, int64_t r0, int64_t count, int64_t col0, int64_t cols,
                           float* qkv) {
  project_rows(a, r0, count, col0, cols, qkv + r0 * 3 * a.f + col0, 3 * a.f);
}

void partition_attention_f32(const PartitionAttention& a, bool eq8, float* scratch) {
  const int64_t p = a.rows.size(), f = a.f, hd = a.head_dim;
  if (p == 0) return;
  if (!eq8) {
    const float* qkv = a.qkv;
    if (qkv == nullptr) {
      partition_project_f32(a, a.rows.begin, p, 0, f, scratch);
      partition_project_f32(a, 0, a.n, f, 2 * f, scratch);
      qkv = scratch;
    }
    kernels::AttentionArgs at;
    at.q = qkv + a.rows.begin * 3 * f; at.ldq = 3 * f; at.k = qkv + f; at.ldk = 3 * f; at.v = qkv + 2 * f;
    at.ldv = 3 * f; at.out = a.out; at.ldo = f;
    at.n_q = p; at.n_kv = a.n; at.heads = a.heads; at.head_dim = hd; at.scale = a.scale;
    at.causal = a.causal; at.q_pos0 = a.rows.begin; at.kv_pos0 = 0;
    kernels::attention_f32(nullptr, at, scratch + 3 * a.n * f, p * a.n);
    return;
  }
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
  // it arrives. The device projects this device's own rows to Q at once, and
  // puts K and V of every block off while the next block is already in: they
  // run as one product per run of adjacent rows once every block is in, so
  // OpenBLAS packs W_K and W_V once for many rows instead of once per block.
  // While the next block is still on the link, the device projects K, then V,
  // of the blocks put off so far: work while it would wait. (BERT-base on 2
  // devices at 1 Gbit/s: about 1% faster than K|V of each block as it comes,
  // median of 16 paired runs; no slower at 500 Mbit/s.)
  // Which collectives run must not depend on the rank (p and eq8 do).
  const bool ring = plan.overlap;
  const bool early = ring && !eq8 && p > 0;
  Tensor qkv = early ? Tensor::zeros_f32({n, 3 * F}) : Tensor();
  std::vector<char> k_pending(counts.size(), 0), v_pending(counts.size(), 0);
  auto layer_attention = [&](int64_t l) {
    const model::LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
    PartitionAttention pa;
    pa.x = a.f32(); pa.n = n; pa.f = F; pa.heads = c.heads; pa.head_dim = c.head_dim(); pa.rows = me;
    pa.packed_qkv = &w.qkv_w; pa.b_qkv = w.qkv_b.f32(); pa.scale = model.attention_scale(l);
    pa.causal = c.causal(); pa.out = ctx.f32(); pa.qkv = early ? qkv.f32() : nullptr;
    return pa;
  };
  // Columns [col0, col0 + F) of the pending blocks, one product per run of
  // adjacent pending (or empty) blocks.
  auto project_pending = [&](int64_t l, std::vector<char>& pending, int64_t col0) {
    for (size_t q = 0; q < counts.size();) {
      if (!pending[q]) { ++q; continue; }
      size_t end = q;
      while (end < counts.size() && (pending[end] || counts[end] == 0)) pending[end++] = 0;
      partition_project_f32(layer_attention(l), rows[q].begin, rows[end - 1].end - rows[q].begin, col0, F, qkv.f32());
      q = end;
    }
  };
  auto project_all_pending = [&](int64_t l) {
    if (!early) return;
    project_pending(l, k_pending, F);
    project_pending(l, v_pending, 2 * F);
  };
  // Layer l's attention input for part `owner` (count rows) of `full`.
  auto prepare_rows = [&](int64_t l, int owner, int64_t count) {
    const int64_t r0 = rows[static_cast<size_t>(owner)].begin;
    if (p == 0 || count == 0) return;
    model.layer_input(l, full.f32() + r0 * F, count, a.f32() + r0 * F, pool);
    if (!early) return;
    if (owner == sync.rank()) partition_project_f32(layer_attention(l), r0, count, 0, F, qkv.f32());
    k_pending[static_cast<size_t>(owner)] = v_pending[static_cast<size_t>(owner)] = 1;
    if (!sync.next_tile_ready()) project_pending(l, k_pending, F);
    if (!sync.next_tile_ready()) project_pending(l, v_pending, 2 * F);
  };
  if (ring) {
    // The first distribution in parts, this device's part first.
    TESSERA_RETURN_IF_ERROR(sync.broadcast_rows_overlapped(
        full.f32(), counts, F, 0,
        [&](int owner, const float*, int64_t count) { prepare_rows(0, owner, count); }));
    project_all_pending(0);
  } else {
    TESSERA_RETURN_IF_ERROR(sync.broadcast(full.f32(), n * F, 0));
    if (p > 0) model.layer_input(0, full.f32(), n, a.f32(), pool);
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
        prepare_rows(l + 1, owner, count);
      }));
      project_all_pending(l + 1);
    } else if (!last) {
      TESSERA_RETURN_IF_ERROR(sync.allgather_rows(out.f32(), counts, F, full.f32()));
      if (p > 0) model.layer_input(l + 1, full.f32(), n, a.f32(), pool);
    } else {
      TESSERA_RETURN_IF_ERROR(sync.gather_rows(out.f32(), counts, F, sync.rank() == 0 ? full.f32() : nullptr, 0));
    }
  }
  return sync.rank() == 0 ? full : Tensor();
}

}  // namespace tessera::parallel
