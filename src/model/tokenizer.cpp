// Shared tokenizer pieces: the normalizer, JSON helpers, the added-token /
// template pipeline and the decoders (Unicode: tokenizer_unicode.cpp; the
// loaders: tokenizer_load.cpp).
#include "model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iterator>

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

// ---- Patterns ----

core::Status Pattern::find_all(std::u32string_view text, std::vector<Span>& out) const {
  if (regex) return regex->find_all(text, out);
  if (literal.empty()) return core::ok_status();
  for (size_t at = text.find(literal); at != std::u32string_view::npos; at = text.find(literal, at + literal.size())) {
    out.push_back({at, at + literal.size()});
  }
  return core::ok_status();
}

core::Result<Pattern> parse_pattern(const Json& j) {
  Pattern p;
  TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> literal, json_opt_string(j, "String"));
  TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> regex, json_opt_string(j, "Regex"));
  if (literal) {
    TESSERA_ASSIGN_OR_RETURN(p.literal, utf8_to_u32(*literal));
    return p;
  }
  if (regex) {
    TESSERA_ASSIGN_OR_RETURN(p.regex, Regex::compile(*regex));
    return p;
  }
  return core::parse_error("\"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
}

core::Result<std::u32string> replace_all(std::u32string_view text, const Pattern& pattern,
                                         std::u32string_view content) {
  std::vector<Span> spans;
  TESSERA_RETURN_IF_ERROR(pattern.find_all(text, spans));
  if (spans.empty()) return std::u32string(text);
  std::u32string out;
  out.reserve(text.size());
  size_t prev = 0;
  for (const Span& s : spans) {
    out.append(text.substr(prev, s.begin - prev));
    out.append(content);
    prev = s.end;
  }
  out.append(text.substr(prev));
  return out;
}

namespace {

std::u32string strip_spaces(std::u32string_view text, bool left, bool right) {
  size_t b = 0, e = text.size();
  while (left && b < e && is_whitespace(text[b])) ++b;
  while (right && e > b && is_whitespace(text[e - 1])) --e;
  return std::u32string(text.substr(b, e - b));
}

}  // namespace

core::Result<std::u32string> normalize(std::u32string_view text, const Normalizer& normalizer) {
  std::u32string out(text);
  for (const NormalizerStep& step : normalizer.steps) {
    switch (step.kind) {
      case NormalizerStep::Kind::kBert:
        out = normalize(out, step.bert);
        break;
      case NormalizerStep::Kind::kForm:
        out = normalize_form(out, step.form);
        break;
      case NormalizerStep::Kind::kLowercase: {
        std::u32string lowered;
        lowered.reserve(out.size());
        for (char32_t c : out) append_lowercase(c, lowered);
        out.swap(lowered);
        break;
      }
      case NormalizerStep::Kind::kStripAccents: {  // HF: drops nonspacing marks (after an NFD step)
        std::u32string kept;
        for (char32_t c : out) {
          if (!is_nonspacing_mark(c)) kept.push_back(c);
        }
        out.swap(kept);
        break;
      }
      case NormalizerStep::Kind::kReplace: {
        TESSERA_ASSIGN_OR_RETURN(out, replace_all(out, step.pattern, step.content));
        break;
      }
      case NormalizerStep::Kind::kPrepend:
        if (!out.empty()) out.insert(0, step.content);  // HF prepends to non-empty text only
        break;
      case NormalizerStep::Kind::kStrip:
        out = strip_spaces(out, step.left, step.right);
        break;
    }
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

namespace {

size_t hash_token(std::string_view token) { return std::hash<std::string_view>{}(token); }

}  // namespace

size_t Vocab::slot_of(std::string_view token, size_t hash) const {
  const size_t mask = slots_.size() - 1;
  const auto h32 = static_cast<uint32_t>(hash);
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const uint64_t s = slots_[i];
    if (s == 0 || (static_cast<uint32_t>(s >> 32) == h32 && entries_[static_cast<uint32_t>(s) - 1].token == token)) {
      return i;
    }
  }
}

std::optional<int64_t> Vocab::find(std::string_view token) const {
  if (slots_.empty()) return std::nullopt;
  const uint64_t e = slots_[slot_of(token, hash_token(token))];
  if (e == 0) return std::nullopt;
  return entries_[static_cast<uint32_t>(e) - 1].id;
}

void Vocab::reserve(size_t n) {
  entries_.reserve(n);
  size_t want = 16;
  while (want < 2 * n) want *= 2;
  if (want <= slots_.size()) return;
  slots_.assign(want, 0);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const size_t h = hash_token(entries_[i].token);
    slots_[slot_of(entries_[i].token, h)] = (static_cast<uint64_t>(static_cast<uint32_t>(h)) << 32) | (i + 1);
  }
}

