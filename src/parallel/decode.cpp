// Generation across devices: the shared tensor-parallel layer loop with a KV
// cache of each rank's heads (tp, and galaxy's decode steps). Strategies
// make their own Decoder (Strategy::make_decoder) in their own file.
#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "model/layer_blocks.h"
#include "parallel/strategy.h"
#include "parallel/sub_sync.h"

namespace tessera::parallel {

using core::Result;
using core::Status;
using core::Tensor;
using kernels::Activation;

namespace {

void ensure(Tensor& t, int64_t rows, int64_t cols) {
  cols = std::max<int64_t>(cols, 1);
  if (t.empty() || t.dim(0) < rows || t.dim(1) != cols) t = Tensor::zeros_f32({std::max<int64_t>(rows, 1), cols});
}

class TpDecoder final : public Decoder {
 public:
  TpDecoder(const model::Transformer& m, Synchronizer& sync, Range heads, int64_t il, model::KvCache cache)
      : m_(m), sync_(sync), heads_(heads), layers_(m, heads, il), cache_(std::move(cache)) {}

  // A handover holds every K/V head: this rank keeps those its query heads read.
  Status take_kv(int64_t l, const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t n) override {
    const model::HeadShard s = m_.config().head_shard(heads_.begin, heads_.end);
    if (s.kv_width() == 0) return core::ok_status();  // no heads here
    const int64_t at = s.kv0 * s.head_dim;
    return model::take_handover(cache_, l, k + at, ldk, v + at, ldv, s.kv_width(), n);
  }

  Result<Tensor> forward(Tensor x, int64_t n, int64_t pos0, core::ThreadPool* pool) override {
    return layers_.decode(sync_, std::move(x), n, pos0, &cache_, pool);
  }
  bool batches(std::span<Decoder* const> decs) const override {
    return std::all_of(decs.begin(), decs.end(), [](Decoder* d) { return dynamic_cast<TpDecoder*>(d) != nullptr; });
  }
  Result<Tensor> forward_rows(std::span<Decoder* const> decs, Tensor x, std::span<const int64_t> pos,
                              core::ThreadPool* pool) override {
    std::vector<model::KvCache*> caches;
    for (Decoder* d : decs) caches.push_back(&static_cast<TpDecoder*>(d)->cache_);
    return layers_.decode_rows(sync_, std::move(x), {pos, caches}, pool);
  }

 private:
  const model::Transformer& m_;
  Synchronizer& sync_;
  Range heads_;
  TpLayers layers_;
  model::KvCache cache_;
};

// A pair: the prefill's layout once, then the decode plan's decoder. The
// ranks outside the decode plan idle through the steps (their chunks return
// at once: no rank waits for them).
class PairDecoder final : public Decoder {
 public:
  PairDecoder(const Strategy& prefill, const model::Transformer& m, const Plan& plan, Synchronizer& sync)
      : prefill_(prefill), m_(m), plan_(plan), sync_(sync) {}

  Status init(const model::CacheSpec& spec) {
    positions_ = spec.positions;
    half_ = spec.dtype == core::DType::kF16;
    const Plan& d = *plan_.decode;
    if (sync_.rank() >= d.world) return core::ok_status();
    TESSERA_ASSIGN_OR_RETURN(const Strategy* ds, strategy_for(d.strategy));
    Synchronizer* s = &sync_;
    if (d.world < sync_.world()) {  // the first devices (or the terminal alone): a world of their own
      sub_ = std::make_unique<SubSynchronizer>(sync_, d.world);
      s = sub_.get();
    }
    TESSERA_ASSIGN_OR_RETURN(dec_, make_decoder(*ds, m_.decode_layout(), d, *s, spec));
    return core::ok_status();
  }

  // The same choice on every rank: it depends on the plan, n and pos0 only.
  bool handover(int64_t n, int64_t pos0) const {
    // Into F16 caches no: the prefill attends over its own F32 K and V,
    // one device over the rounded ones. The decode layout prefills instead
    // (the planner pairs nothing then).
    bool h = pos0 == 0 && !half_;
    for (int r = 0; h && r < plan_.decode->world; ++r) h = prefill_.hands_over_kv(plan_, n, r);
    return h;
  }
  int ranks_in(int64_t n, int64_t pos0) const override {
    return handover(n, pos0) ? plan_.world : plan_.decode->world;
  }

