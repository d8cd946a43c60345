// The tokenizer loaders: tokenizer.json (streamed through a SAX parser),
// tokenizer_config.json, the older vocab files and GGUF, dispatched by model
// type; and StreamDecoder (HF's DecodeStream).
#include <algorithm>
#include <optional>

#include "core/io.h"
#include "core/json.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"

// ---- Loaders ----

namespace tessera::model {
namespace {

using tok::Json;

// Old tokenizer.json files may leave out model.type; HF infers it from the fields.
std::string infer_model_type(const Json& model) {
  if (model.contains("merges")) return "BPE";
  if (model.contains("max_input_chars_per_word") || model.contains("continuing_subword_prefix")) return "WordPiece";
  return "";
}

core::Result<std::unique_ptr<Tokenizer>> tokenizer_from_root(const Json& root, const Json* config,
                                                             tok::StreamedModel& streamed) {
  if (!root.is_object()) return core::parse_error("top level is not a JSON object");
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) return core::parse_error("missing \"model\" object");
  TESSERA_ASSIGN_OR_RETURN(std::string type, tok::json_string(*model, "type", ""));
  if (type.empty()) type = infer_model_type(*model);
  if (type.empty() && streamed.has_merges) type = "BPE";
  if (type == "WordPiece") return tok::wordpiece_from_json(root, config, &streamed);
  if (type == "BPE") return tok::bpe_from_json(root, config, &streamed);
  if (type.empty()) return core::parse_error("model has no \"type\"");
  return core::unimplemented("unsupported model type '" + type + "' (WordPiece and BPE are supported)");
}

}  // namespace

namespace {

// SAX events to a DOM, except model.vocab and model.merges, which go straight
// into a StreamedModel (the DOM keeps an empty object / array in their place).
// Depth is bounded as core::parse_json bounds it.
class TokenizerSax : public nlohmann::json_sax<Json> {
 public:
  TokenizerSax(Json& root, tok::StreamedModel& model, int max_depth)
      : dom_(root, /*allow_exceptions=*/false), model_(model), max_depth_(max_depth) {}
  std::string error;

