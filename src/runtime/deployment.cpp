#include "runtime/deployment.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include <spdlog/spdlog.h>

#include "core/device_speed.h"
#include "core/limits.h"
#include "model/tokenizer.h"
#include "runtime/cluster_profile.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using planner::ClusterProfile;

namespace {

Result<std::vector<std::string>> split_list(const std::string& text, int k, const char* what) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(out.size()) != k)
    return core::invalid_argument(std::string(what) + " needs " + std::to_string(k) + " values, got " + std::to_string(out.size()));
  return out;
}

template <typename T>
std::vector<T> keep_members(const std::vector<T>& all, const std::vector<int>& members) {
  if (all.empty()) return all;
  std::vector<T> kept;
  for (int m : members) kept.push_back(all[static_cast<size_t>(m)]);
  return kept;
}

}  // namespace

Result<std::vector<double>> parse_device_speeds(const std::string& text, int k) {
  TESSERA_ASSIGN_OR_RETURN(const auto v, split_list(text, k, "--device-speed"));
  std::vector<double> out;
  for (const auto& item : v) {
    try {
      size_t used = 0;
      const double s = std::stod(item, &used);
      if (used != item.size() || !(s >= core::kMinDeviceSpeed && s <= 1)) throw std::invalid_argument("range");
      out.push_back(s);
    } catch (const std::exception&) {
      return core::invalid_argument("--device-speed: '" + item.substr(0, 32) + "' is not a speed in [0.01, 1]");
    }
  }
  return out;
}

Result<std::vector<int64_t>> parse_memory_limits(const std::string& text, int k) {
  TESSERA_ASSIGN_OR_RETURN(const auto v, split_list(text, k, "--memory-limit"));
  std::vector<int64_t> out;
  for (const auto& x : v) {
    TESSERA_ASSIGN_OR_RETURN(const int64_t b, planner::parse_bytes(x));
    out.push_back(b);
  }
  return out;
}

Result<std::vector<int>> parse_device_order(const std::string& text, int k) {
  TESSERA_ASSIGN_OR_RETURN(const auto v, split_list(text, k, "--device-order"));
  std::vector<int> out;
  std::vector<bool> seen(static_cast<size_t>(k), false);
  for (const auto& item : v) {
    int d = -1;
    try {
      size_t used = 0;
      d = std::stoi(item, &used);
      if (used != item.size()) d = -1;
    } catch (const std::exception&) {
      d = -1;
    }
    if (d < 0 || d >= k) return core::invalid_argument("--device-order: '" + item + "' is not a device in 0.." + std::to_string(k - 1));
    if (seen[static_cast<size_t>(d)]) return core::invalid_argument("--device-order: device " + item + " appears twice");
    seen[static_cast<size_t>(d)] = true;
    out.push_back(d);
  }
  if (out.front() != 0) return core::invalid_argument("--device-order: the terminal (device 0) comes first");
  return out;
}

int64_t plan_rows(const model::ModelConfig& c, int64_t seq) {
  if (c.takes_images()) return c.max_rows();
  return seq > 0 ? std::min(seq, c.max_rows()) : std::min<int64_t>(128, c.max_rows());
}

Result<int64_t> request_rows(const std::string& model_dir, const model::ModelConfig& c, const std::string& text, size_t ids) {
  if (c.takes_images()) return c.max_rows();
  if (ids > 0) return static_cast<int64_t>(ids);
  if (text.empty()) return core::invalid_argument("give --text or --ids");
  TESSERA_ASSIGN_OR_RETURN(auto tok, model::load_tokenizer(model_dir));
  TESSERA_ASSIGN_OR_RETURN(const auto encoded, tok->encode(text, true));
  return static_cast<int64_t>(encoded.size());
}

bool runs_in_process(const ClusterOptions& o, const std::string& strategy) {
  return strategy == parallel::single_device_plan().strategy && o.devices == 1 && o.cluster_file.empty() &&
         o.memory_limit.empty() && o.device_speed.empty();
}

