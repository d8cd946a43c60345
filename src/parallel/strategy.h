// A strategy is a unit: one file holds its options, what each rank loads,
// its layer loop and its cost estimate, and one line of registry.cpp names
// it. Nothing else switches on strategy names: the CLI, the runtime, the
// benchmarks and the tests list the registry.
//
// Rank 0 is the terminal: it embeds the input before run() and applies the
// head after it; run() takes and returns the hidden rows [n, F] there.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/limits.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/transformer.h"
#include "parallel/partition.h"
#include "parallel/schedule.h"
#include "parallel/sync.h"

namespace tessera::parallel {

// What to run: the strategy, the device count, each device's share, and the
// strategy's own options (its JSON, written and validated by the strategy).
struct Plan {
  std::string strategy = "single";
  int world = 1;
  // Each device's share of the strategy's unit of work (rows, heads, ...);
  // empty = equal. Normalised by complete_plan.
  std::vector<double> ratios;
  nlohmann::json options = nlohmann::json::object();
  // The matrices' type (--quantize): every rank loads its layers' matrices
  // and the LM head in it. complete_plan takes a quantized config's type.
  kernels::WeightType weights = kernels::WeightType::kF32;
  // How activations travel between its ranks (--wire): every collective and
  // send of the run encodes them so (core/wire_format.h). Lossy unless f32.
  core::WireType wire = core::WireType::kF32;
  // A generation's decode layout when it is not this one: a pair. This plan
  // prefills the prompt, every rank hands the K/V of every layer over, and
  // `decode` runs the steps on ranks 0..decode->world-1 (the others idle).
  // Its world is 1 up to this plan's (the first of its devices); its own
  // ratios and options say how it splits (JSON "decode": a plan). Null: this
  // plan decodes too.
  std::shared_ptr<const Plan> decode;

