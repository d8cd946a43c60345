// GPT-2 byte-level BPE: the GPT-2 split pattern, a reversible byte -> char
// map, then merges applied lowest rank first (leftmost on ties), as HF does.
#include <array>
#include <memory>
#include <queue>

#include "core/io.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"

namespace tessera::model::tok {
namespace {

struct BpeConfig {
  std::optional<std::string> unk_token;
  std::string prefix;  // continuing_subword_prefix
  std::string suffix;  // end_of_word_suffix
  bool fuse_unk = false;
  bool ignore_merges = false;
  bool byte_level = true;  // ByteLevel pre-tokenizer; otherwise each piece is one word
  bool add_prefix_space = false;
  bool use_regex = true;
};

using MergeList = std::vector<std::pair<std::string, std::string>>;  // in rank order

struct Merge {
  size_t rank;
  int64_t id;  // of the merged token
};

using MergeMap = std::unordered_map<uint64_t, Merge>;

// Vocab ids are below 2^31, so a pair packs into one key.
uint64_t pair_key(int64_t left, int64_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint64_t>(right);
}

// Applies merges to one word lowest rank first, leftmost on ties, as HF's
// priority queue does. Symbols form a linked list so that long words (pages
// without a space) stay O(n log n).
class MergeWord {
 public:
  MergeWord(std::vector<int64_t>& symbols, const MergeMap& merges)
      : symbols_(symbols),
        merges_(merges),
        n_(static_cast<int>(symbols.size())),
        next_(n_),
        prev_(n_),
        alive_(n_, true) {
    for (int i = 0; i < n_; ++i) next_[i] = i + 1 < n_ ? i + 1 : -1, prev_[i] = i - 1;
  }

  void run() {
    for (int i = 0; i + 1 < n_; ++i) consider(i);
    while (!queue_.empty()) {
      const Candidate c = queue_.top();
      queue_.pop();
      if (!still_valid(c)) continue;
      const int right = next_[c.pos];
      symbols_[c.pos] = c.merged;
      alive_[right] = false;
      next_[c.pos] = next_[right];
      if (next_[right] >= 0) prev_[next_[right]] = c.pos;
      consider(prev_[c.pos]);
      consider(c.pos);
    }
    size_t kept = 0;
    for (int i = 0; i < n_; ++i) {
      if (alive_[i]) symbols_[kept++] = symbols_[i];
    }
    symbols_.resize(kept);
  }

 private:
  struct Candidate {
    size_t rank;
    int pos;  // of the left symbol
    int64_t left, right, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  void consider(int left) {
    if (left < 0 || next_[left] < 0) return;
    const int64_t a = symbols_[left], b = symbols_[next_[left]];
    const auto it = merges_.find(pair_key(a, b));
    if (it != merges_.end()) queue_.push({it->second.rank, left, a, b, it->second.id});
  }

  // A queued pair goes stale when either side has merged since.
  bool still_valid(const Candidate& c) const {
    const int right = next_[c.pos];
    return alive_[c.pos] && right >= 0 && symbols_[c.pos] == c.left && symbols_[right] == c.right;
  }

