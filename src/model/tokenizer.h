// Text <-> token ids, compatible with Hugging Face `tokenizers` for the two
// families our models use: BERT WordPiece and GPT-2 byte-level BPE.
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
  // Distinct tokens, added tokens included (HF get_vocab_size(true)).
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
};

// Reads <dir>/tokenizer.json; falls back to <dir>/vocab.txt (WordPiece,
// lowercase BERT defaults) or <dir>/vocab.json + <dir>/merges.txt (GPT-2 byte-level BPE).
core::Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& dir);
core::Result<std::unique_ptr<Tokenizer>> load_tokenizer_json(const std::string& path);
// The same from the file's text; `name` labels errors.
core::Result<std::unique_ptr<Tokenizer>> parse_tokenizer_json(const std::string& text, const std::string& name);
// BERT defaults as BertTokenizerFast builds them: BertNormalizer, BertPreTokenizer,
// [PAD]/[UNK]/[CLS]/[SEP]/[MASK] as special tokens and a "[CLS] $A [SEP]" template.
core::Result<std::unique_ptr<Tokenizer>> load_wordpiece_vocab_txt(const std::string& path, bool lowercase = true);
// GPT-2 defaults: ByteLevel pre-tokenizer without prefix space, <|endoftext|> special, no template.
core::Result<std::unique_ptr<Tokenizer>> load_bpe_vocab_merges(const std::string& vocab_json,
                                                               const std::string& merges_txt);

}  // namespace tessera::model
