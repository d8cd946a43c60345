// Private to the tokenizer sources: Unicode helpers, the pipeline shared by
// every model (added tokens -> normalizer -> pre-tokenizer -> model ->
// template; decoders) and the per-model factories. Mirrors the stages of
// Hugging Face `tokenizers`.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "model/tokenizer.h"

namespace tessera::model::tok {

using Json = nlohmann::json;

// ---- UTF-8 ----
struct Utf8Step {
  char32_t cp;  // U+FFFD when !valid
  size_t len;   // bytes consumed; for invalid input, the maximal invalid subpart
  bool valid;
};
Utf8Step next_utf8(std::string_view s, size_t pos);
// Strict: an invalid byte sequence is an invalid_argument error naming its offset.
core::Result<std::u32string> utf8_to_u32(std::string_view text);
void append_utf8(char32_t cp, std::string& out);
std::string u32_to_utf8(std::u32string_view text);
// Like Rust's String::from_utf8_lossy: invalid sequences become U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// ---- Unicode (utf8proc: categories, case, normalization forms) ----
bool is_whitespace(char32_t c);       // White_Space, which is also Oniguruma's \s
bool is_letter(char32_t c);           // \p{L}
bool is_number(char32_t c);           // \p{N}
bool is_punctuation(char32_t c);      // ASCII punctuation or \p{P}
bool is_control(char32_t c);          // BERT's "other" chars: Cc, Cf, Co; not \t \n \r
bool is_nonspacing_mark(char32_t c);  // \p{Mn}
bool is_mark(char32_t c);             // \p{M}
bool is_cjk_ideograph(char32_t c);    // the ranges BERT pads with spaces
void append_lowercase(char32_t c, std::u32string& out);
// NFD of `c` without its nonspacing marks (what BERT's strip_accents keeps).
void append_without_accents(char32_t c, std::u32string& out);
enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
std::u32string normalize_form(std::u32string_view text, NormalForm form);

// ---- Regex (PCRE2, UTF + UCP, JIT where available) ----
struct Span {
  size_t begin, end;  // in chars
};
class Regex {
 public:
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // A pattern in the syntax tokenizer.json uses (Oniguruma's; PCRE2 reads the constructs real files use).
  static core::Result<std::shared_ptr<const Regex>> compile(const std::string& pattern);
  // Appends every non-overlapping match, leftmost first (find_iter). Thread-safe.
  core::Status find_all(std::u32string_view subject, std::vector<Span>& out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_32
  bool jit_ = false;
};

// A Split / Replace pattern: {"String": literal} or {"Regex": pattern}.
struct Pattern {
  std::u32string literal;
  std::shared_ptr<const Regex> regex;
  core::Status find_all(std::u32string_view text, std::vector<Span>& out) const;
};
core::Result<Pattern> parse_pattern(const Json& j);
// `text` with every match of `pattern` replaced by `content`.
core::Result<std::u32string> replace_all(std::u32string_view text, const Pattern& pattern,
                                         std::u32string_view content);

// ---- Pipeline configuration ----
struct NormalizerConfig {  // BertNormalizer
  bool clean_text = false;
  bool handle_chinese_chars = false;
  bool strip_accents = false;
  bool lowercase = false;
};
std::u32string normalize(std::u32string_view text, const NormalizerConfig& cfg);

struct NormalizerStep {
  enum class Kind { kBert, kForm, kLowercase, kStripAccents, kReplace, kPrepend, kStrip };
  Kind kind = Kind::kBert;
  NormalizerConfig bert;
  NormalForm form = NormalForm::kNFC;
  Pattern pattern;
  std::u32string content;            // Replace's replacement, Prepend's prefix
  bool left = false, right = false;  // Strip
};
// Steps applied in order (Sequences flattened).
struct Normalizer {
  std::vector<NormalizerStep> steps;
};
core::Result<std::u32string> normalize(std::u32string_view text, const Normalizer& normalizer);

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;  // matched after normalization rather than on raw text
};

struct DecoderStep {
  enum class Kind { kWordPiece, kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kByteLevel;
  std::string prefix = "##";    // WordPiece
  bool cleanup = true;          // WordPiece
  Pattern pattern;              // Replace
  std::string content;          // Replace's replacement; Strip's char
  size_t start = 0, stop = 0;   // Strip
  std::string replacement;      // Metaspace
  bool prepend = true;          // Metaspace: prepend_scheme is not "never"
};
struct DecoderConfig {
  std::vector<DecoderStep> steps;  // none: tokens joined with spaces, as HF does without a decoder
};
// The decoder chain on token strings (HF decode_chain), concatenated. raw:
// bytes that are no UTF-8 stay as they are (Tokenizer::decode_bytes).
core::Result<std::string> run_decoders(std::vector<std::string> tokens, const DecoderConfig& decoder, bool raw = false);

// token <-> id. An open-addressing table over one array of entries: real
// vocabularies (128k-262k tokens, 280k-515k merges to resolve) load several
// times faster than with node-based maps.
class Vocab {
 public:
  std::optional<int64_t> find(std::string_view token) const;
  bool contains(std::string_view token) const { return find(token).has_value(); }
  // A token already present takes the new id; an id's spelling is its first token.
  void add(std::string_view token, int64_t id);
  const std::string* token(int64_t id) const;
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  void reserve(size_t n);
  template <typename F>
  void for_each(F&& f) const {
    for (const Entry& e : entries_) f(e.token, e.id);
  }