  bool null() override { return scalar(Json()); }
  bool boolean(bool v) override { return scalar(Json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v);
    return scalar(Json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v <= static_cast<number_unsigned_t>(INT64_MAX) ? static_cast<int64_t>(v) : -1);
    return scalar(Json(v));
  }
  bool number_float(number_float_t v, const string_t& s) override {
    if (mode_ != Mode::kDom) return bad("a non-integer entry");
    return dom_.number_float(v, s);
  }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ == 1) {  // "a b"
        const size_t space = v.find(' ');
        if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos) {
          return bad("merge " + std::to_string(model_.merges.size() + 1) + " is neither \"a b\" nor [\"a\", \"b\"]");
        }
        model_.merges.emplace_back(v.substr(0, space), v.substr(space + 1));
        return true;
      }
      if (merge_depth_ == 2 && pair_.size() < 2) {
        pair_.push_back(std::move(v));
        return true;
      }
      return bad("merge " + std::to_string(model_.merges.size() + 1) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    if (mode_ == Mode::kVocab) return bad("model.vocab: token '" + key_ + "' has no valid id");
    return dom_.string(v);
  }
  bool binary(binary_t& v) override { return mode_ == Mode::kDom && dom_.binary(v); }
  bool start_object(std::size_t n) override {
    if (++depth_ > max_depth_) return bad("nested deeper than " + std::to_string(max_depth_) + " levels");
    if (mode_ != Mode::kDom) return bad("a nested value");
    if (depth_ == 3 && path_model_ && pending_key_ == "vocab") {
      mode_ = Mode::kVocab;
      model_.has_vocab = true;
      if (n != static_cast<std::size_t>(-1)) model_.vocab.reserve(n);
      return dom_.start_object(0);
    }
    return dom_.start_object(n);
  }
  bool end_object() override {
    --depth_;
    if (mode_ == Mode::kVocab) mode_ = Mode::kDom;
    if (depth_ == 1) path_model_ = false;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) override {
    if (++depth_ > max_depth_) return bad("nested deeper than " + std::to_string(max_depth_) + " levels");
    if (mode_ == Mode::kMerges) {
      if (++merge_depth_ != 2) return bad("merge " + std::to_string(model_.merges.size() + 1) + " is nested too deep");
      pair_.clear();
      return true;
    }
    if (mode_ == Mode::kVocab) return bad("a nested value");
    if (depth_ == 3 && path_model_ && pending_key_ == "merges") {
      mode_ = Mode::kMerges;
      merge_depth_ = 1;
      model_.has_merges = true;
      return dom_.start_array(0);
    }
    return dom_.start_array(n);
  }
  bool end_array() override {
    --depth_;
    if (mode_ == Mode::kMerges) {
      if (--merge_depth_ == 1) {
        if (pair_.size() != 2) return bad("merge " + std::to_string(model_.merges.size() + 1) + " is neither \"a b\" nor [\"a\", \"b\"]");
        model_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        return true;
      }
      mode_ = Mode::kDom;
    }
    return dom_.end_array();
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::kVocab) {
      key_ = std::move(k);
      return true;
    }
    if (depth_ == 1) path_model_ = k == "model";
    pending_key_ = k;
    return dom_.key(k);
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    if (error.empty()) error = std::string(e.what()) + " (byte " + std::to_string(position) + ")";
    return false;
  }

 private:
  enum class Mode { kDom, kVocab, kMerges };
  bool scalar(Json v) {
    if (mode_ == Mode::kVocab) return bad("model.vocab: token '" + key_ + "' has no valid id");
    if (mode_ == Mode::kMerges) return bad("merge " + std::to_string(model_.merges.size() + 1) + " is neither \"a b\" nor [\"a\", \"b\"]");
    if (v.is_null()) return dom_.null();
    if (v.is_boolean()) return dom_.boolean(v.get<bool>());
    if (v.is_number_unsigned()) return dom_.number_unsigned(v.get<number_unsigned_t>());
    return dom_.number_integer(v.get<number_integer_t>());
  }
  bool vocab_id(int64_t id) {
    constexpr int64_t kMaxId = (int64_t{1} << 31) - 1;
    if (id < 0 || id > kMaxId) return bad("model.vocab: token '" + key_ + "' has no valid id");
    model_.vocab.add(key_, id);
    return true;
  }
  bool bad(std::string what) {
    if (error.empty()) error = std::move(what);
    return false;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  tok::StreamedModel& model_;
  int max_depth_;
  int depth_ = 0;
  Mode mode_ = Mode::kDom;
  bool path_model_ = false;  // inside the top-level "model" object
  std::string pending_key_, key_;
  int merge_depth_ = 0;
  std::vector<std::string> pair_;
};

}  // namespace

core::Result<std::unique_ptr<Tokenizer>> parse_tokenizer_json(const std::string& text, const std::string& name,
                                                              const std::string* config_text) {
  // Depth-bounded parse: the loaders below walk the tree recursively.
  // Duplicate keys are left to the format (HF writes none and reads the last).
  Json root;
  tok::StreamedModel streamed;
  TokenizerSax sax(root, streamed, 64);
  bool parsed_ok = false;
  try {
    parsed_ok = Json::sax_parse(text, &sax, Json::input_format_t::json, /*strict=*/true);
  } catch (const Json::exception& e) {
    if (sax.error.empty()) sax.error = e.what();
  }
  if (!parsed_ok) return core::parse_error(name + ": " + (sax.error.empty() ? "not valid JSON" : sax.error));
  std::optional<Json> config;
  if (config_text != nullptr) {
    auto c = core::parse_json(*config_text, name + " (tokenizer_config.json)", core::JsonLimits{64, false});
    if (!c.ok()) return c.status();
    config = std::move(c).value();
  }
  try {
    auto tokenizer = tokenizer_from_root(root, config ? &*config : nullptr, streamed);
    if (!tokenizer.ok()) return tokenizer.status().with_context(name);
    return tokenizer;
  } catch (const Json::exception& e) {  // typed lookups do not throw; a missed one must not abort
    return core::parse_error(name + ": " + e.what());
  }
}

