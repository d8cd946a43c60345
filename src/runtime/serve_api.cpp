#include "runtime/serve_api.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <random>
#include <unordered_set>

#include "core/json.h"
#include "model/tokenizer.h"

namespace tessera::runtime::api {

using core::Result;
using core::Status;
using nlohmann::json;

namespace {

const json* member(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

Status bad(const std::string& what) { return core::invalid_argument(what); }

Result<json> parse_object(std::string_view body) {
  TESSERA_ASSIGN_OR_RETURN(json j, core::parse_json(body, "the request body"));
  if (!j.is_object()) return bad("the request body must be a JSON object");
  return j;
}

Result<std::vector<int64_t>> id_list(const json& a, const char* field, const ApiLimits& limits) {
  std::vector<int64_t> ids;
  for (const json& v : a) {
    if (!v.is_number_integer()) return bad(std::string("\"") + field + "\" must hold token ids (integers)");
    const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
    const int64_t id = too_big ? INT64_MAX : v.get<int64_t>();
    if (id < 0 || id >= limits.vocab)
      return bad(std::string("token id ") + v.dump() + " in \"" + field + "\" is outside [0, " + std::to_string(limits.vocab) + ")");
    ids.push_back(id);
  }
  if (ids.empty()) return bad(std::string("\"") + field + "\" holds no tokens");
  if (limits.max_positions > 0 && static_cast<int64_t>(ids.size()) > limits.max_positions)
    return bad(std::string("\"") + field + "\" has " + std::to_string(ids.size()) + " tokens; the model takes at most " +
               std::to_string(limits.max_positions));
  return ids;
}

// One prompt: a string or a list of token ids.
Result<Prompt> one_prompt(const json& v, const char* field, const ApiLimits& limits) {
  Prompt p;
  if (v.is_string()) {
    p.text = v.get<std::string>();
    if (p.text->empty()) return bad(std::string("\"") + field + "\" is empty");
    return p;
  }
  if (v.is_array()) {
    TESSERA_ASSIGN_OR_RETURN(p.ids, id_list(v, field, limits));
    return p;
  }
  return bad(std::string("\"") + field + "\" must be a string or a list of token ids");
}

// OpenAI's four input forms: string, [string...], [int...], [[int...]...].
Result<std::vector<Prompt>> prompt_list(const json& v, const char* field, const ApiLimits& limits) {
  std::vector<Prompt> out;
  const bool batch = v.is_array() && !v.empty() && (v[0].is_string() || v[0].is_array());
  if (!batch) {
    TESSERA_ASSIGN_OR_RETURN(Prompt p, one_prompt(v, field, limits));
    out.push_back(std::move(p));
    return out;
  }
  if (static_cast<int64_t>(v.size()) > limits.max_inputs)
    return bad(std::string("\"") + field + "\" has " + std::to_string(v.size()) + " entries; at most " +
               std::to_string(limits.max_inputs) + " per request");
  for (const json& e : v) {
    if (!e.is_string() && !e.is_array()) return bad(std::string("\"") + field + "\" mixes strings, lists and numbers");
    TESSERA_ASSIGN_OR_RETURN(Prompt p, one_prompt(e, field, limits));
    out.push_back(std::move(p));
  }
  return out;
}

// core/json's typed accessors, their errors as 400s (invalid_argument).
template <typename T>
Result<T> as_request_error(Result<T> r) {
  if (r.ok()) return r;
  return bad(r.status().message());
}

// The sampling and streaming fields that completions and chat completions share.
Status sampling_fields(const json& j, const ApiLimits& limits, const char* max_tokens_field, CompletionRequest& r) {
  // best_of (several choices ranked on the server) is not implemented:
  // refused, never silently ignored, but for its "off" value 1.
  if (const json* v = member(j, "best_of"); v != nullptr && !(v->is_number_integer() && *v == 1))
    return bad("\"best_of\" is not supported by this server");
  const int64_t positions = limits.max_positions > 0 ? limits.max_positions : INT64_MAX;
  TESSERA_ASSIGN_OR_RETURN(r.max_tokens, as_request_error(core::json_field_int(j, max_tokens_field, 0, positions, 16)));
  TESSERA_ASSIGN_OR_RETURN(r.temperature, as_request_error(core::json_field_number(j, "temperature", 0.0, 2.0, 1.0)));
  TESSERA_ASSIGN_OR_RETURN(r.top_p, as_request_error(core::json_field_number(j, "top_p", 0.0, 1.0, 1.0)));
  if (!(r.top_p > 0.0)) return bad("\"top_p\" must be in (0, 1]");
  TESSERA_ASSIGN_OR_RETURN(r.top_k, as_request_error(core::json_field_int(j, "top_k", 0, INT32_MAX, 0)));
  if (member(j, "seed") != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(const int64_t seed, as_request_error(core::json_field_int(j, "seed", INT64_MIN, INT64_MAX)));
    r.seed = static_cast<uint64_t>(seed);
  }
  TESSERA_ASSIGN_OR_RETURN(r.n, as_request_error(core::json_field_int(j, "n", 1, kMaxChoices, 1)));
  if (const json* stop = member(j, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array() && static_cast<int64_t>(stop->size()) <= limits.max_stop) {
      for (const json& s : *stop) {
        if (!s.is_string()) return bad("\"stop\" must be a string or a list of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return bad("\"stop\" must be a string or a list of at most " + std::to_string(limits.max_stop) + " strings");
    }
    for (const auto& s : r.stop)
      if (s.empty()) return bad("\"stop\" strings must not be empty");
  }
  if (const json* bias = member(j, "logit_bias")) {
    if (!bias->is_object()) return bad("\"logit_bias\" must be an object of token ids to biases in [-100, 100]");
    std::unordered_set<int64_t> seen;  // keys are unique as strings, not as ids ("01", "1")
    for (const auto& [key, v] : bias->items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || (limits.vocab > 0 && id >= limits.vocab))
        return bad("\"logit_bias\" key \"" + key.substr(0, 32) + "\" is not a token id in [0, " + std::to_string(limits.vocab) + ")");
      if (!v.is_number() || !(v.get<double>() >= -100.0 && v.get<double>() <= 100.0))
        return bad("\"logit_bias\"[\"" + key + "\"] must be a number in [-100, 100]");
      if (!seen.insert(id).second)
        return bad("\"logit_bias\" names token " + std::to_string(id) + " twice");
      // -100 bans the token outright (OpenAI: "should result in a ban").
      const double b = v.get<double>();
      r.logit_bias.emplace_back(id, b <= -100.0 ? -INFINITY : static_cast<float>(b));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(r.stream, as_request_error(core::json_field_bool(j, "stream", false)));
  if (const json* so = member(j, "stream_options")) {
    if (!so->is_object()) return bad("\"stream_options\" must be an object");
    TESSERA_ASSIGN_OR_RETURN(r.include_usage, as_request_error(core::json_field_bool(*so, "include_usage", false)));
  }
  return core::ok_status();
}

}  // namespace

Result<CompletionRequest> parse_completion(std::string_view body, const ApiLimits& limits) {
  TESSERA_ASSIGN_OR_RETURN(const json j, parse_object(body));
  CompletionRequest r;
  const json* prompt = member(j, "prompt");
  if (prompt == nullptr) return bad("\"prompt\" is required");
  TESSERA_ASSIGN_OR_RETURN(std::vector<Prompt> prompts, prompt_list(*prompt, "prompt", limits));
  if (prompts.size() != 1) return bad("one prompt per request (\"prompt\" holds " + std::to_string(prompts.size()) + ")");
  r.prompt = std::move(prompts[0]);
  TESSERA_RETURN_IF_ERROR(sampling_fields(j, limits, "max_tokens", r));
  // The legacy API's "logprobs" is the count of alternatives; false or null: none.
  if (const json* lp = member(j, "logprobs"); lp != nullptr && !(lp->is_boolean() && !lp->get<bool>())) {
    if (!lp->is_number_integer() || lp->get<int64_t>() < 0 || lp->get<int64_t>() > kMaxTopLogprobs)
      return bad("\"logprobs\" must be an integer in [0, " + std::to_string(kMaxTopLogprobs) + "] (the alternatives per token)");
    r.logprobs = lp->get<int64_t>();
  }
  if (member(j, "top_logprobs") != nullptr)
    return bad("\"top_logprobs\" is a chat completion field; here \"logprobs\" gives the count");
  TESSERA_ASSIGN_OR_RETURN(r.echo, as_request_error(core::json_field_bool(j, "echo", false)));
  const int64_t positions = limits.max_positions > 0 ? limits.max_positions : INT64_MAX;
  if (!r.prompt.ids.empty() && static_cast<int64_t>(r.prompt.ids.size()) + r.max_tokens > positions)
    return bad("the prompt's " + std::to_string(r.prompt.ids.size()) + " tokens plus max_tokens " +
               std::to_string(r.max_tokens) + " exceed the model's " + std::to_string(positions) + " positions");
  return r;
}

Status check_echo_logits(int64_t tokens, int64_t vocab) {
  if (tokens > 0 && vocab > 0 && tokens <= kMaxEchoLogits / vocab) return core::ok_status();
  return bad("\"echo\" with \"logprobs\" holds the prompt's logits: " + std::to_string(tokens) + " tokens x " +
             std::to_string(vocab) + " exceed " + std::to_string(kMaxEchoLogits) + " floats");
}

Result<ChatRequest> parse_chat(std::string_view body, const ApiLimits& limits) {
  TESSERA_ASSIGN_OR_RETURN(const json j, parse_object(body));
  ChatRequest r;
  const json* messages = member(j, "messages");
  if (messages == nullptr) return bad("\"messages\" is required");
  if (!messages->is_array() || messages->empty()) return bad("\"messages\" must be a non-empty list of messages");
  // The same document in the client's key order, for what the template prints as JSON.
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body, nullptr, false);
  if (static_cast<int64_t>(messages->size()) > limits.max_messages)
    return bad("\"messages\" holds " + std::to_string(messages->size()) + " messages; at most " +
               std::to_string(limits.max_messages));
  r.messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(where + " must be an object with \"role\" and \"content\"");
    const json* role = member(m, "role");
    if (role == nullptr || !role->is_string()) return bad(where + ".role must be a string");
    const std::string& rs = role->get_ref<const std::string&>();
    if (rs != "system" && rs != "developer" && rs != "user" && rs != "assistant" && rs != "tool")
      return bad(where + ".role must be system, developer, user, assistant or tool, not \"" + rs.substr(0, 32) + "\"");
    nlohmann::ordered_json out = {{"role", rs == "developer" ? "system" : rs}};
    const json* content = member(m, "content");
    if (content == nullptr) {
      if (rs != "assistant") return bad(where + ".content is required");
      out["content"] = nullptr;
    } else if (content->is_string()) {
      out["content"] = *content;
    } else if (content->is_array()) {  // content parts: text only
      std::string text;
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          return bad(where + ".content parts must be {\"type\": \"text\", \"text\": ...} (no images here)");
        text += part["text"].get<std::string>();
      }
      out["content"] = text;
    } else {
      return bad(where + ".content must be a string or a list of text parts");
    }
    for (const char* key : {"name", "tool_call_id"})
      if (const json* v = member(m, key)) {
        if (!v->is_string()) return bad(where + "." + key + " must be a string");
        out[key] = *v;
      }
    if (const json* calls = member(m, "tool_calls")) {
      if (!calls->is_array()) return bad(where + ".tool_calls must be a list");
      out["tool_calls"] = ordered["messages"][i]["tool_calls"];
    }
    r.messages.push_back(std::move(out));
  }
  if (const json* tools = member(j, "tools")) {
    if (!tools->is_array()) return bad("\"tools\" must be a list");
    r.tools = ordered["tools"];
  }
  // max_completion_tokens is the current name; max_tokens the older one.
  const bool current = member(j, "max_completion_tokens") != nullptr;
  r.max_tokens_given = current || member(j, "max_tokens") != nullptr;
  TESSERA_RETURN_IF_ERROR(sampling_fields(j, limits, current ? "max_completion_tokens" : "max_tokens", r.sampling));
  if (const json* echo = member(j, "echo"); echo != nullptr && !(echo->is_boolean() && !echo->get<bool>()))
    return bad("\"echo\" is not supported by this server for chat completions");
  TESSERA_ASSIGN_OR_RETURN(const bool logprobs, as_request_error(core::json_field_bool(j, "logprobs", false)));
  if (member(j, "top_logprobs") != nullptr) {
    if (!logprobs) return bad("\"top_logprobs\" needs \"logprobs\": true");
    TESSERA_ASSIGN_OR_RETURN(r.sampling.logprobs,
                             as_request_error(core::json_field_int(j, "top_logprobs", 0, kMaxTopLogprobs, 0)));
  } else if (logprobs) {
    r.sampling.logprobs = 0;
  }
  // Without a limit a chat answer may run to the end of the context (OpenAI's default).
  if (!r.max_tokens_given) r.sampling.max_tokens = limits.max_positions > 0 ? limits.max_positions : INT32_MAX;
  return r;
}

Result<EmbeddingRequest> parse_embedding(std::string_view body, const ApiLimits& limits) {
  TESSERA_ASSIGN_OR_RETURN(const json j, parse_object(body));
  EmbeddingRequest r;
  const json* input = member(j, "input");
  if (input == nullptr) return bad("\"input\" is required");
  TESSERA_ASSIGN_OR_RETURN(r.inputs, prompt_list(*input, "input", limits));
  TESSERA_ASSIGN_OR_RETURN(const std::string fmt, as_request_error(core::json_field_string(j, "encoding_format", "float")));
  if (fmt != "float" && fmt != "base64") return bad("\"encoding_format\" must be \"float\" or \"base64\"");
  r.base64 = fmt == "base64";
  return r;
}

Result<ClassifyRequest> parse_classify(std::string_view body, const ApiLimits& limits) {
  TESSERA_ASSIGN_OR_RETURN(const json j, parse_object(body));
  ClassifyRequest r;
  const json* input = member(j, "input");
  const json* image = member(j, "image");
  if ((input == nullptr) == (image == nullptr)) return bad("give exactly one of \"input\" (text) and \"image\" (base64 PNG/JPEG)");
  if (input != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(r.inputs, prompt_list(*input, "input", limits));
    return r;
  }
  if (!image->is_string()) return bad("\"image\" must be a base64 string");
  auto bytes = base64_decode(image->get_ref<const std::string&>());
  if (!bytes.ok()) return bad("\"image\": " + bytes.status().message());
  if (bytes->empty()) return bad("\"image\" is empty");
  r.image = std::move(*bytes);
  return r;
}

Result<TokenizeRequest> parse_tokenize(std::string_view body) {
  TESSERA_ASSIGN_OR_RETURN(const json j, parse_object(body));
  TokenizeRequest r;
  const json* content = member(j, "content");
  const json* prompt = member(j, "prompt");
  if ((content == nullptr) == (prompt == nullptr)) return bad("give exactly one of \"content\" and \"prompt\" (text)");
  const json& text = content != nullptr ? *content : *prompt;
  if (!text.is_string()) return bad(std::string("\"") + (content != nullptr ? "content" : "prompt") + "\" must be a string");
  r.text = text.get<std::string>();
  const char* special = member(j, "add_special_tokens") != nullptr ? "add_special_tokens" : "add_special";
  TESSERA_ASSIGN_OR_RETURN(r.add_special, as_request_error(core::json_field_bool(j, special, false)));
  return r;
}

Result<std::vector<int64_t>> parse_detokenize(std::string_view body, const ApiLimits& limits) {
  TESSERA_ASSIGN_OR_RETURN(const json j, parse_object(body));
  const json* tokens = member(j, "tokens");
  if (tokens == nullptr || !tokens->is_array()) return bad("\"tokens\" must be a list of token ids");
  if (tokens->empty()) return std::vector<int64_t>{};
  return id_list(*tokens, "tokens", limits);
}

Result<std::string> base64_decode(std::string_view text) {
  if (text.rfind("data:", 0) == 0) {
    const size_t comma = text.find(',');
    if (comma == std::string_view::npos || text.substr(0, comma).find(";base64") == std::string_view::npos)
      return bad("a data URL must be base64");
    text.remove_prefix(comma + 1);
  }
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (const char c : text) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+' || c == '-') v = 62;
    else if (c == '/' || c == '_') v = 63;
    else return bad("not base64");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  if (bits >= 6) return bad("base64 of a wrong length");
  return out;
}

std::string base64_encode(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 2]);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back(i + 2 < bytes.size() ? kAlphabet[v & 63] : '=');
  }
  return out;
}

