// Tokenizers against the ids and tokens Hugging Face `tokenizers` produced
// for tests/data/tokenizers/expected.json, plus templates and error paths.
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/io.h"
#include "model/tokenizer_impl.h"

namespace tessera::model {
namespace {

using nlohmann::json;

const std::string kDir = std::string(TESSERA_TEST_DATA) + "/tokenizers";

struct Case {
  std::string text;
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;
};

std::vector<Case> load_cases(const std::string& family) {
  const auto text = core::read_file(kDir + "/expected.json");
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  const json all = json::parse(text.value());
  std::vector<Case> cases;
  for (const json& c : all.at(family)) {
    cases.push_back({c.at("text"), c.at("ids"), c.at("tokens")});
  }
  return cases;
}

std::unique_ptr<Tokenizer> must(core::Result<std::unique_ptr<Tokenizer>> r) {
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

struct Source {
  std::string name;
  std::string family;  // key in expected.json
  std::function<core::Result<std::unique_ptr<Tokenizer>>()> load;
  bool has_template;  // the vocab.txt fallback wraps in [CLS] ... [SEP], like BertTokenizerFast
};

void PrintTo(const Source& src, std::ostream* os) { *os << src.name; }

class ExpectedCases : public ::testing::TestWithParam<Source> {};

TEST_P(ExpectedCases, IdsAndTokensMatchHuggingFace) {
  const Source& src = GetParam();
  auto tokenizer = must(src.load());
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->vocab_size(), 512);
  const auto cases = load_cases(src.family);
  ASSERT_EQ(cases.size(), 15u);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    auto ids = tokenizer->encode(c.text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_EQ(ids.value(), c.ids);
    auto tokens = tokenizer->id_to_tokens(ids.value());
    ASSERT_TRUE(tokens.ok()) << tokens.status().to_string();
    EXPECT_EQ(tokens.value(), c.tokens);

    auto with_special = tokenizer->encode(c.text);
    ASSERT_TRUE(with_special.ok());
    std::vector<int64_t> want = c.ids;
    if (src.has_template) {
      want.insert(want.begin(), *tokenizer->token_to_id("[CLS]"));
      want.push_back(*tokenizer->token_to_id("[SEP]"));
    }
    EXPECT_EQ(with_special.value(), want);
  }
}

// Byte-level BPE is lossless, so decode(encode(text)) gives the text back.
class BpeRoundTrip : public ::testing::TestWithParam<Source> {};

TEST_P(BpeRoundTrip, DecodeOfEncodeIsIdentity) {
  const Source& src = GetParam();
  auto tokenizer = must(src.load());
  ASSERT_NE(tokenizer, nullptr);
  std::vector<std::string> texts;
  for (const Case& c : load_cases(src.family)) texts.push_back(c.text);
  for (const char* extra : {"a\n\n\nb  c \t", "x's 'LL'd", "e\xCC\x81 combining", "\xC2\xA0nbsp\xE3\x80\x80", " "}) {
    texts.emplace_back(extra);
  }
  for (const std::string& text : texts) {
    auto ids = tokenizer->encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    auto back = tokenizer->decode(ids.value());
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back.value(), text);
  }
}

const Source kWordPieceJson{"WordPieceJson", "wordpiece",
                            [] { return load_tokenizer_json(kDir + "/wordpiece/tokenizer.json"); }, false};
const Source kWordPieceVocabTxt{"WordPieceVocabTxt", "wordpiece",
                                [] { return load_wordpiece_vocab_txt(kDir + "/wordpiece/vocab.txt"); }, true};
const Source kBpeJson{"BpeJson", "bytelevel_bpe", [] { return load_tokenizer(kDir + "/bytelevel_bpe"); }, false};
const Source kBpeVocabMerges{
    "BpeVocabMerges", "bytelevel_bpe",
    [] { return load_bpe_vocab_merges(kDir + "/bytelevel_bpe/vocab.json", kDir + "/bytelevel_bpe/merges.txt"); },
    false};

std::string source_name(const ::testing::TestParamInfo<Source>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(AllSources, ExpectedCases,
                         ::testing::Values(kWordPieceJson, kWordPieceVocabTxt, kBpeJson, kBpeVocabMerges), source_name);
INSTANTIATE_TEST_SUITE_P(BpeSources, BpeRoundTrip, ::testing::Values(kBpeJson, kBpeVocabMerges), source_name);

class TokenizerFiles : public ::testing::Test {
 protected:
  static std::string temp_path(const std::string& name) {
    const std::string dir = ::testing::TempDir() + "tessera_tokenizer_test";
    std::filesystem::create_directories(dir);
    return dir + "/" + name;
  }
  static json wordpiece_json() { return json::parse(core::read_file(kDir + "/wordpiece/tokenizer.json").value()); }
  static core::Result<std::unique_ptr<Tokenizer>> load_modified(const json& j, const std::string& name) {
    const std::string path = temp_path(name);
    EXPECT_TRUE(core::write_file(path, j.dump()).ok());
    return load_tokenizer_json(path);
  }
  // A model directory holding only `files` copied from `from`, so load_tokenizer must fall back.
  static std::string dir_with(const std::string& name, const std::string& from, std::vector<std::string> files) {
    const std::string dir = temp_path(name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    for (const std::string& f : files) std::filesystem::copy_file(from + "/" + f, dir + "/" + f);
    return dir;
  }
};

TEST_F(TokenizerFiles, LoadTokenizerFallsBackToVocabFiles) {
  auto wp = must(load_tokenizer(dir_with("wp_txt", kDir + "/wordpiece", {"vocab.txt"})));
  ASSERT_NE(wp, nullptr);
  EXPECT_EQ(wp->encode("Hello, world!").value(), (std::vector<int64_t>{2, 50, 423, 201, 16, 65, 129, 88, 80, 5, 3}));
  auto bpe = must(load_tokenizer(dir_with("bpe_txt", kDir + "/bytelevel_bpe", {"vocab.json", "merges.txt"})));
  ASSERT_NE(bpe, nullptr);
  EXPECT_EQ(bpe->encode("Hello, world!").value(), (std::vector<int64_t>{40, 69, 76, 364, 12, 314, 265, 76, 68, 1}));
  // With tokenizer_config.json (as OPT ships it): its BOS first when
  // add_bos_token says so, and its tokens special (not split by BPE).
  const std::string opt = dir_with("bpe_opt", kDir + "/bytelevel_bpe", {"vocab.json", "merges.txt"});
  ASSERT_TRUE(core::write_file(opt + "/tokenizer_config.json",
                               R"({"add_bos_token": true, "bos_token": {"content": "<|endoftext|>"}, "eos_token": "<|endoftext|>"})")
                  .ok());
  auto with_bos = must(load_tokenizer(opt));
  ASSERT_NE(with_bos, nullptr);
  EXPECT_EQ(with_bos->encode("Hello, world!").value(), (std::vector<int64_t>{0, 40, 69, 76, 364, 12, 314, 265, 76, 68, 1}));
  EXPECT_EQ(with_bos->encode("Hello, world!", false).value(), (std::vector<int64_t>{40, 69, 76, 364, 12, 314, 265, 76, 68, 1}));
  // A cased BERT (do_lower_case false) keeps its capitals.
  const std::string cased = dir_with("wp_cased", kDir + "/wordpiece", {"vocab.txt"});
  ASSERT_TRUE(core::write_file(cased + "/tokenizer_config.json", R"({"do_lower_case": false})").ok());
  auto wp_cased = must(load_tokenizer(cased));
  ASSERT_NE(wp_cased, nullptr);
  EXPECT_NE(wp_cased->encode("Hello").value(), wp->encode("Hello").value());
  EXPECT_EQ(wp_cased->encode("hello").value(), wp->encode("hello").value());
}

TEST_F(TokenizerFiles, TemplateProcessingAddsClsAndSep) {
  json j = wordpiece_json();
  j["post_processor"] = json::parse(R"({
    "type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
               {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
    "pair": [],
    "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                       "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}})");
  auto tokenizer = must(load_modified(j, "template.json"));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("Hello, world!").value(),
            (std::vector<int64_t>{2, 50, 423, 201, 16, 65, 129, 88, 80, 5, 3}));
  EXPECT_EQ(tokenizer->encode("Hello, world!", false).value(),
            (std::vector<int64_t>{50, 423, 201, 16, 65, 129, 88, 80, 5}));
  EXPECT_EQ(tokenizer->encode("").value(), (std::vector<int64_t>{2, 3}));
  const auto ids = tokenizer->encode("Hello, world!").value();
  EXPECT_EQ(tokenizer->decode(ids).value(), "hello, world!");
  EXPECT_EQ(tokenizer->decode(ids, /*skip_special=*/false).value(), "[CLS] hello, world! [SEP]");
}

TEST_F(TokenizerFiles, BertProcessingAddsClsAndSep) {
  json j = wordpiece_json();
  j["post_processor"] = json::parse(R"({"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]})");
  auto tokenizer = must(load_modified(j, "bert_processing.json"));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("a").value(), (std::vector<int64_t>{2, 43, 3}));
}

