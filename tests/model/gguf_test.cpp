// GGUF: the writer's files read back value for value; every malformed case
// (truncated anywhere, counts and lengths the file cannot hold, unknown or
// nested types, bad dimensions, unaligned or out-of-range data, overlaps,
// duplicates) is a clear error; models written by write_gguf_model load as
// their Hugging Face folders do (F32 exactly; a quantized file's blocks are
// kept: the same logits as --quantize on the folder), with the tokenizer and
// chat template.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <fstream>
#include <filesystem>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <unistd.h>

#include "core/dtype.h"
#include "core/io.h"
#include "model/chat_template.h"
#include "model/gen_model.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/tokenizer.h"
#include "model/transformer.h"

namespace tessera::model {
namespace {

const std::string kData = TESSERA_TEST_DATA;

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::string bytes_of(const std::vector<float>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

// A small file with every value type and one tensor of each readable type.
std::string sample_file() {
  GgufWriter w;
  w.add_string("general.architecture", "gpt2");
  w.add_u32("a.u32", 7);
  w.add_i32("a.i32", -3);
  w.add_f32("a.f32", 0.5f);
  w.add_bool("a.bool", true);
  w.add_strings("a.strings", {"x", "", "yz"});
  w.add_i32s("a.i32s", {1, -2, 3});
  w.add_f32s("a.f32s", {1.5f});
  const auto f = random_vec(64 * 3, 1);
  w.add_tensor("t.f32", GgmlType::kF32, {64, 3}, bytes_of(f));
  std::string h(64 * 2, '\0');
  for (int i = 0; i < 64; ++i) {
    const uint16_t x = core::f32_to_f16(f[static_cast<size_t>(i)]);
    std::memcpy(h.data() + 2 * i, &x, 2);
  }
  w.add_tensor("t.f16", GgmlType::kF16, {64}, h);
  for (auto [name, t, q] : {std::tuple{"t.q8", GgmlType::kQ8_0, kernels::WeightType::kQ8_0},
                            std::tuple{"t.q4", GgmlType::kQ4_0, kernels::WeightType::kQ4_0}}) {
    std::string b(3 * kernels::row_bytes(q, 64), '\0');
    for (int r = 0; r < 3; ++r)
      kernels::quantize_row_ref(q, f.data() + r * 64, 64, reinterpret_cast<uint8_t*>(b.data()) + r * kernels::row_bytes(q, 64));
    w.add_tensor(name, t, {64, 3}, b);
  }
  return w.serialize();
}

core::Result<GgufFile> parse(const std::string& bytes) { return GgufFile::from_bytes(std::make_shared<const std::string>(bytes), "test"); }

TEST(Gguf, WhatTheWriterWritesReadsBack) {
  auto g = parse(sample_file());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const auto& m = g->metadata();
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(m["a.u32"], 7);
  EXPECT_EQ(m["a.i32"], -3);
  EXPECT_EQ(m["a.f32"], 0.5);
  EXPECT_EQ(m["a.bool"], true);
  EXPECT_EQ(m["a.strings"], nlohmann::json({"x", "", "yz"}));
  EXPECT_EQ(m["a.i32s"], nlohmann::json({1, -2, 3}));
  ASSERT_EQ(g->tensors().size(), 4u);
  const auto f = random_vec(64 * 3, 1);
  auto t = g->get_f32("t.f32");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->shape(), (core::Shape{3, 64}));
  EXPECT_EQ(0, std::memcmp(t->f32(), f.data(), f.size() * 4));
  auto h = g->get_f32("t.f16");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->shape(), (core::Shape{64}));
  EXPECT_NEAR(h->f32()[5], f[5], 2e-3 * std::fabs(f[5]) + 1e-4);
  for (const char* name : {"t.q8", "t.q4"}) {
    auto q = g->get_f32(name);
    ASSERT_TRUE(q.ok());
    for (int64_t i = 0; i < q->numel(); ++i) EXPECT_NEAR(q->f32()[i], f[static_cast<size_t>(i)], 0.5) << name;
    EXPECT_EQ(g->tensor(name)->data - g->tensor("t.f32")->data, static_cast<ptrdiff_t>(g->tensor(name)->offset));
  }
  EXPECT_EQ(g->get_f32("nope").status().code(), core::ErrorCode::kNotFound);
}

TEST(Gguf, EveryTruncationIsAnErrorNeverACrash) {
  const std::string full = sample_file();
  for (size_t n = 0; n < full.size(); ++n) {
    auto g = parse(full.substr(0, n));
    // Cut inside the padding after the last tensor's data, a file is still whole.
    if (g.ok()) {
      EXPECT_GE(n, full.size() - 32) << n;
      continue;
    }
    EXPECT_FALSE(g.status().message().empty());
  }
}

// Byte offsets of the sample's fields, found by searching for what precedes them.
size_t find(const std::string& s, const std::string& what) {
  const size_t at = s.find(what);
  EXPECT_NE(at, std::string::npos) << what;
  return at;
}

void put_u64(std::string& s, size_t at, uint64_t v) { std::memcpy(s.data() + at, &v, 8); }
void put_u32(std::string& s, size_t at, uint32_t v) { std::memcpy(s.data() + at, &v, 4); }

void expect_error(const std::string& bytes, const std::string& phrase) {
  auto g = parse(bytes);
  ASSERT_FALSE(g.ok()) << "accepted; expected: " << phrase;
  EXPECT_NE(g.status().message().find(phrase), std::string::npos) << g.status().message();
}

TEST(Gguf, MalformedHeadersGetClearErrors) {
  const std::string good = sample_file();
  std::string s;
  s = good; s[0] = 'X'; expect_error(s, "magic");
  s = good; put_u32(s, 4, 1); expect_error(s, "version 1");
  s = good; put_u64(s, 8, uint64_t{1} << 40); expect_error(s, "tensor count");
  s = good; put_u64(s, 16, uint64_t{1} << 40); expect_error(s, "key count");
  // The first key's length, then a string value's length.
  s = good; put_u64(s, 24, uint64_t{1} << 50); expect_error(s, "runs past the end");
  const size_t arch_type = find(good, "general.architecture") + std::strlen("general.architecture");
  s = good; put_u32(s, arch_type, 99); expect_error(s, "unknown value type");
  const size_t arr = find(good, "a.strings") + std::strlen("a.strings") + 4;  // after the value type: element type
  s = good; put_u32(s, arr, 9); expect_error(s, "arrays of arrays");
  s = good; put_u64(s, arr + 4, uint64_t{1} << 40); expect_error(s, "runs past the end");
  const size_t b = find(good, "a.bool") + std::strlen("a.bool") + 4;
  s = good; s[b] = 2; expect_error(s, "boolean");
  // Duplicate key: rename a.i32 to a.u32.
  s = good; s[find(good, "a.i32") + 2] = 'u';
  expect_error(s, "appears twice");
}

TEST(Gguf, MalformedTensorInfosGetClearErrors) {
  const std::string good = sample_file();
  const size_t info = find(good, "t.f32") + 5;  // n_dims, then ne[], type, offset
  std::string s;
  s = good; put_u32(s, info, 0); expect_error(s, "dimensions (1 to 4)");
  s = good; put_u32(s, info, 5); expect_error(s, "dimensions (1 to 4)");
  s = good; put_u64(s, info + 4, 0); expect_error(s, "absurd dimension");
  s = good; put_u64(s, info + 4, uint64_t{1} << 39); put_u64(s, info + 12, uint64_t{1} << 39); expect_error(s, "absurd dimension");
  s = good; put_u32(s, info + 20, 77); expect_error(s, "unknown ggml type");
  s = good; put_u64(s, info + 24, 8); expect_error(s, "not aligned");
  s = good; put_u64(s, info + 24, uint64_t{1} << 30); expect_error(s, "outside the file");
  const size_t q8 = find(good, "t.q8") + 4;
  s = good; put_u64(s, q8 + 4, 48); expect_error(s, "not whole Q8_0 blocks");
  s = good; put_u64(s, q8 + 24, 0); expect_error(s, "overlap");
  s = good; std::memcpy(s.data() + find(good, "t.q4"), "t.q8", 4); expect_error(s, "appears twice");
  // Alignment must be a power of two.
  GgufWriter w;
  w.add_u32("general.alignment", 48);
  expect_error(w.serialize(), "power of two");
}

TEST(Gguf, ModelsLoadAsTheirFolders) {
  const std::string tmp = ::testing::TempDir() + "/gguf-" + std::to_string(::getpid());
  for (const char* fixture : {"gpt2-tiny", "llama-tiny", "qwen3-tiny", "llama3rope-tiny"}) {
    const std::string gguf = tmp + "-" + fixture + ".gguf";
    ASSERT_TRUE(write_gguf_model(kData + "/" + fixture, "f32", gguf).ok());
    auto a = Transformer::load(kData + "/" + fixture);
    auto b = Transformer::load(gguf);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
    EXPECT_EQ(b->config().layers, a->config().layers);
    EXPECT_EQ(b->config().weights, kernels::WeightType::kF32);
    ModelInput in;
    in.ids = {5, 90, 3, 200, 17, 44};
    auto fa = a->forward(in, {}, nullptr);
    auto fb = b->forward(in, {}, nullptr);
    ASSERT_TRUE(fa.ok() && fb.ok());
    float diff = 0;
    for (int64_t i = 0; i < fa->logits.numel(); ++i) diff = std::max(diff, std::fabs(fa->logits.f32()[i] - fb->logits.f32()[i]));
    EXPECT_LT(diff, 1e-5) << fixture;
    std::remove(gguf.c_str());
  }
  // A quantized GPT-2 file keeps its blocks: the logits of --quantize on the
  // folder (its tied table is the same Q8_0 matrix; dequantizing and
  // quantizing a block again gives the block back).
  for (const char* type : {"q8_0", "q4_0"}) {
    const std::string gguf = tmp + "-copy-" + type + ".gguf";
    ASSERT_TRUE(write_gguf_model(kData + "/gpt2-copy", type, gguf).ok());
    LoadOptions lo;
    lo.weights = kernels::parse_weight_type(type).value();
    auto a = Transformer::load(kData + "/gpt2-copy", lo);
    auto b = Transformer::load(gguf);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(b->config().weights, lo.weights);
    EXPECT_EQ(0, std::memcmp(a->weights().layers[2].ffn_in_w.row_blocks(0), b->weights().layers[2].ffn_in_w.row_blocks(0),
                             a->weights().layers[2].ffn_in_w.nbytes()));
    ModelInput in;
    in.ids = {5, 9, 33, 12, 40, 1};
    auto fa = a->forward(in, {}, nullptr);
    auto fb = b->forward(in, {}, nullptr);
    ASSERT_TRUE(fa.ok() && fb.ok());
    for (int64_t i = 0; i < fa->logits.numel(); ++i) EXPECT_EQ(fa->logits.f32()[i], fb->logits.f32()[i]) << type << " " << i;
    std::remove(gguf.c_str());
  }
}

// A Q4_K_M file (Q4_K and Q6_K matrices, a fused QKV holding both) and a
// Q6_K one load with every matrix in the file's own blocks, byte for byte:
// llama.cpp computes on those, and quantising widened K-quant blocks again
// would not give them back. GPT-2's Conv1D matrices are the file's rows too.
TEST(Gguf, KQuantFilesKeepTheirBlocks) {
  GenModelOptions o;
  o.preset = "llama-3.2-1b";
  o.out_dir = ::testing::TempDir() + "/gguf-kq-" + std::to_string(::getpid());
  o.layers = 1, o.hidden = 512, o.heads = 8, o.kv_heads = 2, o.intermediate = 1024, o.vocab = 300, o.seed = 5;
  ASSERT_TRUE(gen_model(o).ok());
  for (const char* type : {"q4_k_m", "q6_k"}) {
    const std::string gguf = o.out_dir + "-" + type + ".gguf";
    auto rep = write_gguf_model(o.out_dir, type, gguf);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    auto f = GgufFile::open(gguf);
    auto m = Transformer::load(gguf);
    ASSERT_TRUE(f.ok() && m.ok()) << m.status().to_string();
    const bool mix = std::string(type) == "q4_k_m";
    EXPECT_EQ(m->config().weights, mix ? kernels::WeightType::kQ4_K : kernels::WeightType::kQ6_K);
    const LayerWeights& l = m->weights().layers[0];
    auto same = [&](const kernels::PackedLinear& p, int64_t row0, const char* name, int64_t rows) {
      const GgufTensor* t = f->tensor(name);
      ASSERT_NE(t, nullptr) << name;
      ASSERT_EQ(p.type(), kernel_type(t->type).value()) << name;
      const size_t rb = kernels::row_bytes(p.type(), p.cols());
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(0, std::memcmp(p.row_blocks(row0 + r), t->data + static_cast<size_t>(r) * rb, rb)) << type << " " << name << " row " << r;
    };
    // QKV: Q and K rows (llama.cpp's interleave undone), then V's.
    const int64_t q = 512, kv = 2 * 64;
    if (mix) {
      ASSERT_EQ(l.qkv_w.parts().size(), 2u);
      EXPECT_EQ(l.qkv_w.parts()[0].type(), kernels::WeightType::kQ4_K);
      same(l.qkv_w.parts()[1], 0, "blk.0.attn_v.weight", kv);
    } else {
      ASSERT_TRUE(l.qkv_w.parts().empty());
      same(l.qkv_w, q + kv, "blk.0.attn_v.weight", kv);
    }
    same(l.attn_out_w, 0, "blk.0.attn_output.weight", 512);
    same(l.ffn_out_w, 0, "blk.0.ffn_down.weight", 512);
    same(m->weights().lm_head_w, 0, "token_embd.weight", 300);
    // get_f32 widens K-quant blocks as the kernels do.
    auto v = f->get_f32("blk.0.attn_v.weight");
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    std::vector<float> row(512);
    (mix ? l.qkv_w.parts()[1] : l.qkv_w).copy_row(mix ? 3 : q + 2 * 64 + 3, row.data());
    for (int64_t c = 0; c < 512; ++c) ASSERT_EQ(v->f32()[3 * 512 + c], row[static_cast<size_t>(c)]) << c;
    // Estimates count each matrix in its own type: the layer's matrices
    // (one layer: the file's average is this layer's) and the head.
    const ModelConfig& c = m->config();
    const int64_t predicted = c.matrix_bytes(c.qkv_width(), 512) + c.matrix_bytes(512, c.q_width()) +
                              c.matrix_bytes(2 * 1024, 512) + c.matrix_bytes(512, 1024);
    const auto loaded = static_cast<double>(l.qkv_w.nbytes() + l.attn_out_w.nbytes() + l.ffn_in_w.nbytes() + l.ffn_out_w.nbytes());
    EXPECT_NEAR(static_cast<double>(predicted), loaded, 1e-6 * loaded) << type;
    EXPECT_EQ(c.head_bytes(300, 512), static_cast<int64_t>(m->weights().lm_head_w.nbytes())) << type;
    // The cost model weighs a mixed file's layers by the share of their
    // weights in the other type: here V's rows and any matrix held whole in Q6_K.
    double all = 0, other = 0;
    for (const kernels::PackedLinear* p : {&l.qkv_w, &l.attn_out_w, &l.ffn_in_w, &l.ffn_out_w})
      for (const kernels::PackedLinear& r : p->parts().empty() ? std::vector<kernels::PackedLinear>{*p} : p->parts()) {
        const auto n = static_cast<double>(r.rows() * r.cols());
        all += n;
        if (r.type() == kernels::WeightType::kQ6_K) other += n;
      }
    if (mix) {
      EXPECT_EQ(c.other_type(), kernels::WeightType::kQ6_K);
      EXPECT_GT(other, 0);
      EXPECT_NEAR(c.mix_other_share, other / all, 1e-12);
    } else {
      EXPECT_EQ(c.other_type(), c.weights);
    }
    // (kernels' QuantPackedLinear.StackedBlockTypes checks the stacked product.)
    ModelInput in;
    in.ids = {5, 90, 3, 200, 17, 44};
    auto out = m->forward(in, {}, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (int64_t i = 0; i < out->logits.numel(); ++i) ASSERT_TRUE(std::isfinite(out->logits.f32()[i]));
    std::remove(gguf.c_str());
  }
}

// tokenizer.ggml.model "llama": SentencePiece pieces with scores and byte
// tokens. The expected ids are SentencePiece's by hand: "the cat" becomes
// "▁the▁cat", then the adjacent pair whose union scores highest merges
// first: ▁t (-3), he (-4), ▁the (-1), ▁c (-5), at (-6), ▁cat (-2). A
// character without a piece falls back to its UTF-8 bytes.
TEST(Gguf, SentencePieceVocabulariesTokenizeAsSentencePiece) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    tokens.push_back(name);
    types.push_back(6);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  const std::vector<std::pair<std::string, float>> pieces = {
      {"\u2581", -10}, {"t", -10}, {"h", -10}, {"e", -10}, {"c", -10}, {"a", -10}, {"\u2581t", -3}, {"he", -4},
      {"\u2581the", -1}, {"\u2581c", -5}, {"at", -6}, {"\u2581cat", -2}, {"th", -20}};
  for (const auto& [p, s] : pieces) tokens.push_back(p), types.push_back(1), scores.push_back(s);
  auto id = [&](const std::string& p) { return static_cast<int64_t>(std::find(tokens.begin(), tokens.end(), p) - tokens.begin()); };
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_strings("tokenizer.ggml.tokens", tokens);
  w.add_f32s("tokenizer.ggml.scores", scores);
  w.add_i32s("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  const std::string path = ::testing::TempDir() + "/spm-" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto tok = gguf_tokenizer(*f);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  auto ids = (*tok)->encode("the cat");
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<int64_t>{1, id("\u2581the"), id("\u2581cat")}));
  // "th" (-20) loses to "▁t" (-3): SentencePiece's order, not the text's.
  ids = (*tok)->encode("the", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int64_t>{id("\u2581the")}));
  // é has no piece: its two UTF-8 bytes, 0xC3 0xA9 (ids 3 + byte).
  ids = (*tok)->encode("cat\xC3\xA9", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int64_t>{id("\u2581cat"), 3 + 0xC3, 3 + 0xA9}));
  auto text = (*tok)->decode(*ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "cat\xC3\xA9");
  text = (*tok)->decode({1, id("\u2581the"), id("\u2581cat")});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "the cat");
  EXPECT_EQ((*tok)->bos_id(), 1);
  // A score array of the wrong length is a clear error.
  GgufWriter bad;
  bad.add_string("general.architecture", "llama");
  bad.add_string("tokenizer.ggml.model", "llama");
  bad.add_strings("tokenizer.ggml.tokens", tokens);
  bad.add_f32s("tokenizer.ggml.scores", {0.0f});
  ASSERT_TRUE(bad.write(path).ok());
  auto g = GgufFile::open(path);
  ASSERT_TRUE(g.ok());
  auto none = gguf_tokenizer(*g);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().to_string().find("scores"), std::string::npos) << none.status().to_string();
  std::remove(path.c_str());
}

