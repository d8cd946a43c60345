#include "model/gguf_model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <span>
#include <string_view>

#include "core/dtype.h"
#include "core/io.h"
#include "core/json.h"
#include "model/safetensors.h"

namespace tessera::model {

using core::Result;
using core::Status;
using nlohmann::json;

namespace {

// A tensor's GGUF name and its Hugging Face name (within a layer: the
// suffixes after "blk.N." and the family's layer prefix).
struct Rule {
  const char* gguf;
  const char* hf;
  bool transpose = false;  // GPT-2's Conv1D: Hugging Face keeps [in, out]
  int permute = 0;         // llama.cpp's rotary row order: 1 = Q (heads), 2 = K (K/V heads)
};

const Rule kGpt2Base[] = {{"token_embd.weight", "transformer.wte.weight"},
                          {"position_embd.weight", "transformer.wpe.weight"},
                          {"output_norm.weight", "transformer.ln_f.weight"},
                          {"output_norm.bias", "transformer.ln_f.bias"},
                          {"output.weight", "lm_head.weight"}};
const Rule kGpt2Layer[] = {{"attn_norm.weight", "ln_1.weight"},        {"attn_norm.bias", "ln_1.bias"},
                           {"attn_qkv.weight", "attn.c_attn.weight", true}, {"attn_qkv.bias", "attn.c_attn.bias"},
                           {"attn_output.weight", "attn.c_proj.weight", true}, {"attn_output.bias", "attn.c_proj.bias"},
                           {"ffn_norm.weight", "ln_2.weight"},         {"ffn_norm.bias", "ln_2.bias"},
                           {"ffn_up.weight", "mlp.c_fc.weight", true}, {"ffn_up.bias", "mlp.c_fc.bias"},
                           {"ffn_down.weight", "mlp.c_proj.weight", true}, {"ffn_down.bias", "mlp.c_proj.bias"}};
const Rule kLlamaBase[] = {{"token_embd.weight", "model.embed_tokens.weight"},
                           {"output_norm.weight", "model.norm.weight"},
                           {"output.weight", "lm_head.weight"}};
const Rule kLlamaLayer[] = {{"attn_norm.weight", "input_layernorm.weight"},
                            {"attn_q.weight", "self_attn.q_proj.weight", false, 1},
                            {"attn_q.bias", "self_attn.q_proj.bias", false, 1},
                            {"attn_k.weight", "self_attn.k_proj.weight", false, 2},
                            {"attn_k.bias", "self_attn.k_proj.bias", false, 2},
                            {"attn_v.weight", "self_attn.v_proj.weight"},
                            {"attn_v.bias", "self_attn.v_proj.bias"},
                            {"attn_output.weight", "self_attn.o_proj.weight"},
                            {"attn_output.bias", "self_attn.o_proj.bias"},
                            {"attn_q_norm.weight", "self_attn.q_norm.weight"},
                            {"attn_k_norm.weight", "self_attn.k_norm.weight"},
                            {"ffn_norm.weight", "post_attention_layernorm.weight"},
                            {"ffn_gate.weight", "mlp.gate_proj.weight"},
                            {"ffn_gate.bias", "mlp.gate_proj.bias"},
                            {"ffn_up.weight", "mlp.up_proj.weight"},
                            {"ffn_up.bias", "mlp.up_proj.bias"},
                            {"ffn_down.weight", "mlp.down_proj.weight"},
                            {"ffn_down.bias", "mlp.down_proj.bias"}};

struct ArchRules {
  std::span<const Rule> base, layer;
  std::string layer_prefix;  // Hugging Face: "transformer.h." or "model.layers."
  bool permutes = false;     // llama.cpp's llama arch reorders Q/K rows; Qwen (NEOX rotary) does not
};

Result<ArchRules> rules_for(const std::string& arch) {
  if (arch == "gpt2") return ArchRules{kGpt2Base, kGpt2Layer, "transformer.h.", false};
  if (arch == "llama" || arch == "qwen2" || arch == "qwen3") return ArchRules{kLlamaBase, kLlamaLayer, "model.layers.", arch == "llama"};
  return core::unimplemented("GGUF architecture '" + arch + "' is not supported (gpt2, llama, qwen2, qwen3)");
}

Result<std::string> meta_string(const GgufFile& f, const std::string& key) {
  const json& m = f.metadata();
  if (!m.contains(key) || !m[key].is_string()) return core::invalid_argument("GGUF: '" + key + "' is missing or not a string");
  return m[key].get<std::string>();
}

Result<int64_t> meta_int(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi) {
  const json& m = f.metadata();
  if (!m.contains(key) || !m[key].is_number_integer()) return core::invalid_argument("GGUF: '" + key + "' is missing or not an integer");
  const int64_t v = m[key].is_number_unsigned() && m[key].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                        ? INT64_MAX : m[key].get<int64_t>();
  if (v < lo || v > hi) return core::out_of_range("GGUF: '" + key + "' = " + std::to_string(v) + " is outside [" +
                                                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

Result<double> meta_float(const GgufFile& f, const std::string& key, double fallback) {
  const json& m = f.metadata();
  if (!m.contains(key)) return fallback;
  if (!m[key].is_number()) return core::invalid_argument("GGUF: '" + key + "' is not a number");
  return m[key].get<double>();
}

constexpr int64_t kBig = int64_t{1} << 31;

// The rows of a [rows, cols] tensor reordered: llama.cpp stores head h's
// rows (i * d/2 + j) at (2 j + i); `to_hf` undoes it, else applies it.
core::Tensor interleave(const core::Tensor& t, int64_t heads, bool to_hf) {
  const int64_t rows = t.dim(0), cols = t.rank() == 2 ? t.dim(1) : 1, d = rows / heads;
  core::Tensor out = core::Tensor::zeros_f32(t.shape());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < d / 2; ++j) {
        const int64_t hf = h * d + i * (d / 2) + j, gg = h * d + 2 * j + i;
        const int64_t src = to_hf ? gg : hf, dst = to_hf ? hf : gg;
        std::memcpy(out.f32() + dst * cols, t.f32() + src * cols, static_cast<size_t>(cols) * sizeof(float));
      }
  return out;
}

core::Tensor transposed(const core::Tensor& t) {
  const int64_t r = t.dim(0), c = t.dim(1);
  core::Tensor out = core::Tensor::zeros_f32({c, r});
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) out.f32()[j * r + i] = t.f32()[i * c + j];
  return out;
}

}  // namespace

bool is_gguf_path(const std::string& path) {
  // By name: a missing or irregular file then gets GgufFile::open's error.
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

kernels::WeightType gguf_weight_type(const GgufFile& f) {
  // The most common block type of the layers' matrices: a Q4_K_M file's
  // Q4_K (its Q6_K and fall-back matrices keep their own blocks at load).
  std::map<kernels::WeightType, int> count;
  for (const GgufTensor& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0 || t.ne.size() != 2) continue;
    if (const auto k = kernel_type(t.type)) ++count[*k];
  }
  kernels::WeightType best = kernels::WeightType::kF32;
  for (const auto& [type, n] : count)
    if (best == kernels::WeightType::kF32 || n > count[best]) best = type;
  return best;
}

Result<std::string> gguf_config_json(const GgufFile& f) {
  TESSERA_ASSIGN_OR_RETURN(const std::string arch, meta_string(f, "general.architecture"));
  TESSERA_RETURN_IF_ERROR(rules_for(arch).status());
  const GgufTensor* emb = f.tensor("token_embd.weight");
  if (emb == nullptr || emb->ne.size() != 2) return core::invalid_argument("GGUF: no 2-D token_embd.weight");
  json j;
  const std::string p = arch + ".";
  TESSERA_ASSIGN_OR_RETURN(const int64_t hidden, meta_int(f, p + "embedding_length", 1, kBig));
  TESSERA_ASSIGN_OR_RETURN(const int64_t layers, meta_int(f, p + "block_count", 1, 4096));
  TESSERA_ASSIGN_OR_RETURN(const int64_t heads, meta_int(f, p + "attention.head_count", 1, 65536));
  TESSERA_ASSIGN_OR_RETURN(const int64_t ctx, meta_int(f, p + "context_length", 1, kBig));
  TESSERA_ASSIGN_OR_RETURN(const int64_t ffn, meta_int(f, p + "feed_forward_length", 1, kBig));
  j["vocab_size"] = emb->ne[1];
  const json& m = f.metadata();
  for (const char* k : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"})
    if (m.contains(k) && m[k].is_number_integer()) j[std::string(k).find("bos") != std::string::npos ? "bos_token_id" : "eos_token_id"] = m[k];
  if (arch == "gpt2") {
    j["model_type"] = "gpt2";
    j["architectures"] = {"GPT2LMHeadModel"};
    j["n_embd"] = hidden;
    j["n_layer"] = layers;
    j["n_head"] = heads;
    j["n_positions"] = ctx;
    j["n_inner"] = ffn;
    TESSERA_ASSIGN_OR_RETURN(j["layer_norm_epsilon"], meta_float(f, p + "attention.layer_norm_epsilon", 1e-5));
    j["activation_function"] = "gelu_new";
    return j.dump();
  }
  j["model_type"] = arch;
  j["architectures"] = {arch == "llama" ? "LlamaForCausalLM" : arch == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"};
  j["hidden_size"] = hidden;
  j["num_hidden_layers"] = layers;
  j["num_attention_heads"] = heads;
  j["max_position_embeddings"] = ctx;
  j["intermediate_size"] = ffn;
  j["num_key_value_heads"] = heads;
  if (m.contains(p + "attention.head_count_kv")) {
    TESSERA_ASSIGN_OR_RETURN(j["num_key_value_heads"], meta_int(f, p + "attention.head_count_kv", 1, 65536));
  }
  if (m.contains(p + "attention.key_length")) {
    TESSERA_ASSIGN_OR_RETURN(j["head_dim"], meta_int(f, p + "attention.key_length", 1, 65536));
  }
  TESSERA_ASSIGN_OR_RETURN(j["rms_norm_eps"], meta_float(f, p + "attention.layer_norm_rms_epsilon", 1e-6));
  TESSERA_ASSIGN_OR_RETURN(j["rope_theta"], meta_float(f, p + "rope.freq_base", 10000.0));
  // As llama.cpp reads it: a factor (or the older scale_linear) with no
  // type is linear.
  std::string kind = "linear";
  if (m.contains(p + "rope.scaling.type")) {
    TESSERA_ASSIGN_OR_RETURN(kind, meta_string(f, p + "rope.scaling.type"));
  }
  double factor = 0;
  if (m.contains(p + "rope.scaling.factor")) {
    TESSERA_ASSIGN_OR_RETURN(factor, meta_float(f, p + "rope.scaling.factor", 0.0));
  } else if (m.contains(p + "rope.scale_linear")) {
    TESSERA_ASSIGN_OR_RETURN(factor, meta_float(f, p + "rope.scale_linear", 0.0));
  }
  if (kind != "none" && factor != 0 && factor != 1) {
    if (kind != "linear") return core::unimplemented("GGUF: rope scaling '" + kind.substr(0, 32) + "' is not supported (linear)");
    j["rope_scaling"] = {{"type", "linear"}, {"factor", factor}};
  } else if (kind != "none" && kind != "linear") {
    return core::unimplemented("GGUF: rope scaling '" + kind.substr(0, 32) + "' is not supported (linear)");
  }
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = f.tensor("output.weight") == nullptr;
  j["attention_bias"] = f.tensor("blk.0.attn_q.bias") != nullptr;
  j["mlp_bias"] = f.tensor("blk.0.ffn_up.bias") != nullptr;
  return j.dump();
}

Status gguf_adjust_config(const GgufFile& f, ModelConfig& c) {
  c.weights = gguf_weight_type(f);
  if (c.weights != kernels::WeightType::kF32) {
    // What the layers' matrices take in their own types against the main
    // type alone, and the head's type: the estimates of a mixed file.
    double own = 0, main = 0, all = 0;
    std::map<kernels::WeightType, double> by_type;  // the layers' weights in each type
    for (const GgufTensor& t : f.tensors()) {
      const auto type = kernel_type(t.type);
      if (t.name.rfind("blk.", 0) != 0 || t.ne.size() != 2 || !type) continue;
      own += static_cast<double>(t.nbytes);
      main += static_cast<double>(t.rows()) * static_cast<double>(kernels::row_bytes(c.weights, t.row_length()));
      const double n = static_cast<double>(t.rows()) * static_cast<double>(t.row_length());
      all += n;
      by_type[*type] += n;
    }
    c.mix_weights = c.weights;
    c.mix_layer_scale = main > 0 ? own / main : 1.0;
    for (const auto& [type, n] : by_type)
      if (type != c.weights && n / all > c.mix_other_share) c.mix_other = type, c.mix_other_share = n / all;
    // The blocks that column cuts must respect: attn_output's and ffn_down's.
    for (const GgufTensor& t : f.tensors()) {
      const auto type = kernel_type(t.type);
      if (t.name.rfind("blk.", 0) != 0 || t.ne.size() != 2 || !type) continue;
      int64_t* block = t.name.ends_with(".attn_output.weight") ? &c.mix_attn_block
                       : t.name.ends_with(".ffn_down.weight")  ? &c.mix_ffn_block
                                                               : nullptr;
      if (block != nullptr) *block = std::lcm(std::max<int64_t>(*block, 1), kernels::block_elems(*type));
    }
    const GgufTensor* head = f.tensor("output.weight") != nullptr ? f.tensor("output.weight") : f.tensor("token_embd.weight");
    if (head != nullptr)
      if (const auto t = kernel_type(head->type)) c.mix_head = *t;
  }
  // llama.cpp's rope_freqs: per-frequency divisors (Llama 3.1's scaling).
  if (f.tensor("rope_freqs.weight") == nullptr) return core::ok_status();
  TESSERA_ASSIGN_OR_RETURN(const core::Tensor div, f.get_f32("rope_freqs.weight"));
  if (div.rank() != 1 || div.dim(0) != static_cast<int64_t>(c.rope_inv_freq.size()))
    return core::invalid_argument("GGUF: rope_freqs.weight has " + std::to_string(div.numel()) + " values for " +
                                  std::to_string(c.rope_inv_freq.size()) + " rotary frequencies");
  for (size_t i = 0; i < c.rope_inv_freq.size(); ++i) {
    const float d = div.f32()[i];
    if (!(d > 0.0f) || !std::isfinite(d)) return core::invalid_argument("GGUF: rope_freqs.weight holds a divisor that is not positive");
    c.rope_inv_freq[i] /= d;
  }
  return core::ok_status();
}

Result<std::vector<GgufMapped>> gguf_tensor_map(const GgufFile& f) {
  TESSERA_ASSIGN_OR_RETURN(const std::string arch, meta_string(f, "general.architecture"));
  TESSERA_ASSIGN_OR_RETURN(const ArchRules rules, rules_for(arch));
  TESSERA_ASSIGN_OR_RETURN(const int64_t layers, meta_int(f, arch + ".block_count", 1, 4096));
  TESSERA_ASSIGN_OR_RETURN(const int64_t heads, meta_int(f, arch + ".attention.head_count", 1, 65536));
  int64_t kv_heads = heads;
  if (f.metadata().contains(arch + ".attention.head_count_kv")) {
    TESSERA_ASSIGN_OR_RETURN(kv_heads, meta_int(f, arch + ".attention.head_count_kv", 1, 65536));
  }
  std::vector<GgufMapped> out;
  for (const GgufTensor& t : f.tensors()) {
    if (t.ne.size() > 2) return core::invalid_argument("GGUF: tensor '" + t.name + "' has more than 2 dimensions");
    const Rule* rule = nullptr;
    std::string hf;
    for (const Rule& r : rules.base)
      if (t.name == r.gguf) rule = &r, hf = r.hf;
    if (t.name == "rope_freqs.weight") continue;  // not a weight: gguf_adjust_config reads it
    if (rule == nullptr && t.name.rfind("blk.", 0) == 0) {
      const size_t dot = t.name.find('.', 4);
      const std::string num = t.name.substr(4, dot == std::string::npos ? 0 : dot - 4);
      if (!num.empty() && num.size() < 6 && std::all_of(num.begin(), num.end(), ::isdigit) && std::stoll(num) < layers) {
        const std::string rest = t.name.substr(dot + 1);
        for (const Rule& r : rules.layer)
          if (rest == r.gguf) rule = &r, hf = rules.layer_prefix + std::to_string(std::stoll(num)) + "." + r.hf;
      }
    }
    if (rule == nullptr) return core::invalid_argument("GGUF: unexpected tensor '" + t.name + "' for architecture " + arch);
    GgufMapped mp;
    mp.hf_name = hf;
    mp.gguf_name = t.name;
    if (t.ne.size() == 1) {
      mp.shape = {t.ne[0]};
    } else {
      mp.shape = rule->transpose ? core::Shape{t.ne[0], t.ne[1]} : core::Shape{t.ne[1], t.ne[0]};
      if (rule->transpose) mp.layout = GgufMapped::Layout::kTranspose;
    }
    if (rule->permute != 0 && rules.permutes) {
      mp.layout = GgufMapped::Layout::kUnpermute;
      mp.heads = rule->permute == 1 ? heads : kv_heads;
      if (mp.shape[0] % (2 * mp.heads) != 0)
        return core::invalid_argument("GGUF: tensor '" + t.name + "' rows do not split into " + std::to_string(mp.heads) + " heads");
    }
    out.push_back(std::move(mp));
  }
  return out;
}

Result<core::Tensor> gguf_read(const GgufFile& f, const GgufMapped& m) {
  TESSERA_ASSIGN_OR_RETURN(core::Tensor t, f.get_f32(m.gguf_name));
  switch (m.layout) {
    case GgufMapped::Layout::kAsIs: return t;
    case GgufMapped::Layout::kTranspose: return transposed(t);
    case GgufMapped::Layout::kUnpermute: return interleave(t, m.heads, true);
  }
  return t;
}

Result<std::optional<GgufBlocks>> gguf_blocks(const GgufFile& f, const GgufMapped& m) {
  const GgufTensor* t = f.tensor(m.gguf_name);
  if (t == nullptr) return core::not_found("tensor '" + m.gguf_name + "' not in '" + f.path() + "'");
  const auto type = kernel_type(t->type);
  if (!type || t->ne.size() != 2) return std::optional<GgufBlocks>();
  GgufBlocks b;
  b.type = *type;
  b.rows = t->rows();
  b.k = t->row_length();
  const size_t rb = kernels::row_bytes(b.type, b.k);
  // parse() checked the size; the kernels read rows of whole blocks.
  if (!kernels::holds(b.type, b.k) || static_cast<size_t>(b.rows) * rb != t->nbytes)
    return core::invalid_argument("GGUF: tensor '" + m.gguf_name + "' is not whole rows of " + ggml_type_name(t->type) + " blocks");
  b.data = t->data;
  if (m.layout == GgufMapped::Layout::kUnpermute) {
    const int64_t d = m.heads > 0 ? b.rows / m.heads : 0;
    if (m.heads <= 0 || b.rows % m.heads != 0 || d % 2 != 0)
      return core::invalid_argument("GGUF: tensor '" + m.gguf_name + "' rows are not whole heads");
    auto copy = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(b.rows) * rb]);
    for (int64_t h = 0; h < m.heads; ++h)
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < d / 2; ++j)
          std::memcpy(copy.get() + static_cast<size_t>(h * d + i * (d / 2) + j) * rb,
                      t->data + static_cast<size_t>(h * d + 2 * j + i) * rb, rb);
    b.data = copy.get();
    b.keep = copy;
  }
  return std::optional<GgufBlocks>(std::move(b));
}