void Vocab::add(std::string_view token, int64_t id) {
  if (2 * (entries_.size() + 1) > slots_.size()) reserve(std::max<size_t>(16, 2 * entries_.size() + 1));
  const size_t h = hash_token(token);
  const size_t slot = slot_of(token, h);
  uint32_t index;
  if (slots_[slot] != 0) {
    index = static_cast<uint32_t>(slots_[slot]) - 1;
    entries_[index].id = id;  // a repeated token takes the new id
  } else {
    index = static_cast<uint32_t>(entries_.size());
    entries_.push_back({std::string(token), id});
    slots_[slot] = (static_cast<uint64_t>(static_cast<uint32_t>(h)) << 32) | (index + 1);
  }
  // With duplicate ids the first spelling wins.
  const size_t dense_limit = 2 * entries_.capacity() + 65536;
  if (id >= 0 && static_cast<size_t>(id) < dense_limit) {
    if (by_id_.size() <= static_cast<size_t>(id)) by_id_.resize(std::max<size_t>(id + 1, by_id_.size() * 3 / 2), -1);
    if (by_id_[id] < 0) by_id_[id] = static_cast<int32_t>(index);
  } else {
    sparse_by_id_.emplace(id, index);
  }
}

const std::string* Vocab::token(int64_t id) const {
  if (id >= 0 && static_cast<size_t>(id) < by_id_.size() && by_id_[id] >= 0) return &entries_[by_id_[id]].token;
  const auto it = sparse_by_id_.find(id);
  return it == sparse_by_id_.end() ? nullptr : &entries_[it->second].token;
}

