// Sequence parallelism: rows split over devices (plan.ratios); each computes
// Q, K, V for its rows and AllGathers K and V (two AllGathers per layer).
#include <cstring>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "model/layer_blocks.h"
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

namespace {

class Sp final : public Strategy {
 public:
  std::string name() const override { return "sp"; }
  bool takes_llama_layers(const Plan&) const override { return true; }  // rows keep their absolute positions
  ShareKind share_kind() const override { return ShareKind::kRows; }
  std::string summary() const override { return "sequence parallelism: rows split, AllGather of K and V"; }

  core::Status complete(Plan& plan, const model::ModelConfig&) const override { return only_options(plan, {}); }

  Result<Tensor> run(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                     core::ThreadPool* pool) const override {
    return run_keeping(m, plan, sync, std::move(x), n, pool, nullptr);
  }
  // The AllGathers leave every row's K and V on every device, rows or not.
  bool hands_over_kv(const Plan&, int64_t, int) const override { return true; }
  Result<Tensor> run_handing_over(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                                  core::ThreadPool* pool, const KvSink& sink) const override {
    return run_keeping(m, plan, sync, std::move(x), n, pool, &sink);
  }

  Result<Tensor> run_keeping(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                             core::ThreadPool* pool, const KvSink* sink) const {
    const model::ModelConfig& c = m.config();
    const int64_t F = c.hidden;
    // Q, K, V widths: K and V are narrower with grouped K/V heads, and only
    // they travel.
    const model::HeadShard all = c.head_shard(0, c.heads);
    const int64_t Q = all.q_width(), KV = all.kv_width(), ld = all.qkv_width();
    const RowShare share = row_share(plan, n, sync.rank());
    const auto& counts = share.counts;
    const Range me = share.mine;
    const int64_t p = me.size();
    Tensor xp = Tensor::zeros_f32({p, F}), a = Tensor::zeros_f32({p, F}), qkv = Tensor::zeros_f32({p, ld});
    Tensor kp = Tensor::zeros_f32({p, KV}), vp = Tensor::zeros_f32({p, KV}), ctx = Tensor::zeros_f32({p, Q});
    Tensor k = Tensor::zeros_f32({n, KV}), v = Tensor::zeros_f32({n, KV});
    Tensor scores = Tensor::zeros_f32({std::max<int64_t>(p * n, 1)});
    TESSERA_RETURN_IF_ERROR(sync.scatter_rows(sync.rank() == 0 ? floats(x.f32(), n * F) : std::span<const float>(), counts,
                                              F, floats(xp.f32(), p * F), 0));
    model::Workspace ws;
    for (int64_t l = 0; l < c.layers; ++l) {
      const model::LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
      m.layer_input(l, xp.f32(), p, a.f32(), pool);
      kernels::linear_rows_f32(pool, a.f32(), p, w.qkv_w, w.qkv_b, kernels::Activation::kNone, nullptr, qkv.f32());
      model::position_qk(m, l, all, qkv.f32(), p, me.begin, pool);  // RoPE at the rows' own positions
      for (int64_t i = 0; i < p; ++i) {
        std::memcpy(kp.f32() + i * KV, qkv.f32() + i * ld + Q, static_cast<size_t>(KV) * sizeof(float));
        std::memcpy(vp.f32() + i * KV, qkv.f32() + i * ld + Q + KV, static_cast<size_t>(KV) * sizeof(float));
      }
      TESSERA_RETURN_IF_ERROR(sync.allgather_rows(floats(kp.f32(), p * KV), counts, KV, floats(k.f32(), n * KV)));
      TESSERA_RETURN_IF_ERROR(sync.allgather_rows(floats(vp.f32(), p * KV), counts, KV, floats(v.f32(), n * KV)));
      if (sink != nullptr) TESSERA_RETURN_IF_ERROR((*sink)(l, k.f32(), KV, v.f32(), KV, n));
      if (p == 0) continue;
      model::AttentionIo io;
      io.q = qkv.f32(); io.ldq = ld; io.k = k.f32(); io.ldk = KV; io.v = v.f32(); io.ldv = KV;
      io.out = ctx.f32(); io.ldo = Q; io.n_q = p; io.n_kv = n; io.q_pos0 = me.begin;
      kernels::attention_f32(pool, model::attention_args(m, l, io), scores.f32(), scores.numel());
      m.layer_tail(l, xp.f32(), ctx.f32(), p, xp.f32(), ws, pool);
    }
    Tensor out = sync.rank() == 0 ? Tensor::zeros_f32({n, F}) : Tensor();
    TESSERA_RETURN_IF_ERROR(sync.gather_rows(floats(xp.f32(), p * F), counts, F,
                                             sync.rank() == 0 ? floats(out.f32(), n * F) : std::span<float>(), 0));
    return out;
  }

  Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const override {
    const int K = plan.world;
    const int64_t F = c.hidden;
    const auto counts = range_sizes(row_ranges(plan, n));
    Schedule s;
    for (int r = 0; r < K; ++r) {
      const int64_t p = counts[static_cast<size_t>(r)], KV = c.kv_width();
      DeviceSchedule d;
      d.phases.push_back({"scatter rows", -1, {}, {transfer(CollectiveKind::kScatter, "x", r == 0 ? (n - p) * F : 0, everyone_but(r, K))}, false});
      for (int64_t l = 0; l < c.layers; ++l) {
        Phase kv{"qkv", l, {elementwise("norm", p, F)}, {}, false};
        if (p > 0) kv.work.push_back(gemm("qkv", p, F, c.qkv_width()));
        for (const char* what : {"k", "v"})
          kv.transfers.push_back(transfer(CollectiveKind::kAllgather, what, ring_allgather_sent(counts, KV, r), everyone_but(r, K)));
        Phase rest{"attention+mlp", l, {}, {}, false};
        if (p > 0) rest.work.push_back(attention("attention", p, n, c.q_width()));
        add_tail_work(rest.work, c, p);
        d.phases.push_back(std::move(kv));
        d.phases.push_back(std::move(rest));
      }
      d.phases.push_back({"gather rows", -1, {}, {transfer(CollectiveKind::kGather, "y", r == 0 ? 0 : p * F, {0})}, false});
      d.weight_bytes = c.layers * model_layer_weight_bytes(c, 0) + (r == 0 ? terminal_weight_bytes(c) : 0);
      d.activation_bytes =
          (p * (4 * F + c.qkv_width() + 2 * KV + c.q_width() + c.intermediate + (c.llama_style() ? 2 * c.intermediate : 0)) +
           2 * n * KV + p * n) * 4;
      s.devices.push_back(std::move(d));
    }
    return s;
  }
};

}  // namespace

std::unique_ptr<Strategy> make_sp_strategy() { return std::make_unique<Sp>(); }

}  // namespace tessera::parallel