Result<Cluster> Cluster::open(const ClusterOptions& o) {
  Cluster c;
  c.opts_ = o;
  if (o.threads_per_device < 1) return core::invalid_argument("--threads-per-device must be >= 1");
  int world = o.devices;
  if (!o.cluster_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(c.file_, load_cluster_file(o.cluster_file));
    world = 1 + static_cast<int>(c.file_->workers.size());
    c.memory_limits_ = c.file_->memory_limits();
    // The key is read when given; what needs it (profiling the daemons, a
    // session, serve's probes) says so when it is missing, so that planning
    // on a saved profile needs no key.
    if (!o.insecure && !o.key_file.empty()) {
      TESSERA_ASSIGN_OR_RETURN(c.key_, comm::read_key_file(o.key_file));
    }
  }
  if (!o.profile_file.empty()) {  // without a cluster file, a profile names the devices
    TESSERA_ASSIGN_OR_RETURN(c.given_profile_, ClusterProfile::load(o.profile_file));
    if (!c.file_) world = c.given_profile_->size();
  }
  if (world < 1 || world > core::kMaxDevices)
    return core::invalid_argument("--devices must be in [1, " + std::to_string(core::kMaxDevices) + "]");
  if (!o.memory_limit.empty()) {  // given, it overrides the file's budgets
    TESSERA_ASSIGN_OR_RETURN(c.memory_limits_, parse_memory_limits(o.memory_limit, world));
  }
  if (!o.device_speed.empty()) {
    TESSERA_ASSIGN_OR_RETURN(c.speeds_, parse_device_speeds(o.device_speed, world));
  }
  if (!o.device_order.empty()) {
    TESSERA_ASSIGN_OR_RETURN(c.order_, parse_device_order(o.device_order, world));
  } else {
    c.order_.resize(static_cast<size_t>(world));
    std::iota(c.order_.begin(), c.order_.end(), 0);
  }
  c.devices_.push_back({"terminal", "", true});
  if (c.file_) {
    for (const auto& w : c.file_->workers) c.devices_.push_back({w, w, true});
  } else {
    for (int r = 1; r < world; ++r) c.devices_.push_back({"local-" + std::to_string(r), "", true});
  }
  return c;
}

std::vector<int> Cluster::active() const {
  std::vector<int> out;
  for (int d : order_)
    if (devices_[static_cast<size_t>(d)].active) out.push_back(d);
  return out;
}

Result<ClusterProfile> Cluster::profile(const model::ModelConfig& c, int64_t rows, const std::vector<kernels::WeightType>& types) {
  TESSERA_ASSIGN_OR_RETURN(ClusterProfile p, profile(c, rows));
  if (given_profile_ || file_) return p;
  for (const kernels::WeightType t : types) {
    if (t == c.weights) continue;
    model::ModelConfig ct = c;
    ct.weights = t;
    TESSERA_ASSIGN_OR_RETURN(const planner::DeviceProfile d, device_profile(ct, rows, opts_.threads_per_device, opts_.reprofile));
    for (auto& dev : p.devices)
      for (const planner::GemmSample& g : d.gemm)
        if (g.type == t) dev.gemm.push_back(g);
  }
  return p;
}

Result<ClusterProfile> Cluster::profile(const model::ModelConfig& c, int64_t rows) {
  if (const auto it = profiles_.find(rows); it != profiles_.end()) return it->second;
  ClusterProfile p;
  if (given_profile_) {
    p = *given_profile_;
    // A decode step's shapes from the file's step profile, when it has one for these rows.
    if (const ClusterProfile::Step* s = p.step(rows); s != nullptr) p.devices = s->devices;
  } else if (file_) {
    ClusterProfileOptions po;
    po.cluster = *file_;
    po.insecure = opts_.insecure;
    po.key = key_;
    po.threads = opts_.threads_per_device;
    po.rows = rows;
    po.link = opts_.link;
    po.reprofile = opts_.reprofile;
    po.model_dir = opts_.model_dir;  // daemons look the model up by its folder name
    TESSERA_ASSIGN_OR_RETURN(p, profile_cluster(po, c));
  } else {
    const int K = size();
    TESSERA_ASSIGN_OR_RETURN(planner::DeviceProfile d, device_profile(c, rows, opts_.threads_per_device, opts_.reprofile));
    d.memory_bytes /= K;  // local devices share this machine's memory
    if (K > 1) d.host = 0;  // and its memory bandwidth
    p.devices.assign(static_cast<size_t>(K), d);
    // Once: a prefill's and a decode step's plans are priced on the same links.
    if (!local_links_) {
      TESSERA_ASSIGN_OR_RETURN(local_links_, measure_local_links(K, opts_.link, !opts_.insecure));
      for (int a = 0; a < K; ++a)
        for (int b = 0; b < K; ++b)
          if (a != b)
            spdlog::debug("link {} -> {}: {:.3f} ms, {:.0f} Mbit/s", a, b, (*local_links_)[a][b].latency_ms,
                          (*local_links_)[a][b].bandwidth_mbps);
    }
    p.links = *local_links_;
    // Local devices share this machine's cores with their transports, whose
    // encryption then takes time from an overlapped exchange's compute.
    // A refinement: failing to measure it leaves it unpriced.
    if (K > 1 && !opts_.insecure) {
      if (!crypto_gbps_) crypto_gbps_ = crypto_gbps_or_zero();
      for (auto& dev : p.devices) dev.crypto_gbps = *crypto_gbps_;
    }
  }
  if (p.size() != size())
    return core::invalid_argument("the profile has " + std::to_string(p.size()) + " devices, the cluster " +
                                  std::to_string(size()));
  for (size_t d = 0; d < speeds_.size(); ++d) p.devices[d].speed = speeds_[d];
  for (size_t d = 0; d < memory_limits_.size(); ++d)  // a device without a budget keeps what it has
    if (memory_limits_[d] != std::numeric_limits<int64_t>::max()) p.devices[d].memory_bytes = memory_limits_[d];
  profiles_[rows] = p;
  return p;
}