 private:
  struct Entry {
    std::string token;
    int64_t id;
  };
  size_t slot_of(std::string_view token, size_t hash) const;  // its slot, or the empty one it would take
  void grow();
  std::vector<Entry> entries_;
  std::vector<uint64_t> slots_;  // hash's low 32 bits << 32 | (entry index + 1); 0 = empty
  std::vector<int32_t> by_id_;    // dense ids -> entry index, -1 = none
  std::unordered_map<int64_t, uint32_t> sparse_by_id_;  // ids far past the count
};
// {"token": id, ...}; ids must be in [0, 2^31) so merges can pack id pairs.
core::Result<Vocab> vocab_from_json(const Json& obj, const std::string& where);

// model.vocab and model.merges read while parsing (SAX) rather than kept as
// JSON: for the large vocabularies most of the load time.
struct StreamedModel {
  bool has_vocab = false, has_merges = false;
  Vocab vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::string error;  // the first malformed entry
};

struct TokenizerParts {
  Vocab vocab;  // the model's own vocab
  std::vector<AddedToken> added;
  Normalizer normalizer;
  std::vector<int64_t> template_prefix;  // single-sequence template: prefix $A suffix
  std::vector<int64_t> template_suffix;
  DecoderConfig decoder;
  std::optional<std::string> bos_token, eos_token;  // from tokenizer_config.json
};
// added_tokens, normalizer, post_processor and decoder of a tokenizer.json;
// bos_token / eos_token of tokenizer_config.json (`config`, may be null).
core::Status parse_common(const Json& root, const Json* config, TokenizerParts& parts);
// tokenizer_config.json's "bos_token": "<s>" or {"content": "<s>", ...} (config may be null).
std::optional<std::string> config_token(const Json* config, const char* key);

// Typed JSON lookups that never throw: missing or null gives `fallback`, a wrong type an error.
core::Result<bool> json_bool(const Json& obj, const char* key, bool fallback);
core::Result<int64_t> json_int(const Json& obj, const char* key, int64_t fallback);
core::Result<std::string> json_string(const Json& obj, const char* key, std::string fallback);
core::Result<std::optional<std::string>> json_opt_string(const Json& obj, const char* key);

// ---- Shared encode/decode pipeline ----
class TokenizerBase : public Tokenizer {
 public:
  explicit TokenizerBase(TokenizerParts parts);
  core::Result<std::vector<int64_t>> encode(std::string_view text, bool add_special_tokens) const override;
  core::Result<std::vector<std::string>> id_to_tokens(const std::vector<int64_t>& ids) const override;
  core::Result<std::string> decode(const std::vector<int64_t>& ids, bool skip_special) const override;
  core::Result<std::string> decode_bytes(const std::vector<int64_t>& ids, bool skip_special) const override;
  int64_t vocab_size() const override;
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  std::optional<int64_t> bos_id() const override { return bos_id_; }
  std::optional<int64_t> eos_id() const override { return eos_id_; }
  bool is_special(int64_t id) const override { return special_ids_.contains(id); }

 protected:
  // Appends the ids of one normalized piece of text free of added tokens;
  // `first`: the piece starts the input (Metaspace's prepend_scheme "first").
  virtual core::Status encode_piece(std::u32string_view piece, bool first, std::vector<int64_t>& ids) const = 0;
  const Vocab& model_vocab() const { return parts_.vocab; }

 private:
  struct Segment {
    std::u32string_view text;
    std::optional<int64_t> id;  // set when the segment is an added token
  };
  std::vector<Segment> split_added(std::u32string_view text, bool normalized) const;
  std::optional<size_t> longest_added_at(std::u32string_view text, size_t pos, bool normalized) const;
  const std::string* find_token(int64_t id) const;
  // The vocabulary strings of ids for the decoders (unknown ids, and special ones when skipped, left out).
  std::vector<std::string> token_strings(const std::vector<int64_t>& ids, bool skip_special) const;

  TokenizerParts parts_;
  std::vector<std::u32string> match_text_;                       // per added token, as matched
  std::unordered_map<char32_t, std::vector<size_t>> raw_index_;  // first char -> added tokens, longest first
  std::unordered_map<char32_t, std::vector<size_t>> normalized_index_;
  Vocab added_vocab_;
  std::unordered_set<int64_t> special_ids_;
  std::optional<int64_t> bos_id_, eos_id_;
};

// ---- Decoders ----
std::string decode_wordpiece(const std::vector<std::string>& tokens, const std::string& prefix, bool cleanup);
std::string decode_byte_level(const std::vector<std::string>& tokens, bool raw = false);
// HF ByteFallback: runs of <0xNN> tokens become their bytes when those are
// UTF-8, one U+FFFD per byte otherwise (raw: the bytes in every case).
std::vector<std::string> decode_byte_fallback(const std::vector<std::string>& tokens, bool raw = false);

// ---- Model factories (model/tokenizer_wordpiece.cpp, model/tokenizer_bpe.cpp) ----
// `config`: tokenizer_config.json, when there is one.
core::Result<std::unique_ptr<Tokenizer>> wordpiece_from_json(const Json& root, const Json* config,
                                                             StreamedModel* streamed = nullptr);
core::Result<std::unique_ptr<Tokenizer>> bpe_from_json(const Json& root, const Json* config,
                                                       StreamedModel* streamed = nullptr);

}  // namespace tessera::model::tok
