// Hugging Face config.json of the supported families, validated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/elementwise.h"
#include "kernels/quant.h"

namespace tessera::model {

enum class HeadKind { kNone, kSequenceClassification, kLmHead, kImageClassification };

class Architecture;  // model/arch/architecture.h

// Query heads [h0, h1) of a layer and the K/V heads [kv0, kv1) they read
// (the same range without grouped K/V): a tensor-parallel shard's fused
// QKV rows are [Q (h1-h0)d | K (kv1-kv0)d | V (kv1-kv0)d]. With more shards
// than K/V heads, neighbouring shards read, and hold, the same K/V head.
struct HeadShard {
  int64_t h0 = 0, h1 = 0, kv0 = 0, kv1 = 0, head_dim = 0;
  int64_t heads() const { return h1 - h0; }
  int64_t kv_heads() const { return kv1 - kv0; }
  int64_t q_width() const { return heads() * head_dim; }
  int64_t kv_width() const { return kv_heads() * head_dim; }
  int64_t qkv_width() const { return q_width() + 2 * kv_width(); }
};

// A model's shapes and its recipe: which shared blocks its embedding, layers
// and head are built from. Its family's unit (model/arch/) fills it from
// config.json; everything else reads the recipe, never the family.
struct ModelConfig {
  std::string family;        // the unit's name, for output ("gpt2")
  const Architecture* arch = nullptr;  // its unit: tensor names (registry-owned, lives forever)
  std::string architecture;  // e.g. "BertForSequenceClassification"
  HeadKind head = HeadKind::kNone;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t layers = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;          // text models
  int64_t max_positions = 0;  // text models: longest sequence
  int64_t type_vocab = 0;     // token types (BERT); 0: none
  // The recipe. Input: token ids, or an image cut into patches after a
  // class token (ViT).
  bool images = false;
  bool causal_attention = false;   // decoders: each row sees itself and earlier rows
  bool learned_positions = false;  // a position table added to token rows ...
  int64_t position_offset = 0;     // ... read this many rows in (OPT: 2)
  bool embed_norm = false;         // a LayerNorm over the embedded rows (BERT)
  bool pooled_head = false;        // the classifier reads a tanh pooler of the first row (BERT)
  bool decouplable = false;        // DeTransformer's block_parallel form is defined (BERT, GPT-2, ViT)
  bool llama_layers = false;       // RMSNorm, rotary positions and a gated SiLU MLP (model/arch/llama.cpp)
  float eps = 1e-12f;
  kernels::Activation act = kernels::Activation::kGeluErf;
  std::vector<std::string> labels;  // id2label, in id order
  // ViT
  int64_t image_size = 0, patch_size = 0, channels = 3;
  bool qkv_bias = true;
  // GPT-2
  int64_t eos_token_id = -1;
  // Every id that ends a generation: config.json's eos_token_id (a number or
  // a list) and generation_config.json's, ids outside the vocabulary left
  // out; sorted (load_config).
  std::vector<int64_t> eos_token_ids;
  bool ends_generation(int64_t id) const;
  // Llama-style decoders (model/arch/llama.cpp): grouped-query attention,
  // an explicit head size, rotary positions, per-head q/k RMSNorm (Qwen3),
  // biases, a tied head.
  int64_t kv_heads = 0;       // 0: as many as query heads
  int64_t explicit_head_dim = 0;  // 0: hidden / heads
  std::vector<float> rope_inv_freq;  // head_dim/2 frequencies, scaling applied; empty: no RoPE
  bool qk_norm = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2; Llama's attention_bias also o_proj)
  bool o_bias = false;
  bool mlp_bias = false;
  bool tied_head = false;
  int64_t sliding_window = 0;  // Mistral/Qwen: longer sequences are refused; 0: none
  // Post-LN layers (BERT, OPT with do_layer_norm_before false); a norm after
  // the last layer (decoders: on every row; image models: on the class row
  // in the head); the token embedding width (OPT's project_in/project_out
  // when it differs from F).
  bool post_layernorm = false;
  bool final_norm = false;
  int64_t embed_dim = 0;  // 0: hidden
  int64_t token_width() const { return embed_dim > 0 ? embed_dim : hidden; }
  bool projects_embeddings() const { return token_width() != hidden; }
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  // DeTransformer decoupled model ("block_parallel" in config.json): every
  // layer not in bp_original is bp_div sub-blocks, sub-block i reading and
  // writing residual features [i*h/N, (i+1)*h/N). bp_div = 0: ordinary model.
  int64_t bp_div = 0;
  // Not config.json's: the type the deployment holds the dense layers' and
  // the LM head's matrices in (--quantize; a plan's `weights`). Loading and
  // every estimate of weight bytes read it.
  kernels::WeightType weights = kernels::WeightType::kF32;
  // Bytes of a [rows, k] matrix as loaded: a shard of a matrix whose whole
  // rows (full_k inputs; -1: k) are not whole blocks stays F32.
  int64_t matrix_bytes(int64_t rows, int64_t k, int64_t full_k = -1) const {
    const bool q = kernels::holds(weights, full_k < 0 ? k : full_k);
    const int64_t b = rows * static_cast<int64_t>(kernels::row_bytes(q ? weights : kernels::WeightType::kF32, k));
    return q && mixed() ? static_cast<int64_t>(static_cast<double>(b) * mix_layer_scale + 0.5) : b;
  }
  // The LM head's (or tied table's) packed matrix: a mixed file's head type.
  int64_t head_bytes(int64_t rows, int64_t k) const {
    const kernels::WeightType t = head_type();
    return rows * static_cast<int64_t>(kernels::row_bytes(kernels::holds(t, k) ? t : kernels::WeightType::kF32, k));
  }
  // A GGUF file whose matrices mix block types (Q4_K_M: Q4_K with Q6_K).
  // Loading keeps each matrix's own blocks, so while `weights` is the file's
  // type the layers' matrices take mix_layer_scale times the bytes `weights`
  // alone would (the file's average), and the head is held in mix_head.
  kernels::WeightType mix_weights = kernels::WeightType::kF32;
  double mix_layer_scale = 1.0;
  kernels::WeightType mix_head = kernels::WeightType::kF32;
  // The layers' weights a mixed file holds in another type (Q4_K_M's Q6_K
  // ffn_down and attn_v in half the layers): that type and its share of the
  // layers' weights, by which a GEMM's time is weighed (cost model).
  kernels::WeightType mix_other = kernels::WeightType::kF32;
  double mix_other_share = 0;
  // Where a mixed file's shards may cut: the least common multiple of the
  // block widths of the attention-output matrices' types (head cuts) and of
  // the FFN-down ones' (FFN cuts). A Qwen2.5-0.5B Q4_K_M file: 32 (Q8_0)
  // and 256 (Q4_K). 0: unknown, the main type's block.
  int64_t mix_attn_block = 0, mix_ffn_block = 0;
  bool mixed() const { return weights != kernels::WeightType::kF32 && weights == mix_weights; }
  // The type a mixed file's other layer weights are in (`weights` where none).
  kernels::WeightType other_type() const { return mixed() && mix_other_share > 0 ? mix_other : weights; }
  // The type the LM head's matrix is held in.
  kernels::WeightType head_type() const { return mixed() && mix_head != kernels::WeightType::kF32 ? mix_head : weights; }
  std::vector<int64_t> bp_original;  // sorted, distinct

