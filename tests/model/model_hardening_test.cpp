// Regression tests for the audit's model-side findings: each built from the
// audit's input, each failing (or crashing) before its fix.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <tuple>
#include <stb/stb_image_write.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/io.h"
#include "model/config.h"
#include "model/generate.h"
#include "model/image.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/transformer.h"

namespace tessera::model {
namespace {

const std::string kData = TESSERA_TEST_DATA;

std::string with_header(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

core::Status parse_st(const std::string& header, size_t data_bytes) {
  return SafeTensorsFile::from_bytes(std::make_shared<const std::string>(with_header(header, std::string(data_bytes, '\0'))))
      .status();
}

// Audit defect 5: an empty tensor sorted between two overlapping ones hid
// the overlap from the neighbour comparison.
TEST(SafeTensorsHardeningTest, EmptyTensorDoesNotHideAnOverlap) {
  const std::string overlap =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("z":{"dtype":"F32","shape":[0],"data_offsets":[6,6]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[7,11]}})";
  const core::Status st = parse_st(overlap, 16);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("overlap"), std::string::npos) << st.to_string();
  // A long tensor overlapping a later one that is not its neighbour.
  EXPECT_FALSE(parse_st(R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},)"
                        R"("b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},)"
                        R"("c":{"dtype":"U8","shape":[1],"data_offsets":[8,9]}})",
                        16)
                   .ok());
  // Empty tensors anywhere, adjacent tensors: fine.
  EXPECT_TRUE(parse_st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                       16)
                  .ok());
}

TEST(SafeTensorsHardeningTest, RefusesDuplicateHeaderKeys) {
  const core::Status st = parse_st(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                   R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                                   8);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("duplicate key"), std::string::npos) << st.to_string();
}

TEST(ConfigHardeningTest, RefusesDuplicateOrAmbiguousLabelIds) {
  const std::string base = R"({"model_type":"bert","hidden_size":8,"num_attention_heads":2,"num_hidden_layers":1,)"
                           R"("intermediate_size":16,"max_position_embeddings":8,"vocab_size":10,"id2label":)";
  EXPECT_TRUE(parse_config(base + R"({"0":"neg","1":"pos"}})").ok());
  auto dup = parse_config(base + R"({"0":"neg","0":"pos"}})");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("duplicate key"), std::string::npos) << dup.status().to_string();
  // "01" and "+1" would both have named id 1 and left another id empty.
  EXPECT_FALSE(parse_config(base + R"({"0":"neg","01":"pos"}})").ok());
  EXPECT_FALSE(parse_config(base + R"({"+1":"neg","0":"pos"}})").ok());
  EXPECT_FALSE(parse_config(base + R"({" 1":"neg","0":"pos"}})").ok());
}

// A WordPiece tokenizer.json whose normalizer is `depth` nested Sequences.
std::string nested_normalizer_tokenizer(int depth) {
  std::string norm = R"({"type":"Lowercase"})";
  std::string open, close;
  for (int i = 0; i < depth; ++i) {
    open += R"({"type":"Sequence","normalizers":[)";
    close += "]}";
  }
  auto fixture = core::read_file(kData + "/tokenizers/wordpiece/tokenizer.json").value();
  auto j = nlohmann::json::parse(fixture);
  j.erase("normalizer");
  std::string text = j.dump();
  text.pop_back();  // the closing brace
  return text + R"(,"normalizer":)" + open + norm + close + "}";
}

// Audit defect 2: 40,000 nested Sequences overflowed the stack (SIGSEGV).
TEST(TokenizerHardeningTest, DeeplyNestedSequencesAreRefusedNotACrash) {
  auto deep = parse_tokenizer_json(nested_normalizer_tokenizer(40000), "deep.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), core::ErrorCode::kParseError);
  // Within the JSON depth bound but past the Sequence bound.
  auto twenty = parse_tokenizer_json(nested_normalizer_tokenizer(20), "twenty.json");
  ASSERT_FALSE(twenty.ok());
  EXPECT_NE(twenty.status().message().find("nest deeper"), std::string::npos) << twenty.status().to_string();
  auto three = parse_tokenizer_json(nested_normalizer_tokenizer(3), "three.json");
  ASSERT_TRUE(three.ok()) << three.status().to_string();
  EXPECT_TRUE((*three)->encode("Hello", false).ok());
}

// A valid 2x2 PNG whose IHDR then claims width x height (stb does not check
// chunk CRCs, so the header is what it believes).
std::string png_claiming(uint32_t width, uint32_t height) {
  const unsigned char rgb[12] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9};
  std::string out;
  auto append = [](void* ctx, void* data, int size) { static_cast<std::string*>(ctx)->append(static_cast<char*>(data), size); };
  EXPECT_NE(stbi_write_png_to_func(append, &out, 2, 2, 3, rgb, 6), 0);
  for (int i = 0; i < 4; ++i) {  // IHDR data starts at byte 16, big-endian
    out[16 + i] = static_cast<char>((width >> (24 - 8 * i)) & 0xff);
    out[20 + i] = static_cast<char>((height >> (24 - 8 * i)) & 0xff);
  }
  return out;
}

