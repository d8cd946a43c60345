// llama.cpp agrees: GGUF files that Tessera writes (`tessera quantize`) load
// in llama.cpp (node-llama-cpp 3.21.1, test side, driven by
// tests/data/llamacpp/llama_peer.mjs), and llama.cpp's next-token
// log-probabilities and greedy continuation equal Tessera's on the same file,
// on one device and with tp on 2 ranks. Where node or the package cannot be
// had (no npm registry), the test is skipped, not passed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "model/gen_model.h"
#include "model/generate.h"
#include "model/gguf_model.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "parallel/strategy.h"
#include "runtime/in_process.h"

namespace tessera {
namespace {

const std::string kData = TESSERA_TEST_DATA;

// The peer, installed once per machine (npm's cache makes a rerun cheap).
const std::string& peer_dir() {
  static const std::string dir = [] {
    // Outside the test's own folder (tests/scratch_dir.cpp), which goes with it.
    const char* tmp = std::getenv("TESSERA_TEST_OUTER_TMPDIR");
    if (tmp == nullptr) tmp = std::getenv("TMPDIR");
    return std::string(tmp != nullptr ? tmp : "/tmp") + "/tessera-llamacpp-peer-" + std::to_string(::getuid());
  }();
  return dir;
}

bool sh(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }

// Empty when ready; otherwise why not.
std::string setup_peer() {
  static const std::string why = [] () -> std::string {
    if (!sh("node --version >/dev/null 2>&1")) return "node is not installed";
    const std::string d = peer_dir();
    if (!sh("mkdir -p '" + d + "' && cp '" + kData + "/llamacpp/llama_peer.mjs' '" + d + "/'")) return "cannot prepare " + d;
    // CTest runs this file's tests as parallel processes: one installs while
    // the others wait on the lock, and the marker is written only after a
    // whole install (a half-written node_modules is not taken for one).
    if (!sh("cd '" + d + "' && flock -w 900 .install.lock sh -c 'test -f .installed || ((test -f package.json || "
            "npm init -y >/dev/null 2>&1) && timeout 600 npm i -E --no-audit --no-fund --fetch-timeout=30000 "
            "--fetch-retries=1 node-llama-cpp@3.21.1 >/dev/null 2>&1 && touch .installed)'"))
      return "npm could not install node-llama-cpp@3.21.1 (no registry?)";
    return "";
  }();
  return why;
}

struct PeerOut {
  std::vector<float> logp;      // the last position's log-probabilities, by token id
  std::vector<int64_t> greedy;  // greedy continuation
};

PeerOut run_peer(const std::string& gguf, const std::vector<int64_t>& ids, int gen) {
  std::string list;
  for (int64_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
  const std::string prefix = gguf + ".llamacpp";
  const std::string cmd = "cd '" + peer_dir() + "' && node llama_peer.mjs check '" + gguf + "' --ids " + list + " --gen " +
                          std::to_string(gen) + " --threads 1 --kv f32 --fa off --out '" + prefix + "' > '" + prefix +
                          ".json' 2>/dev/null";
  PeerOut out;
  EXPECT_TRUE(sh(cmd)) << cmd;
  std::ifstream js(prefix + ".json");
  std::string line, last;
  while (std::getline(js, line))
    if (!line.empty()) last = line;
  const auto j = nlohmann::json::parse(last, nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("greedy")) << last;
  if (j.is_object() && j.contains("greedy")) out.greedy = j["greedy"].get<std::vector<int64_t>>();
  std::ifstream f(prefix + ".logp.f32", std::ios::binary);
  float v;
  while (f.read(reinterpret_cast<char*>(&v), sizeof v)) out.logp.push_back(v);
  return out;
}

std::vector<double> last_row_logp(const core::Tensor& logits) {
  const int64_t v = logits.dim(logits.rank() - 1), rows = logits.numel() / v;
  const float* x = logits.f32() + (rows - 1) * v;
  double mx = x[0], sum = 0;
  for (int64_t i = 1; i < v; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  for (int64_t i = 0; i < v; ++i) sum += std::exp(x[i] - mx);
  std::vector<double> out(static_cast<size_t>(v));
  for (int64_t i = 0; i < v; ++i) out[static_cast<size_t>(i)] = x[i] - mx - std::log(sum);
  return out;
}

double max_diff(const std::vector<double>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

const std::vector<int64_t> kIds = {5, 9, 33, 12, 40, 22, 7, 19, 2, 60, 31, 44, 3, 8, 50, 1};

// `dir` written as `type`, then llama.cpp and Tessera (one device, tp on 2)
// on the file; `check_file` looks at the file first.
void agree(const std::string& dir, const std::string& type, double tolerance, const std::string& name,
           const std::function<void(const model::GgufFile&)>& check_file = {}) {
  const std::vector<int64_t>& ids = kIds;
  const std::string what = name + " " + type;
  const std::string gguf = ::testing::TempDir() + "/llamacpp-" + name + "-" + type + "-" + std::to_string(::getpid()) + ".gguf";
  auto written = model::write_gguf_model(dir, type, gguf);
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  if (check_file) {
    auto f = model::GgufFile::open(gguf);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    check_file(*f);
  }
  const PeerOut peer = run_peer(gguf, ids, 8);
  ASSERT_FALSE(peer.logp.empty()) << what;
  auto m = model::Transformer::load(gguf);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  model::ModelInput in;
  in.ids = ids;
  auto one = m->forward(in, {}, nullptr);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_LT(max_diff(last_row_logp(one->logits), peer.logp), tolerance) << what << ", one device";
  // tp on 2 ranks (threads), on the same file.
  parallel::Plan tp;
  tp.strategy = "tp";
  tp.world = 2;
  ASSERT_TRUE(parallel::complete_plan(tp, m->config()).ok());
  auto ranks = runtime::load_rank_models(gguf, tp);
  ASSERT_TRUE(ranks.ok()) << ranks.status().to_string();
  auto two = runtime::run_in_process(tp, *ranks, in);
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_LT(max_diff(last_row_logp(two->output.logits), peer.logp), tolerance) << what << ", tp on 2";
  // Greedy continuations.
  model::GenerateOptions g;
  g.greedy = true;
  g.max_new_tokens = 8;
  g.eos_token_id = -1;
  auto seq = model::generate(*m, ids, g, nullptr);
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  EXPECT_EQ(std::vector<int64_t>(seq->begin() + static_cast<std::ptrdiff_t>(ids.size()), seq->end()), peer.greedy) << what;
  std::remove(gguf.c_str());
}

struct Case {
  const char* fixture;
  const char* type;
  double tolerance;
};

TEST(LlamaCppAgreement, GgufFilesTesseraWritesComputeTheSameInLlamaCpp) {
  if (const std::string why = setup_peer(); !why.empty()) GTEST_SKIP() << why;
  // Every matrix of these holds whole blocks, so both sides run the same
  // block formats. gpt2-copy (trained) in F32; Llama's F32 checks the Q/K
  // row order llama.cpp wants, Llama 3.1's its rope_freqs. docs/quantization.md says where quantized
  // GPT-2 and F16 fall-back matrices differ, and by how much.
  const Case cases[] = {{"gpt2-copy", "f32", 1e-3},  {"llama-tiny", "f32", 1e-3},     {"llama3rope-tiny", "f32", 1e-3},
                        {"qwen2-tiny", "q8_0", 1e-2},
                        {"qwen2-tiny", "q4_0", 1e-2}, {"qwen3-tiny", "q8_0", 1e-2},    {"qwen3-tiny", "q4_0", 1e-2},
                        {"qwen3-mqa-tiny", "q8_0", 1e-2}};
  for (const Case& c : cases) agree(kData + "/" + c.fixture, c.type, c.tolerance, c.fixture);
}

// A SentencePiece vocabulary (Llama 2, Mistral): a folder whose
// tokenizer.json is Hugging Face's form of one (a BPE with byte fallback,
// U+2581 for spaces, merges ranked by the merged piece's score) goes into
// the GGUF as tokenizer.ggml.model "llama" with scores. llama.cpp's
// SentencePiece tokenizer, Tessera on the GGUF and Tessera on the folder
// give the same ids.
TEST(LlamaCppAgreement, SentencePieceVocabulariesTokenizeAsLlamaCpp) {
  if (const std::string why = setup_peer(); !why.empty()) GTEST_SKIP() << why;
  const std::string tmp = ::testing::TempDir() + "/spm-" + std::to_string(::getpid());
  const std::string u = "\u2581";
  // Pieces and scores; every character of the texts below is a piece or falls back to bytes.
  const std::vector<std::pair<std::string, double>> pieces = {
      {u, -10}, {"t", -10}, {"h", -10}, {"e", -10}, {"c", -10}, {"a", -10}, {"s", -10}, {"o", -10}, {"n", -10},
      {"d", -10}, {"r", -10}, {"i", -10}, {"g", -10}, {u + "t", -3}, {"he", -4}, {u + "the", -1}, {u + "c", -5},
      {"at", -6}, {u + "cat", -2}, {u + "a", -7}, {"nd", -8}, {u + "and", -2.5}, {"th", -20}, {"er", -9},
      {"in", -9.5}, {"ing", -4.5}, {u + "s", -7.5}, {"on", -8.5}, {u + "on", -3.5}, {"ca", -30}, {u + u, -12}};
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  std::map<std::string, int64_t> id;
  auto add = [&](const std::string& t) { id[t] = static_cast<int64_t>(id.size()); vocab[t] = id[t]; };
  for (const char* s : {"<unk>", "<s>", "</s>"}) {
    added.push_back({{"id", id.size()}, {"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
    add(s);
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    add(name);
  }
  for (const auto& p : pieces) add(p.first);
  // Every split of a piece into two pieces, ranked by the piece's score.
  std::vector<std::tuple<double, int64_t, std::string, std::string>> ms;
  for (const auto& [p, score] : pieces)
    for (size_t cut = 1; cut < p.size(); ++cut) {
      if ((static_cast<unsigned char>(p[cut]) & 0xC0) == 0x80) continue;
      if (id.count(p.substr(0, cut)) && id.count(p.substr(cut))) ms.push_back({-score, id[p], p.substr(0, cut), p.substr(cut)});
    }
  std::sort(ms.begin(), ms.end());
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : ms) merges.push_back(nlohmann::json::array({std::get<2>(m), std::get<3>(m)}));
  const nlohmann::json tj = {
      {"version", "1.0"}, {"added_tokens", added}, {"pre_tokenizer", nullptr}, {"post_processor", nullptr},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", u}},
                                                           {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", u}}}}}},
      {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", u}}}, {"content", " "}},
                                                     {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                                                     {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr}, {"fuse_unk", true}, {"byte_fallback", true}, {"ignore_merges", false},
                 {"vocab", vocab}, {"merges", merges}}}};
  ASSERT_TRUE(sh("mkdir -p '" + tmp + "-tok'"));
  { std::ofstream(tmp + "-tok/tokenizer.json") << tj.dump(); }
  { std::ofstream(tmp + "-tok/tokenizer_config.json") << R"({"add_bos_token": true, "bos_token": "<s>", "eos_token": "</s>"})"; }
  model::GenModelOptions o;
  o.preset = "llama-3.2-1b";
  o.out_dir = tmp + "-model";
  o.layers = 1, o.hidden = 64, o.heads = 2, o.kv_heads = 1, o.intermediate = 128, o.tokenizer_dir = tmp + "-tok";
  ASSERT_TRUE(model::gen_model(o).ok());
  const std::string gguf = tmp + ".gguf";
  auto w = model::write_gguf_model(o.out_dir, "f32", gguf);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto folder = model::load_tokenizer(o.out_dir);
  auto file = model::load_tokenizer(gguf);
  ASSERT_TRUE(folder.ok() && file.ok()) << file.status().to_string();
  for (const std::string text : {"the cat", "the cat and the cats", "  a cat  sat on the thing", "caté 猫 and ending",
                                 "then\nthe\tcat", "ing inging thethe"}) {
    auto a = (*folder)->encode(text, false);
    auto b = (*file)->encode(text, false);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*b, *a) << text;
    { std::ofstream(tmp + ".txt", std::ios::binary) << text; }
    const std::string out = tmp + ".ids.json";
    ASSERT_TRUE(sh("cd '" + peer_dir() + "' && node llama_peer.mjs tokenize '" + gguf + "' --file '" + tmp + ".txt' > '" + out + "' 2>/dev/null"));
    std::ifstream in(out);
    std::string line, last;
    while (std::getline(in, line))
      if (!line.empty()) last = line;
    const auto j = nlohmann::json::parse(last, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("ids")) << last;
    EXPECT_EQ(j["ids"].get<std::vector<int64_t>>(), *b) << text;
    auto back = (*file)->decode(*b);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
  std::remove(gguf.c_str());
}

// K-quants need rows of 256: a Llama-3.2-1B-shaped decoder cut to 512 wide
// (8 heads of 64, 2 K/V heads, FFN 1024), written as llama.cpp's Q4_K_M mix
// (Q4_K, with Q6_K for the tied head and for attn_v and ffn_down in
// use_more_bits layers: a fused QKV matrix then holds two block types) and
// as Q6_K throughout. tp on 2 cuts attn_out and ffn_down at 256 columns:
// whole super-blocks.
//
// One layer agrees to about 1e-6. Deeper, the two sides' hidden states
// differ in the last bits (their norms, softmax and SiLU add in different
// orders), which now and then moves an input across a rounding boundary of
// its 8-bit block: one such step of an input to the (tied, large) head moves
// every log-probability by d_x * w, about 0.02 here. Every type, Q8_0
// included, shows it (docs/quantization.md): 8 layers get 5e-2 and equal
// greedy tokens.
TEST(LlamaCppAgreement, KQuantFilesComputeTheSameInLlamaCpp) {
  if (const std::string why = setup_peer(); !why.empty()) GTEST_SKIP() << why;
  auto decoder = [](int64_t layers) {
    model::GenModelOptions o;
    o.preset = "llama-3.2-1b";
    o.out_dir = ::testing::TempDir() + "/kquant-decoder-" + std::to_string(layers) + "-" + std::to_string(::getpid());
    o.layers = layers, o.hidden = 512, o.heads = 8, o.kv_heads = 2, o.intermediate = 1024, o.vocab = 512, o.seed = 3;
    EXPECT_TRUE(model::gen_model(o).ok());
    return o.out_dir;
  };
  auto count = [](const model::GgufFile& f, model::GgmlType t) {
    int n = 0;
    for (const auto& x : f.tensors()) n += x.type == t;
    return n;
  };
  const std::string one = decoder(1), eight = decoder(8);
  agree(one, "q4_k_m", 1e-2, "decoder-1x512", [&](const model::GgufFile& f) {
    // Layer 0 is a use_more_bits layer: q, k, o, gate, up in Q4_K; v, down and the head in Q6_K.
    EXPECT_EQ(count(f, model::GgmlType::kQ4_K), 5);
    EXPECT_EQ(count(f, model::GgmlType::kQ6_K), 3);
    EXPECT_EQ(f.tensor("blk.0.attn_v.weight")->type, model::GgmlType::kQ6_K);
    EXPECT_EQ(f.tensor("blk.0.attn_k.weight")->type, model::GgmlType::kQ4_K);
  });
  agree(one, "q6_k", 1e-2, "decoder-1x512", [&](const model::GgufFile& f) { EXPECT_EQ(count(f, model::GgmlType::kQ6_K), 8); });
  agree(eight, "q4_k_m", 5e-2, "decoder-8x512", [&](const model::GgufFile& f) {
    // Layers 0, 3, 6 and 7 (use_more_bits of 8) hold attn_v and ffn_down in Q6_K.
    EXPECT_EQ(count(f, model::GgmlType::kQ4_K), 48);
    EXPECT_EQ(count(f, model::GgmlType::kQ6_K), 9);
    EXPECT_EQ(f.tensor("blk.3.ffn_down.weight")->type, model::GgmlType::kQ6_K);
    EXPECT_EQ(f.tensor("blk.4.ffn_down.weight")->type, model::GgmlType::kQ4_K);
  });
}

}  // namespace
}  // namespace tessera
