// GPT-2 byte-level BPE: the GPT-2 split pattern, a reversible byte -> char
// map, then merges applied lowest rank first (leftmost on ties), as HF does.
#include <algorithm>
#include <bit>
#include <array>
#include <cstdio>
#include <memory>
#include <queue>

#include "core/io.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"

namespace tessera::model::tok {
namespace {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

// One pre-tokenizer (Sequences flattened). Words are split further by each
// step in turn, as HF's PreTokenizedString does.
struct PreTokStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace, kDigits, kWhitespaceSplit, kWhitespace };
  Kind kind = Kind::kSplit;
  Pattern pattern;  // Split; ByteLevel's and Whitespace's own regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = true;          // ByteLevel
  char32_t replacement = U'\u2581';  // Metaspace
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = true;               // Metaspace
  bool individual_digits = false;  // Digits
};

struct BpeConfig {
  std::optional<std::string> unk_token;
  std::string prefix;  // continuing_subword_prefix
  std::string suffix;  // end_of_word_suffix
  bool fuse_unk = false;
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool byte_level = false;  // a ByteLevel pre-tokenizer: words are spelled in GPT-2's byte chars
  std::vector<PreTokStep> pre;
};

using MergeList = std::vector<std::pair<std::string, std::string>>;  // in rank order

struct Merge {
  uint32_t rank;
  int32_t id;  // of the merged token (ids are below 2^31)
};

// Pair key -> merge, open addressing (looked up for every adjacent pair while encoding).
class MergeMap {
 public:
  void reserve(size_t n) {
    size_t want = 16;
    while (want < 2 * n) want *= 2;
    if (want <= slots_.size()) return;
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(want, Slot{kEmpty, {}});
    shift_ = 64 - static_cast<int>(std::countr_zero(want));
    for (const Slot& s : old) {
      if (s.key != kEmpty) insert_or_assign(s.key, s.merge);
    }
  }
  void insert_or_assign(uint64_t key, Merge merge) {
    if (2 * (count_ + 1) > slots_.size()) reserve(std::max<size_t>(16, 2 * count_ + 1));
    Slot& s = slots_[slot_of(key)];
    if (s.key == kEmpty) ++count_;
    s = {key, merge};
  }
  const Merge* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    const Slot& s = slots_[slot_of(key)];
    return s.key == kEmpty ? nullptr : &s.merge;
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // pair keys stay below 2^63
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  size_t slot_of(uint64_t key) const {
    const size_t mask = slots_.size() - 1;
    for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;; i = (i + 1) & mask) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) return i;
    }
  }
  std::vector<Slot> slots_;
  size_t count_ = 0;
  int shift_ = 60;
};

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
    if (const Merge* m = merges_.find(pair_key(a, b))) queue_.push({m->rank, left, a, b, m->id});
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

// GPT-2's split pattern, which ByteLevel applies when use_regex is set.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

core::Result<Pattern> regex_pattern(const char* pattern) {
  Pattern p;
  TESSERA_ASSIGN_OR_RETURN(p.regex, Regex::compile(pattern));
  return p;
}

// HF's split by behavior: `spans` are the pattern's matches in `word`.
void split_word(std::u32string_view word, const std::vector<Span>& matches, SplitBehavior behavior, bool invert,
                std::vector<std::u32string>& out) {
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  size_t prev = 0;
  for (const Span& m : matches) {
    if (m.begin > prev) parts.push_back({prev, m.begin, invert});
    parts.push_back({m.begin, m.end, !invert});
    prev = m.end;
  }
  if (prev < word.size()) parts.push_back({prev, word.size(), invert});
  std::vector<Span> kept;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) kept.push_back({p.begin, p.end});
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) kept.push_back({p.begin, p.end});
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !kept.empty()) {
          kept.back().end = p.end;
        } else {
          kept.push_back({p.begin, p.end});
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t i = parts.size(); i-- > 0;) {
        const Part& p = parts[i];
        if (p.is_match && !previous_match && !kept.empty()) {
          kept.back().begin = p.begin;
        } else {
          kept.push_back({p.begin, p.end});
        }
        previous_match = p.is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0 && parts[i].is_match == previous_match) {
          kept.back().end = parts[i].end;
        } else {
          kept.push_back({parts[i].begin, parts[i].end});
        }
        previous_match = parts[i].is_match;
      }
      break;
  }
  for (const Span& k : kept) {
    if (k.end > k.begin) out.emplace_back(word.substr(k.begin, k.end - k.begin));
  }
}

