#include "model/gen_model.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <system_error>

#include "core/io.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/weights.h"

namespace tessera::model {

using core::Result;
using core::Status;
using core::Tensor;
using nlohmann::json;

namespace {

struct Preset {
  const char* name;
  const char* type;
  int64_t layers, hidden, heads;
};

constexpr Preset kPresets[] = {
    {"bert-base", "bert", 12, 768, 12},   {"bert-large", "bert", 24, 1024, 16}, {"distilbert", "bert", 6, 768, 12},
    {"gpt2", "gpt2", 12, 768, 12},        {"gpt2-medium", "gpt2", 24, 1024, 16}, {"gpt2-large", "gpt2", 36, 1280, 20},
    {"vit-base", "vit", 12, 768, 12},
};

// Llama-style presets: the shapes of the released checkpoints' config.json.
struct DecoderPreset {
  const char* name;
  const char* type;  // model_type
  const char* arch;
  int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, max_positions;
  double rope_theta, rms_eps;
  bool tied;
  int64_t bos;
  std::vector<int64_t> eos;
  bool llama3_scaling;  // rope_scaling llama3, factor 32 (Llama 3.2)
};

const std::vector<DecoderPreset>& decoder_presets() {
  static const std::vector<DecoderPreset> p = {
      {"llama-3.2-1b", "llama", "LlamaForCausalLM", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0, 1e-5, true, 128000,
       {128001, 128008, 128009}, true},
      {"llama-3.2-3b", "llama", "LlamaForCausalLM", 28, 3072, 24, 8, 128, 8192, 128256, 131072, 500000.0, 1e-5, true, 128000,
       {128001, 128008, 128009}, true},
      {"tinyllama-1.1b", "llama", "LlamaForCausalLM", 22, 2048, 32, 4, 64, 5632, 32000, 2048, 10000.0, 1e-5, false, 1, {2},
       false},
      {"qwen3-0.6b", "qwen3", "Qwen3ForCausalLM", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0, 1e-6, true, 151643,
       {151645}, false},
      {"qwen2.5-1.5b", "qwen2", "Qwen2ForCausalLM", 28, 1536, 12, 2, 128, 8960, 151936, 32768, 1000000.0, 1e-6, true, 151643,
       {151645}, false},
  };
  return p;
}

// OPT presets (Galaxy's OPT-L and OPT-XL, and the post-LN OPT-350m with
// projected embeddings).
struct OptPreset {
  const char* name;
  int64_t layers, hidden, heads, ffn, embed_dim;
  bool pre_ln;
};
constexpr OptPreset kOptPresets[] = {
    {"opt-350m", 24, 1024, 16, 4096, 512, false},
    {"opt-1.3b", 24, 2048, 32, 8192, 2048, true},
    {"opt-2.7b", 32, 2560, 32, 10240, 2560, true},
};

json labels_json(int64_t n) {
  json m = json::object();
  for (int64_t i = 0; i < n; ++i) m[std::to_string(i)] = "LABEL_" + std::to_string(i);
  return m;
}

// splitmix64 then Box-Muller: fast, seeded, identical on every machine.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float normal() {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) / 9007199254740993.0;
    const double u2 = static_cast<double>(next() >> 11) / 9007199254740992.0;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t s_;
};

Tensor random_tensor(const std::string& name, const core::Shape& shape, Rng& rng) {
  Tensor t = Tensor::zeros_f32(shape);
  float* p = t.f32();
  const bool is_norm = name.find("LayerNorm") != std::string::npos || name.find("ln_") != std::string::npos ||
                       name.find("layernorm") != std::string::npos || name.find("norm.weight") != std::string::npos;
  const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float r = rng.normal();
    p[i] = is_norm && !is_bias ? 1.0f + 0.05f * r : (is_bias ? 0.02f * r : 0.02f * r);
  }
  return t;
}