  Result<Tensor> forward(Tensor x, int64_t n, int64_t pos0, core::ThreadPool* pool) override {
    // Before any collective, on every rank alike: a handover the caches cannot hold stops no rank halfway.
    if (n < 1 || pos0 < 0 || pos0 + n > positions_)
      return core::out_of_range("rows " + std::to_string(pos0) + ".." + std::to_string(pos0 + n - 1) + " outside the " +
                                std::to_string(positions_) + "-position caches");
    if (handover(n, pos0)) {
      Decoder* dec = dec_.get();
      const KvSink sink = [dec](int64_t l, const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t rows) {
        return dec != nullptr ? dec->take_kv(l, k, ldk, v, ldv, rows) : core::ok_status();
      };
      return prefill_.run_handing_over(m_, plan_, sync_, std::move(x), n, pool, sink);
    }
    if (!dec_) return Tensor();
    return dec_->forward(std::move(x), n, pos0, pool);
  }
  // A batch of pairs' steps is a batch of their decode decoders' steps.
  bool batches(std::span<Decoder* const> decs) const override {
    return std::all_of(decs.begin(), decs.end(), [](Decoder* d) { return dynamic_cast<PairDecoder*>(d) != nullptr; });
  }
  Result<Tensor> forward_rows(std::span<Decoder* const> decs, Tensor x, std::span<const int64_t> pos,
                              core::ThreadPool* pool) override {
    std::vector<Decoder*> inner;
    for (Decoder* d : decs) {
      auto* p = static_cast<PairDecoder*>(d);
      if (!p->dec_) return Tensor();  // outside the decode plan: never told of a step
      inner.push_back(p->dec_.get());
    }
    return step_rows(inner, std::move(x), pos, pool);
  }
  // Overlapped steps are its decode layout's, on the decode plan's ranks.
  int overlapped_stages(std::span<Decoder* const> decs) const override {
    std::vector<Decoder*> inner;
    for (Decoder* d : decs) {
      auto* p = dynamic_cast<PairDecoder*>(d);
      if (p == nullptr || !p->dec_) return 1;
      inner.push_back(p->dec_.get());
    }
    return inner.empty() ? 1 : inner[0]->overlapped_stages(inner);
  }
  Result<Tensor> forward_stages(std::span<Decoder* const> decs, std::span<const int64_t> group_rows, Tensor x,
                                std::span<const int64_t> pos, core::ThreadPool* pool) override {
    std::vector<Decoder*> inner;
    for (Decoder* d : decs) {
      auto* p = static_cast<PairDecoder*>(d);
      if (!p->dec_) return Tensor();  // outside the decode plan: never told of a step
      inner.push_back(p->dec_.get());
    }
    return step_stages(inner, group_rows, std::move(x), pos, pool);
  }