TEST(Gguf, TokenizerAndChatTemplateTravelInTheFile) {
  const std::string gguf = ::testing::TempDir() + "/gguf-chat-" + std::to_string(::getpid()) + ".gguf";
  const std::string dir = kData + "/gpt2-chat";
  ASSERT_TRUE(write_gguf_model(dir, "q8_0", gguf).ok());
  auto a = load_tokenizer(dir);
  auto b = load_tokenizer(gguf);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
  for (const char* text : {"Hello world", "  spaces  and\nnew lines", "caf\xc3\xa9 12345 <|endoftext|>", ""}) {
    auto x = (*a)->encode(text, true);
    auto y = (*b)->encode(text, true);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(*x, *y) << text;
    auto dx = (*a)->decode(*x, false);
    auto dy = (*b)->decode(*y, false);
    EXPECT_EQ(*dx, *dy);
  }
  EXPECT_EQ((*a)->eos_id(), (*b)->eos_id());
  auto ta = ChatTemplate::load(dir);
  auto tb = ChatTemplate::load(gguf);
  ASSERT_TRUE(ta.ok() && tb.ok()) << tb.status().to_string();
  const nlohmann::json msgs = nlohmann::json::parse(R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}])");
  EXPECT_EQ(ta->render(msgs, true).value(), tb->render(msgs, true).value());
  // Llama 3 asks for its BOS in tokenizer.json's post-processor, not with
  // add_bos_token: the file must carry it, and encode the same.
  {
    namespace fs = std::filesystem;
    const std::string bos_dir = ::testing::TempDir() + "/gguf-bos-" + std::to_string(::getpid());
    fs::remove_all(bos_dir);
    fs::copy(dir, bos_dir);
    nlohmann::json tj = nlohmann::json::parse(core::read_file(bos_dir + "/tokenizer.json").value());
    ASSERT_TRUE((*a)->eos_id().has_value());
    const std::string eos = std::to_string(*(*a)->eos_id());
    const nlohmann::json templ = nlohmann::json::parse(
        R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|endoftext|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],)"
        R"("pair":[{"SpecialToken":{"id":"<|endoftext|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],)"
        R"("special_tokens":{"<|endoftext|>":{"id":"<|endoftext|>","ids":[)" + eos + R"(],"tokens":["<|endoftext|>"]}}})");
    tj["post_processor"] = {{"type", "Sequence"}, {"processors", nlohmann::json::array({tj["post_processor"], templ})}};
    { std::ofstream(bos_dir + "/tokenizer.json") << tj.dump(); }
    nlohmann::json tc = nlohmann::json::parse(core::read_file(bos_dir + "/tokenizer_config.json").value());
    tc["bos_token"] = "<|endoftext|>";
    tc.erase("add_bos_token");
    { std::ofstream(bos_dir + "/tokenizer_config.json") << tc.dump(); }
    const std::string bos_gguf = bos_dir + ".gguf";
    ASSERT_TRUE(write_gguf_model(bos_dir, "f32", bos_gguf).ok());
    auto folder = load_tokenizer(bos_dir);
    auto file = load_tokenizer(bos_gguf);
    ASSERT_TRUE(folder.ok() && file.ok()) << file.status().to_string();
    auto x = (*folder)->encode("Hello world", true);
    auto y = (*file)->encode("Hello world", true);
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_FALSE(x->empty());
    EXPECT_EQ(x->front(), *(*a)->eos_id());
    EXPECT_EQ(*x, *y);
    fs::remove_all(bos_dir);
    std::remove(bos_gguf.c_str());
  }
  // A placeholder vocabulary (no tokenizer.json) says so.
  const std::string bare = ::testing::TempDir() + "/gguf-bare-" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(write_gguf_model(kData + "/gpt2-tiny", "f32", bare).ok());
  auto none = load_tokenizer(bare);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("placeholder"), std::string::npos) << none.status().message();
  EXPECT_EQ(ChatTemplate::load(bare).status().code(), core::ErrorCode::kNotFound);
  std::remove(gguf.c_str());
  std::remove(bare.c_str());
}