  nlohmann::json to_json() const;
  // Checks the types and ranges of the common fields; the options are the
  // strategy's to check (complete_plan).
  [[nodiscard]] static core::Result<Plan> from_json(const nlohmann::json& j);
};

// A command-line option of a strategy: `--flag VALUE` (or a bare flag that
// sets `key` to `flag_value`) is put into Plan::options[key].
struct OptionFlag {
  enum class Kind { kString, kNumber, kSetsBool };
  std::string flag;  // "--cr"
  std::string key;   // "rate"
  Kind kind = Kind::kString;
  std::string help;
  bool flag_value = false;  // kSetsBool: the value the bare flag sets
};

// What a planner may choose for a strategy: the kind of shares plan.ratios
// hold (rows of the sequence, attention heads plus FFN columns, or layers).
enum class ShareKind { kNone, kRows, kHeads, kLayers };

// A partition in the planner's terms; apply_partition writes it into a plan.
struct Partition {
  std::vector<double> shares;      // kRows, kHeads: one per device
  std::vector<double> ffn_shares;  // kHeads: FFN-column share of each device
  std::vector<int> layer_map;      // kLayers: the device of each layer
  bool blocks = false;             // kLayers: layer_map has two units per layer (attention, MLP)
};

// Generation with a KV cache across devices: the state one rank keeps for
// one request (the K/V of what it computes), made by the strategy and driven
// by the runtime the same way on every rank.
class Decoder {
 public:
  virtual ~Decoder() = default;
  // The layers on rows at positions pos0..pos0+n-1 (pos0 = the rows cached
  // so far: 0 for a prefill, or the length of a reused prefix; then one
  // row per step), their K/V appended
  // to the cache. Rank 0 passes the embedded rows x [n, F] and gets the last
  // layer's output; other ranks pass and get an empty tensor.
  [[nodiscard]] virtual core::Result<core::Tensor> forward(core::Tensor x, int64_t n, int64_t pos0,
                                                           core::ThreadPool* pool) = 0;
  // A handover (Plan::decode): layer l's K and V of every K/V head at
  // positions 0..n-1 (kv_width floats each, rotary applied), computed by
  // another layout's prefill; row i's K at k + i * ldk, its V at v + i * ldv.
  // The decoder keeps what its own steps read. Default: this layout cannot
  // take a handover (Strategy::takes_kv).
  [[nodiscard]] virtual core::Status take_kv(int64_t l, const float* k, int64_t ldk, const float* v, int64_t ldv,
                                             int64_t n);
  // The ranks 0..k-1 that take part in a chunk of n rows at pos0 (the same
  // answer on every rank); the others need not be told of it. Default: all
  // (any k >= the world). A pair's steps run on its decode plan's ranks.
  virtual int ranks_in(int64_t /*n*/, int64_t /*pos0*/) const { return core::kMaxDevices; }
  // Continuous batching (step_rows): one step of several sequences of this
  // plan, decs[0] == this, row i of x (rank 0; an empty tensor elsewhere)
  // at position pos[i] of decs[i]'s caches; returns the rows' outputs as
  // forward does. Only decoders that say batches() override it.
  virtual bool batches(std::span<Decoder* const> /*decs*/) const { return false; }
  [[nodiscard]] virtual core::Result<core::Tensor> forward_rows(std::span<Decoder* const> decs, core::Tensor x,
                                                                std::span<const int64_t> pos, core::ThreadPool* pool);
  // Overlapped steps (step_stages): a layout of k stages, stage s on rank
  // s, whose batched steps keep k groups of sequences in flight, each at
  // another stage, so that every rank computes at once rather than one
  // after another. k (>= 2) when these decoders run them, else 1.
  virtual int overlapped_stages(std::span<Decoder* const> /*decs*/) const { return 1; }
  [[nodiscard]] virtual core::Result<core::Tensor> forward_stages(std::span<Decoder* const> decs,
                                                                  std::span<const int64_t> group_rows, core::Tensor x,
                                                                  std::span<const int64_t> pos, core::ThreadPool* pool);
};

// One decode step of several sequences (continuous batching): row i of
// x [B, F] (rank 0; others pass an empty tensor) at position pos[i] of
// decs[i]'s caches, every decoder made for the same plan. A layout that
// batches runs the B rows through each GEMM at once (its weights read once
// a step); any other runs the sequences one after another, so every
// decoding strategy serves batches, with the same rows either way.
[[nodiscard]] core::Result<core::Tensor> step_rows(std::span<Decoder* const> decs, core::Tensor x,
                                                   std::span<const int64_t> pos, core::ThreadPool* pool);

// One call of overlapped steps (Decoder::overlapped_stages k): group g is
// the next group_rows[g] of decs and pos, in order. Rank 0 runs stage 0 on
// the group that enters (group 0, x [group_rows[0], F]) and returns the
// rows of the group that leaves (group k-1), computed by the last stage in
// the last call. Rank s > 0 sends on group s's rows, which it computed in
// the last call, then runs its stage on group s-1's as they arrive. The
// caller keeps the groups: the next call's group g+1 is this call's group
// g, in the same order. Rows of an empty group are neither sent nor received.
[[nodiscard]] core::Result<core::Tensor> step_stages(std::span<Decoder* const> decs, std::span<const int64_t> group_rows,
                                                     core::Tensor x, std::span<const int64_t> pos, core::ThreadPool* pool);

// Where a prefill that hands its K/V over puts each layer's (Decoder::take_kv's arguments).
using KvSink = std::function<core::Status(int64_t l, const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t n)>;

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  virtual std::string summary() const = 0;
  // False for lossy strategies (PRISM): tests then compare fidelity, not bits.
  virtual bool exact() const { return true; }
  // Whether run() handles a decoupled model's sub-blocks (ModelConfig::bp_div);
  // complete_plan refuses decoupled models to the others.
  virtual bool runs_decoupled() const { return false; }
  // Whether this completed plan runs Llama-style layers (rotary positions,
  // grouped K/V heads, RMSNorm, gated MLP; ModelConfig::plain_layers false);
  // complete_plan refuses such models to the others.
  virtual bool takes_llama_layers(const Plan&) const { return false; }
  virtual std::vector<OptionFlag> flags() const { return {}; }
  // The planner's search space (default: nothing to choose) and how a chosen
  // partition goes into the plan (default: shares into plan.ratios).
  virtual ShareKind share_kind() const { return ShareKind::kNone; }
  virtual void apply_partition(Plan& plan, const Partition& p) const;
  // Choices a completed plan leaves to the planner, each an options patch
  // (default: none); planner::choose_variant prices them on the profiles.
  virtual std::vector<nlohmann::json> variants(const Plan&) const { return {}; }
  // A lossy strategy's settings the planner prices when auto may choose
  // lossy plans (--lossy), each an options object, least loss first
  // (PRISM: its compression rates). The --max-loss gate picks among them by
  // measured loss. Default: none (the strategy's plans start from no options).
  virtual std::vector<nlohmann::json> lossy_settings() const { return {}; }
  // Fills defaults into plan.options, checks them against the config and
  // writes them back in canonical form (so the plan round-trips).
  [[nodiscard]] virtual core::Status complete(Plan& plan, const model::ModelConfig& c) const = 0;
  // What rank `rank` loads; the default: every layer whole, the embeddings
  // and head on the terminal.
  virtual model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& c, int rank) const;
  [[nodiscard]] virtual core::Result<core::Tensor> run(const model::Transformer& m, const Plan& plan,
                                                       Synchronizer& sync, core::Tensor x, int64_t n,
                                                       core::ThreadPool* pool) const = 0;
  // Whether this strategy generates with a KV cache (make_decoder gives a
  // Decoder): true exactly when it overrides make_decoder. Whoever needs the
  // strategies that generate asks this rather than lists names.
  virtual bool decodes() const { return false; }
  // Whether its decoders run a batched step's rows through each GEMM at
  // once (Decoder::batches, continuous batching); otherwise step_rows runs
  // the sequences one after another. The planner prices batches by it.
  virtual bool batches_steps() const { return false; }
  // Whether its decoders run a batch's steps overlapped, k groups of
  // sequences in flight, one at each of k stages (Decoder::overlapped_stages),
  // for this completed plan: k, or 1. The planner prices batches by it.
  virtual int overlapped_stages(const Plan&, const model::ModelConfig&) const { return 1; }
  // A decoder for one generation on this rank (sync.rank()), its caches as
  // `cache` says (positions, F32 or F16); the default: generation is not supported.
  [[nodiscard]] virtual core::Result<std::unique_ptr<Decoder>> make_decoder(const model::Transformer& m, const Plan& plan,
                                                                            Synchronizer& sync,
                                                                            const model::CacheSpec& cache) const;
  // The schedule run() follows for n rows: a pure function, no weights, no
  // network. Weight bytes come from load_options.
  virtual Schedule estimate(const Plan& plan, const model::ModelConfig& c, int64_t n) const = 0;

  // Pairs (Plan::decode). The prefill side: whether run_handing_over gives
  // rank `rank` the K/V of every head of every layer for an n-row prompt,
  // and that run (run()'s result; `sink` gets each layer's K/V on those
  // ranks). Default: not a prefill of a pair.
  virtual bool hands_over_kv(const Plan&, int64_t /*n*/, int /*rank*/) const { return false; }
  [[nodiscard]] virtual core::Result<core::Tensor> run_handing_over(const model::Transformer& m, const Plan& plan,
                                                                    Synchronizer& sync, core::Tensor x, int64_t n,
                                                                    core::ThreadPool* pool, const KvSink& sink) const;
  // The decode side: whether its decoders implement Decoder::take_kv.
  virtual bool takes_kv() const { return false; }
};