core::Result<Vocab> vocab_from_json(const Json& obj, const std::string& where) {
  if (!obj.is_object()) return core::parse_error(where + " is not a JSON object of token -> id");
  constexpr int64_t kMaxId = (int64_t{1} << 31) - 1;
  Vocab vocab;
  vocab.reserve(obj.size());
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

core::Status parse_normalizer(const Json* j, Normalizer& out, int depth = 0) {
  if (j == nullptr) return core::ok_status();
  if (depth > kMaxSequenceNesting) return too_deep("normalizer");
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(*j, "type", ""));
  NormalizerStep step;
  using Kind = NormalizerStep::Kind;
  if (type == "BertNormalizer") {
    NormalizerConfig& cfg = step.bert;
    TESSERA_ASSIGN_OR_RETURN(cfg.clean_text, json_bool(*j, "clean_text", true));
    TESSERA_ASSIGN_OR_RETURN(cfg.handle_chinese_chars, json_bool(*j, "handle_chinese_chars", true));
    TESSERA_ASSIGN_OR_RETURN(cfg.lowercase, json_bool(*j, "lowercase", true));
    // null strip_accents follows lowercase
    TESSERA_ASSIGN_OR_RETURN(cfg.strip_accents, json_bool(*j, "strip_accents", cfg.lowercase));
    step.kind = Kind::kBert;
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.kind = Kind::kForm;
    step.form = type == "NFC"    ? NormalForm::kNFC
                : type == "NFD"  ? NormalForm::kNFD
                : type == "NFKC" ? NormalForm::kNFKC
                                 : NormalForm::kNFKD;
  } else if (type == "StripAccents") {
    step.kind = Kind::kStripAccents;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const Json* pattern = member(*j, "pattern");
    if (pattern == nullptr) return wrong_type("pattern", "an object");
    TESSERA_ASSIGN_OR_RETURN(step.pattern, parse_pattern(*pattern));
    TESSERA_ASSIGN_OR_RETURN(std::string content, json_string(*j, "content", ""));
    TESSERA_ASSIGN_OR_RETURN(step.content, utf8_to_u32(content));
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    TESSERA_ASSIGN_OR_RETURN(std::string prepend, json_string(*j, "prepend", ""));
    TESSERA_ASSIGN_OR_RETURN(step.content, utf8_to_u32(prepend));
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    TESSERA_ASSIGN_OR_RETURN(step.left, json_bool(*j, "strip_left", true));
    TESSERA_ASSIGN_OR_RETURN(step.right, json_bool(*j, "strip_right", true));
  } else if (type == "Sequence") {
    const Json* list = member(*j, "normalizers");
    if (list == nullptr || !list->is_array()) return wrong_type("normalizers", "an array");
    for (const Json& item : *list) TESSERA_RETURN_IF_ERROR(parse_normalizer(&item, out, depth + 1));
    return core::ok_status();
  } else {
    return core::unimplemented("unsupported normalizer type '" + type + "'");
  }
  out.steps.push_back(std::move(step));
  return core::ok_status();
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

core::Status parse_decoder(const Json* j, DecoderConfig& cfg, int depth = 0) {
  if (j == nullptr) return core::ok_status();
  if (depth > kMaxSequenceNesting) return too_deep("decoder");
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(*j, "type", ""));
  using Kind = DecoderStep::Kind;
  DecoderStep step;
  if (type == "WordPiece") {
    step.kind = Kind::kWordPiece;
    TESSERA_ASSIGN_OR_RETURN(step.prefix, json_string(*j, "prefix", "##"));
    TESSERA_ASSIGN_OR_RETURN(step.cleanup, json_bool(*j, "cleanup", true));
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const Json* pattern = member(*j, "pattern");
    if (pattern == nullptr) return wrong_type("pattern", "an object");
    TESSERA_ASSIGN_OR_RETURN(step.pattern, parse_pattern(*pattern));
    TESSERA_ASSIGN_OR_RETURN(step.content, json_string(*j, "content", ""));
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    TESSERA_ASSIGN_OR_RETURN(step.content, json_string(*j, "content", " "));
    TESSERA_ASSIGN_OR_RETURN(int64_t start, json_int(*j, "start", 0));
    TESSERA_ASSIGN_OR_RETURN(int64_t stop, json_int(*j, "stop", 0));
    if (start < 0 || stop < 0) return core::parse_error("Strip decoder start/stop must not be negative");
    step.start = static_cast<size_t>(start), step.stop = static_cast<size_t>(stop);
    TESSERA_ASSIGN_OR_RETURN(std::u32string c, utf8_to_u32(step.content));
    if (c.size() != 1) return core::parse_error("Strip decoder content must be one character");
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    TESSERA_ASSIGN_OR_RETURN(step.replacement, json_string(*j, "replacement", "\u2581"));
    TESSERA_ASSIGN_OR_RETURN(std::u32string c, utf8_to_u32(step.replacement));
    if (c.size() != 1) return core::parse_error("Metaspace replacement must be one character");
    TESSERA_ASSIGN_OR_RETURN(bool add_prefix_space, json_bool(*j, "add_prefix_space", true));
    TESSERA_ASSIGN_OR_RETURN(std::string scheme, json_string(*j, "prepend_scheme", add_prefix_space ? "always" : "never"));
    step.prepend = scheme != "never";
  } else if (type == "Sequence") {
    const Json* list = member(*j, "decoders");
    if (list == nullptr || !list->is_array()) return wrong_type("decoders", "an array");
    for (const Json& item : *list) TESSERA_RETURN_IF_ERROR(parse_decoder(&item, cfg, depth + 1));
    return core::ok_status();
  } else {
    return core::unimplemented("unsupported decoder type '" + type + "'");
  }
  cfg.steps.push_back(std::move(step));
  return core::ok_status();
}

}  // namespace

// "bos_token": "<s>" or {"content": "<s>", ...}.
std::optional<std::string> config_token(const Json* config, const char* key) {
  const Json* v = config ? member(*config, key) : nullptr;
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  const Json* content = member(*v, "content");
  if (content != nullptr && content->is_string()) return content->get<std::string>();
  return std::nullopt;
}