nlohmann::json Deployment::planner_json() const {
  if (!chosen) return nlohmann::json::object();
  return {{"plan", plan.to_json()},
          {"members", chosen->members},
          {"prediction", chosen->prediction.to_json()},
          {"notes", chosen->notes},
          {"measured_loss", chosen->measured_loss >= 0 ? nlohmann::json(chosen->measured_loss) : nlohmann::json(nullptr)}};
}

Result<std::vector<int64_t>> predicted_memory(const parallel::Plan& plan, const model::ModelConfig& c, int64_t rows,
                                             int64_t ctx, core::DType kv_dtype) {
  TESSERA_ASSIGN_OR_RETURN(parallel::Schedule s, parallel::estimate(plan, c, rows));
  parallel::add_kv_cache(s, plan, c, ctx, kv_dtype);
  std::vector<int64_t> out;
  for (const auto& d : s.devices) out.push_back(d.weight_bytes + d.activation_bytes + d.kv_bytes());
  return out;
}

Result<std::function<Result<double>(const parallel::Plan&)>> Cluster::loss_measure(const model::ModelConfig& c, int64_t rows,
                                                                                const std::string& calibration) {
  // The calibration file is read now (a bad one is the user's error); the
  // meter (the exact model's reference outputs) only when a lossy row is
  // first measured, and a failure there leaves that row "not measured".
  std::vector<model::ModelInput> inputs;
  if (calibration.empty()) {
    inputs = random_inputs(c, c.causal_lm() ? 8 : 32, rows, 1);
  } else {
    TESSERA_ASSIGN_OR_RETURN(inputs, calibration_inputs(opts_.model_dir, calibration));
  }
  const std::string key = calibration.empty() ? "random:" + std::to_string(rows) : "file:" + calibration;
  auto shared_inputs = std::make_shared<std::vector<model::ModelInput>>(std::move(inputs));
  return std::function<Result<double>(const parallel::Plan&)>(
      [this, key, shared_inputs](const parallel::Plan& plan) -> Result<double> {
        std::shared_ptr<FidelityMeter>& meter = meters_[key];
        if (meter == nullptr) {
          auto m = FidelityMeter::create(opts_.model_dir, *shared_inputs);
          if (!m.ok()) {
            meters_.erase(key);
            return m.status();
          }
          meter = std::make_shared<FidelityMeter>(std::move(*m));
        }
        return meter->top1_disagreement(plan);
      });
}

Result<planner::PlanTable> plan_table(Cluster& cluster, const model::ModelConfig& c, const planner::PlannerOptions& o) {
  TESSERA_ASSIGN_OR_RETURN(const ClusterProfile p, cluster.profile(c, o.rows, o.weight_types));
  return planner::plan_all(c, p, o);
}

Result<planner::VariantChoice> decide_variants(Cluster& cluster, const model::ModelConfig& c, const parallel::Plan& plan,
                                               int64_t rows) {
  TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* s, parallel::strategy_for(plan.strategy));
  if (s->variants(plan).empty()) return planner::choose_variant(plan, c, {}, rows);
  TESSERA_ASSIGN_OR_RETURN(const ClusterProfile p, cluster.profile(c, rows));
  std::vector<int> first(static_cast<size_t>(std::min(plan.world, p.size())));
  for (size_t i = 0; i < first.size(); ++i) first[i] = static_cast<int>(i);
  return planner::choose_variant(plan, c, p.subset(first), rows);
}

