// Shared tokenizer pieces: the normalizer, JSON helpers, the added-token /
// template pipeline and the loaders' dispatch (Unicode: tokenizer_unicode.cpp).
#include "model/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

#include "core/io.h"
#include "core/json.h"
#include "model/tokenizer_impl.h"

namespace tessera::model::tok {

// ---- Normalizer (BertNormalizer's steps, in its order) ----

namespace {

std::u32string clean_text(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    out.push_back(is_whitespace(c) ? U' ' : c);
  }
  return out;
}

std::u32string pad_chinese_chars(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (is_cjk_ideograph(c)) {
      out.push_back(U' ');
      out.push_back(c);
      out.push_back(U' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::u32string normalize(std::u32string_view text, const NormalizerConfig& cfg) {
  std::u32string out(text);
  if (cfg.clean_text) out = clean_text(out);
  if (cfg.handle_chinese_chars) out = pad_chinese_chars(out);
  if (cfg.strip_accents) {
    std::u32string stripped;
    for (char32_t c : out) append_without_accents(c, stripped);
    out.swap(stripped);
  }
  if (cfg.lowercase) {
    std::u32string lowered;
    for (char32_t c : out) append_lowercase(c, lowered);
    out.swap(lowered);
  }
  return out;
}

// ---- JSON helpers ----

namespace {

const Json* member(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return (it == obj.end() || it->is_null()) ? nullptr : &*it;
}

core::Status wrong_type(const char* key, const char* expected) {
  return core::parse_error(std::string("\"") + key + "\" must be " + expected);
}

}  // namespace

core::Result<bool> json_bool(const Json& obj, const char* key, bool fallback) {
  const Json* v = member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return wrong_type(key, "a boolean");
  return v->get<bool>();
}

core::Result<int64_t> json_int(const Json& obj, const char* key, int64_t fallback) {
  const Json* v = member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) return wrong_type(key, "an integer");
  return v->get<int64_t>();
}

core::Result<std::string> json_string(const Json& obj, const char* key, std::string fallback) {
  const Json* v = member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) return wrong_type(key, "a string");
  return v->get<std::string>();
}

core::Result<std::optional<std::string>> json_opt_string(const Json& obj, const char* key) {
  const Json* v = member(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return wrong_type(key, "a string");
  return std::optional<std::string>(v->get<std::string>());
}

std::optional<int64_t> Vocab::find(std::string_view token) const {
  const auto it = ids.find(token);
  if (it == ids.end()) return std::nullopt;
  return it->second;
}

void Vocab::add(const std::string& token, int64_t id) {
  ids.insert_or_assign(token, id);
  tokens.emplace(id, token);  // with duplicate ids the first spelling wins
}

core::Result<Vocab> vocab_from_json(const Json& obj, const std::string& where) {
  if (!obj.is_object()) return core::parse_error(where + " is not a JSON object of token -> id");
  constexpr int64_t kMaxId = (int64_t{1} << 31) - 1;
  Vocab vocab;
  for (const auto& [token, id] : obj.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxId) {
      return core::parse_error(where + ": token '" + token + "' has no valid id");
    }
    vocab.add(token, id.get<int64_t>());
  }
  return vocab;
}

// ---- tokenizer.json sections shared by all models ----

namespace {

core::Result<AddedToken> parse_added_token(const Json& j) {
  if (!j.is_object()) return core::parse_error("added_tokens entry is not an object");
  AddedToken t;
  TESSERA_ASSIGN_OR_RETURN(t.id, json_int(j, "id", -1));
  TESSERA_ASSIGN_OR_RETURN(t.content, json_string(j, "content", ""));
  if (t.id < 0 || t.content.empty()) return core::parse_error("added token needs an id and a content");
  TESSERA_ASSIGN_OR_RETURN(t.special, json_bool(j, "special", false));
  TESSERA_ASSIGN_OR_RETURN(t.single_word, json_bool(j, "single_word", false));
  TESSERA_ASSIGN_OR_RETURN(t.lstrip, json_bool(j, "lstrip", false));
  TESSERA_ASSIGN_OR_RETURN(t.rstrip, json_bool(j, "rstrip", false));
  TESSERA_ASSIGN_OR_RETURN(t.normalized, json_bool(j, "normalized", !t.special));  // HF's default
  return t;
}

core::Status parse_added_tokens(const Json& root, std::vector<AddedToken>& out) {
  const Json* list = member(root, "added_tokens");
  if (list == nullptr) return core::ok_status();
  if (!list->is_array()) return wrong_type("added_tokens", "an array");
  for (const Json& j : *list) {
    TESSERA_ASSIGN_OR_RETURN(AddedToken t, parse_added_token(j));
    out.push_back(std::move(t));
  }
  return core::ok_status();
}

// Sequences nest; real files nest one or two levels. The bound keeps a
// hostile file from overflowing the stack through the recursion below.
constexpr int kMaxSequenceNesting = 16;

core::Status too_deep(const char* what) {
  return core::parse_error(std::string(what) + " Sequences nest deeper than " + std::to_string(kMaxSequenceNesting) + " levels");
}

core::Status parse_normalizer(const Json* j, NormalizerConfig& cfg, int depth = 0) {
  if (j == nullptr) return core::ok_status();
  if (depth > kMaxSequenceNesting) return too_deep("normalizer");
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(*j, "type", ""));
  if (type == "BertNormalizer") {
    TESSERA_ASSIGN_OR_RETURN(cfg.clean_text, json_bool(*j, "clean_text", true));
    TESSERA_ASSIGN_OR_RETURN(cfg.handle_chinese_chars, json_bool(*j, "handle_chinese_chars", true));
    TESSERA_ASSIGN_OR_RETURN(cfg.lowercase, json_bool(*j, "lowercase", true));
    // null strip_accents follows lowercase
    TESSERA_ASSIGN_OR_RETURN(cfg.strip_accents, json_bool(*j, "strip_accents", cfg.lowercase));
    return core::ok_status();
  }
  if (type == "Lowercase") {
    cfg.lowercase = true;
    return core::ok_status();
  }
  if (type == "Sequence") {
    const Json* list = member(*j, "normalizers");
    if (list == nullptr || !list->is_array()) return wrong_type("normalizers", "an array");
    for (const Json& item : *list) TESSERA_RETURN_IF_ERROR(parse_normalizer(&item, cfg, depth + 1));
    return core::ok_status();
  }
  return core::unimplemented("unsupported normalizer type '" + type + "'");
}

core::Result<std::vector<int64_t>> template_special_ids(const Json& specials, const std::string& name) {
  const Json* entry = member(specials, name.c_str());
  const Json* ids = entry ? member(*entry, "ids") : nullptr;
  if (ids == nullptr || !ids->is_array()) {
    return core::parse_error("template token '" + name + "' has no ids in special_tokens");
  }
  std::vector<int64_t> out;
  for (const Json& id : *ids) {
    if (!id.is_number_integer()) return core::parse_error("template token '" + name + "' has a non-integer id");
    out.push_back(id.get<int64_t>());
  }
  return out;
}

// TemplateProcessing's "single" list: special tokens around one sequence ($A).
core::Status parse_template(const Json& j, std::vector<int64_t>& prefix, std::vector<int64_t>& suffix) {
  const Json* single = member(j, "single");
  if (single == nullptr || !single->is_array()) return wrong_type("single", "an array");
  const Json empty = Json::object();
  const Json* specials = member(j, "special_tokens");
  bool seen_sequence = false;
  for (const Json& piece : *single) {
    if (member(piece, "Sequence") != nullptr) {
      if (seen_sequence) return core::parse_error("template 'single' has more than one sequence");
      seen_sequence = true;
      continue;
    }
    const Json* special = member(piece, "SpecialToken");
    TESSERA_ASSIGN_OR_RETURN(std::string name, json_string(special ? *special : empty, "id", ""));
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> ids, template_special_ids(specials ? *specials : empty, name));
    std::vector<int64_t>& dst = seen_sequence ? suffix : prefix;
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  if (!seen_sequence) return core::parse_error("template 'single' has no $A sequence");
  return core::ok_status();
}

// BertProcessing / RobertaProcessing: "cls": ["[CLS]", 101], "sep": ["[SEP]", 102].
core::Result<int64_t> processing_token_id(const Json& j, const char* key) {
  const Json* pair = member(j, key);
  if (pair == nullptr || !pair->is_array() || pair->size() != 2 || !(*pair)[1].is_number_integer()) {
    return wrong_type(key, "a [token, id] pair");
  }
  return (*pair)[1].get<int64_t>();
}

core::Status parse_post_processor(const Json* j, std::vector<int64_t>& prefix, std::vector<int64_t>& suffix,
                                  int depth = 0) {
  if (j == nullptr) return core::ok_status();
  if (depth > kMaxSequenceNesting) return too_deep("post_processor");
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(*j, "type", ""));
  if (type == "ByteLevel") return core::ok_status();  // only trims offsets
  if (type == "TemplateProcessing") return parse_template(*j, prefix, suffix);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    TESSERA_ASSIGN_OR_RETURN(int64_t cls, processing_token_id(*j, "cls"));
    TESSERA_ASSIGN_OR_RETURN(int64_t sep, processing_token_id(*j, "sep"));
    prefix.insert(prefix.begin(), cls);
    suffix.push_back(sep);
    return core::ok_status();
  }
  if (type == "Sequence") {
    const Json* list = member(*j, "processors");
    if (list == nullptr || !list->is_array()) return wrong_type("processors", "an array");
    for (const Json& item : *list) {
      std::vector<int64_t> p, s;  // each processor wraps what the previous ones produced
      TESSERA_RETURN_IF_ERROR(parse_post_processor(&item, p, s, depth + 1));
      prefix.insert(prefix.begin(), p.begin(), p.end());
      suffix.insert(suffix.end(), s.begin(), s.end());
    }
    return core::ok_status();
  }
  return core::unimplemented("unsupported post_processor type '" + type + "'");
}