core::Status parse_common(const Json& root, const Json* config, TokenizerParts& parts) {
  parts.bos_token = config_token(config, "bos_token");
  parts.eos_token = config_token(config, "eos_token");
  TESSERA_RETURN_IF_ERROR(parse_added_tokens(root, parts.added));
  TESSERA_RETURN_IF_ERROR(parse_normalizer(member(root, "normalizer"), parts.normalizer));
  TESSERA_RETURN_IF_ERROR(
      parse_post_processor(member(root, "post_processor"), parts.template_prefix, parts.template_suffix));
  return parse_decoder(member(root, "decoder"), parts.decoder);
}

// ---- Decoders ----

std::vector<std::string> decode_byte_fallback(const std::vector<std::string>& tokens, bool raw) {
  std::vector<std::string> out;
  std::string bytes;
  auto flush = [&] {
    if (bytes.empty()) return;
    if (raw || utf8_to_u32(bytes).ok()) {
      out.push_back(bytes);
    } else {
      for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\uFFFD");
    }
    bytes.clear();
  };
  for (const std::string& t : tokens) {
    if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
        std::isxdigit(static_cast<unsigned char>(t[4]))) {
      bytes.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
      continue;
    }
    flush();
    out.push_back(t);
  }
  flush();
  return out;
}