json wordpiece_tokenizer_json(int64_t vocab) {
  // A bert-base-uncased-like layout: specials at 0 and 100..103, then
  // characters and "##" characters, then filler pieces up to the model's vocab.
  json v = json::object();
  v["[PAD]"] = 0;
  for (int i = 1; i < 100; ++i) v["[unused" + std::to_string(i - 1) + "]"] = i;
  v["[UNK]"] = 100;
  v["[CLS]"] = 101;
  v["[SEP]"] = 102;
  v["[MASK]"] = 103;
  int64_t next = 104;
  std::string chars = "abcdefghijklmnopqrstuvwxyz0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  for (char ch : chars) v[std::string(1, ch)] = next++;
  for (char ch : chars) v["##" + std::string(1, ch)] = next++;
  while (next < vocab) {
    v["[unused_gen" + std::to_string(next) + "]"] = next;
    ++next;
  }
  json added = json::array();
  for (auto [tok, id] : std::vector<std::pair<std::string, int>>{{"[PAD]", 0}, {"[UNK]", 100}, {"[CLS]", 101}, {"[SEP]", 102}, {"[MASK]", 103}})
    added.push_back({{"id", id}, {"content", tok}, {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true}, {"strip_accents", nullptr}, {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}})},
        {"pair", json::array({{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}, {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 1}}}}})},
        {"special_tokens", {{"[CLS]", {{"id", "[CLS]"}, {"ids", {101}}, {"tokens", {"[CLS]"}}}}, {"[SEP]", {{"id", "[SEP]"}, {"ids", {102}}, {"tokens", {"[SEP]"}}}}}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"}, {"max_input_chars_per_word", 100}, {"vocab", v}}},
  };
}

