#include "planner/profile.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/io.h"
#include "core/json.h"
#include "core/limits.h"
#include "core/memory.h"
#include "core/stats.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/packed_linear.h"
#include "kernels/quant.h"
#include "parallel/strategy.h"

namespace tessera::planner {

using core::Result;
using nlohmann::json;

namespace {

double log_gap(int64_t a, int64_t b) {
  return std::abs(std::log(static_cast<double>(std::max<int64_t>(a, 1))) - std::log(static_cast<double>(std::max<int64_t>(b, 1))));
}

// Median seconds of `reps` calls of fn after one warm-up call.
template <typename Fn>
// The fastest of `reps` runs after a warm-up: other work on the machine only
// ever slows a run, so the minimum is the device's own speed (a median taken
// while something else runs would price every later plan at that load).
double time_best(int reps, Fn&& fn) {
  fn();
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

Result<double> positive(const json& j, const char* key) {
  return core::json_field_number(j, key, 0.0, 1e12);
}

}  // namespace

bool DeviceProfile::measured(kernels::WeightType type) const {
  return std::any_of(gemm.begin(), gemm.end(), [&](const GemmSample& s) { return s.type == type; });
}

double DeviceProfile::gemm_gflops(int64_t m, int64_t k, int64_t n, kernels::WeightType type) const {
  if (!measured(type)) type = kernels::WeightType::kF32;
  const GemmSample* best = nullptr;
  double best_d = 1e300;
  for (const GemmSample& s : gemm) {
    if (s.type != type) continue;
    // Rows matter most (the strategies' shares); k and n pick the shape class.
    const double d = log_gap(m, s.m) + 0.5 * (log_gap(k, s.k) + log_gap(n, s.n));
    if (d < best_d) best_d = d, best = &s;
  }
  return best == nullptr ? 1.0 : std::max(best->gflops, 1e-6);
}

json DeviceProfile::to_json() const {
  json g = json::array();
  for (const GemmSample& s : gemm) {
    json x = {s.m, s.k, s.n, s.gflops};
    if (s.type != kernels::WeightType::kF32) x.push_back(kernels::weight_type_name(s.type));
    g.push_back(std::move(x));
  }
  return {{"name", name},     {"threads", threads},       {"gemm", g},
          {"attention_gflops", attention_gflops},         {"elementwise_gbps", elementwise_gbps},
          {"stream_gbps", stream_gbps}, {"host_stream_gbps", host_stream_gbps}, {"host", host}, {"zero_gbps", zero_gbps}, {"crypto_gbps", crypto_gbps}, {"memory_bytes", memory_bytes}, {"runtime_bytes", runtime_bytes},
          {"speed", speed}};
}

Result<DeviceProfile> DeviceProfile::from_json(const json& j) {
  if (!j.is_object()) return core::invalid_argument("device profile: not an object");
  DeviceProfile d;
  if (j.contains("name") && j["name"].is_string()) d.name = j["name"].get<std::string>();
  TESSERA_ASSIGN_OR_RETURN(const int64_t threads, core::json_field_int(j, "threads", 1, 1024, 1));
  d.threads = static_cast<int>(threads);
  if (!j.contains("gemm") || !j["gemm"].is_array()) return core::invalid_argument("device profile: 'gemm' must be an array");
  for (const json& s : j["gemm"]) {
    if (!s.is_array() || (s.size() != 4 && s.size() != 5))
      return core::invalid_argument("device profile: a gemm sample is [m, k, n, gflops] or [m, k, n, gflops, type]");
    for (size_t i = 0; i < 4; ++i)
      if (!s[i].is_number() || s[i].get<double>() < 0) return core::invalid_argument("device profile: gemm values must be numbers >= 0");
    GemmSample g{s[0].get<int64_t>(), s[1].get<int64_t>(), s[2].get<int64_t>(), s[3].get<double>()};
    if (s.size() == 5) {
      if (!s[4].is_string()) return core::invalid_argument("device profile: a gemm sample's type must be a string");
      TESSERA_ASSIGN_OR_RETURN(g.type, kernels::parse_weight_type(s[4].get<std::string>()));
    }
    d.gemm.push_back(g);
  }
  TESSERA_ASSIGN_OR_RETURN(d.attention_gflops, positive(j, "attention_gflops"));
  TESSERA_ASSIGN_OR_RETURN(d.elementwise_gbps, positive(j, "elementwise_gbps"));
  TESSERA_ASSIGN_OR_RETURN(d.stream_gbps, positive(j, "stream_gbps"));
  TESSERA_ASSIGN_OR_RETURN(d.host_stream_gbps, core::json_field_number(j, "host_stream_gbps", 0.0, 1e12, 0.0));
  TESSERA_ASSIGN_OR_RETURN(const int64_t host, core::json_field_int(j, "host", -1, 1 << 20, -1));
  d.host = static_cast<int>(host);
  TESSERA_ASSIGN_OR_RETURN(d.zero_gbps, core::json_field_number(j, "zero_gbps", 0.0, 1e12, 0.0));
  TESSERA_ASSIGN_OR_RETURN(d.crypto_gbps, core::json_field_number(j, "crypto_gbps", 0.0, 1e12, 0.0));
  TESSERA_ASSIGN_OR_RETURN(d.memory_bytes, core::json_field_int(j, "memory_bytes", 0, INT64_MAX));
  TESSERA_ASSIGN_OR_RETURN(d.runtime_bytes, core::json_field_int(j, "runtime_bytes", 0, INT64_MAX, 0));
  TESSERA_ASSIGN_OR_RETURN(d.speed, core::json_field_number(j, "speed", 1e-3, 1e3, 1.0));
  return d;
}

const LinkProfile& ClusterProfile::link(int from, int to) const {
  TESSERA_CHECK(from >= 0 && from < size() && to >= 0 && to < size());
  return links[static_cast<size_t>(from)][static_cast<size_t>(to)];
}

const ClusterProfile::Step* ClusterProfile::step(int64_t rows) const {
  for (const Step& s : steps)
    if (s.rows == rows) return &s;
  return nullptr;
}

ClusterProfile ClusterProfile::subset(const std::vector<int>& members) const {
  ClusterProfile out;
  for (const Step& s : steps) out.steps.push_back({s.rows, {}});
  for (int a : members) {
    out.devices.push_back(devices[static_cast<size_t>(a)]);
    for (size_t i = 0; i < steps.size(); ++i) out.steps[i].devices.push_back(steps[i].devices[static_cast<size_t>(a)]);
    std::vector<LinkProfile> row;
    for (int b : members) row.push_back(link(a, b));
    out.links.push_back(std::move(row));
  }
  return out;
}

json ClusterProfile::to_json() const {
  json d = json::array(), l = json::array();
  for (const DeviceProfile& p : devices) d.push_back(p.to_json());
  for (const auto& row : links) {
    json r = json::array();
    for (const LinkProfile& x : row) r.push_back({{"latency_ms", x.latency_ms}, {"bandwidth_mbps", x.bandwidth_mbps}});
    l.push_back(r);
  }
  json out = {{"devices", d}, {"links", l}};
  if (!steps.empty()) {
    json all = json::array();
    for (const Step& st : steps) {
      json s = json::array();
      for (const DeviceProfile& p : st.devices) s.push_back(p.to_json());
      all.push_back({{"rows", st.rows}, {"devices", s}});
    }
    out["steps"] = all;
  }
  return out;
}

Result<ClusterProfile> ClusterProfile::from_json(const json& j) {
  if (!j.is_object() || !j.contains("devices") || !j["devices"].is_array() || j["devices"].empty() ||
      j["devices"].size() > core::kMaxDevices)
    return core::invalid_argument("profile: 'devices' must be an array of 1 to " + std::to_string(core::kMaxDevices) + " device profiles");
  ClusterProfile c;
  for (const json& d : j["devices"]) {
    TESSERA_ASSIGN_OR_RETURN(DeviceProfile p, DeviceProfile::from_json(d));
    c.devices.push_back(std::move(p));
  }
  const size_t k = c.devices.size();
  c.links.assign(k, std::vector<LinkProfile>(k));
  if (k > 1) {
    if (!j.contains("links") || !j["links"].is_array() || j["links"].size() != k)
      return core::invalid_argument("profile: 'links' must be a " + std::to_string(k) + "x" + std::to_string(k) + " matrix");
    for (size_t a = 0; a < k; ++a) {
      const json& row = j["links"][a];
      if (!row.is_array() || row.size() != k) return core::invalid_argument("profile: a 'links' row has the wrong length");
      for (size_t b = 0; b < k; ++b) {
        if (a == b) continue;
        TESSERA_ASSIGN_OR_RETURN(c.links[a][b].latency_ms, positive(row[b], "latency_ms"));
        TESSERA_ASSIGN_OR_RETURN(c.links[a][b].bandwidth_mbps, positive(row[b], "bandwidth_mbps"));
      }
    }
  }
  if (j.contains("steps")) {
    const json& all = j["steps"];
    if (!all.is_array() || all.size() > 64) return core::invalid_argument("profile: 'steps' must be an array of at most 64");
    for (const json& s : all) {
      if (!s.is_object() || !s.contains("devices") || !s["devices"].is_array() || s["devices"].size() != k)
        return core::invalid_argument("profile: each of 'steps' must hold 'devices', one for each of the " + std::to_string(k));
      Step st;
      TESSERA_ASSIGN_OR_RETURN(st.rows, core::json_field_int(s, "rows", 1, 4096));
      if (c.step(st.rows) != nullptr)
        return core::invalid_argument("profile: 'steps' has two profiles of " + std::to_string(st.rows) + " rows");
      for (const json& d : s["devices"]) {
        TESSERA_ASSIGN_OR_RETURN(DeviceProfile p, DeviceProfile::from_json(d));
        st.devices.push_back(std::move(p));
      }
      c.steps.push_back(std::move(st));
    }
  }
  return c;
}

Result<ClusterProfile> ClusterProfile::load(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
  TESSERA_ASSIGN_OR_RETURN(const json j, core::parse_json(text, path));
  return from_json(j);
}

core::Status ClusterProfile::save(const std::string& path) const { return core::write_file(path, to_json().dump(1) + "\n"); }

std::vector<int64_t> profile_row_counts(int64_t n, int max_devices) {
  std::set<int64_t> rows;
  for (int k = 1; k <= std::max(1, max_devices); ++k) rows.insert(std::max<int64_t>(1, (n + k - 1) / k));
  return {rows.begin(), rows.end()};
}

namespace {
// Weight copies the GEMM profile cycles through: beyond the last-level caches
// of most machines Tessera runs on (32 MB on the AMD EPYC here).
constexpr int64_t kColdWeightBytes = 96ll << 20;

// Bytes a second the pool's threads read `floats` at (kernels::stream_sum_f32
// on each thread's part).
double stream_read_gbps(core::ThreadPool* pool, const float* buf, int64_t floats) {
  constexpr int64_t kChunk = 64;  // floats a step of the loop reads
  const int64_t chunks = floats / kChunk;
  auto read = [buf](int64_t b, int64_t e) {
    volatile float sink = kernels::stream_sum_f32(buf + b * kChunk, (e - b) * kChunk);  // every load used
    (void)sink;
  };
  const double s = time_best(3, [&] {
    if (pool != nullptr) pool->parallel_for(chunks, read);
    else read(0, chunks);
  });
  return static_cast<double>(chunks * kChunk * 4) / s / 1e9;
}
}  // namespace

// A step's few rows are bound by reading their weights, and on an Intel Xeon
// with a 260 MB L3 the 96 MB of copies stayed there: its one-row samples ran
// from cache (GPT-2 F32 decode predicted +44-80% with the scalar stream floor).
int64_t profile_cold_bytes(int64_t llc, int64_t available) {
  int64_t bytes = std::max<int64_t>(kColdWeightBytes, 2 * llc);
  if (available > 0) bytes = std::min(bytes, std::max<int64_t>(kColdWeightBytes, available / 8));
  return bytes;
}

int64_t profile_cold_bytes() {
  return profile_cold_bytes(core::last_level_cache_bytes(), static_cast<int64_t>(core::available_memory_bytes()));
}

Result<DeviceProfile> measure_device(const model::ModelConfig& c, int64_t n, int max_devices, core::ThreadPool* pool) {
  if (c.hidden < 1 || c.heads < 1 || c.intermediate < 1) return core::invalid_argument("profile: the model config has no shape");
  if (n < 1) return core::invalid_argument("profile: needs at least one row");
  DeviceProfile d;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) d.name = host;
  d.threads = pool != nullptr ? pool->size() : 1;
  const int64_t F = c.hidden, I = c.intermediate;
  // The layer's shape classes: QKV, attention-out, FFN in and out; the
  // strategies' shards have the same k or n with fewer columns.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {F, c.qkv_width()}, {c.q_width(), F}, {F, c.ffn_in_rows()}, {I, F}};
  const std::vector<int64_t> rows = profile_row_counts(n, max_devices);
  // Resident memory that outlives the GEMM and attention sections' own
  // buffers is the libraries' (libxsmm's JIT code, OpenBLAS's packing
  // buffers): every device running the model pays it. Freed heap pages
  // are handed back before each reading: whether malloc kept them varied
  // from run to run (10-20 MB here), and they are not the libraries'.
  ::malloc_trim(0);
  const int64_t resident_before = core::resident_bytes();
  // No more than the model's weights, beyond 96 MB: a model that a large
  // cache holds is read from there (GPT-2 in Q4_K_M, 88 MB, in a 260 MB L3),
  // and a test's tiny model need not fault in 520 MB for each profile.
  int64_t model_bytes = parallel::terminal_weight_bytes(c);
  for (int64_t l = 0; l < c.layers; ++l) model_bytes += parallel::model_layer_weight_bytes(c, l);
  const int64_t cold = std::min(profile_cold_bytes(), std::max(kColdWeightBytes, model_bytes));
  for (auto [k, cols] : shapes) {
    core::Tensor w = core::Tensor::zeros_f32({cols, k}), b = core::Tensor::zeros_f32({cols});
    for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = 0.01f * static_cast<float>(i % 13);
    // With the epilogue the model fuses into each: FFN-in its activation
    // (GELU is a few percent of a layer), the two output projections the
    // residual; the QKV projection none.
    const kernels::Activation act = k == F && cols == c.ffn_in_rows() ? c.act : kernels::Activation::kNone;
    const bool residual = cols == F;
    // A quantized model's matrices run on its own kernels (the dot products
    // up to kQuantDotRows rows, panels widened to F32 beyond), timed beside
    // F32's; a mixed file's head type (Q4_K_M's Q6_K) as well. (A decode
    // step of a 1B Q8_0 model priced at F32's rates was 2.3x slow.)
    std::vector<kernels::WeightType> types = {kernels::WeightType::kF32};
    for (const kernels::WeightType t : {c.weights, c.head_type(), c.other_type()})
      if (kernels::holds(t, k) && std::find(types.begin(), types.end(), t) == types.end()) types.push_back(t);
    for (const kernels::WeightType type : types) {
      // Packed once, as the model's layers are at load. In the model a
      // layer's weights have left the caches by the time they are used
      // again, so the timed products cycle through copies that together
      // exceed the caches (warm weights had the profile predict BERT-base
      // 11% fast).
      // A step's rows (up to kQuantDotRows) are bound by that reading and
      // cycle through `cold` bytes; a prompt's many rows are bound by their
      // arithmetic, and more copies would only lengthen the profile.
      // (Up to 4096 copies then: GPT-2's 2.4 MB matrices took 64 copies,
      // 151 MB, which a 260 MB L3 still held; its 768 x 768 in Q4_K is 331 KB.)
      const int64_t bytes = std::max<int64_t>(static_cast<int64_t>(kernels::row_bytes(type, k)) * cols, 1);
      const auto copies_for = [&](int64_t total, int64_t most) { return std::clamp<int64_t>(total / bytes + 1, 2, most); };
      const bool step_rows = rows.front() <= kernels::kQuantDotRows;
      const int64_t copies = step_rows ? copies_for(cold, 4096) : copies_for(kColdWeightBytes, 64);
      const kernels::WeightSource src{w.f32(), cols, k, 1};
      std::vector<kernels::PackedLinear> packed;
      for (int64_t i = 0; i < copies; ++i)
        packed.push_back(type == kernels::WeightType::kF32 ? kernels::PackedLinear::pack(w)
                         : i == 0 ? kernels::PackedLinear::pack(std::span<const kernels::WeightSource>(&src, 1), k,
                                                                kernels::gemm_path(), {}, type)
                                  : kernels::PackedLinear::from_blocks(type, packed[0].row_blocks(0), cols, k));
      for (int64_t m : rows) {
        core::Tensor x = core::Tensor::zeros_f32({m, k}), y = core::Tensor::zeros_f32({m, cols});
        core::Tensor r = residual ? core::Tensor::zeros_f32({m, cols}) : core::Tensor();
        const int64_t use = m <= kernels::kQuantDotRows ? copies : std::min(copies, copies_for(kColdWeightBytes, 64));
        const double s = time_best(3, [&] {
          for (int64_t i = 0; i < use; ++i)
            kernels::linear_rows_f32(pool, x.f32(), m, packed[static_cast<size_t>(i)], b, act, residual ? r.f32() : nullptr,
                                     y.f32());
        }) / static_cast<double>(use);
        d.gemm.push_back({m, k, cols, 2.0 * static_cast<double>(m * k * cols) / s / 1e9, type});
      }
    }
  }
  {
    // The model's own attention: its head size, its K/V heads.
    const int64_t Q = c.q_width(), KV = c.kv_width();
    core::Tensor qkv = core::Tensor::zeros_f32({n, c.qkv_width()}), out = core::Tensor::zeros_f32({n, Q});
    const int64_t sf = kernels::attention_scratch_floats(n, n, c.heads);
    core::Tensor scratch = core::Tensor::zeros_f32({sf});
    kernels::AttentionArgs a;
    a.q = qkv.f32(); a.k = qkv.f32() + Q; a.v = qkv.f32() + Q + KV;
    a.ldq = a.ldk = a.ldv = c.qkv_width();
    a.out = out.f32(); a.ldo = Q;
    a.n_q = a.n_kv = n; a.heads = c.heads; a.head_dim = c.head_dim();
    a.kv_group = c.kv_group();
    a.scale = 0.125f;
    const double s = time_best(5, [&] { kernels::attention_f32(pool, a, scratch.f32(), sf); });
    d.attention_gflops = 4.0 * static_cast<double>(n * n * Q) / s / 1e9;
  }
  ::malloc_trim(0);
  d.runtime_bytes = std::max<int64_t>(0, core::resident_bytes() - resident_before);
  {
    core::Tensor x = core::Tensor::zeros_f32({n, F}), y = core::Tensor::zeros_f32({n, F});
    core::Tensor g = core::Tensor::zeros_f32({F}), b = core::Tensor::zeros_f32({F});
    const double s = time_best(9, [&] { kernels::layernorm_f32_mt(pool, x.f32(), y.f32(), n, F, g.f32(), b.f32(), c.eps); });
    d.elementwise_gbps = 2.0 * static_cast<double>(n * F * 4) / s / 1e9;
  }
  {
    // Weights read once each, from beyond the caches, on huge pages as the
    // packed weights lie.
    const int64_t floats = cold / 4 / 64 * 64;
    const auto buf = core::alloc_large(static_cast<size_t>(floats) * 4);
    if (buf == nullptr) return core::resource_exhausted("profile: no memory for the streaming read");
    float* const f = reinterpret_cast<float*>(buf.get());
    std::fill(f, f + floats, 1.0f);
    d.stream_gbps = stream_read_gbps(pool, f, floats);
    // With every CPU of the host reading: what the devices emulated on it
    // share when they stream at once (a tp step's, each its share of the
    // weights). On one Intel Xeon VM two readers read 15-24 GB/s in all
    // against 13-14 alone in one session, and twice one reader's rate in
    // the next.
    const int cpus = core::usable_cpus();
    if (cpus > d.threads) {
      core::ThreadPool all(std::min(cpus, 256));
      d.host_stream_gbps = stream_read_gbps(&all, f, floats);
    } else {
      d.host_stream_gbps = d.stream_gbps;
    }
  }
  {
    // A generation's KV caches as its prompt first writes them: a K and a V
    // tensor a layer (1024 positions here), mapped lazily as a decoder maps
    // them (Tensor::try_zeros_lazy), every page faulted in, zeroed by the
    // kernel and written. The median: a run that found pages still mapped
    // (or huge ones) is no guide to the next generation. At most 64 MB (a
    // large model's caches need not be allocated to be timed).
    const int64_t width = std::max<int64_t>(c.kv_width(), 1);
    const int64_t positions = std::clamp<int64_t>((int64_t{64} << 20) / (8 * std::max<int64_t>(c.layers, 1) * width), 16, 1024);
    std::vector<double> seconds;
    for (int rep = 0; rep < 3; ++rep) {
      ::malloc_trim(0);
      std::vector<core::Tensor> caches;
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < 2 * c.layers; ++i) {
        TESSERA_ASSIGN_OR_RETURN(core::Tensor t, core::Tensor::try_zeros_lazy(core::DType::kF32, {positions, width}));
        caches.push_back(std::move(t));
        std::memset(caches.back().raw(), 0, caches.back().nbytes());
      }
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    d.zero_gbps = static_cast<double>(2 * c.layers * positions * width * 4) / std::max(core::median(seconds), 1e-9) / 1e9;
  }
  d.memory_bytes = static_cast<int64_t>(core::available_memory_bytes());
  return d;
}

std::string device_cache_path(const model::ModelConfig& c, int64_t n, int threads) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string base = xdg != nullptr && *xdg != 0 ? std::string(xdg) : std::string(home != nullptr ? home : "/tmp") + "/.cache";
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  // The GEMM path is part of the key: libxsmm and OpenBLAS differ in speed.
  // (10: the host's streaming read with every CPU reading, which depends on
  // how many this process may use: -c.)
  return base + "/tessera/profile10-" + kernels::gemm_path_name(kernels::gemm_path()) + "-" + host + "-F" + std::to_string(c.hidden) + "-H" + std::to_string(c.heads) + "-I" +
         std::to_string(c.intermediate) + (c.llama_style() ? "-Q" + std::to_string(c.qkv_width()) : std::string()) + "-n" + std::to_string(n) + "-t" + std::to_string(threads) + "-c" + std::to_string(core::usable_cpus()) +
         (c.weights != kernels::WeightType::kF32 ? std::string("-") + kernels::weight_type_name(c.weights) : std::string()) +
         (c.head_type() != c.weights ? std::string("-head-") + kernels::weight_type_name(c.head_type()) : std::string()) +
         (c.other_type() != c.weights && c.other_type() != c.head_type() ? std::string("-mix-") + kernels::weight_type_name(c.other_type())
                                                                          : std::string()) +
         ".json";
}