TEST_F(TokenizerFiles, SpecialTokensInTextAreMatchedBeforeNormalization) {
  auto wp = must(load_tokenizer_json(kDir + "/wordpiece/tokenizer.json"));
  ASSERT_NE(wp, nullptr);
  EXPECT_EQ(wp->encode("[CLS] a[SEP]").value(), (std::vector<int64_t>{2, 43, 3}));
  // Lowercased it is no longer the special token.
  EXPECT_NE(wp->encode("[cls]").value(), (std::vector<int64_t>{2}));
  auto bpe = must(load_tokenizer_json(kDir + "/bytelevel_bpe/tokenizer.json"));
  ASSERT_NE(bpe, nullptr);
  const auto ids = bpe->encode("a<|endoftext|>a").value();
  EXPECT_EQ(ids, (std::vector<int64_t>{*bpe->token_to_id("a"), 0, *bpe->token_to_id("a")}));
  EXPECT_EQ(bpe->decode(ids).value(), "aa");
  EXPECT_EQ(bpe->decode(ids, /*skip_special=*/false).value(), "a<|endoftext|>a");
}

TEST_F(TokenizerFiles, BpeAddPrefixSpaceFromPreTokenizer) {
  json j = json::parse(core::read_file(kDir + "/bytelevel_bpe/tokenizer.json").value());
  auto plain = must(load_tokenizer_json(kDir + "/bytelevel_bpe/tokenizer.json"));
  j["pre_tokenizer"]["add_prefix_space"] = true;
  auto prefixed = must(load_modified(j, "prefix_space.json"));
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(prefixed, nullptr);
  EXPECT_EQ(prefixed->encode("Hello world").value(), plain->encode(" Hello world").value());
  EXPECT_EQ(prefixed->encode(" Hello").value(), plain->encode(" Hello").value());  // already starts with a space
  EXPECT_EQ(prefixed->encode("").value(), std::vector<int64_t>{});
}