// ---------------------------------------------------------------- tokenizer

namespace {

// Hugging Face's pre-tokenizer patterns for llama.cpp's `tokenizer.ggml.pre` names.
const char* const kLlama3Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Split =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

json split_then_bytes(const char* pattern) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
            byte_level(false)}}};
}

constexpr int kTokControl = 3, kTokUserDefined = 4;

}  // namespace

Result<std::string> gguf_chat_template(const GgufFile& f) {
  const json& m = f.metadata();
  if (!m.contains("tokenizer.chat_template")) return core::not_found("no tokenizer.chat_template in '" + f.path() + "'");
  if (!m["tokenizer.chat_template"].is_string()) return core::invalid_argument("GGUF: tokenizer.chat_template is not a string");
  return m["tokenizer.chat_template"].get<std::string>();
}

namespace {
Result<std::unique_ptr<Tokenizer>> tokenizer_of(const GgufFile& f);
Result<std::unique_ptr<Tokenizer>> finish_gguf_tokenizer(const GgufFile& f, const json& tokens, json& vocab, json& tj, bool add_bos);
Result<QuantizeReport> write_model(const std::string& dir, const std::string& type, const std::string& out);
}  // namespace

// The metadata is the file's: a value of an unexpected type, or text that is
// not UTF-8, ends in an error rather than an exception.
Result<std::unique_ptr<Tokenizer>> gguf_tokenizer(const GgufFile& f) {
  try {
    return tokenizer_of(f);
  } catch (const json::exception& e) {
    return core::invalid_argument("GGUF tokenizer in '" + f.path() + "': " + e.what());
  }
}

