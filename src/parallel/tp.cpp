// Megatron tensor parallelism: Q/K/V and FFN-in split by columns (whole
// heads), attention-out and FFN-out by rows, two AllReduce per layer.
#include <cstring>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;
using kernels::Activation;

Result<Tensor> run_tp(const model::Transformer& model, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                      core::ThreadPool* pool) {
  const model::ModelConfig& c = model.config();
  const int64_t F = c.hidden, hd = c.head_dim();
  const Range heads = tp_head_ranges(plan, c)[static_cast<size_t>(sync.rank())];
  const Range cols = tp_ffn_ranges(plan, c)[static_cast<size_t>(sync.rank())];
  const int64_t fl = heads.size() * hd, il = cols.size();
  Tensor full = sync.rank() == 0 ? x : Tensor::zeros_f32({n, F});
  TESSERA_RETURN_IF_ERROR(sync.broadcast(full.f32(), n * F, 0));
  Tensor a = Tensor::zeros_f32({n, F}), qkv = Tensor::zeros_f32({n, 3 * fl}), ctx = Tensor::zeros_f32({n, fl});
  Tensor part = Tensor::zeros_f32({n, F}), h = Tensor::zeros_f32({n, F}), f = Tensor::zeros_f32({n, il});
  Tensor scores = Tensor::zeros_f32({std::max<int64_t>(n * n * heads.size(), 1)});
  float* xf = full.f32();
  for (int64_t l = 0; l < c.layers; ++l) {
    const model::LayerWeights& w = model.weights().layers[static_cast<size_t>(l)];
    model.layer_input(l, xf, n, a.f32(), pool);
    if (fl > 0) {
      kernels::linear_rows_f32(pool, a.f32(), n, w.qkv_w, w.qkv_b, Activation::kNone, nullptr, qkv.f32());
      kernels::AttentionArgs at;
      at.q = qkv.f32(); at.k = qkv.f32() + fl; at.v = qkv.f32() + 2 * fl; at.ldq = at.ldk = at.ldv = 3 * fl;
      at.out = ctx.f32(); at.ldo = fl; at.n_q = at.n_kv = n; at.heads = heads.size(); at.head_dim = hd;
      at.scale = model.attention_scale(l); at.causal = c.causal();
      kernels::attention_f32(pool, at, scores.f32(), scores.numel());
    }
    // Partial attention output; bias and residual are added once, after the sum.
    kernels::linear_rows_f32(pool, ctx.f32(), n, w.attn_out_w, Tensor(), Activation::kNone, nullptr, part.f32());
    TESSERA_RETURN_IF_ERROR(sync.allreduce_sum(part.f32(), n * F));
    kernels::bias_act_residual_f32_mt(pool, part.f32(), n, F, F, w.attn_out_b.f32(), Activation::kNone, xf, F);
    const bool pre = c.pre_layernorm();
    if (pre) {
      std::swap(h, part);  // h = attention output + residual
      kernels::layernorm_f32_mt(pool, h.f32(), a.f32(), n, F, w.ln2_g.f32(), w.ln2_b.f32(), c.eps);
    } else {
      kernels::layernorm_f32_mt(pool, part.f32(), h.f32(), n, F, w.ln1_g.f32(), w.ln1_b.f32(), c.eps);
    }
    kernels::linear_rows_f32(pool, pre ? a.f32() : h.f32(), n, w.ffn_in_w, w.ffn_in_b, c.act, nullptr, f.f32());
    kernels::linear_rows_f32(pool, f.f32(), n, w.ffn_out_w, Tensor(), Activation::kNone, nullptr, part.f32());
    TESSERA_RETURN_IF_ERROR(sync.allreduce_sum(part.f32(), n * F));
    kernels::bias_act_residual_f32_mt(pool, part.f32(), n, F, F, w.ffn_out_b.f32(), Activation::kNone, h.f32(), F);
    if (pre) {
      std::memcpy(xf, part.f32(), static_cast<size_t>(n * F) * sizeof(float));
    } else {
      kernels::layernorm_f32_mt(pool, part.f32(), xf, n, F, w.ln2_g.f32(), w.ln2_b.f32(), c.eps);
    }
  }
  return sync.rank() == 0 ? full : Tensor();
}

}  // namespace tessera::parallel