TEST_F(TokenizerFiles, BpeDecodeOfPartialCharacterIsLossy) {
  auto bpe = must(load_tokenizer_json(kDir + "/bytelevel_bpe/tokenizer.json"));
  ASSERT_NE(bpe, nullptr);
  const auto ids = bpe->encode("\u00E9").value();  // two byte tokens
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(bpe->decode({ids[0]}).value(), "\uFFFD");  // as from_utf8_lossy
  EXPECT_EQ(bpe->decode(ids).value(), "\u00E9");
}

// decode_bytes: a token that is part of a character keeps its own bytes,
// where decode writes U+FFFD; whole text decodes as decode does.
TEST_F(TokenizerFiles, BpeDecodeBytesKeepsAPartialCharactersBytes) {
  auto bpe = must(load_tokenizer_json(kDir + "/bytelevel_bpe/tokenizer.json"));
  ASSERT_NE(bpe, nullptr);
  const auto ids = bpe->encode("\u00E9").value();  // C3 A9: two byte tokens
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(bpe->decode_bytes({ids[0]}).value(), "\xC3");
  EXPECT_EQ(bpe->decode_bytes({ids[1]}).value(), "\xA9");
  EXPECT_FALSE(valid_utf8("\xC3"));
  for (const std::string text : {"\u00E9", "Hello world", " caf\u00E9 \U0001F642!"}) {
    const auto all = bpe->encode(text).value();
    EXPECT_EQ(bpe->decode_bytes(all).value(), bpe->decode(all).value()) << text;
    std::string joined;  // byte-level tokens are their bytes, side by side
    for (const int64_t id : all) joined += bpe->decode_bytes({id}).value();
    EXPECT_EQ(joined, text);
    EXPECT_TRUE(valid_utf8(joined));
  }
}