namespace {

std::u32string lossy_u32(std::string_view text) {
  auto decoded = utf8_to_u32(utf8_lossy(text));
  return decoded.ok() ? std::move(decoded).value() : std::u32string();
}

// A text step on token t: f(chars, at_start, at_end) maps its characters.
// Decoding raw keeps the bytes that are no UTF-8 (a token that holds part of
// a character): f then maps each valid run between them (at_start/at_end:
// the run begins/ends the token), and those bytes stay as they are.
template <typename F>
core::Result<std::string> map_text(const std::string& t, bool raw, F&& f) {
  if (!raw) {
    TESSERA_ASSIGN_OR_RETURN(const std::u32string out, f(lossy_u32(t), true, true));
    return u32_to_utf8(out);
  }
  std::string out;
  for (size_t pos = 0; pos < t.size();) {
    std::u32string chars;
    size_t end = pos;
    for (Utf8Step c{}; end < t.size() && (c = next_utf8(t, end)).valid; end += c.len) chars.push_back(c.cp);
    if (end == pos) {  // bytes that are no character
      const size_t n = next_utf8(t, pos).len;
      out.append(t, pos, n);
      pos += n;
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(const std::u32string mapped, f(chars, pos == 0, end == t.size()));
    out += u32_to_utf8(mapped);
    pos = end;
  }
  return out;
}

// HF Strip: up to `start` leading and `stop` trailing copies of one char, per token.
std::u32string strip_chars(const std::u32string& chars, char32_t c, size_t start, size_t stop, bool at_start, bool at_end) {
  size_t b = 0, e = chars.size();
  while (at_start && b < start && b < e && chars[b] == c) ++b;
  for (size_t i = 0; at_end && i < stop && e > b && chars[e - 1] == c; ++i) --e;
  return chars.substr(b, e - b);
}

}  // namespace

core::Result<std::string> run_decoders(std::vector<std::string> tokens, const DecoderConfig& decoder, bool raw) {
  using Kind = DecoderStep::Kind;
  if (decoder.steps.empty()) {  // no decoder: HF joins tokens with spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const DecoderStep& step : decoder.steps) {
    switch (step.kind) {
      case Kind::kWordPiece:
        tokens = {decode_wordpiece(tokens, step.prefix, step.cleanup)};
        break;
      case Kind::kByteLevel:
        tokens = {decode_byte_level(tokens, raw)};
        break;
      case Kind::kByteFallback:
        tokens = decode_byte_fallback(tokens, raw);
        break;
      case Kind::kFuse: {
        std::string joined;
        for (const std::string& t : tokens) joined += t;
        tokens = {std::move(joined)};
        break;
      }
      case Kind::kReplace: {
        const std::u32string content = lossy_u32(step.content);
        for (std::string& t : tokens) {
          TESSERA_ASSIGN_OR_RETURN(t, map_text(t, raw, [&](const std::u32string& chars, bool, bool) {
                                     return replace_all(chars, step.pattern, content);
                                   }));
        }
        break;
      }
      case Kind::kStrip: {
        const std::u32string s = lossy_u32(step.content);
        const char32_t c = s.empty() ? U' ' : s[0];
        for (std::string& t : tokens) {
          TESSERA_ASSIGN_OR_RETURN(t, map_text(t, raw, [&](const std::u32string& chars, bool at_start, bool at_end) {
                                     return core::Result<std::u32string>(strip_chars(chars, c, step.start, step.stop, at_start, at_end));
                                   }));
        }
        break;
      }
      case Kind::kMetaspace: {
        const std::u32string rep = lossy_u32(step.replacement);
        for (size_t i = 0; i < tokens.size(); ++i) {
          TESSERA_ASSIGN_OR_RETURN(tokens[i], map_text(tokens[i], raw, [&](const std::u32string& chars, bool at_start, bool) {
                                     std::u32string out;
                                     for (size_t j = 0; j < chars.size(); ++j) {
                                       if (!rep.empty() && chars[j] == rep[0]) {
                                         // the space the pre-tokenizer prepended
                                         if (i == 0 && j == 0 && at_start && step.prepend) continue;
                                         out.push_back(U' ');
                                       } else {
                                         out.push_back(chars[j]);
                                       }
                                     }
                                     return core::Result<std::u32string>(std::move(out));
                                   }));
        }
        break;
      }
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
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
    if (t.normalized) {
      auto normalized = normalize(text, parts_.normalizer);
      if (normalized.ok()) text = std::move(normalized).value();
    }
    if (!text.empty()) (t.normalized ? normalized_index_ : raw_index_)[text[0]].push_back(i);
    match_text_.push_back(std::move(text));
  }
  for (auto* index : {&raw_index_, &normalized_index_}) {
    for (auto& [first, list] : *index) {
      std::stable_sort(list.begin(), list.end(),
                       [&](size_t a, size_t b) { return match_text_[a].size() > match_text_[b].size(); });
    }
  }
  if (parts_.bos_token) bos_id_ = token_to_id(*parts_.bos_token);
  if (parts_.eos_token) eos_id_ = token_to_id(*parts_.eos_token);
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
    const bool at_start = raw.text.data() == chars.data();
    TESSERA_ASSIGN_OR_RETURN(const std::u32string normalized, normalize(raw.text, parts_.normalizer));
    bool first_piece = true;
    for (const Segment& piece : split_added(normalized, /*normalized=*/true)) {
      if (piece.id) {
        ids.push_back(*piece.id);
      } else if (!piece.text.empty()) {
        TESSERA_RETURN_IF_ERROR(encode_piece(piece.text, at_start && first_piece, ids));
      }
      first_piece = false;
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), parts_.template_suffix.begin(), parts_.template_suffix.end());
  return ids;
}

const std::string* TokenizerBase::find_token(int64_t id) const {
  if (const std::string* t = added_vocab_.token(id)) return t;
  if (const std::string* t = parts_.vocab.token(id)) return t;
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
  return run_decoders(token_strings(ids, skip_special), parts_.decoder);
}

core::Result<std::string> TokenizerBase::decode_bytes(const std::vector<int64_t>& ids, bool skip_special) const {
  return run_decoders(token_strings(ids, skip_special), parts_.decoder, true);
}

std::vector<std::string> TokenizerBase::token_strings(const std::vector<int64_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    const std::string* token = find_token(id);
    if (token == nullptr || (skip_special && special_ids_.contains(id))) continue;
    tokens.push_back(*token);
  }
  return tokens;
}

int64_t TokenizerBase::vocab_size() const {
  auto n = static_cast<int64_t>(parts_.vocab.size());
  added_vocab_.for_each([&](const std::string& token, int64_t) { n += parts_.vocab.contains(token) ? 0 : 1; });
  return n;
}

std::optional<int64_t> TokenizerBase::token_to_id(std::string_view token) const {
  if (auto id = added_vocab_.find(token)) return id;
  return parts_.vocab.find(token);
}

}  // namespace tessera::model::tok