json error_body(const std::string& message, const std::string& type) {
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
}

LogprobToken logprob_token(const model::Tokenizer* tok, int64_t id) {
  if (tok != nullptr)
    if (auto b = tok->decode_bytes({id}, false); b.ok()) {
      if (model::valid_utf8(*b)) return {*b, *b};
      std::string text = "bytes:";
      for (const unsigned char c : *b) text += {'\\', 'x', "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]};
      return {std::move(text), std::move(*b)};
    }
  const std::string text = "token_id:" + std::to_string(id);
  return {text, text};
}

uint64_t choice_seed(uint64_t seed, int64_t i) {
  if (i == 0) return seed;
  // splitmix64 of (seed, i): far from seed's own stream and every other choice's.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t advance_seed(uint64_t seed, int64_t picks) {
  for (int64_t i = 0; i < picks; ++i) {
    std::mt19937_64 rng(seed);
    seed = rng();
  }
  return seed;
}

StopScan scan_stop(const std::string& text, const std::vector<std::string>& stop, bool final) {
  StopScan s;
  size_t first = std::string::npos;
  for (const auto& st : stop) first = std::min(first, text.find(st));
  if (first != std::string::npos) return {first, true};
  s.sendable = text.size();
  if (final) return s;
  // Hold back a suffix that may yet become a stop string.
  for (const auto& st : stop)
    for (size_t k = std::min(st.size() - 1, text.size()); k > 0; --k)
      if (text.compare(text.size() - k, k, st, 0, k) == 0) {
        s.sendable = std::min(s.sendable, text.size() - k);
        break;
      }
  // And an incomplete UTF-8 character, or the replacement character a
  // decoder put in its place: the next token may complete it.
  size_t end = s.sendable;
  if (end >= 3 && text.compare(end - 3, 3, "\xEF\xBF\xBD") == 0) end -= 3;
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto c = static_cast<uint8_t>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back) end -= back;
    break;
  }
  s.sendable = end;
  return s;
}

std::string StopFilter::add(const std::string& piece) { return advance(piece, false); }

std::string StopFilter::finish(const std::string& tail) { return advance(tail, true); }

std::string StopFilter::advance(const std::string& more, bool final) {
  if (stopped_) return {};
  text_ += more;
  const StopScan s = scan_stop(text_, stop_, final);
  std::string delta = s.sendable > sent_ ? text_.substr(sent_, s.sendable - sent_) : std::string();
  sent_ = std::max(sent_, s.sendable);
  stopped_ = s.stopped;
  return delta;
}

int http_status(core::ErrorCode code) {
  switch (code) {
    case core::ErrorCode::kInvalidArgument:
    case core::ErrorCode::kParseError:
    case core::ErrorCode::kOutOfRange:
      return 400;
    case core::ErrorCode::kTimeout:
      return 504;
    case core::ErrorCode::kNetwork:
    case core::ErrorCode::kResourceExhausted:
    case core::ErrorCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

}  // namespace tessera::runtime::api