TEST_F(TokenizerFiles, WordPieceDecodeJoinsContinuations) {
  auto tokenizer = must(load_tokenizer_json(kDir + "/wordpiece/tokenizer.json"));
  ASSERT_NE(tokenizer, nullptr);
  const auto ids = tokenizer->encode("Distributed inference, don't stop!").value();
  // HF's cleanup runs per token, so " ' " never matches and "don ' t" stays (tokenizers >= 0.13).
  EXPECT_EQ(tokenizer->decode(ids).value(), "distributed inference, don ' t stop!");
  EXPECT_EQ(tokenizer->decode({}).value(), "");
  EXPECT_EQ(tokenizer->decode({999999, 43}).value(), "a");  // unknown ids are skipped, as in HF
  EXPECT_FALSE(tokenizer->id_to_tokens({999999}).ok());
  EXPECT_EQ(tokenizer->token_to_id("[UNK]"), 1);
  EXPECT_EQ(tokenizer->token_to_id("no-such-token"), std::nullopt);
}

TEST_F(TokenizerFiles, LongWordBecomesUnk) {
  auto tokenizer = must(load_tokenizer_json(kDir + "/wordpiece/tokenizer.json"));
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode(std::string(101, 'a'), false).value(), (std::vector<int64_t>{1}));
  EXPECT_GT(tokenizer->encode(std::string(100, 'a'), false).value().size(), 1u);
}

TEST_F(TokenizerFiles, InvalidUtf8IsAnError) {
  for (const char* dir : {"/wordpiece", "/bytelevel_bpe"}) {
    auto tokenizer = must(load_tokenizer(kDir + dir));
    ASSERT_NE(tokenizer, nullptr);
    for (std::string bad : {"\xFF", "ok \xC3", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "a\x80z"}) {
      auto ids = tokenizer->encode(bad);
      ASSERT_FALSE(ids.ok()) << dir;
      EXPECT_EQ(ids.status().code(), core::ErrorCode::kInvalidArgument);
      EXPECT_NE(ids.status().message().find("UTF-8"), std::string::npos);
    }
  }
}

TEST_F(TokenizerFiles, BadFilesAreErrors) {
  const std::string bad_json = temp_path("bad.json");
  ASSERT_TRUE(core::write_file(bad_json, "{\"model\": {").ok());
  auto r = load_tokenizer_json(bad_json);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), core::ErrorCode::kParseError);

  EXPECT_FALSE(load_tokenizer_json(kDir + "/missing/tokenizer.json").ok());
  EXPECT_FALSE(load_wordpiece_vocab_txt(kDir + "/missing/vocab.txt").ok());
  EXPECT_FALSE(load_bpe_vocab_merges(kDir + "/missing.json", kDir + "/bytelevel_bpe/merges.txt").ok());
  auto none = load_tokenizer(kDir + "/no_such_dir");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), core::ErrorCode::kNotFound);

  json j = wordpiece_json();
  j["model"]["type"] = "Unigram";
  auto unknown = load_modified(j, "unigram.json");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), core::ErrorCode::kUnimplemented);
  EXPECT_NE(unknown.status().message().find("Unigram"), std::string::npos);

  j.erase("model");
  EXPECT_EQ(load_modified(j, "no_model.json").status().code(), core::ErrorCode::kParseError);
  EXPECT_EQ(load_modified(json::array(), "array.json").status().code(), core::ErrorCode::kParseError);

  json bad_vocab = wordpiece_json();
  bad_vocab["model"]["vocab"]["oops"] = "not an id";
  EXPECT_EQ(load_modified(bad_vocab, "bad_vocab.json").status().code(), core::ErrorCode::kParseError);

  json bad_merges = json::parse(core::read_file(kDir + "/bytelevel_bpe/tokenizer.json").value());
  bad_merges["model"]["merges"].push_back(json::array({"zz", "qq"}));
  EXPECT_EQ(load_modified(bad_merges, "bad_merges.json").status().code(), core::ErrorCode::kParseError);
}