// Chars of a class as matches (Digits, WhitespaceSplit).
std::vector<Span> class_matches(std::u32string_view word, bool (*in_class)(char32_t), bool runs) {
  std::vector<Span> out;
  for (size_t i = 0; i < word.size();) {
    if (!in_class(word[i])) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (runs && end < word.size() && in_class(word[end])) ++end;
    out.push_back({i, end});
    i = end;
  }
  return out;
}

// Applies one pre-tokenizer to every word; `first`: words[0] starts the input.
core::Status pre_tokenize_step(const PreTokStep& step, bool first, std::vector<std::u32string>& words) {
  std::vector<std::u32string> out;
  out.reserve(words.size());
  std::vector<Span> matches;
  for (size_t w = 0; w < words.size(); ++w) {
    std::u32string& word = words[w];
    matches.clear();
    switch (step.kind) {
      case PreTokStep::Kind::kSplit:
        TESSERA_RETURN_IF_ERROR(step.pattern.find_all(word, matches));
        split_word(word, matches, step.behavior, step.invert, out);
        break;
      case PreTokStep::Kind::kByteLevel:
        if (step.add_prefix_space && !word.starts_with(U' ')) word.insert(word.begin(), U' ');
        if (!step.use_regex) {
          out.push_back(std::move(word));
          break;
        }
        TESSERA_RETURN_IF_ERROR(step.pattern.find_all(word, matches));
        split_word(word, matches, SplitBehavior::kIsolated, false, out);
        break;
      case PreTokStep::Kind::kMetaspace: {
        for (char32_t& c : word) {
          if (c == U' ') c = step.replacement;
        }
        const bool prepend = step.prepend == PrependScheme::kAlways || (step.prepend == PrependScheme::kFirst && first && w == 0);
        if (prepend && !word.starts_with(step.replacement)) word.insert(word.begin(), step.replacement);
        if (!step.split) {
          out.push_back(std::move(word));
          break;
        }
        for (size_t i = 0; i < word.size(); ++i) {
          if (word[i] == step.replacement) matches.push_back({i, i + 1});
        }
        split_word(word, matches, SplitBehavior::kMergedWithNext, false, out);
        break;
      }
      case PreTokStep::Kind::kDigits:
        split_word(word, class_matches(word, &is_number, !step.individual_digits),
                   step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false, out);
        break;
      case PreTokStep::Kind::kWhitespaceSplit:
        split_word(word, class_matches(word, &is_whitespace, true), SplitBehavior::kRemoved, false, out);
        break;
      case PreTokStep::Kind::kWhitespace:  // \w+|[^\w\s]+ kept, the rest (whitespace) removed
        TESSERA_RETURN_IF_ERROR(step.pattern.find_all(word, matches));
        split_word(word, matches, SplitBehavior::kRemoved, true, out);
        break;
    }
  }
  words.swap(out);
  return core::ok_status();
}

// The bytes spelled with the byte -> char map, as UTF-8.
std::string to_byte_chars(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(byte_to_char()[static_cast<uint8_t>(c)], out);
  return out;
}