// Audit: a 196 KB PNG of 16385x4096 was decoded (404 MB) before the check.
TEST(ImageHardeningTest, DimensionsAreCheckedFromTheHeaderFirst) {
  ImagePreprocess pp;
  pp.image_size = 2;
  ASSERT_TRUE(decode_image(png_claiming(2, 2), pp, "ok.png").ok());
  for (auto [w, h] : {std::pair{16385u, 4096u}, {4096u, 16385u}, {16384u, 16384u}}) {
    auto r = decode_image(png_claiming(w, h), pp, "big.png");
    ASSERT_FALSE(r.ok());
    // The header check's message, not a decoder failure.
    EXPECT_NE(r.status().message().find("at most"), std::string::npos) << r.status().to_string();
  }
  EXPECT_FALSE(decode_image("not an image", pp, "junk").ok());
  // Found by fuzz_image: a truncated 16-bit PGM made stb read past the
  // buffer. Only PNG and JPEG reach the decoder now.
  auto pgm = decode_image(core::read_file(kData + "/../fuzz/corpus/fuzz_image/crash-pgm-16bit-truncated").value(), pp, "x.pgm");
  ASSERT_FALSE(pgm.ok());
  EXPECT_NE(pgm.status().message().find("neither a PNG nor a JPEG"), std::string::npos) << pgm.status().to_string();
}

// Found by fuzz_image: a 3x3 PNG whose second IDAT chunk declares 1.6 GB made
// stb_image's PNG reader grow its buffer to 2 GiB before reading the chunk.
// Chunks are now checked against the file's size before stb sees them.
TEST(ImageHardeningTest, PngChunksLongerThanTheFileAreRefusedBeforeDecoding) {
  ImagePreprocess pp;
  pp.image_size = 2;
  auto r = decode_image(core::read_file(kData + "/../fuzz/corpus/fuzz_image/crash-png-chunk-2GiB").value(), pp, "x.png");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("PNG chunk at byte 92 declares 1627389999 bytes"), std::string::npos) << r.status().to_string();
  ASSERT_TRUE(decode_image(png_claiming(2, 2), pp, "ok.png").ok());  // a well-formed PNG still decodes
}

TEST(GenerateHardeningTest, NonsenseOptionsAreRejected) {
  GenerateOptions ok;
  EXPECT_TRUE(validate_generate_options(ok).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (float t : {0.0f, -1.0f, nan, inf}) {
    GenerateOptions o;
    o.temperature = t;
    EXPECT_FALSE(validate_generate_options(o).ok()) << t;
  }
  for (float p : {0.0f, -0.5f, 1.5f, nan}) {
    GenerateOptions o;
    o.top_p = p;
    EXPECT_FALSE(validate_generate_options(o).ok()) << p;
  }
  GenerateOptions k;
  k.top_k = -1;
  EXPECT_FALSE(validate_generate_options(k).ok());
  GenerateOptions n;
  n.max_new_tokens = -1;
  EXPECT_FALSE(validate_generate_options(n).ok());
}

// Audit: NaN logits broke the sort comparator and the argmax.
TEST(GenerateHardeningTest, NanLogitsAreNeverPicked) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  GenerateOptions greedy;
  const float a[] = {nan, 1.0f, 3.0f, nan, 2.0f};
  uint64_t rng = 1;
  EXPECT_EQ(pick_token(a, 5, greedy, &rng), 2);
  GenerateOptions sample;
  sample.greedy = false;
  const float b[] = {nan, nan, -4.0f, nan};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(pick_token(b, 4, sample, &rng), 2);
  const float all_nan[] = {nan, nan};
  EXPECT_EQ(pick_token(all_nan, 2, greedy, &rng), -1);
  EXPECT_EQ(pick_token(all_nan, 2, sample, &rng), -1);
  // +inf logits share the mass; exp(inf - inf) must not make it NaN.
  const float c[] = {inf, 0.0f, inf, nan};
  for (int i = 0; i < 50; ++i) {
    const int64_t t = pick_token(c, 4, sample, &rng);
    EXPECT_TRUE(t == 0 || t == 2) << t;
  }
  sample.top_p = 0.5f;
  sample.top_k = 3;
  const float d[] = {nan, 0.0f, 1.0f, nan, 5.0f, 2.0f};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(pick_token(d, 6, sample, &rng), 4);
}