TEST(TokenizerUnicode, BertNormalizerStripsAccentsAndLowercases) {
  const tok::NormalizerConfig bert{
      .clean_text = true, .handle_chinese_chars = true, .strip_accents = true, .lowercase = true};
  const auto norm = [&](std::string_view s) {
    return tok::u32_to_utf8(tok::normalize(tok::utf8_to_u32(s).value(), bert));
  };
  EXPECT_EQ(norm("Caf\u00E9 \u00C5NGSTR\u00D6M"), "cafe angstrom");
  EXPECT_EQ(norm("\u0419\u043E\u0433\u0443\u0440\u0442 \u0401"), "\u0438\u043E\u0433\u0443\u0440\u0442 \u0435");
  EXPECT_EQ(norm("\u038A\u03B8\u03AC\u03BA\u03B7 \u1F00"), "\u03B9\u03B8\u03B1\u03BA\u03B7 \u03B1");
  EXPECT_EQ(norm("\u304C\u30D1"), "\u304B\u30CF");  // dakuten are Mn
  EXPECT_EQ(norm("\uD55C"), "\u1112\u1161\u11AB");  // Hangul -> jamo
  EXPECT_EQ(norm("\u0130stanbul"), "istanbul");
  EXPECT_EQ(norm("a\tb\nc\x01\u200B\uFFFDd"), "a b cd");  // controls dropped
  EXPECT_EQ(norm("\u4F60\u597D"), " \u4F60  \u597D ");    // CJK padded
  EXPECT_EQ(norm("e\u0301\u0308"), "e");
  EXPECT_EQ(norm("\u1EC7 \u01D5"), "e u");  // Vietnamese, stacked marks
}

TEST(TokenizerUnicode, CharacterClasses) {
  EXPECT_TRUE(tok::is_letter(U'\u00E9'));
  EXPECT_TRUE(tok::is_letter(U'\u0416'));
  EXPECT_TRUE(tok::is_letter(U'\u4E2D'));
  EXPECT_TRUE(tok::is_letter(U'\u3042'));
  EXPECT_TRUE(tok::is_letter(U'\uD55C'));
  EXPECT_TRUE(tok::is_letter(U'\u0628'));
  EXPECT_FALSE(tok::is_letter(U'\u064E'));  // Arabic fatha is a mark
  EXPECT_FALSE(tok::is_letter(U'\U0001F680'));
  EXPECT_FALSE(tok::is_number(U'\U0001F680'));
  EXPECT_TRUE(tok::is_number(U'\u0663'));
  EXPECT_TRUE(tok::is_number(U'\u00BD'));
  EXPECT_TRUE(tok::is_punctuation(U'\u3002'));
  EXPECT_TRUE(tok::is_punctuation(U'$'));
  EXPECT_FALSE(tok::is_punctuation(U'\u00D7'));
  EXPECT_TRUE(tok::is_whitespace(U'\u3000'));
  EXPECT_FALSE(tok::is_whitespace(U'\u200B'));
}

}  // namespace
}  // namespace tessera::model

// ---- Split / SentencePiece BPE, added tokens, decoders, streaming (issue 25) ----

namespace tessera::model {
namespace {

using nlohmann::json;

// A tokenizer.json around a small vocab: every char of `chars` is a token,
// plus `extra` tokens (merges "a b" need "ab" in extra), `<0x00>`..`<0xFF>`
// byte tokens when byte_fallback is set.
json tiny_tokenizer(const std::string& chars, const std::vector<std::string>& extra, const json& merges) {
  json vocab = json::object();
  int64_t id = 0;
  for (const char* t : {"<unk>", "<s>", "</s>"}) vocab[t] = id++;
  for (size_t i = 0; i < chars.size();) {
    const size_t len = tok::next_utf8(chars, i).len;
    vocab[chars.substr(i, len)] = id++;
    i += len;
  }
  for (const std::string& t : extra) vocab[t] = id++;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = id++;
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"unk_token", "<unk>"}}},
          {"added_tokens",
           json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                        {{"id", 1}, {"content", "<s>"}, {"special", true}},
                        {{"id", 2}, {"content", "</s>"}, {"special", true}}})}};
}