  int64_t head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden / heads; }
  int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t q_width() const { return heads * head_dim(); }         // attention context width
  int64_t kv_width() const { return kv_head_count() * head_dim(); }  // one of K, V per row
  int64_t qkv_width() const { return q_width() + 2 * kv_width(); }
  int64_t kv_group() const { return heads / kv_head_count(); }  // query heads per K/V head
  HeadShard head_shard(int64_t h0, int64_t h1) const {
    if (h1 <= h0) return {h0, h0, 0, 0, head_dim()};
    return {h0, h1, h0 / kv_group(), (h1 - 1) / kv_group() + 1, head_dim()};
  }
  // RMSNorm, RoPE and a gated SiLU MLP, in place of LayerNorm, learned
  // positions and a two-matrix MLP.
  bool llama_style() const { return llama_layers; }
  int64_t ffn_in_rows() const { return llama_style() ? 2 * intermediate : intermediate; }  // gate|up fused
  // Every layer is multi-head attention over F-wide Q, K and V with learned
  // or no positions, LayerNorm and a two-matrix MLP: what the strategies
  // that split a layer's insides (tp, sp, voltage, galaxy, prism, bp) and
  // the block pipeline assume. Others run whole layers only.
  bool plain_layers() const { return !llama_style(); }
  int64_t num_labels() const { return static_cast<int64_t>(labels.size()); }
  // Longest input the model accepts, in rows (ViT: patches + CLS).
  int64_t max_rows() const;
  bool causal() const { return causal_attention; }
  // A causal LM with its head: generation and /v1/completions take it.
  bool causal_lm() const { return causal() && head == HeadKind::kLmHead; }
  bool pre_layernorm() const { return !post_layernorm; }
  bool takes_images() const { return images; }
  bool has_token_types() const { return type_vocab > 0; }
  bool decoupled(int64_t l) const;          // layer l is sub-blocks
  int64_t block_width() const { return bp_div > 0 ? hidden / bp_div : hidden; }  // h/N
};

core::Result<ModelConfig> parse_config(const std::string& json_text);
core::Result<ModelConfig> load_config(const std::string& model_dir);

}  // namespace tessera::model
