// Model weights by role, loaded from Hugging Face tensor names. Every dense
// layer is packed once, at load, for the GEMM kernels (kernels::PackedLinear,
// [out, in] in Linear terms; GPT-2's Conv1D [in, out] is packed from its own
// layout) and Q, K, V are fused into one [3F, F] matrix, so that each layer is
// one QKV GEMM and shard maths is the same for all families. Everything kept
// is an owned copy: the file's pages are dropped as each tensor is copied and
// the mapping closes with the store.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/packed_linear.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace tessera::model {

struct LayerWeights {
  kernels::PackedLinear qkv_w;          // [3F, F] (Llama-style: [(H + 2 KV) d, F])
  core::Tensor qkv_b;                   // [3F]; may be empty (no biases)
  kernels::PackedLinear attn_out_w;     // [F, F]
  core::Tensor attn_out_b;              // [F]
  core::Tensor ln1_g, ln1_b;            // BERT: after attention; GPT-2/ViT: before it
  kernels::PackedLinear ffn_in_w;       // [I, F]
  core::Tensor ffn_in_b;                // [I]
  kernels::PackedLinear ffn_out_w;      // [F, I]
  core::Tensor ffn_out_b;               // [F]
  core::Tensor ln2_g, ln2_b;            // BERT: after FFN; GPT-2/ViT: before it
  // Llama-style layers: ln1/ln2 are RMSNorm weights (no _b); ffn_in is the
  // fused [gate; up] [2I, F]; QKV is [(H + 2 KV) d, F]; Qwen3's per-head
  // q/k RMSNorm weights [d].
  core::Tensor q_norm, k_norm;
  // A decoupled layer (ModelConfig::decoupled) holds no matrices of its own
  // but N sub-blocks, each a layer whose residual width is h/N (F above reads
  // h/N; attention and FFN keep their full widths); unloaded ones are empty.
  std::vector<LayerWeights> blocks;
  size_t bytes() const;
};

struct ModelWeights {
  // Embeddings (BERT, GPT-2: word/position; BERT: token type + layer norm).
  // GPT-2 with a tied head keeps word_emb empty: its one copy of wte is the
  // packed lm_head_w, and the lookup reads a row from it (word_row).
  core::Tensor word_emb, pos_emb, type_emb, emb_ln_g, emb_ln_b;
  // ViT: patch projection [F, C*p*p], CLS token [F], positions [rows, F].
  kernels::PackedLinear patch_w;
  core::Tensor patch_b, cls_token;
  std::vector<LayerWeights> layers;  // indexed by global layer; unloaded ones are empty
  core::Tensor final_ln_g, final_ln_b;     // GPT-2 ln_f, ViT layernorm, Llama's norm (RMS: no _b)
  kernels::PackedLinear pooler_w;          // BERT / ViT pooler, when present
  core::Tensor pooler_b;
  kernels::PackedLinear classifier_w;
  core::Tensor classifier_b;
  kernels::PackedLinear lm_head_w;         // GPT-2: wte itself when tied
  // OPT with word_embed_proj_dim != F: token rows [wdim] -> F, and the last
  // hidden state F -> wdim before the head.
  kernels::PackedLinear project_in_w, project_out_w;
  // Token `id`'s embedding row (F floats) into dst, wherever it is held.
  void word_row(int64_t id, float* dst) const;
  size_t bytes() const;  // bytes of every distinct tensor held
};

// What to load: a device in a pipeline needs only some layers; the terminal
// needs the embeddings and the head.
struct LoadOptions {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;          // -1: all layers
  std::vector<int64_t> only_layers;  // when set, exactly these layers (pipelines)
  // With only_layers, per listed layer: 1 = its attention block only, 2 = its
  // MLP block only, 3 = whole (empty: all whole). A block pipeline places the
  // two blocks of a layer on different devices; norms and biases stay.
  std::vector<int> only_parts;
  bool embeddings = true;
  bool head = true;
  // Tensor-parallel shard: heads [head_begin, head_end) and FFN columns
  // [ffn_begin, ffn_end) of every layer (-1: all). Output biases and norms
  // stay whole; they are applied once after the AllReduce.
  int64_t head_begin = 0, head_end = -1;
  int64_t ffn_begin = 0, ffn_end = -1;
  // Decoupled layers: sub-blocks [block_begin, block_end) (-1: all). The
  // tensor-parallel shard above applies to the original layers only.
  int64_t block_begin = 0, block_end = -1;
  // --quantize: the layers' matrices and a decoder's LM head (with a tied
  // head, the token table it also is) are quantized as they are packed; a
  // matrix whose rows are not whole blocks stays F32. The other matrices
  // (pooler, classifier, patches) are small and stay F32.
  kernels::WeightType weights = kernels::WeightType::kF32;
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
// "bert.", "transformer.", "vit.", "model." when the head model wraps the base model.
std::string hf_prefix(const ModelConfig& config);

}  // namespace tessera::model