core::Status parse_decoder(const Json* j, DecoderConfig& cfg) {
  if (j == nullptr) return core::ok_status();
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(*j, "type", ""));
  if (type == "WordPiece") {
    cfg.kind = DecoderKind::kWordPiece;
    TESSERA_ASSIGN_OR_RETURN(cfg.prefix, json_string(*j, "prefix", "##"));
    TESSERA_ASSIGN_OR_RETURN(cfg.cleanup, json_bool(*j, "cleanup", true));
    return core::ok_status();
  }
  if (type == "ByteLevel") {
    cfg.kind = DecoderKind::kByteLevel;
    return core::ok_status();
  }
  return core::unimplemented("unsupported decoder type '" + type + "'");
}

}  // namespace

core::Status parse_common(const Json& root, TokenizerParts& parts) {
  TESSERA_RETURN_IF_ERROR(parse_added_tokens(root, parts.added));
  TESSERA_RETURN_IF_ERROR(parse_normalizer(member(root, "normalizer"), parts.normalizer));
  TESSERA_RETURN_IF_ERROR(
      parse_post_processor(member(root, "post_processor"), parts.template_prefix, parts.template_suffix));
  return parse_decoder(member(root, "decoder"), parts.decoder);
}

// ---- TokenizerBase ----

TokenizerBase::TokenizerBase(TokenizerParts parts) : parts_(std::move(parts)) {
  for (size_t i = 0; i < parts_.added.size(); ++i) {
    const AddedToken& t = parts_.added[i];
    added_vocab_.add(t.content, t.id);
    if (t.special) special_ids_.insert(t.id);
    auto decoded = utf8_to_u32(t.content);  // JSON strings are valid UTF-8; skip the token otherwise
    std::u32string text = decoded.ok() ? std::move(decoded).value() : std::u32string();
    // Normalized tokens are matched in normalized text, so they are normalized too (as HF does).
    if (t.normalized) text = normalize(text, parts_.normalizer);
    if (!text.empty()) (t.normalized ? normalized_index_ : raw_index_)[text[0]].push_back(i);
    match_text_.push_back(std::move(text));
  }
  for (auto* index : {&raw_index_, &normalized_index_}) {
    for (auto& [first, list] : *index) {
      std::stable_sort(list.begin(), list.end(),
                       [&](size_t a, size_t b) { return match_text_[a].size() > match_text_[b].size(); });
    }
  }
}