Result<int64_t> parse_bytes(const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    return core::invalid_argument("'" + text + "' is not a size (e.g. 512MB)");
  }
  std::string unit = text.substr(pos);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double mul = 1;
  if (unit == "" || unit == "B") mul = 1;
  else if (unit == "KB" || unit == "K") mul = 1e3;
  else if (unit == "MB" || unit == "M") mul = 1e6;
  else if (unit == "GB" || unit == "G") mul = 1e9;
  else if (unit == "KIB") mul = 1024.0;
  else if (unit == "MIB") mul = 1024.0 * 1024;
  else if (unit == "GIB") mul = 1024.0 * 1024 * 1024;
  else return core::invalid_argument("'" + text + "': unknown unit (B, KB, MB, GB, KiB, MiB, GiB)");
  if (!std::isfinite(v) || v <= 0 || v * mul > 9e18) return core::invalid_argument("'" + text + "' is not a positive size");
  return static_cast<int64_t>(v * mul);
}

std::string format_bytes(int64_t bytes) {
  char buf[32];
  if (bytes >= 1000000000) std::snprintf(buf, sizeof(buf), "%.2fGB", static_cast<double>(bytes) / 1e9);
  else if (bytes >= 1000000) std::snprintf(buf, sizeof(buf), "%.1fMB", static_cast<double>(bytes) / 1e6);
  else std::snprintf(buf, sizeof(buf), "%.1fKB", static_cast<double>(bytes) / 1e3);
  return buf;
}

}  // namespace tessera::planner