// The registry (registry.cpp lists the built-in strategies).
void register_strategy(std::unique_ptr<Strategy> s);  // replaces one of the same name
const Strategy* find_strategy(const std::string& name);
[[nodiscard]] core::Result<const Strategy*> strategy_for(const std::string& name);
std::vector<const Strategy*> strategies();
std::string strategy_names();  // "single, tp, ..."
// The one-device plan (the registry's one-device strategy, world 1, not yet
// completed), and whether a plan is it: code outside parallel/ asks these
// rather than writing the strategy's name. Both live in single.cpp.
Plan single_device_plan();
bool is_single_device(const Plan& plan);
// Whether the plan generates: its strategy decodes, or it is a pair.
bool plan_decodes(const Plan& plan);
// The plan that runs a generation's steps: the pair's decode plan, or the plan.
const Plan& decode_plan(const Plan& plan);
// The strategy's name, a pair's as "prefill+decode" (voltage+single).
std::string plan_name(const Plan& plan);

// Common checks (world, ratios), then the strategy's own complete().
[[nodiscard]] core::Status complete_plan(Plan& plan, const model::ModelConfig& config);
model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& config, int rank);
// A pair whose decode layout on `rank` needs layers that the prefill's do
// not hold in the same form (a TP shard beside Voltage's whole layers): what
// the rank loads beside them, layers only (the terminal's embeddings and head
// are the prefill's). None where the decode's weights are part of the
// prefill's, or the rank is outside the decode plan. `plan` is completed.
std::optional<model::LoadOptions> decode_load_options(const Plan& plan, const model::ModelConfig& config, int rank);
// Rank `rank`'s model for a completed plan, with a pair's decode layout
// beside it where decode_load_options says (Transformer::decode_layout).
[[nodiscard]] core::Result<model::Transformer> load_rank_model(const std::string& dir, const Plan& plan,
                                                               const model::ModelConfig& config, int rank);