std::optional<size_t> TokenizerBase::longest_added_at(std::u32string_view text, size_t pos, bool normalized) const {
  const auto& index = normalized ? normalized_index_ : raw_index_;
  const auto it = index.find(text[pos]);
  if (it == index.end()) return std::nullopt;
  for (size_t i : it->second) {
    if (text.substr(pos).starts_with(match_text_[i])) return i;
  }
  return std::nullopt;
}

namespace {

bool is_word_char(char32_t c) { return is_letter(c) || is_number(c) || is_nonspacing_mark(c) || c == U'_'; }

// single_word tokens only match when not glued to letters or digits.
bool stands_alone(std::u32string_view text, size_t begin, size_t end) {
  return (begin == 0 || !is_word_char(text[begin - 1])) && (end == text.size() || !is_word_char(text[end]));
}

}  // namespace

// Leftmost-longest matching of added tokens, like HF's Aho-Corasick pass.
std::vector<TokenizerBase::Segment> TokenizerBase::split_added(std::u32string_view text, bool normalized) const {
  std::vector<Segment> out;
  size_t start = 0;  // first char not emitted yet
  for (size_t pos = 0; pos < text.size();) {
    const std::optional<size_t> hit = longest_added_at(text, pos, normalized);
    if (!hit) {
      ++pos;
      continue;
    }
    const AddedToken& token = parts_.added[*hit];
    size_t begin = pos, end = pos + match_text_[*hit].size();
    pos = end;
    if (token.single_word && !stands_alone(text, begin, end)) continue;
    while (token.lstrip && begin > start && is_whitespace(text[begin - 1])) --begin;
    while (token.rstrip && end < text.size() && is_whitespace(text[end])) ++end;
    if (begin > start) out.push_back({text.substr(start, begin - start), std::nullopt});
    out.push_back({text.substr(begin, end - begin), token.id});
    start = pos = end;
  }
  if (start < text.size()) out.push_back({text.substr(start), std::nullopt});
  return out;
}