// GPT-2's byte-to-unicode map: printable bytes stand for themselves, the
// rest are shifted to 256+.
std::string byte_symbol(int b) {
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  static int shifted[256];
  static bool init = false;
  if (!init) {
    int n = 0;
    for (int i = 0; i < 256; ++i) {
      const bool p = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
      shifted[i] = p ? i : 256 + n++;
    }
    init = true;
  }
  const int cp = printable ? b : shifted[b];
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

json bpe_tokenizer_json(int64_t vocab) {
  // Byte-level BPE over single bytes (no merges): every text encodes, and
  // generated ids below 256 decode back to bytes.
  json v = json::object();
  for (int b = 0; b < 256; ++b) v[byte_symbol(b)] = b;
  const int64_t eos = vocab - 1;
  v["<|endoftext|>"] = eos;
  json added = json::array({{{"id", eos}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", true}, {"special", true}}});
  json bl = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
          {"normalizer", nullptr}, {"pre_tokenizer", bl}, {"post_processor", bl}, {"decoder", bl},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                     {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                     {"vocab", v}, {"merges", json::array()}}}};
}

}  // namespace

std::vector<std::string> gen_model_presets() {
  std::vector<std::string> out;
  for (const auto& p : kPresets) out.push_back(p.name);
  for (const auto& p : decoder_presets()) out.push_back(p.name);
  for (const auto& p : kOptPresets) out.push_back(p.name);
  return out;
}

namespace {

// A Llama-style preset with the overrides; a changed hidden size or head
// count drops the preset's explicit head size unless --head-dim gives one.
json decoder_config(const DecoderPreset& p, const GenModelOptions& o) {
  const int64_t F = o.hidden ? o.hidden : p.hidden, H = o.heads ? o.heads : p.heads;
  const int64_t d = o.head_dim ? o.head_dim : (o.hidden || o.heads ? 0 : p.head_dim);
  const int64_t V = o.vocab ? o.vocab : p.vocab;
  json c = {{"architectures", {p.arch}}, {"model_type", p.type}, {"hidden_size", F}, {"num_attention_heads", H},
            {"num_key_value_heads", o.kv_heads ? o.kv_heads : std::min(p.kv_heads, H)},
            {"num_hidden_layers", o.layers ? o.layers : p.layers}, {"intermediate_size", o.intermediate ? o.intermediate : p.intermediate},
            {"vocab_size", V}, {"max_position_embeddings", p.max_positions}, {"rope_theta", p.rope_theta},
            {"rms_norm_eps", p.rms_eps}, {"hidden_act", "silu"}, {"tie_word_embeddings", p.tied},
            {"torch_dtype", "float32"}, {"attention_bias", false}, {"rope_scaling", nullptr}};
  if (d > 0) c["head_dim"] = d;
  if (p.bos < V) c["bos_token_id"] = p.bos;
  json eos = json::array();
  for (int64_t id : p.eos)
    if (id < V) eos.push_back(id);
  if (!eos.empty()) c["eos_token_id"] = eos.size() == 1 ? eos[0] : eos;
  if (p.llama3_scaling)
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  return c;
}

}  // namespace

Result<json> gen_model_config(const GenModelOptions& o) {
  const Preset* preset = nullptr;
  for (const auto& p : kPresets)
    if (o.preset == p.name) preset = &p;
  for (const auto& p : decoder_presets())
    if (o.preset == p.name) {
      if (o.bp_div > 0 || !o.bp_original.empty()) return core::invalid_argument("--bp-div is for the BERT and GPT-2 presets");
      if (o.labels) return core::invalid_argument("--labels is for classifier presets");
      json c = decoder_config(p, o);
      auto parsed = parse_config(c.dump());
      if (!parsed.ok()) return parsed.status().with_context("preset '" + o.preset + "' with these overrides");
      return c;
    }
  for (const auto& p : kOptPresets)
    if (o.preset == p.name) {
      if (o.bp_div > 0 || !o.bp_original.empty() || o.labels || o.kv_heads || o.head_dim)
        return core::invalid_argument("--bp-div, --labels, --kv-heads and --head-dim do not apply to OPT presets");
      const int64_t F = o.hidden ? o.hidden : p.hidden, V = o.vocab ? o.vocab : 50272;
      json c = {{"architectures", {"OPTForCausalLM"}}, {"model_type", "opt"}, {"hidden_size", F},
                {"num_attention_heads", o.heads ? o.heads : p.heads}, {"num_hidden_layers", o.layers ? o.layers : p.layers},
                {"ffn_dim", o.intermediate ? o.intermediate : p.ffn}, {"vocab_size", V}, {"max_position_embeddings", 2048},
                {"word_embed_proj_dim", o.hidden && p.embed_dim == p.hidden ? F : p.embed_dim},
                {"do_layer_norm_before", p.pre_ln}, {"activation_function", "relu"}, {"enable_bias", true},
                {"layer_norm_elementwise_affine", true}, {"tie_word_embeddings", true}, {"torch_dtype", "float32"},
                {"bos_token_id", 2}, {"eos_token_id", 2}, {"pad_token_id", 1}};
      auto parsed = parse_config(c.dump());
      if (!parsed.ok()) return parsed.status().with_context("preset '" + o.preset + "' with these overrides");
      return c;
    }
  if (preset == nullptr) return core::invalid_argument("unknown preset '" + o.preset + "' (" + [] {
    std::string all;
    for (const auto& n : gen_model_presets()) all += (all.empty() ? "" : ", ") + n;
    return all;
  }() + ")");
  if (o.kv_heads || o.head_dim) return core::invalid_argument("--kv-heads and --head-dim are for the Llama-style presets");
  const int64_t L = o.layers ? o.layers : preset->layers;
  const int64_t F = o.hidden ? o.hidden : preset->hidden;
  const int64_t H = o.heads ? o.heads : preset->heads;
  const int64_t I = o.intermediate ? o.intermediate : 4 * F;
  const std::string type = preset->type;
  json c;
  if (type == "bert") {
    const int64_t V = o.vocab ? o.vocab : 30522;
    c = {{"architectures", {"BertForSequenceClassification"}}, {"model_type", "bert"}, {"hidden_size", F},
         {"num_attention_heads", H}, {"num_hidden_layers", L}, {"intermediate_size", I}, {"vocab_size", V},
         {"max_position_embeddings", 512}, {"type_vocab_size", 2}, {"hidden_act", "gelu"}, {"layer_norm_eps", 1e-12},
         {"pad_token_id", 0}, {"id2label", labels_json(o.labels ? o.labels : 2)}};
  } else if (type == "gpt2") {
    const int64_t V = o.vocab ? o.vocab : 50257;
    c = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"n_embd", F}, {"n_head", H}, {"n_layer", L},
         {"n_inner", nullptr}, {"n_positions", 1024}, {"vocab_size", V}, {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", 1e-5}, {"bos_token_id", V - 1}, {"eos_token_id", V - 1}, {"tie_word_embeddings", true}};
    if (o.intermediate) c["n_inner"] = I;
  } else {
    c = {{"architectures", {"ViTForImageClassification"}}, {"model_type", "vit"}, {"hidden_size", F},
         {"num_attention_heads", H}, {"num_hidden_layers", L}, {"intermediate_size", I}, {"image_size", 224},
         {"patch_size", 16}, {"num_channels", 3}, {"qkv_bias", true}, {"hidden_act", "gelu"}, {"layer_norm_eps", 1e-12},
         {"id2label", labels_json(o.labels ? o.labels : 1000)}};
  }
  if (o.bp_div > 0) c["block_parallel"] = {{"n_div", o.bp_div}, {"original_layers", o.bp_original}};
  else if (!o.bp_original.empty()) return core::invalid_argument("original layers given without a sub-block count (--bp-div)");
  auto parsed = parse_config(c.dump());
  if (!parsed.ok()) return parsed.status().with_context("preset '" + o.preset + "' with these overrides");
  return c;
}

Status gen_model(const GenModelOptions& in) {
  GenModelOptions o = in;
  std::unique_ptr<Tokenizer> tok;
  if (!o.tokenizer_dir.empty()) {
    if (o.vocab) return core::invalid_argument("--vocab and --tokenizer both size the vocabulary: give one");
    TESSERA_ASSIGN_OR_RETURN(tok, load_tokenizer(o.tokenizer_dir));
    o.vocab = tok->vocab_size();
  }
  TESSERA_ASSIGN_OR_RETURN(json cj, gen_model_config(o));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig c, parse_config(cj.dump()));
  if (o.out_dir.empty()) return core::invalid_argument("no output folder given");
  // Missing parent folders are created, as `mkdir -p` would.
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) return core::io_error("cannot create folder " + o.out_dir + ": " + ec.message());
  TESSERA_RETURN_IF_ERROR(core::write_file(o.out_dir + "/config.json", cj.dump(2) + "\n"));
  Rng rng(o.seed);
  std::map<std::string, Tensor> tensors;
  for (const auto& e : hf_tensor_table(c)) tensors[e.name] = random_tensor(e.name, e.shape, rng);
  TESSERA_RETURN_IF_ERROR(write_safetensors(o.out_dir + "/model.safetensors", tensors, {{"format", "pt"}}));
  if (tok) {  // the real tokenizer, as it is
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      const std::string src = o.tokenizer_dir + "/" + f;
      if (!core::file_exists(src)) continue;
      TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(src));
      TESSERA_RETURN_IF_ERROR(core::write_file(o.out_dir + "/" + f, text));
    }
    return core::ok_status();
  }
  // The generated tokenizers need room for their fixed pieces.
  if (!c.causal() && !c.takes_images() && c.vocab >= 256)
    TESSERA_RETURN_IF_ERROR(core::write_file(o.out_dir + "/tokenizer.json", wordpiece_tokenizer_json(c.vocab).dump()));
  if (c.causal() && c.vocab >= 257)
    TESSERA_RETURN_IF_ERROR(core::write_file(o.out_dir + "/tokenizer.json", bpe_tokenizer_json(c.vocab).dump()));
  return core::ok_status();
}

}  // namespace tessera::model