  std::vector<int64_t>& symbols_;
  const MergeMap& merges_;
  int n_;
  std::vector<int> next_, prev_;  // live neighbours; -1 past the ends
  std::vector<bool> alive_;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue_;
};

// GPT-2's reversible byte -> char map: printable Latin-1 bytes stand for
// themselves, the others take U+0100 upwards, so every token is printable.
constexpr size_t kMappedChars = 256 + 68;

const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

std::optional<uint8_t> char_to_byte(char32_t c) {
  static const std::array<int16_t, kMappedChars> table = [] {
    std::array<int16_t, kMappedChars> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_char()[b]] = static_cast<int16_t>(b);
    return t;
  }();
  if (c >= kMappedChars || table[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(table[c]);
}

// ---- The GPT-2 split pattern, by hand ----
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Alternatives are tried in order (Oniguruma semantics), so each helper
// returns the length one alternative matches at `i`, or 0.

bool is_other(char32_t c) { return !is_whitespace(c) && !is_letter(c) && !is_number(c); }

size_t contraction_length(std::u32string_view s, size_t i) {
  if (s[i] != U'\'') return 0;
  for (std::u32string_view suffix : {U"s", U"t", U"re", U"ve", U"m", U"ll", U"d"}) {
    if (s.substr(i + 1).starts_with(suffix)) return 1 + suffix.size();
  }
  return 0;
}

// ` ?X+`: an optional U+0020, then one or more chars of class X.
size_t spaced_run_length(std::u32string_view s, size_t i, bool (*in_class)(char32_t)) {
  const size_t first = s[i] == U' ' ? i + 1 : i;
  size_t end = first;
  while (end < s.size() && in_class(s[end])) ++end;
  return end > first ? end - i : 0;
}

// `\s+(?!\S)|\s+`: a whitespace run that leaves its last char to a following word.
size_t whitespace_run_length(std::u32string_view s, size_t i) {
  size_t end = i;
  while (end < s.size() && is_whitespace(s[end])) ++end;
  const size_t n = end - i;
  if (n == 0) return 1;  // unreachable: every char is in one class; guarantees progress
  return (end == s.size() || n == 1) ? n : n - 1;
}

size_t gpt2_match_length(std::u32string_view s, size_t i) {
  if (size_t n = contraction_length(s, i)) return n;
  for (bool (*in_class)(char32_t) : {&is_letter, &is_number, &is_other}) {
    if (size_t n = spaced_run_length(s, i, in_class)) return n;
  }
  return whitespace_run_length(s, i);
}

// The word's UTF-8 bytes spelled with the byte -> char map, as UTF-8.
std::string to_byte_chars(std::u32string_view word) {
  std::string out;
  for (char c : u32_to_utf8(word)) append_utf8(byte_to_char()[static_cast<uint8_t>(c)], out);
  return out;
}

class BpeTokenizer final : public TokenizerBase {
 public:
  BpeTokenizer(TokenizerParts parts, BpeConfig cfg, MergeMap merges)
      : TokenizerBase(std::move(parts)), cfg_(std::move(cfg)), merges_(std::move(merges)) {
    if (cfg_.unk_token) unk_id_ = model_vocab().find(*cfg_.unk_token);
  }

 private:
  core::Status encode_piece(std::u32string_view piece, std::vector<int64_t>& ids) const override {
    if (!cfg_.byte_level) return encode_word(u32_to_utf8(piece), ids);
    std::u32string text;
    if (cfg_.add_prefix_space && !piece.empty() && piece[0] != U' ') text.push_back(U' ');
    text.append(piece);
    const std::u32string_view view(text);
    for (size_t i = 0; i < view.size();) {
      const size_t n = cfg_.use_regex ? gpt2_match_length(view, i) : view.size() - i;
      TESSERA_RETURN_IF_ERROR(encode_word(to_byte_chars(view.substr(i, n)), ids));
      i += n;
    }
    return core::ok_status();
  }

  core::Status encode_word(const std::string& word, std::vector<int64_t>& ids) const {
    if (cfg_.ignore_merges) {
      if (auto id = model_vocab().find(word)) {
        ids.push_back(*id);
        return core::ok_status();
      }
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> symbols, initial_symbols(word));
    apply_merges(symbols);
    ids.insert(ids.end(), symbols.begin(), symbols.end());
    return core::ok_status();
  }

  // One symbol per char; chars missing from the vocab become unk_token, or
  // are dropped when there is none (HF's behaviour).
  core::Result<std::vector<int64_t>> initial_symbols(const std::string& word) const {
    std::vector<int64_t> symbols;
    bool last_unk = false;
    for (size_t pos = 0; pos < word.size();) {
      const size_t len = next_utf8(word, pos).len;
      std::string symbol = (pos > 0 ? cfg_.prefix : std::string()) + word.substr(pos, len);
      pos += len;
      if (pos == word.size()) symbol += cfg_.suffix;
      if (auto id = model_vocab().find(symbol)) {
        symbols.push_back(*id);
        last_unk = false;
      } else if (cfg_.unk_token) {
        if (!unk_id_) return core::not_found("BPE unk_token '" + *cfg_.unk_token + "' is not in the vocabulary");
        if (!(cfg_.fuse_unk && last_unk)) symbols.push_back(*unk_id_);
        last_unk = true;
      }
    }
    return symbols;
  }

  void apply_merges(std::vector<int64_t>& symbols) const { MergeWord(symbols, merges_).run(); }

  BpeConfig cfg_;
  MergeMap merges_;
  std::optional<int64_t> unk_id_;
};

core::Result<MergeMap> build_merges(const MergeList& list, const Vocab& vocab, const std::string& prefix) {
  MergeMap merges;
  for (size_t rank = 0; rank < list.size(); ++rank) {
    const auto& [left, right] = list[rank];
    // The merged token drops the right side's continuation prefix.
    const std::string_view tail = (!prefix.empty() && right.starts_with(prefix))
                                      ? std::string_view(right).substr(prefix.size())
                                      : std::string_view(right);
    const auto a = vocab.find(left), b = vocab.find(right), merged = vocab.find(left + std::string(tail));
    if (!a || !b || !merged) {
      return core::parse_error("merge " + std::to_string(rank + 1) + " ('" + left + " " + right +
                               "') uses a token missing from the vocabulary");
    }
    merges.insert_or_assign(pair_key(*a, *b), Merge{rank, *merged});  // a repeated pair keeps its last rank, like HF
  }
  return merges;
}

core::Result<std::unique_ptr<Tokenizer>> make_bpe(TokenizerParts parts, BpeConfig cfg, const MergeList& list) {
  TESSERA_ASSIGN_OR_RETURN(auto merges, build_merges(list, parts.vocab, cfg.prefix));
  return std::unique_ptr<Tokenizer>(
      std::make_unique<BpeTokenizer>(std::move(parts), std::move(cfg), std::move(merges)));
}

// "a b" strings or ["a", "b"] pairs.
core::Result<MergeList> merges_from_json(const Json& model) {
  const auto it = model.find("merges");
  if (it == model.end() || !it->is_array()) return core::parse_error("model.merges must be an array");
  MergeList list;
  for (const Json& m : *it) {
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      list.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      continue;
    }
    const std::string s = m.is_string() ? m.get<std::string>() : std::string();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return core::parse_error("merge " + std::to_string(list.size() + 1) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    list.emplace_back(s.substr(0, space), s.substr(space + 1));
  }
  return list;
}

core::Status parse_model_config(const Json& model, BpeConfig& cfg) {
  TESSERA_ASSIGN_OR_RETURN(cfg.unk_token, json_opt_string(model, "unk_token"));
  TESSERA_ASSIGN_OR_RETURN(cfg.prefix, json_string(model, "continuing_subword_prefix", ""));
  TESSERA_ASSIGN_OR_RETURN(cfg.suffix, json_string(model, "end_of_word_suffix", ""));
  TESSERA_ASSIGN_OR_RETURN(cfg.fuse_unk, json_bool(model, "fuse_unk", false));
  TESSERA_ASSIGN_OR_RETURN(cfg.ignore_merges, json_bool(model, "ignore_merges", false));
  TESSERA_ASSIGN_OR_RETURN(bool byte_fallback, json_bool(model, "byte_fallback", false));
  if (byte_fallback) return core::unimplemented("BPE byte_fallback is not supported");
  return core::ok_status();  // dropout is ignored: it only matters for training
}

core::Status parse_pre_tokenizer(const Json& root, BpeConfig& cfg) {
  const auto it = root.find("pre_tokenizer");
  cfg.byte_level = it != root.end() && !it->is_null();
  if (!cfg.byte_level) return core::ok_status();
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(*it, "type", ""));
  if (type != "ByteLevel") return core::unimplemented("unsupported pre_tokenizer '" + type + "' for BPE");
  TESSERA_ASSIGN_OR_RETURN(cfg.add_prefix_space, json_bool(*it, "add_prefix_space", true));  // HF's defaults
  TESSERA_ASSIGN_OR_RETURN(cfg.use_regex, json_bool(*it, "use_regex", true));
  return core::ok_status();
}

core::Result<MergeList> read_merges_txt(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
  MergeList list;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.starts_with("#version")) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return core::parse_error(path + ": line " + std::to_string(line_no) + " is not \"a b\"");
    }
    list.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  return list;
}

}  // namespace