// Lowest rank first, leftmost on ties, by scanning: for the short words of
// regex-split text this beats the queue's allocations and gives the same result.
void merge_short_word(std::vector<int64_t>& symbols, const MergeMap& merges) {
  while (symbols.size() > 1) {
    size_t best = 0;
    const Merge* best_merge = nullptr;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const Merge* m = merges.find(pair_key(symbols[i], symbols[i + 1]));
      if (m != nullptr && (best_merge == nullptr || m->rank < best_merge->rank)) best = i, best_merge = m;
    }
    if (best_merge == nullptr) return;
    symbols[best] = best_merge->id;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

class BpeTokenizer final : public TokenizerBase {
 public:
  BpeTokenizer(TokenizerParts parts, BpeConfig cfg, MergeMap merges)
      : TokenizerBase(std::move(parts)), cfg_(std::move(cfg)), merges_(std::move(merges)) {
    if (cfg_.unk_token) unk_id_ = model_vocab().find(*cfg_.unk_token);
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      append_utf8(byte_to_char()[b], ch);
      byte_char_ids_[b] = model_vocab().find(ch).value_or(-1);
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      byte_fallback_ids_[b] = model_vocab().find(name).value_or(-1);
    }
  }

 private:
  core::Status encode_piece(std::u32string_view piece, bool first, std::vector<int64_t>& ids) const override {
    std::vector<std::u32string> words{std::u32string(piece)};
    for (const PreTokStep& step : cfg_.pre) TESSERA_RETURN_IF_ERROR(pre_tokenize_step(step, first, words));
    std::string bytes;
    for (const std::u32string& word : words) {
      bytes.clear();
      for (char32_t c : word) append_utf8(c, bytes);
      TESSERA_RETURN_IF_ERROR(cfg_.byte_level ? encode_byte_word(bytes, ids) : encode_word(bytes, ids));
    }
    return core::ok_status();
  }

  // A byte-level word: one symbol per byte (its mapped char's id), then merges.
  core::Status encode_byte_word(const std::string& bytes, std::vector<int64_t>& ids) const {
    if (!cfg_.prefix.empty() || !cfg_.suffix.empty()) return encode_word(to_byte_chars(bytes), ids);
    if (cfg_.ignore_merges) {
      if (auto id = model_vocab().find(to_byte_chars(bytes))) {
        ids.push_back(*id);
        return core::ok_status();
      }
    }
    std::vector<int64_t> symbols;
    symbols.reserve(bytes.size());
    for (char c : bytes) {
      const int64_t id = byte_char_ids_[static_cast<uint8_t>(c)];
      if (id < 0) return encode_word(to_byte_chars(bytes), ids);  // a vocab without every byte: the general path
      symbols.push_back(id);
    }
    apply_merges(symbols);
    ids.insert(ids.end(), symbols.begin(), symbols.end());
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

  // One symbol per char; a char missing from the vocab becomes its <0xNN>
  // byte tokens (byte_fallback, when all exist), else unk_token (fused when
  // fuse_unk), else is dropped: HF's BPE::merge_word.
  core::Result<std::vector<int64_t>> initial_symbols(const std::string& word) const {
    std::vector<int64_t> symbols;
    bool last_unk = false;
    for (size_t pos = 0; pos < word.size();) {
      const size_t len = next_utf8(word, pos).len;
      const std::string_view ch = std::string_view(word).substr(pos, len);
      std::string symbol = (pos > 0 ? cfg_.prefix : std::string()) + std::string(ch);
      pos += len;
      if (pos == word.size()) symbol += cfg_.suffix;
      if (auto id = model_vocab().find(symbol)) {
        symbols.push_back(*id);
        last_unk = false;
        continue;
      }
      if (cfg_.byte_fallback) {
        bool all = true;
        for (char c : ch) all = all && byte_fallback_ids_[static_cast<uint8_t>(c)] >= 0;
        if (all) {
          for (char c : ch) symbols.push_back(byte_fallback_ids_[static_cast<uint8_t>(c)]);
          last_unk = false;
          continue;
        }
      }
      if (cfg_.unk_token) {
        if (!unk_id_) return core::not_found("BPE unk_token '" + *cfg_.unk_token + "' is not in the vocabulary");
        if (!(cfg_.fuse_unk && last_unk)) symbols.push_back(*unk_id_);
        last_unk = true;
      }
    }
    return symbols;
  }

  void apply_merges(std::vector<int64_t>& symbols) const {
    if (symbols.size() <= 24) {
      merge_short_word(symbols, merges_);
    } else {
      MergeWord(symbols, merges_).run();
    }
  }

  BpeConfig cfg_;
  MergeMap merges_;
  std::optional<int64_t> unk_id_;
  std::array<int64_t, 256> byte_char_ids_{};      // byte-level: id of each byte's mapped char
  std::array<int64_t, 256> byte_fallback_ids_{};  // id of <0xNN>, or -1
};

core::Result<MergeMap> build_merges(const MergeList& list, const Vocab& vocab, const std::string& prefix) {
  MergeMap merges;
  merges.reserve(list.size());
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
    merges.insert_or_assign(pair_key(*a, *b), Merge{static_cast<uint32_t>(rank), static_cast<int32_t>(*merged)});  // a repeated pair keeps its last rank, like HF
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
  TESSERA_ASSIGN_OR_RETURN(cfg.byte_fallback, json_bool(model, "byte_fallback", false));
  return core::ok_status();  // dropout is ignored: it only matters for training
}

core::Result<SplitBehavior> parse_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return core::unimplemented("unsupported Split behavior '" + name + "'");
}