std::unique_ptr<Tokenizer> parse(const json& j) { return must(parse_tokenizer_json(j.dump(), "test")); }

std::vector<std::string> tokens_of(const Tokenizer& t, const std::string& text, bool special = false) {
  auto ids = t.encode(text, special);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  if (!ids.ok()) return {};
  auto tokens = t.id_to_tokens(*ids);
  return tokens.ok() ? *tokens : std::vector<std::string>{};
}

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Llama 3's shape: Split regex + ByteLevel without regex; the byte-level
// vocab holds each piece as one token so the split is visible in the tokens.
json llama3_like(const std::vector<std::string>& pieces) {
  json j = tiny_tokenizer("", {}, json::array());
  json& vocab = j["model"]["vocab"];
  int64_t id = 1000;
  // GPT-2's byte chars for the bytes used below: printable ASCII is itself, ' ' is Ġ, '\n' is Ċ, '\t' is ĉ.
  for (const char* c : {"Ġ", "Ċ", "ĉ"}) vocab[c] = id++;
  for (char c = 33; c < 127; ++c) vocab[std::string(1, c)] = id++;
  for (const std::string& p : pieces) vocab[p] = id++;
  j["model"]["ignore_merges"] = true;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({{{"type", "Split"},
                                       {"pattern", {{"Regex", kLlama3Pattern}}},
                                       {"behavior", "Isolated"},
                                       {"invert", false}},
                                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["decoder"] = {{"type", "ByteLevel"}};
  return j;
}

TEST(TokenizerSplit, Llama3PatternKeepsLastSpaceForTheNextWordAndContractionsInAnyCase) {
  auto t = parse(llama3_like({"Hello", "Ġworld", "ĠĠ", "'S", "'re", "123", "4", "ĠHello", "'M"}));
  // \s+(?!\S): of three spaces, two stand alone and the third joins "world".
  EXPECT_EQ(tokens_of(*t, "Hello   world"), (std::vector<std::string>{"Hello", "ĠĠ", "Ġworld"}));
  // (?i:'s|...) matches contractions in any case; \p{N}{1,3} splits digit runs by three.
  EXPECT_EQ(tokens_of(*t, "I'M Hello'S 1234"),
            (std::vector<std::string>{"I", "'M", "ĠHello", "'S", "Ġ", "123", "4"}));
  auto text = t->decode(t->encode("Hello   world'S", false).value(), false);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "Hello   world'S");
}

TEST(TokenizerSplit, BehaviorsAndInvert) {
  auto with_split = [](const std::string& behavior, bool invert) {
    json j = tiny_tokenizer("ab-", {}, json::array());
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
    return parse(j);
  };
  EXPECT_EQ(tokens_of(*with_split("Removed", false), "a-b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(tokens_of(*with_split("Isolated", false), "a-b"), (std::vector<std::string>{"a", "-", "b"}));
  EXPECT_EQ(tokens_of(*with_split("MergedWithPrevious", false), "a-b"), (std::vector<std::string>{"a", "-", "b"}));
  EXPECT_EQ(tokens_of(*with_split("Removed", true), "a-b"), (std::vector<std::string>{"-"}));
}

// Llama 2 / Mistral: Prepend ▁ + Replace " " -> ▁, no pre-tokenizer, byte fallback.
json sentencepiece_like() {
  json j = tiny_tokenizer("▁abcdehlorw", {"▁h", "▁he", "ll", "llo", "▁hello"},
                          json::array({"▁ h", "▁h e", "l l", "ll o", "▁he llo"}));
  j["model"]["byte_fallback"] = true;
  j["model"]["fuse_unk"] = true;
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", "▁"}},
                                                  {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}})}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                                            {{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  return j;
}

TEST(TokenizerSentencePiece, PrependMergesByteFallbackAndTemplateBos) {
  auto t = parse(sentencepiece_like());
  EXPECT_EQ(tokens_of(*t, "hello"), (std::vector<std::string>{"▁hello"}));
  EXPECT_EQ(tokens_of(*t, "hello", true), (std::vector<std::string>{"<s>", "▁hello"}));  // TemplateProcessing BOS
  // é is not in the vocab: its two UTF-8 bytes.
  EXPECT_EQ(tokens_of(*t, "hé"), (std::vector<std::string>{"▁h", "<0xC3>", "<0xA9>"}));
  for (const std::string s : {"hello world", "hé 🙂 x", "a  b"}) {
    auto text = t->decode(t->encode(s, true).value(), true);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, s);
  }
}

TEST(TokenizerSentencePiece, DecodeBytesKeepsByteFallbackBytes) {
  auto t = parse(sentencepiece_like());
  const auto ids = t->encode("h\u00E9", false).value();  // ▁h <0xC3> <0xA9>
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(t->decode({ids[1]}).value(), "\uFFFD");
  EXPECT_EQ(t->decode_bytes({ids[1]}).value(), "\xC3");
  EXPECT_EQ(t->decode_bytes({ids[2]}).value(), "\xA9");
  EXPECT_EQ(t->decode_bytes({ids[0]}).value(), "h");  // Strip takes the leading space, as decode does
  EXPECT_EQ(t->decode_bytes(ids).value(), "h\u00E9");
  EXPECT_EQ(t->decode_bytes({ids[0], ids[1]}).value(), "h\xC3");
}

TEST(TokenizerSentencePiece, MetaspacePrependSchemes) {
  auto with_scheme = [](const std::string& scheme) {
    json j = tiny_tokenizer("▁ab", {"▁a", "▁b"}, json::array({"▁ a", "▁ b"}));
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", true}};
    j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}};
    return parse(j);
  };
  EXPECT_EQ(tokens_of(*with_scheme("always"), "a b"), (std::vector<std::string>{"▁a", "▁b"}));
  EXPECT_EQ(tokens_of(*with_scheme("never"), "a b"), (std::vector<std::string>{"a", "▁b"}));
  // "first": only the text's first section gets the ▁, not the one after an added token.
  EXPECT_EQ(tokens_of(*with_scheme("first"), "a<s>b"), (std::vector<std::string>{"▁a", "<s>", "b"}));
  EXPECT_EQ(tokens_of(*with_scheme("always"), "a<s>b"), (std::vector<std::string>{"▁a", "<s>", "▁b"}));
  auto always = with_scheme("always");
  auto text = always->decode(always->encode("a b", false).value(), false);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "a b");
}

