// BERT WordPiece: BertPreTokenizer + greedy longest-match-first subwords.
#include <memory>

#include "core/io.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"

namespace tessera::model::tok {
namespace {

struct WordPieceConfig {
  std::string unk_token = "[UNK]";
  std::string prefix = "##";
  size_t max_input_chars_per_word = 100;
  bool split_words = true;  // BertPreTokenizer; false when the file has no pre_tokenizer
};

// BertPreTokenizer: whitespace separates words and each punctuation char is a word.
std::vector<std::u32string_view> bert_pre_tokenize(std::u32string_view text) {
  std::vector<std::u32string_view> words;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool space = is_whitespace(text[i]);
    if (!space && !is_punctuation(text[i])) continue;
    if (i > start) words.push_back(text.substr(start, i - start));
    if (!space) words.push_back(text.substr(i, 1));
    start = i + 1;
  }
  if (start < text.size()) words.push_back(text.substr(start));
  return words;
}

class WordPieceTokenizer final : public TokenizerBase {
 public:
  WordPieceTokenizer(TokenizerParts parts, WordPieceConfig cfg)
      : TokenizerBase(std::move(parts)), cfg_(std::move(cfg)), unk_id_(model_vocab().find(cfg_.unk_token)) {}

 private:
  core::Status encode_piece(std::u32string_view piece, bool /*first*/, std::vector<int64_t>& ids) const override {
    if (!cfg_.split_words) return encode_word(piece, ids);
    for (std::u32string_view word : bert_pre_tokenize(piece)) TESSERA_RETURN_IF_ERROR(encode_word(word, ids));
    return core::ok_status();
  }

  core::Status push_unk(std::vector<int64_t>& ids) const {
    if (!unk_id_) return core::not_found("WordPiece unk_token '" + cfg_.unk_token + "' is not in the vocabulary");
    ids.push_back(*unk_id_);
    return core::ok_status();
  }

  // Longest vocab entry starting at each position; the whole word is [UNK] if any position fails.
  core::Status encode_word(std::u32string_view word, std::vector<int64_t>& ids) const {
    if (word.size() > cfg_.max_input_chars_per_word) return push_unk(ids);
    std::vector<size_t> offsets;  // byte offset of each char in `utf8`, plus the end
    std::string utf8;
    for (char32_t c : word) {
      offsets.push_back(utf8.size());
      append_utf8(c, utf8);
    }
    offsets.push_back(utf8.size());
    std::vector<int64_t> pieces;
    std::string candidate;
    for (size_t start = 0; start < word.size();) {
      std::optional<int64_t> id;
      size_t end = word.size();
      for (; end > start; --end) {
        candidate = start > 0 ? cfg_.prefix : "";
        candidate.append(utf8, offsets[start], offsets[end] - offsets[start]);
        if ((id = model_vocab().find(candidate))) break;
      }
      if (!id) return push_unk(ids);
      pieces.push_back(*id);
      start = end;
    }
    ids.insert(ids.end(), pieces.begin(), pieces.end());
    return core::ok_status();
  }

  WordPieceConfig cfg_;
  std::optional<int64_t> unk_id_;
};

core::Result<WordPieceConfig> wordpiece_config(const Json& root) {
  const Json& model = root.at("model");
  WordPieceConfig cfg;
  TESSERA_ASSIGN_OR_RETURN(cfg.unk_token, json_string(model, "unk_token", "[UNK]"));
  TESSERA_ASSIGN_OR_RETURN(cfg.prefix, json_string(model, "continuing_subword_prefix", "##"));
  TESSERA_ASSIGN_OR_RETURN(int64_t max_chars, json_int(model, "max_input_chars_per_word", 100));
  if (max_chars < 0) return core::parse_error("max_input_chars_per_word must not be negative");
  cfg.max_input_chars_per_word = static_cast<size_t>(max_chars);
  const auto pre = root.find("pre_tokenizer");
  cfg.split_words = pre != root.end() && !pre->is_null();
  if (!cfg.split_words) return cfg;
  TESSERA_ASSIGN_OR_RETURN(const std::string pre_type, json_string(*pre, "type", ""));
  if (pre_type != "BertPreTokenizer")
    return core::unimplemented("unsupported pre_tokenizer '" + pre_type + "' for WordPiece");
  return cfg;
}

}  // namespace

namespace {

// HF's WordPiece decoder cleanup: drops the space before punctuation and contractions.
std::string cleanup_tokenization(std::string text) {
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},           {" !", "!"},   {" ,", ","},     {" ' ", "'"},   {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
  }
  return text;
}

}  // namespace

std::string decode_wordpiece(const std::vector<std::string>& tokens, const std::string& prefix, bool cleanup) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& raw = tokens[i];
    std::string token = i == 0 ? raw : raw.starts_with(prefix) ? raw.substr(prefix.size()) : " " + raw;
    out += cleanup ? cleanup_tokenization(std::move(token)) : token;  // per token, as HF does
  }
  return out;
}

core::Result<std::unique_ptr<Tokenizer>> wordpiece_from_json(const Json& root, const Json* config,
                                                             StreamedModel* streamed) {
  TokenizerParts parts;
  if (streamed != nullptr && streamed->has_vocab) {
    parts.vocab = std::move(streamed->vocab);
  } else {
    TESSERA_ASSIGN_OR_RETURN(parts.vocab, vocab_from_json(root.at("model").value("vocab", Json()), "model.vocab"));
  }
  TESSERA_RETURN_IF_ERROR(parse_common(root, config, parts));
  TESSERA_ASSIGN_OR_RETURN(WordPieceConfig cfg, wordpiece_config(root));
  return std::unique_ptr<Tokenizer>(std::make_unique<WordPieceTokenizer>(std::move(parts), std::move(cfg)));
}

}  // namespace tessera::model::tok

namespace tessera::model {

core::Result<std::unique_ptr<Tokenizer>> load_wordpiece_vocab_txt(const std::string& path, bool lowercase) {
  TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
  tok::TokenizerParts parts;
  int64_t id = 0;
  for (size_t pos = 0; pos < text.size(); ++id) {  // one token per line; the id is the line number
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    if (!tok::utf8_to_u32(line).ok())
      return core::parse_error(path + ": line " + std::to_string(id + 1) + " is not UTF-8");
    parts.vocab.add(line, id);
    pos = end + 1;
  }
  if (parts.vocab.empty()) return core::parse_error(path + ": empty vocabulary");
  for (const char* special : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    if (auto special_id = parts.vocab.find(special)) {
      parts.added.push_back({.id = *special_id, .content = special, .special = true});
    }
  }
  const auto cls = parts.vocab.find("[CLS]"), sep = parts.vocab.find("[SEP]");
  if (cls && sep) parts.template_prefix = {*cls}, parts.template_suffix = {*sep};
  tok::NormalizerStep bert;
  bert.bert = {.clean_text = true, .handle_chinese_chars = true, .strip_accents = lowercase, .lowercase = lowercase};
  parts.normalizer.steps.push_back(std::move(bert));
  tok::DecoderStep decoder;
  decoder.kind = tok::DecoderStep::Kind::kWordPiece;
  parts.decoder.steps.push_back(std::move(decoder));
  return std::unique_ptr<Tokenizer>(
      std::make_unique<tok::WordPieceTokenizer>(std::move(parts), tok::WordPieceConfig{}));
}

}  // namespace tessera::model