// `config` with the plan's weight type (what its ranks load).
model::ModelConfig with_weights(const model::ModelConfig& config, const Plan& plan);
// Runs every layer. Rank 0 passes the embedded input [n, F] and gets back the
// last layer's output [n, F] (before GPT-2's ln_f); other ranks pass and get
// an empty tensor. `n` is known to every rank.
[[nodiscard]] core::Result<core::Tensor> run_layers(const model::Transformer& model, const Plan& plan,
                                                    Synchronizer& sync, core::Tensor x, int64_t n,
                                                    core::ThreadPool* pool);
// Strategy::make_decoder on `sync` set to the plan's wire, as run_layers
// sets it: every rank's generation goes through here.
[[nodiscard]] core::Result<std::unique_ptr<Decoder>> make_decoder(const Strategy& strategy, const model::Transformer& m,
                                                                  const Plan& plan, Synchronizer& sync,
                                                                  const model::CacheSpec& cache);
// The plan's schedule, with each device's weight bytes filled in and each
// transfer's bytes as the plan's wire carries them.
[[nodiscard]] core::Result<Schedule> estimate(const Plan& plan, const model::ModelConfig& config, int64_t n);

// Helpers the strategies share.
// The options as an object (null -> {}), with `key` read as T or `fallback`.
template <typename T>
core::Result<T> option(const Plan& plan, const std::string& key, T fallback) {
  if (!plan.options.is_object() || !plan.options.contains(key)) return fallback;
  try {
    return plan.options.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    return core::invalid_argument("strategy '" + plan.strategy + "': option '" + key + "' has the wrong type");
  }
}
// Refuses options the strategy does not know.
[[nodiscard]] core::Status only_options(const Plan& plan, const std::vector<std::string>& known);
// A share vector option ("1,1,2" or [1,1,2]) for plan.world devices; absent = `fallback`.
[[nodiscard]] core::Result<std::vector<double>> ratio_option(const Plan& plan, const std::string& key,
                                                             const std::vector<double>& fallback);