TEST(TokenizerAddedTokens, LstripRstripSpecialAndNormalized) {
  json j = tiny_tokenizer("ab ", {}, json::array());
  j["added_tokens"].push_back({{"id", 1000}, {"content", "[M]"}, {"special", true}, {"lstrip", true}, {"rstrip", true}});
  j["added_tokens"].push_back({{"id", 1001}, {"content", "xy"}, {"special", false}, {"normalized", true}});
  j["normalizer"] = {{"type", "Lowercase"}};
  auto t = parse(j);
  // lstrip/rstrip swallow the spaces around [M]; "XY" matches "xy" after the Lowercase normalizer.
  EXPECT_EQ(tokens_of(*t, "a  [M]  b"), (std::vector<std::string>{"a", "[M]", "b"}));
  EXPECT_EQ(tokens_of(*t, "aXYb"), (std::vector<std::string>{"a", "xy", "b"}));
  EXPECT_TRUE(t->is_special(1000));
  EXPECT_FALSE(t->is_special(1001));
  const std::vector<int64_t> ids{*t->token_to_id("a"), 1000};
  auto kept = t->decode(ids, false), dropped = t->decode(ids, true);
  ASSERT_TRUE(kept.ok() && dropped.ok());
  EXPECT_EQ(*kept, "a [M]");  // no decoder: tokens joined with spaces
  EXPECT_EQ(*dropped, "a");
}