Result<QuantizeReport> write_gguf_model(const std::string& dir, const std::string& type, const std::string& out) {
  try {
    return write_model(dir, type, out);
  } catch (const json::exception& e) {
    return core::invalid_argument("quantize '" + dir + "': " + e.what());
  }
}

namespace {

constexpr int kTokNormal = 1, kTokUnknown = 2, kTokByte = 6;

// The index of each UTF-8 character boundary of s after the first (split points).
std::vector<size_t> utf8_splits(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 1; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  return out;
}

// tokenizer.ggml.model "llama": a SentencePiece vocabulary with scores and
// <0xXX> byte tokens (Llama 2, Mistral, TinyLlama). SentencePiece merges the
// adjacent pair whose union has the highest score; that is a BPE whose merges
// are every (left, right) split of a token into two tokens, ranked by the
// token's score (ties by token id, then the pieces' ids), with byte fallback,
// as Hugging Face's tokenizer.json for these models has it. Spaces become
// U+2581, and a text starts with one unless add_space_prefix is false.
Result<std::unique_ptr<Tokenizer>> spm_tokenizer_of(const GgufFile& f) {
  const json& m = f.metadata();
  const json& tokens = m.value("tokenizer.ggml.tokens", json());
  const json& scores = m.value("tokenizer.ggml.scores", json());
  const json& types = m.value("tokenizer.ggml.token_type", json::array());
  if (!tokens.is_array() || tokens.empty()) return core::invalid_argument("GGUF: tokenizer.ggml.tokens is missing");
  if (!scores.is_array() || scores.size() != tokens.size())
    return core::invalid_argument("GGUF: tokenizer.ggml.scores must hold one number per token");
  json vocab = json::object(), added = json::array();
  std::map<std::string, int64_t, std::less<>> id_of;
  std::string unk;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!tokens[i].is_string() || !scores[i].is_number()) return core::invalid_argument("GGUF: a token or score of the wrong type");
    const std::string& t = tokens[i].get_ref<const std::string&>();
    if (id_of.count(t)) continue;  // the first id wins, as in SentencePiece
    id_of[t] = static_cast<int64_t>(i);
    vocab[t] = i;
    const int type = i < types.size() && types[i].is_number_integer() ? types[i].get<int>() : kTokNormal;
    if (type == kTokUnknown && unk.empty()) unk = t;
    if (type == kTokControl || type == kTokUserDefined || type == kTokUnknown)
      added.push_back({{"id", i}, {"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", type != kTokUserDefined}});
  }
  struct Merge {
    double score;
    int64_t id, left, right;
    std::string l, r;
  };
  std::vector<Merge> ms;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int type = i < types.size() && types[i].is_number_integer() ? types[i].get<int>() : kTokNormal;
    if (type != kTokNormal && type != kTokUserDefined) continue;  // control, unknown and byte tokens are never merged into
    const std::string& t = tokens[i].get_ref<const std::string&>();
    // SentencePiece's pieces are at most 16 characters (its trainer's
    // max_sentencepiece_length), 64 bytes; a longer token in a hostile file
    // would make this quadratic, and it gets no merges.
    if (id_of.find(t)->second != static_cast<int64_t>(i) || t.size() > 64) continue;
    const std::string_view tv = t;
    for (size_t cut : utf8_splits(t)) {
      const auto a = id_of.find(tv.substr(0, cut)), b = id_of.find(tv.substr(cut));
      if (a != id_of.end() && b != id_of.end())
        ms.push_back({scores[i].get<double>(), static_cast<int64_t>(i), a->second, b->second, a->first, b->first});
    }
  }
  std::sort(ms.begin(), ms.end(), [](const Merge& x, const Merge& y) {
    if (x.score != y.score) return x.score > y.score;
    if (x.id != y.id) return x.id < y.id;
    return x.left != y.left ? x.left < y.left : x.right < y.right;
  });
  json merges = json::array();
  for (const Merge& x : ms) merges.push_back(json::array({x.l, x.r}));
  const std::string space = "\u2581";
  const bool prefix = m.value("tokenizer.ggml.add_space_prefix", true) == true;
  json norm = json::array();
  if (prefix) norm.push_back({{"type", "Prepend"}, {"prepend", space}});
  norm.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}});
  json dec = json::array({{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                          {{"type", "ByteFallback"}},
                          {{"type", "Fuse"}}});
  if (prefix) dec.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  json tj = {{"version", "1.0"},
             {"added_tokens", added},
             {"normalizer", {{"type", "Sequence"}, {"normalizers", norm}}},
             {"pre_tokenizer", nullptr},
             {"post_processor", nullptr},
             {"decoder", {{"type", "Sequence"}, {"decoders", dec}}},
             {"model",
              {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", unk.empty() ? json(nullptr) : json(unk)},
               {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", true},
               {"byte_fallback", true}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}}}};
  return finish_gguf_tokenizer(f, tokens, vocab, tj, m.value("tokenizer.ggml.add_bos_token", true) == true);
}

