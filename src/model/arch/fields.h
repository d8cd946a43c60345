// Typed, bounded reads of config.json fields for the architecture units: a
// missing field takes the fallback (or is an error naming it), a wrong type
// or a value out of range is an error naming it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "kernels/elementwise.h"

namespace tessera::model::arch {

using nlohmann::json;

inline core::Result<int64_t> int_field(const json& j, const char* key, int64_t lo, int64_t hi, int64_t fallback = -1) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback >= 0) return fallback;
    return core::parse_error(std::string("config.json: missing '") + key + "'");
  }
  if (!j[key].is_number_integer()) return core::parse_error(std::string("config.json: '") + key + "' is not an integer");
  const int64_t v = j[key].get<int64_t>();
  if (v < lo || v > hi)
    return core::out_of_range(std::string("config.json: '") + key + "' = " + std::to_string(v) + " outside [" +
                              std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

inline core::Result<double> number_field(const json& j, const char* key, double lo, double hi, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) return core::parse_error(std::string("config.json: '") + key + "' is not a number");
  const double v = j[key].get<double>();
  if (!(v >= lo && v <= hi))
    return core::out_of_range(std::string("config.json: '") + key + "' = " + std::to_string(v) + " out of range");
  return v;
}

inline core::Result<bool> bool_field(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) return core::parse_error(std::string("config.json: '") + key + "' is not true or false");
  return j[key].get<bool>();
}

// Hugging Face's activation names for the two-matrix MLPs.
inline core::Result<kernels::Activation> parse_activation(const std::string& name) {
  if (name == "gelu") return kernels::Activation::kGeluErf;
  if (name == "relu") return kernels::Activation::kRelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast") return kernels::Activation::kGeluTanh;
  return core::unimplemented("config.json: activation '" + name + "' is not supported (gelu, gelu_new, relu)");
}

// A string field, or `fallback` when absent; a non-string is an error naming it.
inline core::Result<std::string> string_field(const json& j, const char* key, const std::string& fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_string()) return core::parse_error(std::string("config.json: '") + key + "' is not a string");
  return j[key].get<std::string>();
}

// The dimensions the encoder-style configs share (BERT, ViT, OPT, Llama):
// hidden_size, num_attention_heads, num_hidden_layers.
inline core::Status common_dims(const json& j, int64_t& hidden, int64_t& heads, int64_t& layers) {
  TESSERA_ASSIGN_OR_RETURN(hidden, int_field(j, "hidden_size", 1, 1 << 16));
  TESSERA_ASSIGN_OR_RETURN(heads, int_field(j, "num_attention_heads", 1, 1024));
  TESSERA_ASSIGN_OR_RETURN(layers, int_field(j, "num_hidden_layers", 1, 1024));
  return core::ok_status();
}

}  // namespace tessera::model::arch