constexpr int kMaxPreTokNesting = 16;

core::Status parse_pre_tokenizer(const Json& j, BpeConfig& cfg, int depth = 0) {
  if (depth > kMaxPreTokNesting) return core::parse_error("pre_tokenizer Sequences nest too deep");
  TESSERA_ASSIGN_OR_RETURN(std::string type, json_string(j, "type", ""));
  if (type == "Sequence") {
    const auto list = j.find("pretokenizers");
    if (list == j.end() || !list->is_array()) return core::parse_error("\"pretokenizers\" must be an array");
    for (const Json& item : *list) TESSERA_RETURN_IF_ERROR(parse_pre_tokenizer(item, cfg, depth + 1));
    return core::ok_status();
  }
  // Later steps would see GPT-2's byte chars, which we only spell inside the model.
  if (cfg.byte_level) return core::unimplemented("pre_tokenizer '" + type + "' after ByteLevel is not supported");
  PreTokStep step;
  using Kind = PreTokStep::Kind;
  if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    TESSERA_ASSIGN_OR_RETURN(step.add_prefix_space, json_bool(j, "add_prefix_space", true));  // HF's defaults
    TESSERA_ASSIGN_OR_RETURN(step.use_regex, json_bool(j, "use_regex", true));
    if (step.use_regex) {
      TESSERA_ASSIGN_OR_RETURN(step.pattern, regex_pattern(kGpt2Pattern));
    }
    cfg.byte_level = true;
  } else if (type == "Split") {
    step.kind = Kind::kSplit;
    const auto pattern = j.find("pattern");
    if (pattern == j.end() || !pattern->is_object()) return core::parse_error("Split needs a \"pattern\" object");
    TESSERA_ASSIGN_OR_RETURN(step.pattern, parse_pattern(*pattern));
    TESSERA_ASSIGN_OR_RETURN(std::string behavior, json_string(j, "behavior", "Isolated"));
    TESSERA_ASSIGN_OR_RETURN(step.behavior, parse_behavior(behavior));
    TESSERA_ASSIGN_OR_RETURN(step.invert, json_bool(j, "invert", false));
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    TESSERA_ASSIGN_OR_RETURN(std::string replacement, json_string(j, "replacement", "\u2581"));
    TESSERA_ASSIGN_OR_RETURN(std::u32string rep, utf8_to_u32(replacement));
    if (rep.size() != 1) return core::parse_error("Metaspace replacement must be one character");
    step.replacement = rep[0];
    TESSERA_ASSIGN_OR_RETURN(bool add_prefix_space, json_bool(j, "add_prefix_space", true));  // older files
    TESSERA_ASSIGN_OR_RETURN(std::string scheme, json_string(j, "prepend_scheme", add_prefix_space ? "always" : "never"));
    if (scheme == "always") {
      step.prepend = PrependScheme::kAlways;
    } else if (scheme == "first") {
      step.prepend = PrependScheme::kFirst;
    } else if (scheme == "never") {
      step.prepend = PrependScheme::kNever;
    } else {
      return core::unimplemented("unsupported Metaspace prepend_scheme '" + scheme + "'");
    }
    TESSERA_ASSIGN_OR_RETURN(step.split, json_bool(j, "split", true));
  } else if (type == "Digits") {
    step.kind = Kind::kDigits;
    TESSERA_ASSIGN_OR_RETURN(step.individual_digits, json_bool(j, "individual_digits", false));
  } else if (type == "WhitespaceSplit") {
    step.kind = Kind::kWhitespaceSplit;
  } else if (type == "Whitespace") {
    step.kind = Kind::kWhitespace;
    TESSERA_ASSIGN_OR_RETURN(step.pattern, regex_pattern(R"(\w+|[^\w\s]+)"));
  } else {
    return core::unimplemented("unsupported pre_tokenizer type '" + type + "'");
  }
  cfg.pre.push_back(std::move(step));
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

