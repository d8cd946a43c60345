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
