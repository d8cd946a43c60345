// Parsing and reading untrusted JSON (files a user names, messages a peer
// sends) without exceptions: every wrong type or out-of-range number is a
// Status, never a nlohmann exception or an unchecked conversion.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tessera::core {

struct JsonLimits {
  // Deeper documents are refused: nothing we read nests more than a few
  // levels, and code that walks a document recursively must stay bounded.
  int max_depth = 64;
  // Refuse an object that names the same key twice (nlohmann keeps the last
  // one silently, so two readers could see different documents).
  bool refuse_duplicate_keys = true;
};

// `what` names the document in errors ("config.json", "job").
Result<nlohmann::json> parse_json(std::string_view text, const std::string& what, const JsonLimits& limits = {});

// Typed members of an object. Absent (or null) members give the fallback
// when there is one, else an error; present members of the wrong type or
// outside [lo, hi] are errors.
Result<int64_t> json_field_int(const nlohmann::json& obj, const char* key, int64_t lo, int64_t hi,
                               std::optional<int64_t> fallback = std::nullopt);
Result<double> json_field_number(const nlohmann::json& obj, const char* key, double lo, double hi,
                                 std::optional<double> fallback = std::nullopt);
Result<bool> json_field_bool(const nlohmann::json& obj, const char* key, std::optional<bool> fallback = std::nullopt);
Result<std::string> json_field_string(const nlohmann::json& obj, const char* key,
                                      std::optional<std::string> fallback = std::nullopt);

}  // namespace tessera::core