std::string decode_byte_level(const std::vector<std::string>& tokens, bool raw) {
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
  return raw ? bytes : utf8_lossy(bytes);
}

core::Result<std::unique_ptr<Tokenizer>> bpe_from_json(const Json& root, const Json* config,
                                                       StreamedModel* streamed) {
  const Json& model = root.at("model");
  TokenizerParts parts;
  MergeList merges;
  if (streamed != nullptr && streamed->has_vocab) {
    parts.vocab = std::move(streamed->vocab);
  } else {
    TESSERA_ASSIGN_OR_RETURN(parts.vocab, vocab_from_json(model.value("vocab", Json()), "model.vocab"));
  }
  if (streamed != nullptr && streamed->has_merges) {
    merges = std::move(streamed->merges);
  } else {
    TESSERA_ASSIGN_OR_RETURN(merges, merges_from_json(model));
  }
  TESSERA_RETURN_IF_ERROR(parse_common(root, config, parts));
  BpeConfig cfg;
  TESSERA_RETURN_IF_ERROR(parse_model_config(model, cfg));
  const auto pre = root.find("pre_tokenizer");
  if (pre != root.end() && !pre->is_null()) TESSERA_RETURN_IF_ERROR(parse_pre_tokenizer(*pre, cfg));
  return make_bpe(std::move(parts), std::move(cfg), merges);
}

}  // namespace tessera::model::tok

namespace tessera::model {

core::Result<std::unique_ptr<Tokenizer>> load_bpe_vocab_merges(const std::string& vocab_json,
                                                               const std::string& merges_txt,
                                                               const std::string* config_text) {
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
  if (config_text != nullptr) {
    const tok::Json config = tok::Json::parse(*config_text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) return core::parse_error("tokenizer_config.json: not a JSON object");
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      const auto t = tok::config_token(&config, key);
      if (!t) continue;
      const auto id = parts.vocab.find(*t);
      if (!id) continue;
      const bool known = std::any_of(parts.added.begin(), parts.added.end(), [&](const auto& a) { return a.id == *id; });
      if (!known) parts.added.push_back({.id = *id, .content = *t, .special = true});
    }
    parts.bos_token = tok::config_token(&config, "bos_token");
    parts.eos_token = tok::config_token(&config, "eos_token");
    TESSERA_ASSIGN_OR_RETURN(const bool add_bos, tok::json_bool(config, "add_bos_token", false));
    if (add_bos && parts.bos_token) {
      if (const auto bos = parts.vocab.find(*parts.bos_token)) parts.template_prefix = {*bos};
    }
  }
  parts.decoder.steps.emplace_back();  // a default step is ByteLevel
  tok::BpeConfig cfg;  // GPT-2: ByteLevel without prefix space, with its regex
  tok::PreTokStep byte_level;
  byte_level.kind = tok::PreTokStep::Kind::kByteLevel;
  TESSERA_ASSIGN_OR_RETURN(byte_level.pattern, tok::regex_pattern(tok::kGpt2Pattern));
  cfg.pre.push_back(std::move(byte_level));
  cfg.byte_level = true;
  auto tokenizer = tok::make_bpe(std::move(parts), std::move(cfg), merges);
  if (!tokenizer.ok()) return tokenizer.status().with_context(merges_txt);
  return tokenizer;
}

}  // namespace tessera::model