core::Result<std::vector<int64_t>> TokenizerBase::encode(std::string_view text, bool add_special_tokens) const {
  TESSERA_ASSIGN_OR_RETURN(const std::u32string chars, utf8_to_u32(text));
  std::vector<int64_t> ids;
  if (add_special_tokens) ids = parts_.template_prefix;
  for (const Segment& raw : split_added(chars, /*normalized=*/false)) {
    if (raw.id) {
      ids.push_back(*raw.id);
      continue;
    }
    const std::u32string normalized = normalize(raw.text, parts_.normalizer);
    for (const Segment& piece : split_added(normalized, /*normalized=*/true)) {
      if (piece.id) {
        ids.push_back(*piece.id);
      } else {
        TESSERA_RETURN_IF_ERROR(encode_piece(piece.text, ids));
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), parts_.template_suffix.begin(), parts_.template_suffix.end());
  return ids;
}

const std::string* TokenizerBase::find_token(int64_t id) const {
  if (const auto it = added_vocab_.tokens.find(id); it != added_vocab_.tokens.end()) return &it->second;
  if (const auto it = parts_.vocab.tokens.find(id); it != parts_.vocab.tokens.end()) return &it->second;
  return nullptr;
}

core::Result<std::vector<std::string>> TokenizerBase::id_to_tokens(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    const std::string* token = find_token(id);
    if (token == nullptr) return core::out_of_range("token id " + std::to_string(id) + " is not in the vocabulary");
    tokens.push_back(*token);
  }
  return tokens;
}

