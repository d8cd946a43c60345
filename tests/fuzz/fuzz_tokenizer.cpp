// tokenizer.json loading, and encoding arbitrary bytes (UTF-8 or not) with
// the fixture tokenizers and with any tokenizer.json that loads.
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
  return out;
}

void exercise(const tessera::model::Tokenizer& t, const std::string& input) {
  for (bool special : {false, true}) {
    auto ids = t.encode(input, special);
    if (!ids.ok()) continue;
    (void)t.decode(*ids, true);
    (void)t.id_to_tokens(*ids);
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
    if (t.ok()) exercise(**t, "Hello, world! Ünïcödé 你好 [CLS] 123");
    return 0;
  }
  for (const auto& t : known) exercise(*t, input);
  return 0;
}
