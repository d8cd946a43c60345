#include "parallel/strategy.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>

#include "core/check.h"
#include "core/limits.h"

namespace tessera::parallel {

using core::Result;
using core::Status;
using core::Tensor;
using nlohmann::json;

std::vector<std::unique_ptr<Strategy>> builtin_strategies();  // registry.cpp

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<Strategy>> list;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: strategies outlive static destructors
    reg->list = builtin_strategies();
    return reg;
  }();
  return *r;
}

}  // namespace

void register_strategy(std::unique_ptr<Strategy> s) {
  TESSERA_CHECK(s != nullptr);
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto& have : reg.list)
    if (have->name() == s->name()) {
      have = std::move(s);
      return;
    }
  reg.list.push_back(std::move(s));
}

const Strategy* find_strategy(const std::string& name) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (const auto& s : reg.list)
    if (s->name() == name) return s.get();
  return nullptr;
}

std::vector<const Strategy*> strategies() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::vector<const Strategy*> out;
  for (const auto& s : reg.list) out.push_back(s.get());
  return out;
}

std::string strategy_names() {
  std::string out;
  for (const Strategy* s : strategies()) out += (out.empty() ? "" : ", ") + s->name();
  return out;
}

Result<const Strategy*> strategy_for(const std::string& name) {
  const Strategy* s = find_strategy(name);
  if (s == nullptr) return core::invalid_argument("unknown strategy '" + name + "' (" + strategy_names() + ")");
  return s;
}

json Plan::to_json() const {
  json j = {{"strategy", strategy}, {"world", world}, {"ratios", ratios}, {"options", options.is_null() ? json::object() : options}};
  if (weights != kernels::WeightType::kF32) j["weights"] = kernels::weight_type_name(weights);
  if (wire != core::WireType::kF32) j["wire"] = core::wire_type_name(wire);
  if (decode) j["decode"] = decode->to_json();
  return j;
}

Result<Plan> Plan::from_json(const json& j) {
  if (!j.is_object()) return core::invalid_argument("plan: not a JSON object");
  Plan p;
  if (!j.contains("strategy") || !j["strategy"].is_string()) return core::invalid_argument("plan: 'strategy' must be a string");
  p.strategy = j["strategy"].get<std::string>();
  if (!j.contains("world") || !j["world"].is_number_integer()) return core::invalid_argument("plan: 'world' must be an integer");
  const int64_t world = j["world"].get<int64_t>();
  if (world < 1 || world > core::kMaxDevices)
    return core::invalid_argument("plan: 'world' must be in [1, " + std::to_string(core::kMaxDevices) + "]");
  p.world = static_cast<int>(world);
  if (j.contains("ratios")) {
    if (!j["ratios"].is_array() || j["ratios"].size() > core::kMaxDevices) return core::invalid_argument("plan: 'ratios' must be a short array");
    for (const auto& r : j["ratios"]) {
      if (!r.is_number()) return core::invalid_argument("plan: 'ratios' must hold numbers");
      p.ratios.push_back(r.get<double>());
    }
  }
  if (j.contains("options")) {
    if (!j["options"].is_object()) return core::invalid_argument("plan: 'options' must be an object");
    p.options = j["options"];
  }
  if (j.contains("weights")) {
    if (!j["weights"].is_string()) return core::invalid_argument("plan: 'weights' must be a string");
    TESSERA_ASSIGN_OR_RETURN(p.weights, kernels::parse_weight_type(j["weights"].get<std::string>()));
  }
  if (j.contains("wire")) {
    if (!j["wire"].is_string()) return core::invalid_argument("plan: 'wire' must be a string");
    TESSERA_ASSIGN_OR_RETURN(p.wire, core::parse_wire_type(j["wire"].get<std::string>()));
  }
  if (j.contains("decode")) {
    if (!j["decode"].is_object() || j["decode"].contains("decode"))
      return core::invalid_argument("plan: 'decode' must be a plan without a 'decode' of its own");
    auto d = from_json(j["decode"]);
    if (!d.ok()) return core::invalid_argument("plan: 'decode': " + d.status().message());
    p.decode = std::make_shared<const Plan>(std::move(d).value());
  }
  return p;
}