core::Result<std::string> TokenizerBase::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    const std::string* token = find_token(id);
    if (token == nullptr || (skip_special && special_ids_.contains(id))) continue;
    tokens.push_back(*token);
  }
  switch (parts_.decoder.kind) {
    case DecoderKind::kWordPiece:
      return decode_wordpiece(tokens, parts_.decoder.prefix, parts_.decoder.cleanup);
    case DecoderKind::kByteLevel:
      return decode_byte_level(tokens);
    case DecoderKind::kNone:
      break;
  }
  std::string out;  // no decoder: HF joins tokens with spaces
  for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
  return out;
}

int64_t TokenizerBase::vocab_size() const {
  auto n = static_cast<int64_t>(parts_.vocab.ids.size());
  for (const auto& [token, id] : added_vocab_.ids) n += parts_.vocab.ids.contains(token) ? 0 : 1;
  return n;
}

std::optional<int64_t> TokenizerBase::token_to_id(std::string_view token) const {
  if (auto id = added_vocab_.find(token)) return id;
  return parts_.vocab.find(token);
}

}  // namespace tessera::model::tok

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

core::Result<std::unique_ptr<Tokenizer>> tokenizer_from_root(const Json& root) {
  if (!root.is_object()) return core::parse_error("top level is not a JSON object");
  const auto model = root.find("model");
  if (model == root.end() || !model->is_object()) return core::parse_error("missing \"model\" object");
  TESSERA_ASSIGN_OR_RETURN(std::string type, tok::json_string(*model, "type", ""));
  if (type.empty()) type = infer_model_type(*model);
  if (type == "WordPiece") return tok::wordpiece_from_json(root);
  if (type == "BPE") return tok::bpe_from_json(root);
  if (type.empty()) return core::parse_error("model has no \"type\"");
  return core::unimplemented("unsupported model type '" + type + "' (WordPiece and BPE are supported)");
}

}  // namespace

core::Result<std::unique_ptr<Tokenizer>> parse_tokenizer_json(const std::string& text, const std::string& name) {
  // Depth-bounded parse: the loaders below walk the tree recursively.
  // Duplicate keys are left to the format (HF writes none and reads the last).
  auto parsed = core::parse_json(text, name, core::JsonLimits{64, false});
  if (!parsed.ok()) return parsed.status();
  try {
    auto tokenizer = tokenizer_from_root(*parsed);
    if (!tokenizer.ok()) return tokenizer.status().with_context(name);
    return tokenizer;
  } catch (const Json::exception& e) {  // typed lookups do not throw; a missed one must not abort
    return core::parse_error(name + ": " + e.what());
  }
}

core::Result<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
  return parse_tokenizer_json(text, path);
}

core::Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir) {
  const std::string json_path = dir + "/tokenizer.json";
  if (core::file_exists(json_path)) return load_tokenizer_json(json_path);
  if (core::file_exists(dir + "/vocab.txt")) return load_wordpiece_vocab_txt(dir + "/vocab.txt");
  if (core::file_exists(dir + "/vocab.json") && core::file_exists(dir + "/merges.txt")) {
    return load_bpe_vocab_merges(dir + "/vocab.json", dir + "/merges.txt");
  }
  return core::not_found("no tokenizer.json, vocab.txt or vocab.json + merges.txt in '" + dir + "'");
}

}  // namespace tessera::model