Result<Deployment> deploy(Cluster& cluster, const model::ModelConfig& c, const DeployRequest& r, std::vector<int> devices) {
  if (devices.empty()) devices = cluster.active();
  if (devices.empty() || devices.front() != 0) return core::invalid_argument("a deployment runs on the terminal");
  for (int d : devices)
    if (d < 0 || d >= cluster.size()) return core::invalid_argument("no device " + std::to_string(d) + " in the cluster");
  const int64_t rows = r.rows > 0 ? r.rows : plan_rows(c, 0);
  Deployment out;
  if (r.plan.strategy == "auto") {
    // --lossy on an F32 model: weights quantized at load are a choice too.
    const std::vector<kernels::WeightType> types =
        r.lossy && c.weights == kernels::WeightType::kF32
            ? std::vector<kernels::WeightType>{kernels::WeightType::kF32, kernels::WeightType::kQ8_0, kernels::WeightType::kQ4_0}
            : std::vector<kernels::WeightType>{};
    TESSERA_ASSIGN_OR_RETURN(const ClusterProfile all, cluster.profile(c, rows, types));
    planner::PlannerOptions o;
    o.rows = rows;
    o.ctx_size = r.ctx_size;
    o.kv_dtype = r.kv_dtype;
    std::optional<ClusterProfile> step;
    if (r.ctx_size > 0 && r.new_tokens > 0) {
      o.decode_batch = std::max<int64_t>(r.decode_batch, 1);
      TESSERA_ASSIGN_OR_RETURN(const ClusterProfile step_rows, cluster.profile(c, o.decode_batch, types));
      step = step_rows.subset(devices);
      o.new_tokens = r.new_tokens;
      o.step_profile = &*step;
    }
    // The wire is the user's: a lossy one only when named (--wire).
    o.wire = r.plan.wire;
    o.wires = {r.plan.wire};
    o.wire_given = r.plan.wire != core::WireType::kF32;
    o.lossy_allowed = r.lossy;
    if (r.lossy && !o.wire_given) o.wires = {core::WireType::kF32, core::WireType::kF16, core::WireType::kQ8};
    if (!types.empty()) o.weight_types = types;
    if (r.lossy) {
      o.max_loss = r.max_loss;
      TESSERA_ASSIGN_OR_RETURN(o.measure_loss, cluster.loss_measure(c, rows, r.calibration));
    }
    TESSERA_ASSIGN_OR_RETURN(const planner::PlanTable t, planner::plan_all(c, all.subset(devices), o));
    out.chosen = t.rows[static_cast<size_t>(t.chosen)];
    out.plan = out.chosen->plan;
    // The candidate's members index into `devices`.
    for (int m : out.chosen->members) out.members.push_back(devices[static_cast<size_t>(m)]);
    out.chosen->members = out.members;
  } else {
    out.plan = r.plan;
    // The type the caller holds the weights in (--quantize on a folder, a
    // quantized GGUF's own): every rank loads it, and a pair's decode too.
    if (out.plan.weights == kernels::WeightType::kF32) out.plan.weights = c.weights;
    out.plan.world = static_cast<int>(devices.size());
    if (!out.plan.ratios.empty() && static_cast<int>(out.plan.ratios.size()) != out.plan.world)
      return core::invalid_argument("--partition names " + std::to_string(out.plan.ratios.size()) + " devices, the plan has " +
                                    std::to_string(out.plan.world));
    out.members = devices;
    if (out.plan.decode && out.plan.decode->world > out.plan.world) {
      // A pair's decode on more devices than are left (after a failover): on all of them.
      parallel::Plan d = *out.plan.decode;
      d.world = out.plan.world;
      if (static_cast<int>(d.ratios.size()) != d.world) d.ratios.clear();
      out.plan.decode = std::make_shared<const parallel::Plan>(std::move(d));
    }
    TESSERA_ASSIGN_OR_RETURN(const parallel::Strategy* s, parallel::strategy_for(out.plan.strategy));
    if (!s->variants(out.plan).empty()) {  // e.g. --bp-plan auto: priced on the profile of these devices
      TESSERA_ASSIGN_OR_RETURN(const ClusterProfile all, cluster.profile(c, rows));
      TESSERA_ASSIGN_OR_RETURN(const planner::VariantChoice v, planner::choose_variant(out.plan, c, all.subset(devices), rows));
      out.plan = v.plan;
    }
  }
  if (out.members.empty() || out.members.front() != 0) return core::invalid_argument("the plan does not run on the terminal");
  const ClusterOptions& o = cluster.options();
  SessionOptions& s = out.session;
  s.model_dir = o.model_dir;
  s.plan = out.plan;
  s.threads_per_device = o.threads_per_device;
  s.link = o.link;
  s.insecure = o.insecure;
  s.key_file = o.key_file;
  s.timeout_ms = o.timeout_ms;
  s.run_timeout_ms = r.run_timeout_ms;
  s.cpus_per_device = o.cpus_per_device;
  s.budget_rows = rows;
  s.budget_ctx = r.ctx_size;
  s.budget_kv_dtype = r.kv_dtype;
  // Local devices are alike: the chosen ones run as the first local
  // processes, with their budgets and speeds. Daemons run where they are,
  // in the plan's order.
  s.memory_limits = keep_members(cluster.memory_limits(), out.members);
  s.device_speeds = keep_members(cluster.speeds(), out.members);
  if (cluster.file() && out.members.size() > 1) s.cluster = cluster.file()->subset(out.members);
  return out;
}

}  // namespace tessera::runtime