Status only_options(const Plan& plan, const std::vector<std::string>& known) {
  if (plan.options.is_null()) return core::ok_status();
  if (!plan.options.is_object()) return core::invalid_argument("strategy options must be a JSON object");
  for (const auto& [key, value] : plan.options.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      return core::invalid_argument("option '" + key + "' does not apply to strategy '" + plan.strategy + "'");
  return core::ok_status();
}

Result<std::vector<double>> ratio_option(const Plan& plan, const std::string& key, const std::vector<double>& fallback) {
  if (!plan.options.is_object() || !plan.options.contains(key)) return fallback;
  const json& v = plan.options.at(key);
  if (v.is_string()) return parse_ratios(v.get<std::string>(), plan.world);
  if (!v.is_array() || static_cast<int>(v.size()) != plan.world)
    return core::invalid_argument("option '" + key + "' needs " + std::to_string(plan.world) + " shares");
  std::vector<double> out;
  double sum = 0;
  for (const auto& r : v) {
    if (!r.is_number() || !std::isfinite(r.get<double>()) || r.get<double>() < 0)
      return core::invalid_argument("option '" + key + "' must hold finite shares >= 0");
    out.push_back(r.get<double>());
    sum += out.back();
  }
  if (!(sum > 0)) return core::invalid_argument("option '" + key + "': shares must not all be 0");
  return out;  // as given: shares are relative, and completing a plan twice must not change it
}

std::vector<Range> row_ranges(const Plan& plan, int64_t n) { return split_by_ratio(n, plan.ratios); }

RowShare row_share(const Plan& plan, int64_t n, int rank) {
  RowShare s;
  s.rows = row_ranges(plan, n);
  s.counts = range_sizes(s.rows);
  s.mine = s.rows[static_cast<size_t>(rank)];
  return s;
}

int64_t layer_weight_bytes(const model::ModelConfig& c, int64_t width, int64_t ffn_cols) {
  const int64_t F = c.hidden;
  // QKV [3w, F] + [3w], out [F, w] + [F], FFN [I', F] + [I'] and [F, I'] + [F], two norms.
  const int64_t floats = 3 * width + F + ffn_cols + F + 4 * F;
  return floats * static_cast<int64_t>(sizeof(float)) + c.matrix_bytes(3 * width, F) + c.matrix_bytes(F, width, F) +
         c.matrix_bytes(ffn_cols, F) + c.matrix_bytes(F, ffn_cols, c.intermediate);
}

// A Llama-style layer as weights.cpp holds it: fused QKV [(H + 2 KV) d, F],
// o_proj [F, H d], gate|up [2I, F], down [F, I], the biases it has, two
// RMSNorm weights and Qwen3's q/k norms.
int64_t llama_layer_weight_bytes(const model::ModelConfig& c) {
  const int64_t F = c.hidden, I = c.intermediate;
  int64_t floats = 2 * F;
  if (c.attention_bias) floats += c.qkv_width();
  if (c.o_bias) floats += F;
  if (c.mlp_bias) floats += 2 * I + F;
  if (c.qk_norm) floats += 2 * c.head_dim();
  return floats * static_cast<int64_t>(sizeof(float)) + c.matrix_bytes(c.qkv_width(), F) +
         c.matrix_bytes(F, c.q_width()) + c.matrix_bytes(2 * I, F) + c.matrix_bytes(F, I);
}

ShardDims shard_dims(const model::ModelConfig& c, Range heads, int64_t ffn_cols) {
  const model::HeadShard s = c.head_shard(heads.begin, heads.end);
  return {s.qkv_width(), s.q_width(), c.llama_style() ? 2 * ffn_cols : ffn_cols};
}

int64_t shard_weight_bytes(const model::ModelConfig& c, Range heads, int64_t ffn_cols) {
  if (!c.llama_style()) return layer_weight_bytes(c, heads.size() * c.head_dim(), ffn_cols);
  const ShardDims d = shard_dims(c, heads, ffn_cols);
  const int64_t F = c.hidden;
  int64_t floats = 2 * F;  // two norms
  if (c.attention_bias) floats += d.qkv;
  if (c.o_bias) floats += F;
  if (c.mlp_bias) floats += 2 * ffn_cols + F;
  if (c.qk_norm) floats += 2 * c.head_dim();
  // QKV, o_proj, gate|up and down
  return floats * static_cast<int64_t>(sizeof(float)) + c.matrix_bytes(d.qkv, F) + c.matrix_bytes(F, d.q, c.q_width()) +
         c.matrix_bytes(2 * ffn_cols, F) + c.matrix_bytes(F, ffn_cols, c.intermediate);
}

// What load_weights gives the terminal (embeddings and head), from the recipe.
int64_t terminal_weight_bytes(const model::ModelConfig& c) {
  const int64_t F = c.hidden, W = c.token_width();
  int64_t floats = 0, bytes = 0;
  if (c.takes_images()) {
    floats += c.max_rows() * F + F + F * c.channels * c.patch_size * c.patch_size + F;  // positions, cls, patches
  } else {
    // A decoder's packed matrix (the LM head, or the tied table that is
    // both) is held in the deployment's type; a separate table stays F32.
    if (c.causal()) {
      bytes += c.head_bytes(c.vocab, W);
      if (c.head == model::HeadKind::kLmHead && !c.tied_head) floats += c.vocab * W;
    } else {
      floats += c.vocab * W;
    }
    if (c.learned_positions) floats += (c.max_positions + c.position_offset) * F;
    if (c.has_token_types()) floats += c.type_vocab * F;
    if (c.embed_norm) floats += 2 * F;
    if (c.projects_embeddings()) bytes += c.matrix_bytes(F, W) + c.matrix_bytes(W, F);  // in and out
  }
  if (c.final_norm) floats += c.llama_style() ? F : 2 * F;
  if (!c.causal() && c.head != model::HeadKind::kNone)
    floats += F * F + F + c.num_labels() * F + c.num_labels();  // pooler, classifier
  return floats * static_cast<int64_t>(sizeof(float)) + bytes;
}

std::vector<int64_t> kv_cache_layer_bytes(const Plan& plan, const model::ModelConfig& c, int rank, int64_t positions,
                                          core::DType dtype) {
  std::vector<int64_t> bytes(static_cast<size_t>(std::max<int64_t>(c.layers, 0)), 0);
  // A pair's caches are its decode layout's; a rank outside it keeps none.
  if (plan.decode) return rank < plan.decode->world ? kv_cache_layer_bytes(*plan.decode, c, rank, positions, dtype) : bytes;
  const Strategy* s = find_strategy(plan.strategy);
  if (s == nullptr || !s->decodes() || positions <= 0) return bytes;
  const model::LoadOptions o = load_options(plan, c, rank);
  const int64_t kv_width = c.head_shard(o.head_begin, o.head_end < 0 ? c.heads : o.head_end).kv_width();
  // A decoupled layer caches its N sub-blocks' whole K and V (Transformer::make_cache).
  auto add = [&](int64_t l) {
    if (l < 0 || l >= c.layers) return;
    const int64_t width = c.decoupled(l) ? c.bp_div * c.hidden : kv_width;
    bytes[static_cast<size_t>(l)] += 2 * width * positions * static_cast<int64_t>(core::dtype_size(dtype));
  };
  if (!o.only_layers.empty()) {
    for (size_t i = 0; i < o.only_layers.size(); ++i)
      if (o.only_parts.empty() || (o.only_parts[i] & 1)) add(o.only_layers[i]);  // the attention block's device
  } else {
    for (int64_t l = o.layer_begin; l < (o.layer_end < 0 ? c.layers : o.layer_end); ++l) add(l);
  }
  return bytes;
}

int64_t kv_cache_bytes(const Plan& plan, const model::ModelConfig& c, int rank, int64_t positions, core::DType dtype) {
  const auto layers = kv_cache_layer_bytes(plan, c, rank, positions, dtype);
  return std::accumulate(layers.begin(), layers.end(), int64_t{0});
}

void add_kv_cache(Schedule& s, const Plan& plan, const model::ModelConfig& c, int64_t positions, core::DType dtype) {
  for (size_t d = 0; d < s.devices.size(); ++d)
    s.devices[d].kv_layer_bytes = kv_cache_layer_bytes(plan, c, static_cast<int>(d), positions, dtype);
}

void add_cache_reads(Schedule& s, const model::ModelConfig& c, int64_t keys, core::DType dtype, int64_t rows) {
  const int64_t hd = c.head_dim(), group = std::max<int64_t>(c.kv_group(), 1);
  for (DeviceSchedule& d : s.devices)
    for (Phase& ph : d.phases)
      for (Work& w : ph.work) {
        if (w.kind != WorkKind::kAttention || w.m != rows || rows < 1 || keys < 1) continue;
        // A shard's query heads read whole K/V heads (a group split over two
        // devices is read by both).
        const int64_t q_heads = w.k / std::max<int64_t>(hd, 1), kv_heads = (q_heads + group - 1) / group;
        const Work priced = attention(w.what, 1, keys, w.k);
        w.n = priced.n;
        w.flops = rows * priced.flops;
        w.bytes = rows * 2 * keys * kv_heads * hd * static_cast<int64_t>(core::dtype_size(dtype));
      }
}

void add_tail_work(std::vector<Work>& w, const model::ModelConfig& c, int64_t rows) {
  if (rows <= 0) return;
  const int64_t F = c.hidden, I = c.intermediate;
  if (c.llama_style()) {  // o_proj from the heads' width, gate|up, SiLU, down
    w.push_back(gemm("attn_out", rows, c.q_width(), F));
    w.push_back(elementwise("norm", rows, F));
    w.push_back(gemm("ffn_in", rows, F, 2 * I));
    w.push_back(elementwise("swiglu", rows, I));
    w.push_back(gemm("ffn_out", rows, I, F));
    w.push_back(elementwise("residual", rows, F));  // last, as the other families' norm (Voltage splits ffn_out off)
    return;
  }
  w.push_back(gemm("attn_out", rows, F, F));
  w.push_back(elementwise("norm", rows, F));
  w.push_back(gemm("ffn_in", rows, F, I));
  w.push_back(gemm("ffn_out", rows, I, F));
  w.push_back(elementwise("norm", rows, F));
}

// A Llama-style layer as Transformer::layer runs it.
void add_llama_layer_work(std::vector<Work>& w, const model::ModelConfig& c, int64_t rows, int64_t kv_rows) {
  const int64_t F = c.hidden;
  w.push_back(elementwise("norm", rows, F));
  w.push_back(gemm("qkv", rows, F, c.qkv_width()));
  w.push_back(elementwise("rope", rows, c.q_width() + c.kv_width()));
  w.push_back(attention("attention", rows, kv_rows, c.q_width()));
  add_tail_work(w, c, rows);
}

void add_layer_work(std::vector<Work>& w, const model::ModelConfig& c, int64_t rows, int64_t kv_rows) {
  if (rows <= 0) return;
  if (c.llama_style()) return add_llama_layer_work(w, c, rows, kv_rows);
  const int64_t F = c.hidden;
  w.push_back(elementwise("norm", rows, F));
  w.push_back(gemm("qkv", rows, F, 3 * F));
  w.push_back(attention("attention", rows, kv_rows, F));
  add_tail_work(w, c, rows);
}

void add_block_work(std::vector<Work>& w, const model::ModelConfig& c, int64_t rows) {
  if (rows <= 0) return;
  const int64_t H = c.hidden, Fr = c.block_width(), I = c.intermediate;
  w.push_back(elementwise("norm", rows, Fr));
  w.push_back(gemm("qkv", rows, Fr, 3 * H));
  w.push_back(attention("attention", rows, rows, H));
  w.push_back(gemm("attn_out", rows, H, Fr));
  w.push_back(elementwise("norm", rows, Fr));
  w.push_back(gemm("ffn_in", rows, Fr, I));
  w.push_back(gemm("ffn_out", rows, I, Fr));
  w.push_back(elementwise("norm", rows, Fr));
}

int64_t block_weight_bytes(const model::ModelConfig& c) {
  // [3H, Fr] + [3H], [Fr, H] + [Fr], [I, Fr] + [I], [Fr, I] + [Fr], four norms of Fr.
  const int64_t H = c.hidden, Fr = c.block_width(), I = c.intermediate;
  return (3 * H * Fr + 3 * H + Fr * H + Fr + 2 * I * Fr + I + Fr + 4 * Fr) * static_cast<int64_t>(sizeof(float));
}

void add_model_layer_work(std::vector<Work>& w, const model::ModelConfig& c, int64_t l, int64_t rows) {
  if (!c.decoupled(l)) return add_layer_work(w, c, rows, rows);
  for (int64_t i = 0; i < c.bp_div; ++i) add_block_work(w, c, rows);
}

int64_t model_layer_weight_bytes(const model::ModelConfig& c, int64_t l) {
  if (c.llama_style()) return llama_layer_weight_bytes(c);
  return c.decoupled(l) ? c.bp_div * block_weight_bytes(c) : layer_weight_bytes(c, c.hidden, c.intermediate);
}

namespace {

// split_by_ratio in whole units of `unit` (the last one may be short).
std::vector<Range> split_in_units(int64_t n, int64_t unit, const std::vector<double>& ratios) {
  if (unit <= 1) return split_by_ratio(n, ratios);
  std::vector<Range> r = split_by_ratio((n + unit - 1) / unit, ratios);
  for (Range& x : r) x = {std::min(n, x.begin * unit), std::min(n, x.end * unit)};
  return r;
}

// Quantized weights: shards cut columns on whole blocks, so each device
// holds the single device's blocks and their sums agree (quant.h). A mixed
// file's cuts fall on the blocks of the matrix they cut (`mixed_block`: a
// Q8_0 file's K-quant ffn_down is 256 wide, its attn_output 32).
int64_t column_unit(const model::ModelConfig& c, int64_t width, int64_t mixed_block) {
  if (c.weights == kernels::WeightType::kF32) return 1;
  const int64_t block = c.mixed() && mixed_block > 0 ? mixed_block : kernels::block_elems(c.weights);
  return block / std::gcd(width, block);
}

}  // namespace

std::vector<Range> head_ranges(const model::ModelConfig& c, const std::vector<double>& ratios) {
  // Grouped K/V heads: whole groups per device while there are as many K/V
  // heads as devices, so no K/V head is computed or cached twice; with more
  // devices the query heads are split and neighbours share (replicate) a
  // K/V head (model::HeadShard) rather than refusing.
  return split_in_units(c.heads, head_unit(c, static_cast<int>(ratios.size())), ratios);
}

int64_t head_unit(const model::ModelConfig& c, int devices) {
  // A group's g * head_dim output columns may not be whole blocks (Qwen's
  // 640 against Q4_K's 256): then whole runs of groups that are.
  const int64_t g = c.kv_group();
  if (g > 1 && devices <= c.kv_head_count()) return g * column_unit(c, g * c.head_dim(), c.mix_attn_block);
  return column_unit(c, c.head_dim(), c.mix_attn_block);
}

std::vector<Range> ffn_ranges(const model::ModelConfig& c, const std::vector<double>& ffn_ratios) {
  return split_in_units(c.intermediate, column_unit(c, 1, c.mix_ffn_block), ffn_ratios);
}

model::LoadOptions shard_load_options(Range heads, Range ffn, int rank) {
  model::LoadOptions o;
  o.embeddings = o.head = rank == 0;
  o.head_begin = heads.begin;
  o.head_end = heads.end;
  o.ffn_begin = ffn.begin;
  o.ffn_end = ffn.end;
  return o;
}

namespace {

// The parts of each layer `o` loads: bit 1 its attention, bit 2 its MLP.
std::vector<int> layer_parts(const model::LoadOptions& o, int64_t layers) {
  std::vector<int> parts(static_cast<size_t>(layers), 0);
  if (!o.only_layers.empty()) {
    for (size_t i = 0; i < o.only_layers.size(); ++i)
      if (o.only_layers[i] >= 0 && o.only_layers[i] < layers)
        parts[static_cast<size_t>(o.only_layers[i])] |= o.only_parts.empty() ? 3 : o.only_parts[i];
    return parts;
  }
  const int64_t end = o.layer_end < 0 ? layers : std::min(o.layer_end, layers);
  for (int64_t l = std::max<int64_t>(o.layer_begin, 0); l < end; ++l) parts[static_cast<size_t>(l)] = 3;
  return parts;
}

// Whether what `inner` loads is part of what `outer` loads, in the same form:
// a head or FFN shard is packed apart, so shards must be the same.
bool load_covers(const model::LoadOptions& outer, const model::LoadOptions& inner, int64_t layers) {
  if ((inner.embeddings && !outer.embeddings) || (inner.head && !outer.head) || inner.weights != outer.weights) return false;
  if (inner.head_begin != outer.head_begin || inner.head_end != outer.head_end || inner.ffn_begin != outer.ffn_begin ||
      inner.ffn_end != outer.ffn_end || inner.block_begin != outer.block_begin || inner.block_end != outer.block_end)
    return false;
  const auto in = layer_parts(inner, layers), out = layer_parts(outer, layers);
  for (size_t l = 0; l < in.size(); ++l)
    if ((in[l] & ~out[l]) != 0) return false;
  return true;
}

// A pair's decode plan: completed in the prefill's weights and wire, on the
// first decode.world of the prefill's devices (parallel::SubSynchronizer).
// World 0 chooses: the prefill's world or, when its strategy runs on one
// device only, the terminal.
Status complete_pair(Plan& plan, const Strategy& prefill, const model::ModelConfig& config) {
  Plan d = *plan.decode;
  if (d.decode) return core::invalid_argument("a pair's decode plan has no decode plan of its own");
  TESSERA_ASSIGN_OR_RETURN(const Strategy* ds, strategy_for(d.strategy));
  std::string prefills, takes;
  for (const Strategy* t : strategies()) {
    if (t->hands_over_kv(plan, config.max_positions, 0)) prefills += (prefills.empty() ? "" : ", ") + t->name();
    if (t->decodes() && t->takes_kv()) takes += (takes.empty() ? "" : ", ") + t->name();
  }
  if (!ds->decodes() || !ds->takes_kv())
    return core::unimplemented("strategy '" + d.strategy + "' cannot decode after another layout's prefill (these can: " +
                               takes + ")");
  d.weights = plan.weights;
  d.wire = plan.wire;
  if (d.world == 0) {
    Plan whole = d;
    whole.world = plan.world;
    d.world = complete_plan(whole, config).ok() ? plan.world : 1;
  }
  if (d.world < 1 || d.world > plan.world)
    return core::invalid_argument("a pair's decode plan runs on the first 1.." + std::to_string(plan.world) +
                                  " of the prefill's devices, not " + std::to_string(d.world));
  if (Status st = complete_plan(d, config); !st.ok()) return st.with_context("the decode plan");
  // With every rank's share > 0, a prompt as long as the context gives each rank rows.
  for (int r = 0; r < d.world; ++r)
    if (!prefill.hands_over_kv(plan, config.max_positions, r))
      return core::unimplemented("strategy '" + plan.strategy + "' (as planned) does not hand device " + std::to_string(r) +
                                 " the K/V a decode needs (prefills of a pair: " + (prefills.empty() ? "none" : prefills) + ")");
  // A decode layout whose weights are not part of the prefill's is loaded
  // beside them (decode_load_options), and counted so (estimate).
  plan.decode = std::make_shared<const Plan>(std::move(d));
  return core::ok_status();
}

}  // namespace

Status complete_plan(Plan& plan, const model::ModelConfig& config) {
  TESSERA_ASSIGN_OR_RETURN(const Strategy* s, strategy_for(plan.strategy));
  if (plan.world < 1 || plan.world > core::kMaxDevices)
    return core::invalid_argument("device count must be in [1, " + std::to_string(core::kMaxDevices) + "]");
  if (plan.ratios.empty()) plan.ratios = equal_ratios(plan.world);
  if (static_cast<int>(plan.ratios.size()) != plan.world)
    return core::invalid_argument("partition has " + std::to_string(plan.ratios.size()) + " entries for " +
                                  std::to_string(plan.world) + " devices");
  double sum = 0;
  for (double r : plan.ratios) {
    if (!std::isfinite(r) || r < 0) return core::invalid_argument("partition shares must be finite and >= 0");
    sum += r;
  }
  if (!(sum > 0)) return core::invalid_argument("partition shares must not all be 0");
  if (!std::isfinite(sum)) return core::invalid_argument("partition shares must add up to a finite number");
  if (plan.options.is_null()) plan.options = json::object();
  if (!plan.options.is_object()) return core::invalid_argument("strategy options must be a JSON object");
  if (config.bp_div > 0 && !s->runs_decoupled())
    return core::invalid_argument("strategy '" + plan.strategy + "' cannot run a decoupled model (block_parallel); use bp or single");
  if (plan.weights == kernels::WeightType::kF32) plan.weights = config.weights;
  if (plan.weights != kernels::WeightType::kF32 && config.bp_div > 0)
    return core::unimplemented("a decoupled model (block_parallel) does not run on quantized weights yet; load it in f32");
  TESSERA_RETURN_IF_ERROR(s->complete(plan, with_weights(config, plan)));
  if (!config.plain_layers() && !s->takes_llama_layers(plan)) {
    std::string can;
    for (const Strategy* t : strategies())
      if (t->takes_llama_layers(plan)) can += (can.empty() ? "" : ", ") + t->name();
    return core::unimplemented("strategy '" + plan.strategy +
                               "' does not handle Llama-style layers (rotary positions per row, grouped K/V heads, "
                               "RMSNorm) yet; use " + can + " (pipeline with units=layers)");
  }
  if (plan.decode) TESSERA_RETURN_IF_ERROR(complete_pair(plan, *s, config));
  return core::ok_status();
}

void Strategy::apply_partition(Plan& plan, const Partition& p) const {
  if (!p.shares.empty()) plan.ratios = p.shares;
}

model::LoadOptions Strategy::load_options(const Plan&, const model::ModelConfig&, int rank) const {
  model::LoadOptions o;
  o.embeddings = o.head = rank == 0;
  return o;
}

model::ModelConfig with_weights(const model::ModelConfig& config, const Plan& plan) {
  model::ModelConfig c = config;
  c.weights = plan.weights;
  return c;
}

model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& config, int rank) {
  const Strategy* s = find_strategy(plan.strategy);
  TESSERA_CHECK_MSG(s != nullptr, "load_options of an unchecked plan (" << plan.strategy << ")");
  model::LoadOptions o = s->load_options(plan, with_weights(config, plan), rank);
  o.weights = plan.weights;
  return o;
}

