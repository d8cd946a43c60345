// Megatron tensor parallelism: Q/K/V and FFN-in split by columns (whole
// heads), attention-out and FFN-out by rows, two AllReduce per layer.
// plan.ratios shares the heads; option "ffn_ratios" the FFN columns.
#include "parallel/strategy.h"

namespace tessera::parallel {

using core::Result;
using core::Tensor;

namespace {

class Tp final : public Strategy {
 public:
  std::string name() const override { return "tp"; }
  bool takes_llama_layers(const Plan&) const override { return true; }  // shards by model::HeadShard
  ShareKind share_kind() const override { return ShareKind::kHeads; }
  void apply_partition(Plan& plan, const Partition& p) const override {
    if (!p.shares.empty()) plan.ratios = p.shares;
    if (!p.ffn_shares.empty()) plan.options["ffn_ratios"] = p.ffn_shares;
  }
  std::string summary() const override { return "Megatron tensor parallelism: heads and FFN columns, two AllReduce per layer"; }
  std::vector<OptionFlag> flags() const override {
    return {{"--ffn-partition", "ffn_ratios", OptionFlag::Kind::kString, "FFN-column share of each device (default: --partition)"}};
  }

  core::Status complete(Plan& plan, const model::ModelConfig&) const override {
    TESSERA_RETURN_IF_ERROR(only_options(plan, {"ffn_ratios"}));
    TESSERA_ASSIGN_OR_RETURN(std::vector<double> ffn, ratio_option(plan, "ffn_ratios", plan.ratios));
    plan.options["ffn_ratios"] = ffn;
    return core::ok_status();
  }

  model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& c, int rank) const override {
    const auto r = static_cast<size_t>(rank);
    return shard_load_options(head_ranges(c, plan.ratios)[r], ffn_ranges(c, ffn_ratios(plan))[r], rank);
  }

  Result<Tensor> run(const model::Transformer& m, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                     core::ThreadPool* pool) const override {
    const int64_t F = m.config().hidden;
    Tensor full = sync.rank() == 0 ? x : Tensor::zeros_f32({n, F});
    TESSERA_RETURN_IF_ERROR(sync.broadcast(floats(full.f32(), n * F), 0));
    const auto r = static_cast<size_t>(sync.rank());
    TpLayers layers(m, head_ranges(m.config(), plan.ratios)[r], ffn_ranges(m.config(), ffn_ratios(plan))[r].size());
    TESSERA_RETURN_IF_ERROR(layers.run(sync, full.f32(), n, 0, nullptr, pool));
    return sync.rank() == 0 ? full : Tensor();
  }

  bool decodes() const override { return true; }
  bool batches_steps() const override { return true; }
  // After another layout's prefill (a pair) each device keeps its heads' K/V
  // of the handover; its shard is loaded beside the prefill's layers.
  bool takes_kv() const override { return true; }
  // Each device caches the K/V of its heads; a step is one row through the same layers.
  Result<std::unique_ptr<Decoder>> make_decoder(const model::Transformer& m, const Plan& plan, Synchronizer& sync,
                                                const model::CacheSpec& spec) const override {
    const auto r = static_cast<size_t>(sync.rank());
    return make_tp_decoder(m, sync, head_ranges(m.config(), plan.ratios)[r],
                           ffn_ranges(m.config(), ffn_ratios(plan))[r].size(), spec);
  }

  Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const override {
    const int K = plan.world;
    const auto heads = head_ranges(c, plan.ratios);
    const auto ffn = ffn_ranges(c, ffn_ratios(plan));
    const int64_t F = c.hidden;
    Schedule s;
    for (int r = 0; r < K; ++r) {
      const int64_t il = ffn[static_cast<size_t>(r)].size();
      const ShardDims sd = shard_dims(c, heads[static_cast<size_t>(r)], il);
      const int64_t w = sd.q;
      DeviceSchedule d;
      d.phases.push_back({"broadcast input", -1, {}, {transfer(CollectiveKind::kBroadcast, "x", tree_broadcast_sent(n * F, K, r, 0), everyone_but(r, K))}, false});
      for (int64_t l = 0; l < c.layers; ++l) {
        Phase attn{"attention", l, {}, {}, false};
        attn.work.push_back(elementwise("norm", n, F));
        if (w > 0) {
          attn.work.push_back(gemm("qkv", n, F, sd.qkv));
          attn.work.push_back(attention("attention", n, n, w));
        }
        attn.work.push_back(gemm("attn_out", n, w, F));
        attn.transfers.push_back(transfer(CollectiveKind::kAllreduce, "attn_out", ring_allreduce_sent(n * F, K, r), everyone_but(r, K)));
        Phase mlp{"mlp", l, {}, {}, false};
        mlp.work.push_back(elementwise("residual+norm", n, F));
        mlp.work.push_back(gemm("ffn_in", n, F, sd.ffn_in));
        mlp.work.push_back(gemm("ffn_out", n, il, F));
        mlp.transfers.push_back(transfer(CollectiveKind::kAllreduce, "ffn_out", ring_allreduce_sent(n * F, K, r), everyone_but(r, K)));
        d.phases.push_back(std::move(attn));
        d.phases.push_back(std::move(mlp));
        d.phases.push_back({"residual", l, {elementwise("residual+norm", n, F)}, {}, false});
      }
      d.weight_bytes =
          c.layers * shard_weight_bytes(c, heads[static_cast<size_t>(r)], il) + (r == 0 ? terminal_weight_bytes(c) : 0);
      const auto h = heads[static_cast<size_t>(r)].size();
      d.activation_bytes = (n * (4 * F + sd.qkv + w + il + (c.llama_style() ? sd.ffn_in : 0)) + n * n * h) * 4;
      s.devices.push_back(std::move(d));
    }
    return s;
  }

 private:
  static std::vector<double> ffn_ratios(const Plan& plan) {
    return option<std::vector<double>>(plan, "ffn_ratios", plan.ratios).value_or(plan.ratios);
  }
};

}  // namespace

std::unique_ptr<Strategy> make_tp_strategy() { return std::make_unique<Tp>(); }

}  // namespace tessera::parallel