Result<std::unique_ptr<Tokenizer>> tokenizer_of(const GgufFile& f) {
  const json& m = f.metadata();
  TESSERA_ASSIGN_OR_RETURN(const std::string kind, meta_string(f, "tokenizer.ggml.model"));
  if (kind == "llama") return spm_tokenizer_of(f);
  if (kind != "gpt2")
    return core::unimplemented("GGUF tokenizer '" + kind + "' is not supported (gpt2-style byte-level BPE, llama-style SentencePiece); give token ids");
  const json& tokens = m.value("tokenizer.ggml.tokens", json());
  if (!tokens.is_array() || tokens.empty()) return core::invalid_argument("GGUF: tokenizer.ggml.tokens is missing");
  const json& merges = m.value("tokenizer.ggml.merges", json::array());
  const json& types = m.value("tokenizer.ggml.token_type", json::array());
  if (!merges.is_array() || merges.empty())
    return core::unimplemented("GGUF: the vocabulary has no merges (a placeholder vocabulary); give token ids");
  const std::string pre = m.contains("tokenizer.ggml.pre") && m["tokenizer.ggml.pre"].is_string()
                              ? m["tokenizer.ggml.pre"].get<std::string>() : "default";
  json pre_tok;
  if (pre == "gpt2" || pre == "gpt-2" || pre == "default") pre_tok = byte_level(true);
  else if (pre == "llama-bpe" || pre == "llama3") pre_tok = split_then_bytes(kLlama3Split);
  else if (pre == "qwen2") pre_tok = split_then_bytes(kQwen2Split);
  else return core::unimplemented("GGUF pre-tokenizer '" + pre + "' is not supported (gpt-2, llama-bpe, qwen2)");
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!tokens[i].is_string()) return core::invalid_argument("GGUF: tokenizer.ggml.tokens holds a non-string");
    const std::string& t = tokens[i].get_ref<const std::string&>();
    vocab[t] = i;
    const int type = i < types.size() && types[i].is_number_integer() ? types[i].get<int>() : 1;
    if (type == kTokControl || type == kTokUserDefined)
      added.push_back({{"id", i}, {"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", type == kTokControl}});
  }
  json tj = {{"version", "1.0"},
             {"added_tokens", added},
             // Qwen2's tokenizer.json composes (NFC) before splitting; llama.cpp does too.
             {"normalizer", pre == "qwen2" ? json{{"type", "NFC"}} : json()},
             {"pre_tokenizer", pre_tok},
             {"post_processor", nullptr},
             {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
             {"model",
              {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
               {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
               {"ignore_merges", pre == "llama-bpe" || pre == "llama3"}, {"vocab", vocab}, {"merges", merges}}}};
  return finish_gguf_tokenizer(f, tokens, vocab, tj, m.value("tokenizer.ggml.add_bos_token", false) == true);
}

// The BOS template (when the file adds BOS) and the special tokens' names.
Result<std::unique_ptr<Tokenizer>> finish_gguf_tokenizer(const GgufFile& f, const json& tokens, json& vocab, json& tj, bool add_bos) {
  const json& m = f.metadata();
  json cfg = json::object();
  auto name_of = [&](const char* key) -> std::string {
    if (!m.contains(key) || !m[key].is_number_unsigned()) return "";
    const uint64_t id = m[key].get<uint64_t>();
    return id < tokens.size() && tokens[id].is_string() ? tokens[id].get<std::string>() : "";
  };
  if (const std::string b = name_of("tokenizer.ggml.bos_token_id"); !b.empty()) {
    cfg["bos_token"] = b;
    if (add_bos)
      tj["post_processor"] = {{"type", "TemplateProcessing"},
                              {"single", {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                              {"pair", {{{"SpecialToken", {{"id", b}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
                              {"special_tokens", {{b, {{"id", b}, {"ids", {vocab[b]}}, {"tokens", {b}}}}}}};
  }
  if (const std::string e = name_of("tokenizer.ggml.eos_token_id"); !e.empty()) cfg["eos_token"] = e;
  const std::string cfg_text = cfg.dump();
  return parse_tokenizer_json(tj.dump(), f.path() + " (tokenizer.ggml)", &cfg_text);
}

// ---------------------------------------------------------------- writer

std::string f32_bytes(const core::Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.f32()), static_cast<size_t>(t.numel()) * sizeof(float));
}

std::string f16_bytes(const core::Tensor& t) {
  std::string out(static_cast<size_t>(t.numel()) * 2, '\0');
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint16_t h = core::f32_to_f16(t.f32()[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

std::string quant_bytes(const core::Tensor& t, kernels::WeightType q) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  const size_t rb = kernels::row_bytes(q, cols);
  std::string out(static_cast<size_t>(rows) * rb, '\0');
  for (int64_t r = 0; r < rows; ++r)
    kernels::quantize_row_ref(q, t.f32() + r * cols, cols, reinterpret_cast<uint8_t*>(out.data()) + r * rb);
  return out;
}

// Byte-level BPE's printable stand-ins for bytes 0..255 (GPT-2's table), for
// placeholder vocabularies.
std::vector<std::string> byte_chars() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<std::string> out(256);
  std::vector<bool> seen(256, false);
  for (int b : bs) seen[static_cast<size_t>(b)] = true;
  int extra = 0;
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  for (int b = 0; b < 256; ++b) out[static_cast<size_t>(b)] = utf8(seen[static_cast<size_t>(b)] ? b : 256 + extra++);
  return out;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre = "default";
  bool placeholder = true;
  // A SentencePiece-style BPE (byte_fallback, U+2581 spaces: Llama 2,
  // Mistral) goes out as tokenizer.ggml.model "llama": scores instead of
  // merges, each merged token scored minus the rank of its first merge.
  bool spm = false, space_prefix = true;
  std::vector<float> scores;
};

// The folder's byte-level BPE vocabulary (tokenizer.json), or a placeholder
// of `n` tokens (token ids still work; text does not).
Result<Vocab> folder_vocab(const std::string& dir, int64_t n) {
  Vocab v;
  const std::string path = dir + "/tokenizer.json";
  if (core::file_exists(path)) {
    TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
    const json tj = json::parse(text, nullptr, false);
    if (tj.is_object() && tj.contains("model") && tj["model"].is_object() && tj["model"].value("type", "") == "BPE" &&
        tj["model"].contains("vocab") && tj["model"]["vocab"].is_object()) {
      std::map<int64_t, std::string> by_id;
      for (const auto& [tok, id] : tj["model"]["vocab"].items())
        if (id.is_number_integer()) by_id[id.get<int64_t>()] = tok;
      std::map<int64_t, bool> special;
      for (const json& a : tj.value("added_tokens", json::array()))
        if (a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") && a["content"].is_string()) {
          by_id[a["id"].get<int64_t>()] = a["content"].get<std::string>();
          special[a["id"].get<int64_t>()] = a.value("special", false);
        }
      const int64_t size = std::max<int64_t>(n, by_id.empty() ? 0 : by_id.rbegin()->first + 1);
      for (int64_t i = 0; i < size; ++i) {
        auto it = by_id.find(i);
        v.tokens.push_back(it != by_id.end() ? it->second : "[PAD" + std::to_string(i) + "]");
        v.types.push_back(it == by_id.end() ? 5 : special.count(i) ? (special[i] ? kTokControl : kTokUserDefined) : 1);
      }
      for (const json& mg : tj["model"].value("merges", json::array())) {
        if (mg.is_string()) v.merges.push_back(mg.get<std::string>());
        else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string())
          v.merges.push_back(mg[0].get<std::string>() + " " + mg[1].get<std::string>());
      }
      if (tj["model"].value("byte_fallback", false) == true) {
        v.spm = true;
        v.space_prefix = tj.value("normalizer", json()).dump().find("\"Prepend\"") != std::string::npos;
        std::map<std::string, size_t> id;
        for (size_t i = 0; i < v.tokens.size(); ++i) id.emplace(v.tokens[i], i);
        const std::string unk = tj["model"].value("unk_token", json()).is_string() ? tj["model"]["unk_token"].get<std::string>() : "";
        v.scores.assign(v.tokens.size(), 0.0f);
        std::vector<bool> scored(v.tokens.size(), false);
        for (size_t r = 0; r < v.merges.size(); ++r) {
          const size_t sp = v.merges[r].find(' ');
          const auto it = id.find(v.merges[r].substr(0, sp) + v.merges[r].substr(sp + 1));
          if (it != id.end() && !scored[it->second]) v.scores[it->second] = -static_cast<float>(r + 1), scored[it->second] = true;
        }
        for (size_t i = 0; i < v.tokens.size(); ++i) {
          const std::string& t = v.tokens[i];
          if (t == unk) v.types[i] = kTokUnknown;
          else if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>') v.types[i] = kTokByte;
        }
        v.merges.clear();
        v.placeholder = false;
        return v;
      }
      const json pt = tj.value("pre_tokenizer", json());
      const std::string dumped = pt.dump();
      if (dumped.find(json(kLlama3Split).dump()) != std::string::npos) v.pre = "llama-bpe";
      else if (dumped.find(json(kQwen2Split).dump()) != std::string::npos) v.pre = "qwen2";
      else if (pt.is_object() && pt.value("type", "") == "ByteLevel") v.pre = "gpt-2";
      v.placeholder = false;
      return v;
    }
  }
  const auto bytes = byte_chars();
  for (int64_t i = 0; i < n; ++i) {
    v.tokens.push_back(i < 256 ? bytes[static_cast<size_t>(i)] : "<tok" + std::to_string(i) + ">");
    v.types.push_back(1);
  }
  return v;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and
// every third one between get more bits in its _M mixes.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The block type of one matrix (GGUF name) in a file of type `q`; `mixed`:
// Q4_K_M, whose mix is llama.cpp's (Q6_K for the output matrix, and for
// attn_v and ffn_down in use_more_bits layers; it would give 70B models'
// attn_v and fused QKV matrices Q5_K, which Tessera does not read). A row
// length that is not whole blocks falls back as llama.cpp's does, except
// that Q4_K's Q5_0 becomes Q8_0 (no Q5_0 here); then F16.
kernels::WeightType matrix_type(kernels::WeightType q, bool mixed, const std::string& gname, int64_t layers,
                                bool has_output, int64_t ne0) {
  using WT = kernels::WeightType;
  WT t = q;
  if (mixed) {
    const bool head = gname == "output.weight" || (!has_output && gname == "token_embd.weight");
    int64_t layer = -1;
    if (gname.rfind("blk.", 0) == 0) layer = std::atoll(gname.c_str() + 4);
    const bool more = layer >= 0 && use_more_bits(layer, layers) &&
                      (gname.find(".attn_v.") != std::string::npos || gname.find(".ffn_down.") != std::string::npos);
    if (head || more) t = WT::kQ6_K;
  }
  if (kernels::holds(t, ne0)) return t;
  if (kernels::block_elems(t) > kernels::kQuantBlock && kernels::holds(WT::kQ8_0, ne0)) return WT::kQ8_0;
  return WT::kF32;  // written as F16
}

// Whether tokenizer.json's post-processor (or one in its Sequence) is a
// TemplateProcessing whose "single" begins with a SpecialToken (a BOS).
bool template_starts_with_special(const std::string& path) {
  if (!core::file_exists(path)) return false;
  auto text = core::read_file(path);
  if (!text.ok()) return false;
  const json tj = json::parse(*text, nullptr, false);
  if (!tj.is_object() || !tj.contains("post_processor") || !tj["post_processor"].is_object()) return false;
  std::vector<const json*> procs = {&tj["post_processor"]};
  if (const json& pp = tj["post_processor"]; pp.value("type", "") == "Sequence" && pp.contains("processors") && pp["processors"].is_array())
    for (const json& x : pp["processors"]) procs.push_back(&x);
  for (const json* x : procs) {
    if (!x->is_object() || x->value("type", "") != "TemplateProcessing" || !x->contains("single")) continue;
    const json& single = (*x)["single"];
    if (single.is_array() && !single.empty() && single[0].is_object() && single[0].contains("SpecialToken")) return true;
  }
  return false;
}

Result<QuantizeReport> write_model(const std::string& dir, const std::string& type, const std::string& out) {
  kernels::WeightType q = kernels::WeightType::kF32;
  bool f16 = false, mixed = false;
  if (type == "f16") f16 = true;
  else if (type == "q4_k_m") q = kernels::WeightType::kQ4_K, mixed = true;
  else if (type != "f32") {
    TESSERA_ASSIGN_OR_RETURN(q, kernels::parse_weight_type(type));
  }
  TESSERA_ASSIGN_OR_RETURN(const std::string cfg_text, core::read_file(dir + "/config.json"));
  TESSERA_ASSIGN_OR_RETURN(const ModelConfig c, parse_config(cfg_text));
  json cj = json::parse(cfg_text, nullptr, false);
  // transformers 5's "rope_parameters" as 4's two keys, which the rest reads.
  if (cj.contains("rope_parameters") && cj["rope_parameters"].is_object()) {
    json rs = cj["rope_parameters"];
    if (rs.contains("rope_theta")) cj["rope_theta"] = rs["rope_theta"];
    rs.erase("rope_theta");
    cj["rope_scaling"] = rs;
    cj.erase("rope_parameters");
  }
  const std::string mt = cj.value("model_type", "");
  const std::map<std::string, std::string> arch_of{{"gpt2", "gpt2"}, {"llama", "llama"}, {"mistral", "llama"},
                                                   {"qwen2", "qwen2"}, {"qwen3", "qwen3"}};
  if (!arch_of.count(mt)) return core::unimplemented("quantize: model_type '" + mt + "' has no GGUF architecture here (gpt2, llama, mistral, qwen2, qwen3)");
  const std::string arch = arch_of.at(mt);
  std::string rope_kind;
  if (cj.contains("rope_scaling") && cj["rope_scaling"].is_object()) {
    const json& rs = cj["rope_scaling"];
    const json kind = rs.contains("rope_type") ? rs["rope_type"] : rs.value("type", json(""));
    rope_kind = kind.is_string() ? kind.get<std::string>() : "";
    if (rope_kind != "linear" && rope_kind != "default" && rope_kind != "llama3")
      return core::unimplemented("quantize: rope_scaling '" + rope_kind + "' is not written to GGUF (linear, llama3)");
    if (rope_kind == "llama3" && arch != "llama")
      return core::unimplemented("quantize: llama.cpp reads llama3 rope scaling for its llama architecture only");
  }
  if (c.bp_div > 0) return core::unimplemented("quantize: a decoupled (block_parallel) checkpoint has no GGUF form");
  // llama.cpp's gpt2 has tanh GELU and the default attention scale; a file
  // that says otherwise would load as another model.
  if (arch == "gpt2") {
    const std::string act = cj.value("activation_function", "gelu_new");
    if ((act != "gelu_new" && act != "gelu_pytorch_tanh") || !cj.value("scale_attn_weights", true) ||
        cj.value("scale_attn_by_inverse_layer_idx", false))
      return core::unimplemented("quantize: a gpt2 config with activation_function '" + act +
                                 "' or non-default attention scaling has no GGUF form (gelu_new, scale_attn_weights)");
  }
  TESSERA_ASSIGN_OR_RETURN(const TensorStore store, TensorStore::open_dir(dir));
  TESSERA_ASSIGN_OR_RETURN(const ArchRules rules, rules_for(arch));
  // Hugging Face name -> (GGUF name, rule); names are normalised to the
  // causal-LM wrapper (a base-model checkpoint has no prefix).
  std::map<std::string, std::pair<std::string, const Rule*>> to_gguf;
  for (const Rule& r : rules.base) to_gguf[r.hf] = {r.gguf, &r};
  for (int64_t l = 0; l < c.layers; ++l)
    for (const Rule& r : rules.layer)
      to_gguf[rules.layer_prefix + std::to_string(l) + "." + r.hf] = {"blk." + std::to_string(l) + "." + r.gguf, &r};
  const std::string wrapper = arch == "gpt2" ? "transformer." : "model.";
  GgufWriter w;
  QuantizeReport rep;
  std::vector<std::pair<std::string, std::string>> order;  // (gguf name, file name)
  for (const std::string& name : store.names()) {
    std::string hf = name;
    if (!to_gguf.count(hf) && name != "lm_head.weight") hf = wrapper + name;
    auto it = to_gguf.find(hf);
    if (it == to_gguf.end()) {
      const bool buffer = name.find("attn.bias") != std::string::npos || name.find("masked_bias") != std::string::npos ||
                          name.find("inv_freq") != std::string::npos;
      if (buffer) continue;
      return core::invalid_argument("quantize: tensor '" + name + "' has no GGUF name for architecture " + arch);
    }
    if (hf == "lm_head.weight" && c.tied_head) continue;  // llama.cpp reuses token_embd
    order.push_back({it->second.first, name});
  }
  // llama.cpp wants nothing in particular, but a stable order keeps files comparable.
  std::sort(order.begin(), order.end());
  const int64_t heads = c.heads, kv_heads = c.kv_head_count();
  bool has_output = false;
  for (const auto& o : order) has_output |= o.first == "output.weight";
  for (const auto& [gname, name] : order) {
    std::string hf = name;
    if (!to_gguf.count(hf) && name != "lm_head.weight") hf = wrapper + name;
    const Rule* r = to_gguf.at(hf).second;
    TESSERA_ASSIGN_OR_RETURN(core::Tensor t, store.get_f32(name));
    if (t.rank() == 2 && r->transpose) t = transposed(t);
    if (r->permute != 0 && rules.permutes) t = interleave(t, r->permute == 1 ? heads : kv_heads, false);
    std::vector<int64_t> ne = t.rank() == 1 ? std::vector<int64_t>{t.dim(0)} : std::vector<int64_t>{t.dim(1), t.dim(0)};
    const bool matrix = t.rank() == 2 && gname != "position_embd.weight" && gname.find("_norm") == std::string::npos;
    GgmlType gt = GgmlType::kF32;
    std::string bytes;
    const kernels::WeightType mt =
        matrix && q != kernels::WeightType::kF32 ? matrix_type(q, mixed, gname, c.layers, has_output, ne[0]) : q;
    if (matrix && mt != kernels::WeightType::kF32) {
      gt = ggml_type_of(mt);
      if (mt != q && kernels::block_elems(mt) < kernels::block_elems(q))
        rep.notes.push_back(gname + ": rows of " + std::to_string(ne[0]) + " are not whole blocks of " +
                            std::to_string(kernels::block_elems(q)) + "; " + ggml_type_name(gt) + " instead");
      bytes = quant_bytes(t, mt);
      ++rep.quantized;
      ++rep.types[ggml_type_name(gt)];
    } else if (matrix && (f16 || q != kernels::WeightType::kF32)) {
      if (!f16) rep.notes.push_back(gname + ": rows of " + std::to_string(ne[0]) + " are not whole blocks of 32; F16 instead");
      gt = GgmlType::kF16;
      bytes = f16_bytes(t);
    } else {
      bytes = f32_bytes(t);
    }
    store.release(name);
    w.add_tensor(gname, gt, ne, std::move(bytes));
    ++rep.tensors;
  }
  if (rope_kind == "llama3") {
    // llama.cpp's rope_freqs: each frequency's divisor, unscaled / scaled.
    json plain = cj;
    plain.erase("rope_scaling");
    TESSERA_ASSIGN_OR_RETURN(const ModelConfig c0, parse_config(plain.dump()));
    std::vector<float> div(c.rope_inv_freq.size());
    for (size_t i = 0; i < div.size(); ++i) div[i] = c0.rope_inv_freq[i] / c.rope_inv_freq[i];
    w.add_tensor("rope_freqs.weight", GgmlType::kF32, {static_cast<int64_t>(div.size())},
                 std::string(reinterpret_cast<const char*>(div.data()), div.size() * sizeof(float)));
    ++rep.tensors;
  }
  // Metadata: the architecture's hyper-parameters as llama.cpp reads them.
  const std::string p = arch + ".";
  w.add_string("general.architecture", arch);
  std::string base = dir;
  while (!base.empty() && base.back() == '/') base.pop_back();
  w.add_string("general.name", base.substr(base.find_last_of('/') + 1));
  // llama_ftype: MOSTLY_F16 1, Q4_0 2, Q8_0 7, Q4_K_S 14, Q4_K_M 15, Q6_K 18.
  const uint32_t ftype = f16 ? 1
                         : q == kernels::WeightType::kQ8_0 ? 7
                         : q == kernels::WeightType::kQ4_0 ? 2
                         : q == kernels::WeightType::kQ4_K ? (mixed ? 15 : 14)
                         : q == kernels::WeightType::kQ6_K ? 18
                                                           : 0;
  w.add_u32("general.file_type", ftype);
  if (q != kernels::WeightType::kF32) w.add_u32("general.quantization_version", 2);
  w.add_u32(p + "block_count", static_cast<uint32_t>(c.layers));
  // A sliding window: the context a reader may use with full attention
  // (Tessera refuses longer sequences from the folder too).
  w.add_u32(p + "context_length", static_cast<uint32_t>(c.sliding_window > 0 ? std::min(c.max_positions, c.sliding_window)
                                                                              : c.max_positions));
  w.add_u32(p + "embedding_length", static_cast<uint32_t>(c.hidden));
  w.add_u32(p + "feed_forward_length", static_cast<uint32_t>(c.intermediate));
  w.add_u32(p + "attention.head_count", static_cast<uint32_t>(c.heads));
  w.add_u32(p + "attention.head_count_kv", static_cast<uint32_t>(kv_heads));
  if (arch == "gpt2") {
    w.add_f32(p + "attention.layer_norm_epsilon", c.eps);
  } else {
    w.add_u32(p + "vocab_size", static_cast<uint32_t>(c.vocab));
    w.add_f32(p + "attention.layer_norm_rms_epsilon", c.eps);
    w.add_f32(p + "rope.freq_base", static_cast<float>(cj.value("rope_theta", 10000.0)));
    w.add_u32(p + "attention.key_length", static_cast<uint32_t>(c.head_dim()));
    w.add_u32(p + "attention.value_length", static_cast<uint32_t>(c.head_dim()));
    w.add_u32(p + "rope.dimension_count", static_cast<uint32_t>(c.head_dim()));
    if (cj.contains("rope_scaling") && cj["rope_scaling"].is_object() &&
        cj["rope_scaling"].value("rope_type", cj["rope_scaling"].value("type", "")) == "linear") {
      w.add_string(p + "rope.scaling.type", "linear");
      w.add_f32(p + "rope.scaling.factor", static_cast<float>(cj["rope_scaling"].value("factor", 1.0)));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(const Vocab v, folder_vocab(dir, c.vocab));
  if (v.placeholder) rep.notes.push_back("no BPE tokenizer.json: a placeholder vocabulary (give token ids)");
  if (v.spm) {
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_strings("tokenizer.ggml.tokens", v.tokens);
    w.add_f32s("tokenizer.ggml.scores", v.scores);
    w.add_i32s("tokenizer.ggml.token_type", v.types);
    w.add_bool("tokenizer.ggml.add_space_prefix", v.space_prefix);
    for (size_t i = 0; i < v.tokens.size(); ++i)
      if (v.types[i] == kTokUnknown) w.add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(i));
  } else {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", v.pre);
    w.add_strings("tokenizer.ggml.tokens", v.tokens);
    w.add_i32s("tokenizer.ggml.token_type", v.types);
    w.add_strings("tokenizer.ggml.merges", v.merges);
  }
  const auto id_of = [&](const char* key) -> int64_t {
    if (!cj.contains(key)) return -1;
    const json& x = cj[key].is_array() && !cj[key].empty() ? cj[key][0] : cj[key];
    return x.is_number_integer() ? x.get<int64_t>() : -1;
  };
  int64_t bos = id_of("bos_token_id"), eos = id_of("eos_token_id");
  // Llama 3 says it in tokenizer.json's post-processor (a template whose
  // single sequence starts with a special token); tokenizer_config.json's
  // add_bos_token, where given, decides.
  bool add_bos = template_starts_with_special(dir + "/tokenizer.json");
  if (core::file_exists(dir + "/tokenizer_config.json")) {
    TESSERA_ASSIGN_OR_RETURN(const std::string tc_text, core::read_file(dir + "/tokenizer_config.json"));
    const json tc = json::parse(tc_text, nullptr, false);
    if (tc.is_object()) {
      if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean()) add_bos = tc["add_bos_token"].get<bool>();
      if (tc.contains("chat_template") && tc["chat_template"].is_string())
        w.add_string("tokenizer.chat_template", tc["chat_template"].get<std::string>());
      // The tokenizer's own BOS/EOS tokens name the ids (config.json's may lie outside a small vocabulary).
      auto token_id = [&](const char* key) -> int64_t {
        if (!tc.contains(key)) return -1;
        const json& t = tc[key].is_object() ? tc[key].value("content", json()) : tc[key];
        if (!t.is_string()) return -1;
        const auto it = std::find(v.tokens.begin(), v.tokens.end(), t.get<std::string>());
        return it == v.tokens.end() ? -1 : static_cast<int64_t>(it - v.tokens.begin());
      };
      if (const int64_t b = token_id("bos_token"); b >= 0) bos = b;
      if (const int64_t e = token_id("eos_token"); e >= 0) eos = e;
    }
  }
  if (bos >= 0 && bos < static_cast<int64_t>(v.tokens.size())) w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  if (eos >= 0 && eos < static_cast<int64_t>(v.tokens.size())) w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos));
  w.add_bool("tokenizer.ggml.add_bos_token", add_bos);
  const std::string bytes = w.serialize();
  rep.bytes = bytes.size();
  TESSERA_RETURN_IF_ERROR(core::write_file(out, bytes));
  return rep;
}

}  // namespace

}  // namespace tessera::model