// A folder written by transformers 5 ("rope_parameters", no rope_theta or
// rope_scaling) quantizes to the same file as 4's: Llama 3.1's scaling and
// theta travel. A gpt2 config whose activation llama.cpp's gpt2 lacks is
// refused rather than written as another model.
TEST(Gguf, TheWriterReadsEitherRopeFormatAndRefusesWhatItCannotKeep) {
  namespace fs = std::filesystem;
  const std::string tmp = ::testing::TempDir() + "/gguf-rope5-" + std::to_string(::getpid());
  fs::remove_all(tmp);
  fs::copy(kData + "/llama3rope-tiny", tmp);
  nlohmann::json j = nlohmann::json::parse(core::read_file(tmp + "/config.json").value());
  ASSERT_TRUE(j["rope_scaling"].is_object());
  nlohmann::json params = j["rope_scaling"];
  params["rope_theta"] = j["rope_theta"];
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = params;
  { std::ofstream(tmp + "/config.json") << j.dump(); }
  ASSERT_TRUE(write_gguf_model(kData + "/llama3rope-tiny", "f32", tmp + "-4.gguf").ok());
  ASSERT_TRUE(write_gguf_model(tmp, "f32", tmp + "-5.gguf").ok());
  auto four = Transformer::load(tmp + "-4.gguf"), five = Transformer::load(tmp + "-5.gguf"), folder = Transformer::load(tmp);
  ASSERT_TRUE(four.ok() && five.ok() && folder.ok()) << five.status().to_string();
  EXPECT_EQ(five->config().rope_inv_freq, four->config().rope_inv_freq);
  EXPECT_EQ(folder->config().rope_inv_freq, four->config().rope_inv_freq);
  fs::remove_all(tmp);
  fs::copy(kData + "/gpt2-tiny", tmp);
  j = nlohmann::json::parse(core::read_file(tmp + "/config.json").value());
  j["activation_function"] = "relu";
  { std::ofstream(tmp + "/config.json") << j.dump(); }
  auto relu = write_gguf_model(tmp, "f32", tmp + "-relu.gguf");
  ASSERT_FALSE(relu.ok());
  EXPECT_NE(relu.status().message().find("relu"), std::string::npos) << relu.status().message();
  fs::remove_all(tmp);
  for (const char* f : {"-4.gguf", "-5.gguf", "-relu.gguf"}) std::remove((tmp + f).c_str());
}

TEST(Gguf, UnsupportedModelsAreRefusedWithTheReason) {
  const std::string tmp = ::testing::TempDir() + "/gguf-bad-" + std::to_string(::getpid());
  auto r = write_gguf_model(kData + "/bert-tiny", "q8_0", tmp + ".gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model_type 'bert'"), std::string::npos) << r.status().message();
  EXPECT_FALSE(Transformer::load(tmp + "-missing.gguf").ok());
  EXPECT_FALSE(load_config(tmp + "-missing.gguf").ok());
}

}  // namespace
}  // namespace tessera::model
