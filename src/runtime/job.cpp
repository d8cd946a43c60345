#include "runtime/job.h"

#include <cmath>

#include "core/duration.h"
#include "core/json.h"

namespace tessera::runtime {

using core::Result;
using nlohmann::json;

json JobSpec::to_json() const {
  return {{"rank", rank},         {"endpoints", endpoints}, {"group_id", group_id},   {"insecure", insecure},
          {"key_file", key_file}, {"link", link},           {"model_dir", model_dir}, {"strategy", strategy},
          {"ratios", ratios},     {"layer_map", layer_map}, {"adaptive_order", adaptive_order},
          {"prism_rate", prism_rate}, {"prism_segments", prism_segments},
          {"ffn_ratios", ffn_ratios}, {"overlap", overlap},
          {"threads", threads},   {"timeout_ms", timeout_ms}};
}

Result<JobSpec> JobSpec::from_json(const std::string& text) {
  auto parsed = core::parse_json(text, "job");
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  if (!j.is_object()) return core::parse_error("job is not a JSON object");
  JobSpec s;
  // Numbers are read through range-checked helpers: get<int>() truncates
  // large integers and is undefined for large doubles.
  auto field = [](auto r, const char* what) -> decltype(r) {
    if (!r.ok()) return r.status().with_context(std::string("job: ") + what);
    return r;
  };
  TESSERA_ASSIGN_OR_RETURN(s.rank, field(core::json_field_int(j, "rank", 0, 63), "rank"));
  TESSERA_ASSIGN_OR_RETURN(s.threads, field(core::json_field_int(j, "threads", 1, 256), "threads"));
  TESSERA_ASSIGN_OR_RETURN(s.timeout_ms,
                           field(core::json_field_int(j, "timeout_ms", 1, core::kMaxDuration.count()), "timeout_ms"));
  TESSERA_ASSIGN_OR_RETURN(s.prism_rate, field(core::json_field_number(j, "prism_rate", 0, 1e9, 0.0), "prism_rate"));
  TESSERA_ASSIGN_OR_RETURN(s.prism_segments,
                           field(core::json_field_int(j, "prism_segments", 0, int64_t{1} << 40, 0), "prism_segments"));
  for (const char* key : {"ratios", "ffn_ratios"})
    if (j.contains(key) && j[key].is_array())
      for (const auto& r : j[key])
        if (!r.is_number() || !std::isfinite(r.get<double>()) || r.get<double>() < 0)
          return core::invalid_argument(std::string("job: ") + key + " must be finite non-negative numbers");
  if (j.contains("layer_map") && j["layer_map"].is_array())
    for (const auto& d : j["layer_map"])
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > 63)
        return core::invalid_argument("job: layer_map entries must be device numbers");
  try {
    s.endpoints = j.at("endpoints").get<std::vector<std::string>>();
    s.group_id = j.at("group_id").get<std::string>();
    s.insecure = j.at("insecure").get<bool>();
    s.key_file = j.at("key_file").get<std::string>();
    s.link = j.at("link").get<std::string>();
    s.model_dir = j.at("model_dir").get<std::string>();
    s.strategy = j.at("strategy").get<std::string>();
    s.ratios = j.at("ratios").get<std::vector<double>>();
    s.layer_map = j.at("layer_map").get<std::vector<int>>();
    s.adaptive_order = j.at("adaptive_order").get<bool>();
    // Absent in jobs from before PRISM: unset.
    s.ffn_ratios = j.value("ffn_ratios", std::vector<double>{});
    s.overlap = j.value("overlap", true);
  } catch (const json::exception& e) {
    return core::parse_error(std::string("job: ") + e.what());
  }
  const int world = static_cast<int>(s.endpoints.size());
  if (world < 1 || world > 64) return core::invalid_argument("job: 1..64 endpoints required");
  if (s.rank < 0 || s.rank >= world) return core::invalid_argument("job: rank outside the group");
  if (s.threads < 1 || s.threads > 256) return core::invalid_argument("job: threads must be in [1, 256]");
  if (s.timeout_ms < 1) return core::invalid_argument("job: timeout must be positive");
  if (!std::isfinite(s.prism_rate) || s.prism_rate < 0 || s.prism_segments < 0)
    return core::invalid_argument("job: prism rate and segments must be non-negative");
  return s;
}

Result<parallel::Plan> JobSpec::plan(const model::ModelConfig& config) const {
  parallel::Plan p;
  TESSERA_ASSIGN_OR_RETURN(p.strategy, parallel::parse_strategy(strategy));
  p.world = static_cast<int>(endpoints.size());
  p.ratios = ratios;
  p.ffn_ratios = ffn_ratios;
  p.overlap = overlap;
  p.adaptive_order = adaptive_order;
  p.prism_rate = prism_rate;
  p.prism_segments = prism_segments;
  if (!layer_map.empty()) {
    p.layers.devices = p.world;
    p.layers.device_of_layer = layer_map;
    for (int d : layer_map)
      if (d < 0 || d >= p.world) return core::invalid_argument("job: layer map names a device outside the group");
  }
  TESSERA_RETURN_IF_ERROR(parallel::complete_plan(p, config));
  return p;
}

}  // namespace tessera::runtime