TEST(TokenizerDecoders, EachDecoder) {
  auto run = [](std::vector<std::string> tokens, const json& decoder) {
    json j = tiny_tokenizer("", {}, json::array());
    j["decoder"] = decoder;
    auto parsed = parse_tokenizer_json(j.dump(), "test");
    EXPECT_TRUE(parsed.ok()) << parsed.status().to_string();
    // Reach the parsed decoder through a decode of the tokens' ids.
    std::vector<int64_t> ids;
    for (const std::string& t : tokens) ids.push_back(*(*parsed)->token_to_id(t));
    auto out = (*parsed)->decode(ids, false);
    EXPECT_TRUE(out.ok());
    return out.ok() ? *out : std::string();
  };
  EXPECT_EQ(run({"<0xE2>", "<0x82>", "<0xAC>"}, {{"type", "ByteFallback"}}), "€");
  EXPECT_EQ(run({"<0xE2>", "<0x82>"}, {{"type", "ByteFallback"}}), "\uFFFD\uFFFD");  // invalid: one U+FFFD per byte
  EXPECT_EQ(run({"<s>", "</s>"}, {{"type", "Fuse"}}), "<s></s>");
  EXPECT_EQ(run({"<s>", "</s>"}, json::object({{"type", "Sequence"}, {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "s"}}}, {"content", "x"}}})}})), "<x></x>");
  EXPECT_EQ(run({"<s>"}, {{"type", "Strip"}, {"content", "<"}, {"start", 1}, {"stop", 0}}), "s>");
  EXPECT_EQ(run({"<s>"}, {{"type", "ByteLevel"}}), "<s>");
}

// The text steps after ByteFallback, on raw bytes: each applies to the
// characters around the bytes that are none, and those bytes stay.
TEST(TokenizerDecoders, RawBytesPassTheTextSteps) {
  json j = tiny_tokenizer("\u2581ab", {"\u2581a", "b\u2581"}, json::array({"\u2581 a", "b \u2581"}));
  j["model"]["byte_fallback"] = true;
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}},
                                            {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}},
                                            {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", "A"}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 0}, {"stop", 1}}})}};
  auto t = parse(j);
  auto id = [&](const std::string& s) { return *t->token_to_id(s); };
  // Fused: "▁a" 0xC3 "b▁" -> Metaspace drops the first ▁ only at the very start, then "a" -> "A", one trailing space stripped.
  EXPECT_EQ(t->decode_bytes({id("\u2581a"), id("<0xC3>"), id("b\u2581")}).value(), "A\xC3" "b");
  EXPECT_EQ(t->decode({id("\u2581a"), id("<0xC3>"), id("b\u2581")}).value(), "A\uFFFDb");
  // A run that starts after the raw byte is not the token's start: its ▁ is a space.
  EXPECT_EQ(t->decode_bytes({id("<0xC3>"), id("\u2581a")}).value(), "\xC3 A");
}

TEST(TokenizerStream, NeverEmitsPartialUtf8) {
  auto t = parse(sentencepiece_like());
  // 🙂 is four byte-fallback tokens: nothing comes out until the fourth.
  auto ids = t->encode("h🙂e", false);
  ASSERT_TRUE(ids.ok());
  StreamDecoder stream(*t);
  std::string all;
  std::vector<std::string> pieces;
  for (int64_t id : *ids) {
    auto piece = stream.step(id);
    ASSERT_TRUE(piece.ok());
    auto checked = tok::utf8_to_u32(*piece);
    EXPECT_TRUE(checked.ok()) << "partial UTF-8 emitted";
    pieces.push_back(*piece);
    all += *piece;
  }
  auto rest = stream.flush();
  ASSERT_TRUE(rest.ok());
  all += *rest;
  EXPECT_EQ(all, t->decode(*ids, true).value());
  EXPECT_EQ(all, "h🙂e");
  ASSERT_EQ(pieces.size(), 6u);  // ▁h, 4 bytes, e
  EXPECT_EQ(pieces[1], "");
  EXPECT_EQ(pieces[3], "");
  EXPECT_EQ(pieces[4], "🙂");
}

TEST(TokenizerErrors, UnknownComponentTypesAreNamed) {
  for (const char* key : {"normalizer", "pre_tokenizer", "decoder", "post_processor"}) {
    json j = tiny_tokenizer("ab", {}, json::array());
    j[key] = {{"type", "Frobnicate"}};
    auto r = parse_tokenizer_json(j.dump(), "test");
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_NE(r.status().to_string().find("Frobnicate"), std::string::npos) << r.status().to_string();
  }
  json j = tiny_tokenizer("ab", {}, json::array());
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_FALSE(parse_tokenizer_json(j.dump(), "test").ok());
}

}  // namespace
}  // namespace tessera::model