// The rows of each device under plan.ratios, their counts, and `rank`'s own.
std::vector<Range> row_ranges(const Plan& plan, int64_t n);
struct RowShare {
  std::vector<Range> rows;
  std::vector<int64_t> counts;
  Range mine;
};
RowShare row_share(const Plan& plan, int64_t n, int rank);
// One layer's weight-matrix and vector bytes, whole or as a TP shard.
int64_t layer_weight_bytes(const model::ModelConfig& c, int64_t width, int64_t ffn_cols);
// A tensor-parallel shard (query heads `heads`, `ffn_cols` FFN columns) as
// the kernels run it: fused QKV columns (model::HeadShard), attention width,
// FFN-in columns (gate and up for Llama-style layers); and its weight bytes.
struct ShardDims {
  int64_t qkv = 0, q = 0, ffn_in = 0;
};
ShardDims shard_dims(const model::ModelConfig& c, Range heads, int64_t ffn_cols);
int64_t shard_weight_bytes(const model::ModelConfig& c, Range heads, int64_t ffn_cols);
// Bytes of the embeddings and the head (the terminal's).
int64_t terminal_weight_bytes(const model::ModelConfig& c);
// Bytes of rank `rank`'s KV caches for a generation of `positions`
// positions: the K/V heads its head shard reads (replicated ones included)
// in every layer whose attention it holds, as its decoder allocates them; 0
// for a strategy that does not decode.
int64_t kv_cache_bytes(const Plan& plan, const model::ModelConfig& c, int rank, int64_t positions,
                       core::DType dtype = core::DType::kF32);
// The same, layer by layer (c.layers entries; 0 where the rank holds none).
std::vector<int64_t> kv_cache_layer_bytes(const Plan& plan, const model::ModelConfig& c, int rank, int64_t positions,
                                          core::DType dtype = core::DType::kF32);
// Every device's kv_layer_bytes in `s` (positions <= 0: none).
void add_kv_cache(Schedule& s, const Plan& plan, const model::ModelConfig& c, int64_t positions,
                  core::DType dtype = core::DType::kF32);
// A decode step of `rows` sequences (a batched step: each row its own
// sequence's): each attention call on that many rows reads, for each row,
// `keys` positions of the K/V heads its query heads use, in `dtype`; its
// n_kv, FLOPs and bytes say so.
void add_cache_reads(Schedule& s, const model::ModelConfig& c, int64_t keys, core::DType dtype = core::DType::kF32,
                     int64_t rows = 1);
// The kernel calls of Transformer::layer_tail on `rows` rows, and of a whole
// layer (QKV, attention over `kv_rows` keys, tail) on `rows` query rows.
void add_tail_work(std::vector<Work>& w, const model::ModelConfig& c, int64_t rows);
void add_layer_work(std::vector<Work>& w, const model::ModelConfig& c, int64_t rows, int64_t kv_rows);
// A decoupled model: one sub-block (Transformer::block) on `rows` rows, and its weight bytes.
void add_block_work(std::vector<Work>& w, const model::ModelConfig& c, int64_t rows);
int64_t block_weight_bytes(const model::ModelConfig& c);
// Every layer of the model on one device: add_layer_work, or N sub-blocks.
void add_model_layer_work(std::vector<Work>& w, const model::ModelConfig& c, int64_t l, int64_t rows);
int64_t model_layer_weight_bytes(const model::ModelConfig& c, int64_t l);
// Tensor-parallel shards (tp, and galaxy's MHA and MLP blocks): the heads and
// FFN columns of each device, and what a device loads.
std::vector<Range> head_ranges(const model::ModelConfig& c, const std::vector<double>& ratios);
// The query heads head_ranges splits in on `devices` devices: whole K/V
// groups while the devices are no more than the K/V heads, and runs of them
// (or of heads) whose attention-output columns are whole blocks of quantized
// weights (the last run may be short).
int64_t head_unit(const model::ModelConfig& c, int devices);
std::vector<Range> ffn_ranges(const model::ModelConfig& c, const std::vector<double>& ffn_ratios);
model::LoadOptions shard_load_options(Range heads, Range ffn, int rank);

