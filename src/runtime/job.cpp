#include "runtime/job.h"

#include "core/device_speed.h"
#include "core/io.h"
#include "core/limits.h"

namespace tessera::runtime {

using core::Result;
using nlohmann::json;

json JobSpec::to_json() const {
  return {{"rank", rank},         {"endpoints", endpoints},       {"group_id", group_id},
          {"insecure", insecure}, {"link", link},                 {"timeout_ms", timeout_ms},
          {"heartbeat_ms", heartbeat_ms}, {"run_timeout_ms", run_timeout_ms}, {"model", model_dir}, {"threads", threads},
          {"device_speed", device_speed}, {"plan", plan.to_json()}};
}

namespace {
// A field of `j` with the JSON type `want` (no exceptions on hostile input).
Result<const json*> field(const json& j, const char* name, json::value_t want) {
  auto it = j.find(name);
  if (it == j.end()) return core::parse_error(std::string("job: missing '") + name + "'");
  const bool ok = want == json::value_t::number_integer ? it->is_number_integer() : it->type() == want;
  if (!ok) return core::parse_error(std::string("job: '") + name + "' has the wrong type");
  return &*it;
}
}  // namespace

Result<JobSpec> JobSpec::from_json(const std::string& text) {
  if (text.size() > (1u << 20)) return core::invalid_argument("job: larger than 1 MiB");
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return core::parse_error("job is not a JSON object");
  return from_object(j);
}

Result<JobSpec> JobSpec::from_object(const json& j) {
  if (!j.is_object()) return core::parse_error("job is not a JSON object");
  JobSpec s;
  TESSERA_ASSIGN_OR_RETURN(const json* rank, field(j, "rank", json::value_t::number_integer));
  TESSERA_ASSIGN_OR_RETURN(const json* eps, field(j, "endpoints", json::value_t::array));
  TESSERA_ASSIGN_OR_RETURN(const json* gid, field(j, "group_id", json::value_t::string));
  TESSERA_ASSIGN_OR_RETURN(const json* insecure, field(j, "insecure", json::value_t::boolean));
  TESSERA_ASSIGN_OR_RETURN(const json* link, field(j, "link", json::value_t::string));
  TESSERA_ASSIGN_OR_RETURN(const json* timeout, field(j, "timeout_ms", json::value_t::number_integer));
  TESSERA_ASSIGN_OR_RETURN(const json* heartbeat, field(j, "heartbeat_ms", json::value_t::number_integer));
  TESSERA_ASSIGN_OR_RETURN(const json* dir, field(j, "model", json::value_t::string));
  TESSERA_ASSIGN_OR_RETURN(const json* threads, field(j, "threads", json::value_t::number_integer));
  TESSERA_ASSIGN_OR_RETURN(const json* plan, field(j, "plan", json::value_t::object));
  if (eps->size() < 1 || eps->size() > static_cast<size_t>(core::kMaxDevices))
    return core::invalid_argument("job: 1.." + std::to_string(core::kMaxDevices) + " endpoints required");
  for (const auto& e : *eps) {
    if (!e.is_string() || e.get_ref<const std::string&>().size() > 256)
      return core::invalid_argument("job: endpoints must be short strings");
    s.endpoints.push_back(e.get<std::string>());
  }
  const int world = static_cast<int>(s.endpoints.size());
  const int64_t r = rank->get<int64_t>();
  if (r < 0 || r >= world) return core::invalid_argument("job: rank outside the group");
  s.rank = static_cast<int>(r);
  s.group_id = gid->get<std::string>();
  if (s.group_id.size() > 256) return core::invalid_argument("job: group id longer than 256 bytes");
  s.insecure = insecure->get<bool>();
  s.link = link->get<std::string>();
  if (s.link.size() > (64u << 10)) return core::invalid_argument("job: link matrix larger than 64 KiB");
  s.timeout_ms = timeout->get<int64_t>();
  if (s.timeout_ms < 1 || s.timeout_ms > 24ll * 3600 * 1000) return core::invalid_argument("job: timeout must be in [1 ms, 24 h]");
  s.heartbeat_ms = heartbeat->get<int64_t>();
  if (s.heartbeat_ms < 100 || s.heartbeat_ms > 60000) return core::invalid_argument("job: heartbeat must be in [100 ms, 60 s]");
  if (auto rt = j.find("run_timeout_ms"); rt != j.end()) {  // optional: 0 or absent, the job's timeout
    if (!rt->is_number_integer() || rt->get<int64_t>() < 0 || rt->get<int64_t>() > 24ll * 3600 * 1000)
      return core::invalid_argument("job: run_timeout_ms must be in [0 ms, 24 h]");
    s.run_timeout_ms = rt->get<int64_t>();
  }
  s.model_dir = dir->get<std::string>();
  if (s.model_dir.empty() || s.model_dir.size() > 4096) return core::invalid_argument("job: model must be 1..4096 bytes");
  const int64_t t = threads->get<int64_t>();
  if (t < 1 || t > 256) return core::invalid_argument("job: threads must be in [1, 256]");
  s.threads = static_cast<int>(t);
  if (auto sp = j.find("device_speed"); sp != j.end()) {  // optional: older jobs run at full speed
    if (!sp->is_number() || !(sp->get<double>() >= core::kMinDeviceSpeed && sp->get<double>() <= 1))
      return core::invalid_argument("job: device_speed must be a number in [0.01, 1]");
    s.device_speed = sp->get<double>();
  }
  TESSERA_ASSIGN_OR_RETURN(s.plan, parallel::Plan::from_json(*plan));
  if (s.plan.world != world) return core::invalid_argument("job: the plan's device count differs from the endpoints");
  return s;
}

Result<comm::LinkMatrix> job_links(const std::string& link, int world) {
  if (link.empty()) return comm::LinkMatrix();
  if (link.front() == '{') return comm::LinkMatrix::from_json(link, world);
  // A spec only: a job never names a file for the worker to read.
  TESSERA_ASSIGN_OR_RETURN(comm::LinkSpec spec, comm::parse_link_spec(link));
  return comm::LinkMatrix::uniform(world, spec);
}

Result<std::string> inline_link_arg(const std::string& arg, int world) {
  if (arg.empty()) return std::string();
  const bool file = arg.front() == '@' || (arg.size() > 5 && arg.ends_with(".json"));
  if (!file) {
    TESSERA_RETURN_IF_ERROR(comm::parse_link_spec(arg).status());
    return arg;
  }
  const std::string path = arg.front() == '@' ? arg.substr(1) : arg;
  TESSERA_ASSIGN_OR_RETURN(comm::LinkMatrix checked, comm::LinkMatrix::load(path, world));
  (void)checked;
  TESSERA_ASSIGN_OR_RETURN(std::string text, core::read_file(path));
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return core::parse_error("link matrix '" + path + "' is not JSON");
  std::string compact = j.dump();
  if (compact.size() > (64u << 10)) return core::invalid_argument("link matrix '" + path + "' is larger than 64 KiB");
  return compact;
}

Result<comm::GroupOptions> group_options(const JobSpec& job, const std::optional<comm::ClusterKey>& key) {
  comm::GroupOptions o;
  o.rank = job.rank;
  o.endpoints = job.endpoints;
  o.group_id = job.group_id;
  o.insecure = job.insecure;
  o.connect_timeout = comm::Millis(job.timeout_ms);
  if (!job.insecure) {
    if (!key) return core::invalid_argument("a secure job needs the cluster key");
    o.key = key;
  }
  if (!job.link.empty()) {
    TESSERA_ASSIGN_OR_RETURN(o.links, job_links(job.link, static_cast<int>(job.endpoints.size())));
  }
  return o;
}

Result<parallel::Plan> JobSpec::completed_plan(const model::ModelConfig& config) const {
  parallel::Plan p = plan;
  TESSERA_RETURN_IF_ERROR(parallel::complete_plan(p, config));
  return p;
}

}  // namespace tessera::runtime
