// tokenizer.json loading, and encoding arbitrary bytes (UTF-8 or not) with
// the fixture tokenizers, with two built-in ones that use the Llama 3 / Qwen
// Split regex (PCRE2) + ByteLevel and the SentencePiece style (Prepend,
// Replace, byte fallback, Metaspace, ByteFallback/Fuse/Strip decoders), and
// with any tokenizer.json that loads; decoding streams through StreamDecoder.
#include <memory>
#include <vector>

#include "fuzz_util.h"
#include "model/tokenizer.h"

namespace {

std::vector<std::unique_ptr<tessera::model::Tokenizer>> fixtures() {
  std::vector<std::unique_ptr<tessera::model::Tokenizer>> out;
  for (const char* d : {"/tokenizers/wordpiece", "/tokenizers/bytelevel_bpe"}) {
    auto t = tessera::model::load_tokenizer(std::string(TESSERA_TEST_DATA) + d);
    if (t.ok()) out.push_back(std::move(t).value());
  }
  // Small vocabularies: what matters is reaching every pre-tokenizer, normalizer and decoder.
  const char* split_bytelevel = R"({"model": {"type": "BPE", "ignore_merges": true,
    "vocab": {"a": 0, "b": 1, "\u0120": 2, "ab": 3, "\u0120a": 4, "<|x|>": 5},
    "merges": ["a b", "\u0120 a"]},
    "added_tokens": [{"id": 5, "content": "<|x|>", "special": true}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
      {"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
    "decoder": {"type": "ByteLevel"}})";
  const char* sentencepiece = R"({"model": {"type": "BPE", "byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>",
    "vocab": {"<unk>": 0, "<s>": 1, "\u2581": 2, "a": 3, "\u2581a": 4, "<0xC3>": 5, "<0xA9>": 6, "<0xF0>": 7, "<0x9F>": 8},
    "merges": ["\u2581 a"]},
    "added_tokens": [{"id": 1, "content": "<s>", "special": true, "lstrip": true, "rstrip": true}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"Regex": " +"}, "content": "\u2581"}, {"type": "Strip", "strip_left": false, "strip_right": true}]},
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0},
      {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"}]}})";
  for (const char* text : {split_bytelevel, sentencepiece}) {
    auto t = tessera::model::parse_tokenizer_json(text, "fuzz-builtin");
    if (t.ok()) out.push_back(std::move(t).value());
  }
  return out;
}

void exercise(const tessera::model::Tokenizer& t, const std::string& input) {
  for (bool special : {false, true}) {
    auto ids = t.encode(input, special);
    if (!ids.ok()) continue;
    (void)t.decode(*ids, true);
    (void)t.id_to_tokens(*ids);
    tessera::model::StreamDecoder stream(t, !special);
    for (int64_t id : *ids) (void)stream.step(id);
    (void)stream.flush();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  static const auto known = fixtures();
  const std::string input = tessera::fuzz::text(data, size);
  if (!input.empty() && input[0] == '{') {
    auto t = tessera::model::parse_tokenizer_json(input, "fuzz");
    if (t.ok()) exercise(**t, "Hello, world! Ünïcödé 你好 [CLS] 123 I'M  \t\n 🤷🏽\u200d♀️ e\u0301 <s>");
    return 0;
  }
  for (const auto& t : known) exercise(*t, input);
  return 0;
}