std::optional<model::LoadOptions> decode_load_options(const Plan& plan, const model::ModelConfig& config, int rank) {
  if (!plan.decode || rank >= plan.decode->world) return std::nullopt;
  model::LoadOptions d = load_options(*plan.decode, config, rank);
  if (load_covers(load_options(plan, config, rank), d, config.layers)) return std::nullopt;
  d.embeddings = d.head = false;
  return d;
}

Result<model::Transformer> load_rank_model(const std::string& dir, const Plan& plan, const model::ModelConfig& config,
                                           int rank) {
  TESSERA_ASSIGN_OR_RETURN(model::Transformer m, model::Transformer::load(dir, load_options(plan, config, rank)));
  if (const auto d = decode_load_options(plan, config, rank)) {
    TESSERA_ASSIGN_OR_RETURN(model::Transformer layers, model::Transformer::load(dir, *d));
    m.set_decode_layout(std::make_shared<const model::Transformer>(std::move(layers)));
  }
  return m;
}

Result<Tensor> run_layers(const model::Transformer& model, const Plan& plan, Synchronizer& sync, Tensor x, int64_t n,
                          core::ThreadPool* pool) {
  TESSERA_ASSIGN_OR_RETURN(const Strategy* s, strategy_for(plan.strategy));
  if (sync.world() != plan.world) return core::invalid_argument("synchronizer world size differs from the plan");
  if (n < 1) return core::invalid_argument("a run needs at least one row");
  if (sync.rank() == 0 && (x.rank() != 2 || x.dim(0) != n || x.dim(1) != model.config().hidden))
    return core::invalid_argument("terminal input must be [n, hidden]");
  sync.set_wire(plan.wire);
  return s->run(model, plan, sync, std::move(x), n, pool);
}

