#include "core/json.h"

#include <cmath>
#include <unordered_set>
#include <vector>

namespace tessera::core {

using nlohmann::json;

Result<json> parse_json(std::string_view text, const std::string& what, const JsonLimits& limits) {
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  std::string problem;
  int depth = 0;
  auto cb = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (++depth > limits.max_depth && problem.empty())
          problem = "nested deeper than " + std::to_string(limits.max_depth) + " levels";
        if (event == json::parse_event_t::object_start && limits.refuse_duplicate_keys) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        --depth;
        if (event == json::parse_event_t::object_end && limits.refuse_duplicate_keys && !keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (limits.refuse_duplicate_keys && !keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get_ref<const std::string&>()).second && problem.empty())
          problem = "duplicate key \"" + parsed.get_ref<const std::string&>().substr(0, 64) + "\"";
        break;
      case json::parse_event_t::value:
        break;
    }
    // Past the depth bound, drop what we would keep: the document is refused
    // anyway, and this keeps a hostile one from building a deep tree.
    return problem.empty();
  };
  json j = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
  if (!problem.empty()) return parse_error(what + ": " + problem);
  if (j.is_discarded()) return parse_error(what + " is not valid JSON");
  return j;
}

namespace {

const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

Status missing(const char* key) { return parse_error(std::string("missing \"") + key + "\""); }
Status wrong_type(const char* key, const char* what) {
  return parse_error(std::string("\"") + key + "\" must be " + what);
}

}  // namespace

Result<int64_t> json_field_int(const json& obj, const char* key, int64_t lo, int64_t hi, std::optional<int64_t> fallback) {
  const json* v = member(obj, key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    return missing(key);
  }
  if (!v->is_number_integer()) return wrong_type(key, "an integer");
  // Unsigned values above INT64_MAX are out of range, not negative.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return out_of_range(std::string("\"") + key + "\" is out of range");
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi)
    return out_of_range(std::string("\"") + key + "\" = " + std::to_string(x) + " is outside [" + std::to_string(lo) +
                        ", " + std::to_string(hi) + "]");
  return x;
}

Result<double> json_field_number(const json& obj, const char* key, double lo, double hi, std::optional<double> fallback) {
  const json* v = member(obj, key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    return missing(key);
  }
  if (!v->is_number()) return wrong_type(key, "a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    return out_of_range(std::string("\"") + key + "\" = " + v->dump() + " is outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  return x;
}

Result<bool> json_field_bool(const json& obj, const char* key, std::optional<bool> fallback) {
  const json* v = member(obj, key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    return missing(key);
  }
  if (!v->is_boolean()) return wrong_type(key, "true or false");
  return v->get<bool>();
}

Result<std::string> json_field_string(const json& obj, const char* key, std::optional<std::string> fallback) {
  const json* v = member(obj, key);
  if (v == nullptr) {
    if (fallback) return *fallback;
    return missing(key);
  }
  if (!v->is_string()) return wrong_type(key, "a string");
  return v->get<std::string>();
}

}  // namespace tessera::core