// The draw walks the kept tokens by id, and sorts them (most likely first,
// ties by id) only for top-p, as far as the nucleus goes. A reference that
// sorts the whole vocabulary first draws the same tokens from the same
// states: plain temperature, top-k, top-p and both, with ties and -inf.
int64_t pick_by_full_sort(const float* logits, int64_t vocab, const GenerateOptions& o, uint64_t* state) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < order.size()) order.resize(static_cast<size_t>(o.top_k));
  const double mx = logits[order[0]] / o.temperature;
  double sum = 0;
  for (int64_t id : order) sum += std::exp(logits[id] / o.temperature - mx);
  if (o.top_p < 1.0f) {
    double cum = 0, kept = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      const double w = std::exp(logits[order[i]] / o.temperature - mx);
      kept += w;
      if ((cum += w / sum) >= o.top_p) {
        order.resize(i + 1);
        break;
      }
    }
    sum = kept;
  } else {
    std::sort(order.begin(), order.end());  // by id
  }
  std::mt19937_64 rng(*state);
  *state = rng();
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (int64_t id : order) {
    const double w = std::exp(logits[id] / o.temperature - mx);
    if ((r -= w) <= 0.0 && w > 0.0) return id;
  }
  return order.back();
}

TEST(GenerateHardeningTest, SamplingDrawsAsAFullSortWould) {
  std::mt19937 gen(7);
  std::normal_distribution<float> z(0.0f, 3.0f);
  int64_t draws = 0, beyond_first_64 = 0;  // draws of top-p's sorted walk past its first stretch
  for (const int64_t vocab : {5, 300, 5000}) {
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (float& x : logits) x = std::round(z(gen) * 4.0f) / 4.0f;  // ties
    logits[1] = -std::numeric_limits<float>::infinity();
    for (const auto& [temp, k, top_p] : {std::tuple{1.0f, 0, 1.0f}, std::tuple{2.5f, 0, 1.0f}, std::tuple{0.7f, 40, 1.0f},
                                        std::tuple{1.0f, 0, 0.9f}, std::tuple{1.3f, 100, 0.95f}}) {
      GenerateOptions o;
      o.greedy = false;
      o.temperature = temp;
      o.top_k = k;
      o.top_p = top_p;
      uint64_t a = 11, b = 11;
      for (int i = 0; i < 200; ++i, ++draws) {
        const int64_t want = pick_by_full_sort(logits.data(), vocab, o, &a);
        const int64_t got = pick_token(logits.data(), vocab, o, &b);
        ASSERT_EQ(got, want) << "vocab " << vocab << ", temperature " << temp << ", top-k " << k << ", top-p " << top_p;
        ASSERT_EQ(a, b);
        int64_t rank = 0;  // how far down the walk went
        for (int64_t j = 0; j < vocab; ++j) rank += logits[static_cast<size_t>(j)] > logits[static_cast<size_t>(got)];
        beyond_first_64 += top_p < 1.0f && rank >= 64;
      }
    }
  }
  EXPECT_GT(beyond_first_64, 0) << "no draw walked past the first sorted stretch";
  EXPECT_GT(draws, 0);
}