 private:
  const Strategy& prefill_;
  const model::Transformer& m_;
  const Plan plan_;
  Synchronizer& sync_;
  int64_t positions_ = 0;
  bool half_ = false;  // F16 caches: no handover
  std::unique_ptr<SubSynchronizer> sub_;
  std::unique_ptr<Decoder> dec_;  // null outside the decode plan's ranks; goes before its synchronizer
};

}  // namespace

Result<Tensor> Decoder::forward_rows(std::span<Decoder* const>, Tensor, std::span<const int64_t>, core::ThreadPool*) {
  return core::unimplemented("this decoder runs no batched steps");
}

Result<Tensor> step_rows(std::span<Decoder* const> decs, Tensor x, std::span<const int64_t> pos, core::ThreadPool* pool) {
  const auto b = static_cast<int64_t>(decs.size());
  if (b < 1 || pos.size() != decs.size())
    return core::invalid_argument("a batched step of " + std::to_string(decs.size()) + " decoders at " +
                                  std::to_string(pos.size()) + " positions");
  if (!x.empty() && (x.rank() != 2 || x.dim(0) != b))
    return core::invalid_argument("a batched step of " + std::to_string(b) + " sequences on " +
                                  std::to_string(x.empty() ? 0 : x.dim(0)) + " rows");
  if (decs[0]->batches(decs)) return decs[0]->forward_rows(decs, std::move(x), pos, pool);
  // One sequence after another: each decoder's own one-row step.
  Tensor out;
  for (int64_t i = 0; i < b; ++i) {
    Tensor row;
    if (!x.empty()) {
      row = Tensor::zeros_f32({1, x.dim(1)});
      std::memcpy(row.f32(), x.f32() + i * x.dim(1), static_cast<size_t>(x.dim(1)) * sizeof(float));
    }
    TESSERA_ASSIGN_OR_RETURN(Tensor y, decs[static_cast<size_t>(i)]->forward(std::move(row), 1, pos[static_cast<size_t>(i)], pool));
    if (y.empty()) continue;  // not the terminal
    if (out.empty()) out = Tensor::zeros_f32({b, y.dim(1)});
    std::memcpy(out.f32() + i * y.dim(1), y.f32(), static_cast<size_t>(y.dim(1)) * sizeof(float));
  }
  return out;
}

Result<Tensor> Decoder::forward_stages(std::span<Decoder* const>, std::span<const int64_t>, Tensor,
                                       std::span<const int64_t>, core::ThreadPool*) {
  return core::unimplemented("this decoder runs no overlapped steps");
}

Result<Tensor> step_stages(std::span<Decoder* const> decs, std::span<const int64_t> group_rows, Tensor x,
                           std::span<const int64_t> pos, core::ThreadPool* pool) {
  int64_t total = 0;
  for (const int64_t g : group_rows) {
    if (g < 0) return core::invalid_argument("an overlapped step's group of " + std::to_string(g) + " rows");
    total += g;
  }
  if (decs.empty() || total != static_cast<int64_t>(decs.size()) || pos.size() != decs.size())
    return core::invalid_argument("an overlapped step of " + std::to_string(decs.size()) + " decoders, " +
                                  std::to_string(pos.size()) + " positions and groups of " + std::to_string(total) +
                                  " rows in all");
  const int k = decs[0]->overlapped_stages(decs);
  if (k < 2 || static_cast<int64_t>(group_rows.size()) != k)
    return core::invalid_argument("an overlapped step in " + std::to_string(group_rows.size()) + " groups of a layout of " +
                                  std::to_string(k) + " overlapped stage(s)");
  if (!x.empty() && (x.rank() != 2 || x.dim(0) != group_rows[0]))
    return core::invalid_argument("an overlapped step whose entering group of " + std::to_string(group_rows[0]) +
                                  " sequences came with " + std::to_string(x.rank() == 2 ? x.dim(0) : 0) + " rows");
  return decs[0]->forward_stages(decs, group_rows, std::move(x), pos, pool);
}

Result<std::unique_ptr<Decoder>> make_pair_decoder(const Strategy& prefill, const model::Transformer& m,
                                                   const Plan& plan, Synchronizer& sync, const model::CacheSpec& spec) {
  if (!plan.decode) return core::invalid_argument("a pair decoder of a plan without a decode plan");
  auto dec = std::make_unique<PairDecoder>(prefill, m, plan, sync);
  TESSERA_RETURN_IF_ERROR(dec->init(spec));
  return std::unique_ptr<Decoder>(std::move(dec));
}

Result<std::unique_ptr<Decoder>> Strategy::make_decoder(const model::Transformer&, const Plan& plan, Synchronizer&,
                                                        const model::CacheSpec&) const {
  // The strategies that can, from the registry: the message stays true as strategies come and go.
  std::string can;
  for (const Strategy* s : strategies())
    if (s->decodes() && s->name() != single_device_plan().strategy) can += (can.empty() ? "" : ", ") + s->name();
  return core::unimplemented("strategy '" + plan.strategy + "' cannot generate across devices (use " + can +
                             "; see docs/generation.md)");
}

Result<Tensor> TpLayers::decode(Synchronizer& sync, Tensor x, int64_t n, int64_t pos0, model::KvCache* cache,
                                core::ThreadPool* pool) {
  const int64_t F = m_.config().hidden;
  Tensor full = sync.rank() == 0 ? std::move(x) : Tensor::zeros_f32({n, F});
  TESSERA_RETURN_IF_ERROR(sync.broadcast(floats(full.f32(), n * F), 0));
  TESSERA_RETURN_IF_ERROR(run(sync, full.f32(), n, pos0, cache, pool));
  return sync.rank() == 0 ? full : Tensor();
}

Result<Tensor> TpLayers::decode_rows(Synchronizer& sync, Tensor x, const Rows& rows, core::ThreadPool* pool) {
  const int64_t F = m_.config().hidden, b = static_cast<int64_t>(rows.pos.size());
  Tensor full = sync.rank() == 0 ? std::move(x) : Tensor::zeros_f32({b, F});
  TESSERA_RETURN_IF_ERROR(sync.broadcast(floats(full.f32(), b * F), 0));
  TESSERA_RETURN_IF_ERROR(run_rows(sync, full.f32(), rows, pool));
  return sync.rank() == 0 ? full : Tensor();
}

Result<model::KvCache> TpLayers::make_cache(const model::CacheSpec& spec) const {
  const model::ModelConfig& c = m_.config();
  const int64_t positions = spec.positions;
  TESSERA_RETURN_IF_ERROR(model::check_kv_dtype(c, spec.dtype));
  if (positions < 1 || positions > c.max_positions)
    return core::out_of_range("a KV cache of " + std::to_string(positions) + " positions (the model has " +
                              std::to_string(c.max_positions) + ")");
  const int64_t width = std::max<int64_t>(c.head_shard(heads_.begin, heads_.end).kv_width(), 1);
  model::KvCache cache;
  for (int64_t l = 0; l < c.layers; ++l) {
    TESSERA_ASSIGN_OR_RETURN(Tensor k, Tensor::try_zeros_lazy(spec.dtype, {positions, width}));
    TESSERA_ASSIGN_OR_RETURN(Tensor v, Tensor::try_zeros_lazy(spec.dtype, {positions, width}));
    cache.k.push_back(std::move(k));
    cache.v.push_back(std::move(v));
  }
  return cache;
}

void TpLayers::cache_kv(int64_t l, const float* qkv, int64_t n, int64_t pos0, model::KvCache& cache) const {
  const model::HeadShard s = m_.config().head_shard(heads_.begin, heads_.end);
  const int64_t q = s.q_width(), kv = s.kv_width(), ld = s.qkv_width();
  if (q == 0) return;
  model::store_kv(cache, l, qkv, ld, q, kv, n, pos0);
}

Status TpLayers::run_impl(Synchronizer& sync, float* xf, int64_t n, int64_t pos0, model::KvCache* cache,
                          const Rows* rows, core::ThreadPool* pool) {
  const model::Transformer& m = m_;
  const model::ModelConfig& c = m.config();
  const model::HeadShard shard = c.head_shard(heads_.begin, heads_.end);
  const int64_t F = c.hidden, fl = shard.q_width(), il = il_;
  const int64_t n_kv = cache ? pos0 + n : rows ? 1 : n;
  ensure(a_, n, F);
  ensure(qkv_, n, shard.qkv_width());
  ensure(ctx_, n, fl);
  ensure(part_, n, F);
  ensure(h_, n, F);
  ensure(f_, n, il);
  const int64_t want = std::max<int64_t>(kernels::attention_scratch_floats(n, n_kv, heads_.size()), 1);
  if (scores_.empty() || scores_.numel() < want) scores_ = Tensor::zeros_f32({want});
  // A step's few rows (one, or one a sequence of a batch) in one hop.
  auto allreduce = [&](float* data) {
    return (cache != nullptr && n == 1) || rows != nullptr ? exchange_sum(sync, data, n * F, sum_buf_)
                                                             : sync.allreduce_sum(floats(data, n * F));
  };
  for (int64_t l = 0; l < c.layers; ++l) {
    const model::LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
    m.layer_input(l, xf, n, a_.f32(), pool);
    if (fl > 0) {
      kernels::linear_rows_f32(pool, a_.f32(), n, w.qkv_w, w.qkv_b, Activation::kNone, nullptr, qkv_.f32());
      if (rows != nullptr) {
        model::attend_rows(m, l, shard, qkv_.f32(), rows->pos, rows->caches, ctx_.f32(), scores_, pool);
      } else {
        model::position_qk(m, l, shard, qkv_.f32(), n, pos0, pool);
        model::AttentionIo io = model::shard_qkv_io(shard, qkv_.f32(), n, ctx_.f32());
        io.q_pos0 = io.kv_pos0 = pos0;
        if (cache != nullptr) {
          cache_kv(l, qkv_.f32(), n, pos0, *cache);
          model::cache_io(*cache, l, shard.kv_width(), n_kv, io);
        }
        kernels::attention_f32(pool, model::attention_args(m, l, io), scores_.f32(), scores_.numel());
      }
    }
    // Partial output projections; bias and residual are added once, after the sum.
    kernels::linear_rows_f32(pool, ctx_.f32(), n, w.attn_out_w, Tensor(), Activation::kNone, nullptr, part_.f32());
    TESSERA_RETURN_IF_ERROR(allreduce(part_.f32()));
    const float* mlp_in = model::attention_residual(m, l, part_.f32(), xf, true, n, a_.f32(), pool);
    std::swap(h_, part_);  // h: the MLP's residual
    model::mlp_input(m, l, mlp_in, n, f_.f32(), gate_up_, pool);
    kernels::linear_rows_f32(pool, f_.f32(), n, w.ffn_out_w, Tensor(), Activation::kNone, nullptr, part_.f32());
    TESSERA_RETURN_IF_ERROR(allreduce(part_.f32()));
    model::mlp_residual(m, l, part_.f32(), h_.f32(), true, n, xf, pool);
  }
  return core::ok_status();
}

Result<std::unique_ptr<Decoder>> make_tp_decoder(const model::Transformer& m, Synchronizer& sync, Range heads,
                                                 int64_t ffn_cols, const model::CacheSpec& spec) {
  TESSERA_ASSIGN_OR_RETURN(model::KvCache cache, TpLayers(m, heads, ffn_cols).make_cache(spec));
  return std::unique_ptr<Decoder>(std::make_unique<TpDecoder>(m, sync, heads, ffn_cols, std::move(cache)));
}

}  // namespace tessera::parallel