core::Result<std::unique_ptr<Tokenizer>> parse_tokenizer_json(const std::string& text, const std::string& name) {
  return parse_tokenizer_json(text, name, nullptr);
}

core::Result<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
  return parse_tokenizer_json(text, path);
}

core::Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir) {
  if (is_gguf_path(dir)) {
    TESSERA_ASSIGN_OR_RETURN(const GgufFile f, GgufFile::open(dir));
    return gguf_tokenizer(f);
  }
  const std::string json_path = dir + "/tokenizer.json";
  if (core::file_exists(json_path)) {
    TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(json_path));
    const std::string config_path = dir + "/tokenizer_config.json";
    if (!core::file_exists(config_path)) return parse_tokenizer_json(text, json_path, nullptr);
    TESSERA_ASSIGN_OR_RETURN(const std::string config, core::read_file(config_path));
    return parse_tokenizer_json(text, json_path, &config);
  }
  // Without tokenizer.json, tokenizer_config.json still says what the slow
  // tokenizer's defaults do not: OPT's BOS, an uncased BERT's casing.
  std::optional<std::string> config;
  if (core::file_exists(dir + "/tokenizer_config.json")) {
    TESSERA_ASSIGN_OR_RETURN(config, core::read_file(dir + "/tokenizer_config.json"));
  }
  if (core::file_exists(dir + "/vocab.txt")) {
    bool lowercase = true;
    if (config) {
      const tok::Json c = tok::Json::parse(*config, nullptr, false);
      if (c.is_object()) {
        TESSERA_ASSIGN_OR_RETURN(lowercase, tok::json_bool(c, "do_lower_case", true));
      }
    }
    return load_wordpiece_vocab_txt(dir + "/vocab.txt", lowercase);
  }
  if (core::file_exists(dir + "/vocab.json") && core::file_exists(dir + "/merges.txt")) {
    return load_bpe_vocab_merges(dir + "/vocab.json", dir + "/merges.txt", config ? &*config : nullptr);
  }
  return core::not_found("no tokenizer.json, vocab.txt or vocab.json + merges.txt in '" + dir + "'");
}

// ---- StreamDecoder (HF's DecodeStream) ----

namespace {

bool ends_with_replacement(const std::string& s) { return s.ends_with("\xEF\xBF\xBD"); }

}  // namespace

bool valid_utf8(std::string_view bytes) { return tok::utf8_to_u32(bytes).ok(); }

core::Result<std::string> StreamDecoder::step(int64_t id) {
  ids_.push_back(id);
  TESSERA_ASSIGN_OR_RETURN(std::string text, tokenizer_.decode(ids_, skip_special_));
  if (text.size() <= prefix_.size() || ends_with_replacement(text) || !text.starts_with(prefix_)) {
    return std::string();  // nothing new, or a character still incomplete
  }
  std::string fresh = text.substr(prefix_.size());
  // The ids just emitted become the context of the next step.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_index_ = ids_.size();
  TESSERA_ASSIGN_OR_RETURN(prefix_, tokenizer_.decode(ids_, skip_special_));
  return fresh;
}

core::Result<std::string> StreamDecoder::flush() {
  std::string fresh;
  if (ids_.size() > prefix_index_) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, tokenizer_.decode(ids_, skip_special_));
    if (text.size() > prefix_.size() && text.starts_with(prefix_)) fresh = text.substr(prefix_.size());
  }
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return fresh;
}

}  // namespace tessera::model