// A token's log-probability is the log-softmax of the raw logits (long
// double here), the alternatives the most likely first with ties by id;
// NaN is -inf, +inf logits share the mass, and no mass reads -9999. (And
// logit_bias, which moves the pick but not the row reported.)
TEST(GenerateHardeningTest, TokenLogprobsAreTheLogSoftmaxOfTheRawLogits) {
  std::mt19937 gen(3);
  std::normal_distribution<float> z(0.0f, 4.0f);
  const int64_t vocab = 3000;
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& x : logits) x = std::round(z(gen) * 2.0f) / 2.0f;  // ties
  logits[7] = std::numeric_limits<float>::quiet_NaN();
  logits[8] = -std::numeric_limits<float>::infinity();
  long double mx = -INFINITY, sum = 0;
  for (const float x : logits) mx = std::isnan(x) ? mx : std::max<long double>(mx, x);
  for (const float x : logits) sum += std::isnan(x) ? 0.0L : std::exp(static_cast<long double>(x) - mx);
  const auto want = [&](int64_t i) { return static_cast<double>(logits[static_cast<size_t>(i)] - mx - std::log(sum)); };
  std::vector<int64_t> order;
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[static_cast<size_t>(i)])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
  for (const int64_t token : {int64_t{0}, int64_t{1234}, order[0], order[500]}) {
    const TokenLogprobs t = token_logprobs(logits.data(), vocab, token, 20);
    EXPECT_EQ(t.token, token);
    EXPECT_NEAR(t.logprob, want(token), 1e-5);
    ASSERT_EQ(t.top.size(), 20u);
    for (size_t i = 0; i < t.top.size(); ++i) {
      EXPECT_EQ(t.top[i].first, order[i]) << i;
      EXPECT_NEAR(t.top[i].second, want(order[i]), 1e-5);
    }
  }
  EXPECT_EQ(token_logprobs(logits.data(), vocab, 7, 0).logprob, kNoMassLogprob);  // NaN
  EXPECT_EQ(token_logprobs(logits.data(), vocab, 8, 0).logprob, kNoMassLogprob);  // -inf
  EXPECT_TRUE(token_logprobs(logits.data(), vocab, 0, 0).top.empty());
  const float inf = std::numeric_limits<float>::infinity();
  const float shared[] = {inf, 1.0f, inf, std::numeric_limits<float>::quiet_NaN()};
  const TokenLogprobs s = token_logprobs(shared, 4, 2, 4);
  EXPECT_FLOAT_EQ(s.logprob, -std::log(2.0f));
  EXPECT_EQ(s.top[0].first, 0);
  EXPECT_EQ(s.top[1].first, 2);
  EXPECT_EQ(s.top[2].second, kNoMassLogprob);
  const float none[] = {-inf, -inf};
  EXPECT_EQ(token_logprobs(none, 2, 0, 1).logprob, kNoMassLogprob);

  // generate() hands on_logits the row each token was picked from, before on_token.
  auto model = Transformer::load(kData + "/gpt2-tiny");
  ASSERT_TRUE(model.ok());
  GenerateOptions o;
  o.max_new_tokens = 5;
  std::vector<int64_t> argmax, seen;
  o.on_logits = [&](const float* row, int64_t v, int64_t token) {
    EXPECT_EQ(v, model->config().vocab);
    argmax.push_back(std::max_element(row, row + v) - row);
    seen.push_back(token);
  };
  o.on_token = [&](int64_t token) {
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back(), token);
  };
  core::ThreadPool pool(1);
  const auto seq = generate(*model, {17, 4, 99}, o, &pool);
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(argmax, std::vector<int64_t>(seq->begin() + 3, seq->end()));
  EXPECT_EQ(seen, argmax);

  // logit_bias is added before the pick: banning each greedy token moves the
  // pick to its row's next best, and on_logits still sees the model's own row.
  GenerateOptions biased;
  biased.max_new_tokens = 1;
  biased.logit_bias = {{argmax[0], -INFINITY}};
  std::vector<float> row;
  biased.on_logits = [&](const float* l, int64_t v, int64_t) { row.assign(l, l + v); };
  const auto banned = generate(*model, {17, 4, 99}, biased, &pool);
  ASSERT_TRUE(banned.ok());
  ASSERT_EQ(std::max_element(row.begin(), row.end()) - row.begin(), argmax[0]);
  row[static_cast<size_t>(argmax[0])] = -INFINITY;
  EXPECT_EQ(banned->back(), std::max_element(row.begin(), row.end()) - row.begin());
  biased.logit_bias = {{5, 1e6f}};
  EXPECT_EQ(generate(*model, {17, 4, 99}, biased, &pool)->back(), 5);
  for (const auto& bad : {std::pair<int64_t, float>{model->config().vocab, 1.0f}, std::pair<int64_t, float>{-1, 1.0f},
                          std::pair<int64_t, float>{3, std::nanf("")}}) {
    biased.logit_bias = {bad};
    EXPECT_EQ(generate(*model, {17, 4, 99}, biased, &pool).status().code(), core::ErrorCode::kInvalidArgument);
  }
}

// Audit defect 3: the cache was sized by n_positions before the request was
// looked at, and a failed allocation aborted.
TEST(KvCacheHardeningTest, SizedByTheRequestAndCheckedAgainstMemory) {
  auto model = Transformer::load(kData + "/gpt2-tiny");
  ASSERT_TRUE(model.ok());
  auto cache = model->make_cache(7);
  ASSERT_TRUE(cache.ok());
  ASSERT_EQ(cache->k.size(), static_cast<size_t>(model->config().layers));
  EXPECT_EQ(cache->k[0].dim(0), 7);
  EXPECT_FALSE(model->make_cache(0).ok());
  EXPECT_FALSE(model->make_cache(model->config().max_positions + 1).ok());
  // The audit's shape: 1024 layers, 2^20 positions (wider, so that no
  // machine has the memory): an error, not an allocation or an abort.
  ModelConfig huge = model->config();
  huge.layers = 1024;
  huge.max_positions = 1 << 20;
  huge.hidden = 1 << 16;
  huge.heads = 1;
  const Transformer big(huge, ModelWeights{});
  auto refused = big.make_cache(1 << 20);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), core::ErrorCode::kResourceExhausted);
  // Generation asks for prompt + new tokens only.
  GenerateOptions o;
  o.max_new_tokens = 3;
  auto seq = generate(*model, {1, 2}, o, nullptr);
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  EXPECT_EQ(seq->size(), 5u);
}

}  // namespace
}  // namespace tessera::model
