// Text <-> token ids, compatible with Hugging Face `tokenizers`: BERT
// WordPiece, GPT-2 byte-level BPE, tiktoken-style BPE with regex Split
// pre-tokenizers (Llama 3, Qwen2/3, DeepSeek-V3) and SentencePiece-style BPE
// with byte fallback (Llama 2, Mistral, Gemma).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tessera::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text -> ids. add_special_tokens applies the post-processor template when
  // the tokenizer has one (e.g. [CLS] ... [SEP]); otherwise nothing is added.
  // Text that is not valid UTF-8 is an invalid_argument error.
  virtual core::Result<std::vector<int64_t>> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  // The token strings for ids (as the vocab spells them); an unknown id is an error.
  virtual core::Result<std::vector<std::string>> id_to_tokens(const std::vector<int64_t>& ids) const = 0;
  // Ids -> text (WordPiece: joins with spaces and merges "##" continuations,
  // HF cleanup; BPE: byte-level decode back to UTF-8). skip_special drops
  // special tokens; unknown ids are skipped, as HF does.
  virtual core::Result<std::string> decode(const std::vector<int64_t>& ids, bool skip_special = true) const = 0;
  // The same bytes, except that bytes which are no UTF-8 stay as they are
  // where decode writes U+FFFD: the raw bytes of a token that holds part of a
  // character (a log-probability's "bytes"). Not always valid UTF-8.
  virtual core::Result<std::string> decode_bytes(const std::vector<int64_t>& ids, bool skip_special = true) const {
    return decode(ids, skip_special);
  }
  // Distinct tokens, added tokens included (HF get_vocab_size(true)).
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
  // tokenizer_config.json's bos_token / eos_token, when the directory has one naming a known token.
  virtual std::optional<int64_t> bos_id() const { return std::nullopt; }
  virtual std::optional<int64_t> eos_id() const { return std::nullopt; }
  // An added token marked "special" (what decode's skip_special drops).
  virtual bool is_special(int64_t /*id*/) const { return false; }
};

// Whether bytes are valid UTF-8 (decode_bytes may give bytes that are not).
bool valid_utf8(std::string_view bytes);

// Streaming detokenisation: ids go in one at a time and only complete UTF-8
// text comes out, so a character split over byte tokens (byte-level BPE or
// <0xNN> byte fallback) is held back until its last byte arrives. The
// concatenated output equals decode(all ids) (HF's DecodeStream algorithm:
// the text of a few previous ids is decoded along, so decoders that look at
// neighbours, such as Metaspace's leading space, see the same context).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  // The new complete text after `id` (often empty); an unknown id is skipped, as decode does.
  core::Result<std::string> step(int64_t id);
  // Whatever is held back (an incomplete character becomes U+FFFD); resets the stream.
  core::Result<std::string> flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int64_t> ids_;  // context ids already emitted, then pending ones
  std::string prefix_;        // decode of the context ids alone
  size_t prefix_index_ = 0;   // how many of ids_ are context
};

// Reads <dir>/tokenizer.json (and <dir>/tokenizer_config.json for the BOS/EOS
// tokens when present); falls back to <dir>/vocab.txt (WordPiece,
// lowercase BERT defaults) or <dir>/vocab.json + <dir>/merges.txt (GPT-2 byte-level BPE).
core::Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir);
core::Result<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::string& path);
// The same from the file's text; `name` labels errors.
core::Result<std::unique_ptr<Tokenizer>> parse_tokenizer_json(const std::string& text, const std::string& name);
// The same with tokenizer_config.json's text (null: none), for the BOS/EOS tokens.
core::Result<std::unique_ptr<Tokenizer>> parse_tokenizer_json(const std::string& text, const std::string& name,
                                                              const std::string* config_text);
// BERT defaults as BertTokenizerFast builds them: BertNormalizer, BertPreTokenizer,
// [PAD]/[UNK]/[CLS]/[SEP]/[MASK] as special tokens and a "[CLS] $A [SEP]" template.
core::Result<std::unique_ptr<Tokenizer>> load_wordpiece_vocab_txt(const std::string& path, bool lowercase = true);
// GPT-2 defaults: ByteLevel pre-tokenizer without prefix space, <|endoftext|> special, no template.
// With tokenizer_config.json's text (OPT's): its bos/eos/unk/pad tokens are
// special, and add_bos_token puts the BOS first, as GPT2TokenizerFast does.
core::Result<std::unique_ptr<Tokenizer>> load_bpe_vocab_merges(const std::string& vocab_json,
                                                               const std::string& merges_txt,
                                                               const std::string* config_text = nullptr);

}  // namespace tessera::model
