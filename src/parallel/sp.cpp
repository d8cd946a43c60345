// Sequence parallelism: rows split over devices; each computes Q, K, V for
// its rows and AllGathers K and V (two AllGathers per layer).
#include <cstring>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

Result<Tensor> run_sp(const model::Transformer& model, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                      core::ThreadPool* pool) {
  const model::ModelConfig& c = model.config();
  const int64_t F = c.hidden;
  const auto rows = split_by_ratio(n, plan.ratios);
  const auto counts = range_sizes(rows);
  const Range me = rows[static_cast<size_t>(sync.rank())];
  const int64_t p = me.size();
  Tensor xp = Tensor::zeros_f32({p, F}), a = Tensor::zeros_f32({p, F}), qkv = Tensor::zeros_f32({p, 3 * F});
  Tensor kp = Tensor::zeros_f32({p, F}), vp = Tensor::zeros_f32({p, F}), ctx = Tensor::zeros_f32({p, F});
  Tensor k = Tensor::zeros_f32({n, F}), v = Tensor::zeros_f32({n, F});
  Tensor scores = Tensor::zeros_f32({std::max<int64_t>(p * n, 1)});
  TESSERA_RETURN_IF_ERROR(sync.scatter_rows(sync.rank() == 0 ? x.f32() : nullptr, counts, F, xp.f32(), 0));
  model::Workspace ws;
  for (int64_t l = 0; l < c.layers; ++l) {
    const model::LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
    model.layer_input(l, xp.f32(), p, a.f32(), pool);
    kernels::linear_rows_f32(pool, a.f32(), p, w.qkv_w, w.qkv_b, kernels::Activation::kNone, nullptr, qkv.f32());
    for (int64_t i = 0; i < p; ++i) {
      std::memcpy(kp.f32() + i * F, qkv.f32() + i * 3 * F + F, static_cast<size_t>(F) * sizeof(float));
      std::memcpy(vp.f32() + i * F, qkv.f32() + i * 3 * F + 2 * F, static_cast<size_t>(F) * sizeof(float));
    }
    TESSERA_RETURN_IF_ERROR(sync.allgather_rows(kp.f32(), counts, F, k.f32()));
    TESSERA_RETURN_IF_ERROR(sync.allgather_rows(vp.f32(), counts, F, v.f32()));
    if (p == 0) continue;
    kernels::AttentionArgs at;
    at.q = qkv.f32(); at.ldq = 3 * F; at.k = k.f32(); at.ldk = F; at.v = v.f32(); at.ldv = F;
    at.out = ctx.f32(); at.ldo = F; at.n_q = p; at.n_kv = n; at.heads = c.heads; at.head_dim = c.head_dim();
    at.scale = model.attention_scale(l); at.causal = c.causal(); at.q_pos0 = me.begin; at.kv_pos0 = 0;
    kernels::attention_f32(pool, at, scores.f32(), scores.numel());
    model.layer_tail(l, xp.f32(), ctx.f32(), p, xp.f32(), ws, pool);
  }
  Tensor out = sync.rank() == 0 ? Tensor::zeros_f32({n, F}) : Tensor();
  TESSERA_RETURN_IF_ERROR(sync.gather_rows(xp.f32(), counts, F, sync.rank() == 0 ? out.f32() : nullptr, 0));
  return out;
}

}  // namespace tessera::parallel