std::string decode_byte_level(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    // A token with a char outside the map (an added token, say) is kept as is, as HF does.
    std::string mapped;
    bool all_mapped = true;
    for (size_t pos = 0; pos < token.size() && all_mapped;) {
      const Utf8Step step = next_utf8(token, pos);
      const std::optional<uint8_t> byte = char_to_byte(step.cp);
      all_mapped = step.valid && byte.has_value();
      if (all_mapped) mapped.push_back(static_cast<char>(*byte));
      pos += step.len;
    }
    bytes += all_mapped ? mapped : token;
  }
  return utf8_lossy(bytes);
}

core::Result<std::unique_ptr<Tokenizer>> bpe_from_json(const Json& root) {
  const Json& model = root.at("model");
  TokenizerParts parts;
  TESSERA_ASSIGN_OR_RETURN(parts.vocab, vocab_from_json(model.value("vocab", Json()), "model.vocab"));
  TESSERA_ASSIGN_OR_RETURN(MergeList merges, merges_from_json(model));
  TESSERA_RETURN_IF_ERROR(parse_common(root, parts));
  BpeConfig cfg;
  TESSERA_RETURN_IF_ERROR(parse_model_config(model, cfg));
  TESSERA_RETURN_IF_ERROR(parse_pre_tokenizer(root, cfg));
  return make_bpe(std::move(parts), std::move(cfg), merges);
}

}  // namespace tessera::model::tok

namespace tessera::model {

core::Result<std::unique_ptr<Tokenizer>> load_bpe_vocab_merges(const std::string& vocab_json,
                                                               const std::string& merges_txt) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(vocab_json));
  tok::TokenizerParts parts;
  try {
    TESSERA_ASSIGN_OR_RETURN(parts.vocab, tok::vocab_from_json(tok::Json::parse(text), vocab_json));
  } catch (const tok::Json::exception& e) {
    return core::parse_error(vocab_json + ": " + e.what());
  }
  TESSERA_ASSIGN_OR_RETURN(tok::MergeList merges, tok::read_merges_txt(merges_txt));
  if (auto eos = parts.vocab.find("<|endoftext|>")) {
    parts.added.push_back({.id = *eos, .content = "<|endoftext|>", .special = true});
  }
  parts.decoder.kind = tok::DecoderKind::kByteLevel;
  auto tokenizer = tok::make_bpe(std::move(parts), tok::BpeConfig{}, merges);
  if (!tokenizer.ok()) return tokenizer.status().with_context(merges_txt);
  return tokenizer;
}

}  // namespace tessera::model