// Tensor-parallel layers with an optional KV cache of this rank's heads (tp's
// run and decoder, galaxy's decode steps). `full` [n, F] is on every rank
// and is updated in place; rows are at positions pos0.. . With a cache, a
// one-row step sums its partial projections in one hop (point to point)
// rather than a ring.
class TpLayers {
 public:
  TpLayers(const model::Transformer& m, Range heads, int64_t ffn_cols) : m_(m), heads_(heads), il_(ffn_cols) {}
  [[nodiscard]] core::Status run(Synchronizer& sync, float* full, int64_t n, int64_t pos0, model::KvCache* cache,
                                 core::ThreadPool* pool) {
    return run_impl(sync, full, n, pos0, cache, nullptr, pool);
  }
  // Continuous batching: full [pos.size(), F] holds one row of each of
  // several sequences, row i at pos[i] with caches[i] (model::attend_rows).
  struct Rows {
    std::span<const int64_t> pos;
    std::span<model::KvCache* const> caches;
  };
  [[nodiscard]] core::Status run_rows(Synchronizer& sync, float* full, const Rows& rows, core::ThreadPool* pool) {
    return run_impl(sync, full, static_cast<int64_t>(rows.pos.size()), 0, nullptr, &rows, pool);
  }
  // A decoder's chunk or batched step: rank 0 broadcasts its rows x [n, F]
  // (others pass an empty tensor), every rank runs the layers, and rank 0
  // gets the rows back (the others an empty tensor).
  [[nodiscard]] core::Result<core::Tensor> decode(Synchronizer& sync, core::Tensor x, int64_t n, int64_t pos0,
                                                  model::KvCache* cache, core::ThreadPool* pool);
  [[nodiscard]] core::Result<core::Tensor> decode_rows(Synchronizer& sync, core::Tensor x, const Rows& rows,
                                                       core::ThreadPool* pool);
  // A cache of `positions` rows of this rank's heads for every loaded layer.
  [[nodiscard]] core::Result<model::KvCache> make_cache(const model::CacheSpec& spec) const;
  // Appends K/V of rows qkv [n, 3 * width] (this rank's heads) at pos0.
  void cache_kv(int64_t l, const float* qkv, int64_t n, int64_t pos0, model::KvCache& cache) const;

 private:
  const model::Transformer& m_;
  Range heads_;
  int64_t il_;
  core::Status run_impl(Synchronizer& sync, float* full, int64_t n, int64_t pos0, model::KvCache* cache,
                        const Rows* rows, core::ThreadPool* pool);
  core::Tensor a_, qkv_, ctx_, part_, h_, f_, scores_, gate_up_;
  std::vector<float> sum_buf_;  // a decode step's one-hop AllReduce
};
// The TP decoder on `heads`/`ffn_cols` of sync's rank: the terminal
// broadcasts the rows, then TpLayers with the cache.
// A pair's decoder (Plan::decode; make_decoder calls it): the first chunk
// of a generation is the prefill's run handing its K/V over to the decode
// plan's decoder on ranks 0..decode->world-1, and every later chunk is that
// decoder's (a prompt too short to give those ranks rows is prefilled by it).
[[nodiscard]] core::Result<std::unique_ptr<Decoder>> make_pair_decoder(const Strategy& prefill,
                                                                       const model::Transformer& m, const Plan& plan,
                                                                       Synchronizer& sync,
                                                                       const model::CacheSpec& cache);
[[nodiscard]] core::Result<std::unique_ptr<Decoder>> make_tp_decoder(const model::Transformer& m, Synchronizer& sync,
                                                                     Range heads, int64_t ffn_cols,
                                                                     const model::CacheSpec& cache);

}  // namespace tessera::parallel