Result<std::unique_ptr<Decoder>> make_decoder(const Strategy& strategy, const model::Transformer& m, const Plan& plan,
                                              Synchronizer& sync, const model::CacheSpec& cache) {
  sync.set_wire(plan.wire);
  if (plan.decode) return make_pair_decoder(strategy, m, plan, sync, cache);
  return strategy.make_decoder(m, plan, sync, cache);
}

bool plan_decodes(const Plan& plan) {
  if (plan.decode) return true;
  const Strategy* s = find_strategy(plan.strategy);
  return s != nullptr && s->decodes();
}

const Plan& decode_plan(const Plan& plan) { return plan.decode ? *plan.decode : plan; }

std::string plan_name(const Plan& plan) { return plan.strategy + (plan.decode ? "+" + plan.decode->strategy : ""); }

Result<Tensor> Strategy::run_handing_over(const model::Transformer&, const Plan& plan, Synchronizer&, Tensor, int64_t,
                                          core::ThreadPool*, const KvSink&) const {
  return core::unimplemented("strategy '" + plan.strategy + "' cannot prefill a pair");
}

Status Decoder::take_kv(int64_t, const float*, int64_t, const float*, int64_t, int64_t) {
  return core::unimplemented("this decoder cannot take another layout's K/V");
}

Result<Schedule> estimate(const Plan& plan, const model::ModelConfig& config, int64_t n) {
  TESSERA_ASSIGN_OR_RETURN(const Strategy* s, strategy_for(plan.strategy));
  if (n < 1) return core::invalid_argument("an estimate needs at least one row");
  Schedule sched = s->estimate(plan, with_weights(config, plan), n);
  if (static_cast<int>(sched.devices.size()) != plan.world)
    return core::internal_error("strategy '" + plan.strategy + "' estimated the wrong number of devices");
  // A pair's decode layout loaded beside the prefill's weights: its layers.
  std::optional<Schedule> decode;
  for (int r = 0; plan.decode && r < std::min(plan.decode->world, plan.world); ++r) {
    if (!decode_load_options(plan, config, r)) continue;
    if (!decode) {
      TESSERA_ASSIGN_OR_RETURN(decode, estimate(*plan.decode, config, 1));
    }
    const model::LoadOptions whole = load_options(*plan.decode, config, r);
    sched.devices[static_cast<size_t>(r)].weight_bytes +=
        decode->devices[static_cast<size_t>(r)].weight_bytes -
        (whole.embeddings || whole.head ? terminal_weight_bytes(with_weights(config, plan)) : 0);
  }
  const model::ModelConfig held = with_weights(config, plan);
  for (auto& d : sched.devices)
    for (auto& ph : d.phases)
      for (auto& w : ph.work)
        if (w.kind == WorkKind::kGemm) {
          w.weights = held.weights;
          if (held.other_type() != held.weights) w.mix = held.other_type(), w.mix_share = held.mix_other_share;
        }
  // A transfer's floats as one run of rows: exact when every message's rows
  // are whole 32-value blocks (hidden sizes and their K-way parts are).
  if (plan.wire != core::WireType::kF32)
    for (auto& d : sched.devices)
      for (auto& ph : d.phases)
        for (auto& t : ph.transfers) t.bytes_sent = core::wire_bytes(plan.wire, 1, t.bytes_sent / 4);
  return sched;
}

}  // namespace tessera::parallel
