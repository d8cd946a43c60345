// Model weights by role, loaded from Hugging Face tensor names. Every tensor
// is in Linear layout [out, in] (GPT-2's Conv1D [in, out] is transposed on
// load) and Q, K, V are fused into one [3F, F] matrix, so that each layer is
// one QKV GEMM and shard maths is the same for all families.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace tessera::model {

struct LayerWeights {
  core::Tensor qkv_w, qkv_b;            // [3F, F], [3F]
  core::Tensor attn_out_w, attn_out_b;  // [F, F], [F]
  core::Tensor ln1_g, ln1_b;            // BERT: after attention; GPT-2/ViT: before it
  core::Tensor ffn_in_w, ffn_in_b;      // [I, F], [I]
  core::Tensor ffn_out_w, ffn_out_b;    // [F, I], [F]
  core::Tensor ln2_g, ln2_b;            // BERT: after FFN; GPT-2/ViT: before it
  size_t bytes() const;
};

struct ModelWeights {
  // Embeddings (BERT, GPT-2: word/position; BERT: token type + layer norm).
  core::Tensor word_emb, pos_emb, type_emb, emb_ln_g, emb_ln_b;
  // ViT: patch projection [F, C*p*p], CLS token [F], positions [rows, F].
  core::Tensor patch_w, patch_b, cls_token;
  std::vector<LayerWeights> layers;  // indexed by global layer; unloaded ones are empty
  core::Tensor final_ln_g, final_ln_b;     // GPT-2 ln_f, ViT layernorm
  core::Tensor pooler_w, pooler_b;         // BERT / ViT pooler, when present
  core::Tensor classifier_w, classifier_b;
  core::Tensor lm_head_w;                  // GPT-2: tied to word_emb unless stored
  size_t bytes() const;  // bytes of every distinct tensor held
};

// What to load: a device in a pipeline needs only some layers; the terminal
// needs the embeddings and the head.
struct LoadOptions {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;          // -1: all layers
  std::vector<int64_t> only_layers;  // when set, exactly these layers (pipelines)
  bool embeddings = true;
  bool head = true;
  // Tensor-parallel shard: heads [head_begin, head_end) and FFN columns
  // [ffn_begin, ffn_end) of every layer (-1: all). Output biases and norms
  // stay whole; they are applied once after the AllReduce.
  int64_t head_begin = 0, head_end = -1;
  int64_t ffn_begin = 0, ffn_end = -1;
};

// The tensor-parallel shard of a whole layer (see LoadOptions).
LayerWeights shard_layer(const LayerWeights& full, int64_t hidden, int64_t head_dim, int64_t head_begin, int64_t head_end,
                         int64_t ffn_begin, int64_t ffn_end);

// Reads the tensors of `config` from `store`, checking every name and shape;
// unknown tensors are an error (a few buffers HF writes are ignored).
core::Result<ModelWeights> load_weights(const TensorStore& store, ModelConfig& config, const LoadOptions& opts = {});

// The names Hugging Face's save_pretrained writes for `config`, without the
// family prefix; gen-model writes exactly these.
struct NamedShape {
  std::string name;
  core::Shape shape;
};
std::vector<NamedShape> hf_tensor_table(const ModelConfig& config);
// "bert.", "transformer.", "vit." when the head model wraps the base model.
std::string hf_prefix(const ModelConfig& config);

}  // namespace tessera::model
