// Galaxy hybrid model parallelism (Ye et al., §III-B): tensor parallelism on
// the MHA block (whole heads, partition A) and the MLP block (FFN columns,
// partition B); sequence parallelism on the connective blocks (residual add
// and layer norm) over an equal sequence partition S. An AllGather opens
// each TP block and a ReduceScatter closes it, so the residual stream stays
// split by sequence. With plan.overlap both run as rings whose tiles overlap
// the first and last GEMM of the block (§III-D).
#include <algorithm>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Status;
using core::Tensor;
using kernels::Activation;

namespace {

// Row offsets of the parts of S.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> at(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) at[i + 1] = at[i] + counts[i];
  return at;
}

// One TP block: gather the connective block's rows, GEMM1 on each tile as it
// arrives, the middle (attention, or nothing for the MLP), then GEMM2 per
// destination part and reduce-scatter.
struct TpBlock {
  Synchronizer& sync;
  bool overlap;
  const std::vector<int64_t>& counts;
  int64_t cols;

  template <typename First, typename Middle, typename Last>
  Status run(const float* mine, First&& first, Middle&& middle, Last&& last, float* out) const {
    const TileFn on_tile = first;
    const PartialFn partial = last;
    TESSERA_RETURN_IF_ERROR(overlap ? sync.allgather_rows_overlapped(mine, counts, cols, on_tile)
                                    : sync.allgather_rows_then_tiles(mine, counts, cols, on_tile));
    middle();
    return overlap ? sync.reduce_scatter_rows_overlapped(counts, cols, partial, out)
                   : sync.partials_then_reduce_scatter(counts, cols, partial, out);
  }
};

}  // namespace

Result<Tensor> run_galaxy(const model::Transformer& model, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                          core::ThreadPool* pool) {
  const model::ModelConfig& c = model.config();
  const int64_t F = c.hidden, hd = c.head_dim();
  const size_t me = static_cast<size_t>(sync.rank());
  const Range heads = tp_head_ranges(plan, c)[me];
  const int64_t fl = heads.size() * hd, il = tp_ffn_ranges(plan, c)[me].size();
  const auto counts = range_sizes(galaxy_seq_ranges(n, sync.world()));
  const auto at = offsets_of(counts);
  const int64_t s = counts[me];
  const bool pre = c.pre_layernorm();

  // Sequence-parallel state: the residual stream (xr), the input of the next
  // TP block (ar) and the reduce-scatter result (g), s rows each.
  Tensor xr = Tensor::zeros_f32({s, F}), ar = Tensor::zeros_f32({s, F}), g = Tensor::zeros_f32({s, F});
  Tensor hr = Tensor::zeros_f32({s, F});  // BERT: the MLP's residual, LN1(attention + x)
  // Tensor-parallel state over all n rows, for this rank's heads / columns.
  Tensor qkv = Tensor::zeros_f32({n, 3 * fl}), ctx = Tensor::zeros_f32({n, fl}), f = Tensor::zeros_f32({n, il});
  const int64_t scratch = std::max<int64_t>(kernels::attention_scratch_floats(n, n, heads.size()), 1);
  Tensor scores = Tensor::zeros_f32({scratch});
  TESSERA_RETURN_IF_ERROR(sync.scatter_rows(sync.rank() == 0 ? x.f32() : nullptr, counts, F, xr.f32(), 0));
  const TpBlock block{sync, plan.overlap, counts, F};

  for (int64_t l = 0; l < c.layers; ++l) {
    const model::LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
    // MHA block. GEMM1 (Q, K, V of this rank's heads) tile by tile.
    model.layer_input(l, xr.f32(), s, ar.f32(), pool);
    auto qkv_tile = [&](int owner, const float* rows, int64_t cnt) {
      if (cnt > 0 && fl > 0)
        kernels::linear_rows_f32(pool, rows, cnt, w.qkv_w, w.qkv_b, Activation::kNone, nullptr,
                                 qkv.f32() + at[static_cast<size_t>(owner)] * 3 * fl);
    };
    auto attention = [&] {
      if (fl == 0 || n == 0) return;
      kernels::AttentionArgs a;
      a.q = qkv.f32(); a.k = qkv.f32() + fl; a.v = qkv.f32() + 2 * fl; a.ldq = a.ldk = a.ldv = 3 * fl;
      a.out = ctx.f32(); a.ldo = fl; a.n_q = a.n_kv = n; a.heads = heads.size(); a.head_dim = hd;
      a.scale = model.attention_scale(l); a.causal = c.causal();
      kernels::attention_f32(pool, a, scores.f32(), scores.numel());
    };
    // GEMM2 (output projection rows of this rank's heads) per destination
    // part; the bias is added once, after the sum.
    auto out_proj = [&](int dest, float* out) {
      kernels::linear_rows_f32(pool, ctx.f32() + at[static_cast<size_t>(dest)] * fl, counts[static_cast<size_t>(dest)],
                               w.attn_out_w, Tensor(), Activation::kNone, nullptr, out);
    };
    TESSERA_RETURN_IF_ERROR(block.run(ar.f32(), qkv_tile, attention, out_proj, g.f32()));

    // Connective block on this rank's rows: residual add and layer norm.
    kernels::bias_act_residual_f32_mt(pool, g.f32(), s, F, F, w.attn_out_b.f32(), Activation::kNone, xr.f32(), F);
    if (pre) {
      std::swap(xr, g);  // xr = x + attention
      kernels::layernorm_f32_mt(pool, xr.f32(), ar.f32(), s, F, w.ln2_g.f32(), w.ln2_b.f32(), c.eps);
    } else {
      kernels::layernorm_f32_mt(pool, g.f32(), hr.f32(), s, F, w.ln1_g.f32(), w.ln1_b.f32(), c.eps);
    }

    // MLP block: FFN-in columns of this rank tile by tile, FFN-out per part.
    auto ffn_in = [&](int owner, const float* rows, int64_t cnt) {
      if (cnt > 0 && il > 0)
        kernels::linear_rows_f32(pool, rows, cnt, w.ffn_in_w, w.ffn_in_b, c.act, nullptr,
                                 f.f32() + at[static_cast<size_t>(owner)] * il);
    };
    auto ffn_out = [&](int dest, float* out) {
      kernels::linear_rows_f32(pool, f.f32() + at[static_cast<size_t>(dest)] * il, counts[static_cast<size_t>(dest)],
                               w.ffn_out_w, Tensor(), Activation::kNone, nullptr, out);
    };
    TESSERA_RETURN_IF_ERROR(block.run(pre ? ar.f32() : hr.f32(), ffn_in, [] {}, ffn_out, g.f32()));

    // Connective block: residual add, and BERT's LN2.
    kernels::bias_act_residual_f32_mt(pool, g.f32(), s, F, F, w.ffn_out_b.f32(), Activation::kNone,
                                      pre ? xr.f32() : hr.f32(), F);
    if (pre) {
      std::swap(xr, g);
    } else {
      kernels::layernorm_f32_mt(pool, g.f32(), xr.f32(), s, F, w.ln2_g.f32(), w.ln2_b.f32(), c.eps);
    }
  }
  Tensor out = sync.rank() == 0 ? Tensor::zeros_f32({n, F}) : Tensor();
  TESSERA_RETURN_IF_ERROR(sync.gather_rows(xr.f32(), counts, F, sync.rank() == 0 ? out.f32() : nullptr, 0));
  return out;
}

}  // namespace tessera::parallel
