// The single-device forward pass for BERT, GPT-2, ViT and the Llama-style
// decoders. Layers run on a
// block of rows at given global positions, so strategies that split the
// sequence reuse the same code; buffers live in a Workspace that is sized
// once and reused across layers.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"

namespace tessera::model {

struct ModelInput {
  std::vector<int64_t> ids;          // BERT, GPT-2
  std::vector<int64_t> token_types;  // BERT; empty = all zeros
  core::Tensor pixels;               // ViT: F32 [1, C, H, W]
};

// Scratch buffers for one layer over n rows attending to n_kv rows.
struct Workspace {
  core::Tensor qkv, ctx, h, a, ffn, scores;
  core::Tensor gate_up;  // Llama-style MLP input projection [n, 2I]
  core::Tensor slice;  // a decoupled layer's sub-block rows [n, h/N]
  void ensure(const ModelConfig& c, int64_t n, int64_t n_kv);
};

// Keys and values of past positions, one [positions, KV d] pair per layer
// ([positions, N*F] for a decoupled layer: sub-block i at columns i*F).
// F32 rows, or F16 ones (--kv-type f16: half the memory; attention widens
// the rows it reads).
struct KvCache {
  std::vector<core::Tensor> k, v;
  int64_t length = 0;
};

// What a generation's KV caches hold: `positions` rows (the context) of
// `dtype` (F32 or F16).
struct CacheSpec {
  int64_t positions = 0;
  core::DType dtype = core::DType::kF32;
};

struct ForwardOptions {
  bool all_hidden = false;    // keep every hidden state (HF output_hidden_states)
  bool logits = true;         // run the head
  bool last_row_logits = false;  // GPT-2: logits of the last position only
};

struct ForwardOutput {
  std::vector<core::Tensor> hidden;  // [N, F] each: all L+1, or just hidden.L
  core::Tensor logits;               // BERT/ViT [1, labels]; GPT-2 [N or 1, vocab]
  core::Tensor pooler;               // [1, F] when the model has a pooler
};

class Transformer {
 public:
  Transformer(ModelConfig config, ModelWeights weights) : config_(std::move(config)), weights_(std::move(weights)) {}
  // config.json + safetensors of a Hugging Face folder.
  static core::Result<Transformer> load(const std::string& dir, const LoadOptions& opts = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // A generation pair whose decode layout's layers are not part of this
  // model's (a TP shard beside Voltage's whole layers): those layers, loaded
  // beside it (parallel::load_rank_model). Without one, this model.
  void set_decode_layout(std::shared_ptr<const Transformer> m) { decode_layout_ = std::move(m); }
  const Transformer& decode_layout() const { return decode_layout_ ? *decode_layout_ : *this; }
  // The bytes of every weight loaded: this model's and a decode layout's.
  size_t loaded_bytes() const { return weights_.bytes() + (decode_layout_ ? decode_layout_->loaded_bytes() : 0); }

  // Checks ids, token types, lengths and pixel shapes against the config.
  core::Status validate_input(const ModelInput& in) const;
  // Embedding rows [N, F]; text rows start at global position pos0.
  core::Result<core::Tensor> embed(const ModelInput& in, int64_t pos0 = 0) const;
  // Layer l on rows x [n, F] (updated in place) at positions pos0..pos0+n-1.
  // With a cache, keys/values are appended and attention covers the cache.
  void layer(int64_t l, core::Tensor& x, int64_t pos0, KvCache* cache, Workspace& ws, core::ThreadPool* pool) const;
  // Sub-block i of decoupled layer l on its own rows xi [n, h/N] (contiguous,
  // updated in place): the block parallelism strategy runs these alone.
  void block(int64_t l, int64_t i, float* xi, int64_t n, int64_t pos0, KvCache* cache, Workspace& ws,
             core::ThreadPool* pool) const;
  // The pieces of a layer, for strategies that split it across devices:
  // what attention reads (LN1(x) for pre-LN families, x itself for BERT) ...
  void layer_input(int64_t l, const float* x, int64_t n, float* out, core::ThreadPool* pool) const;
  // ... and everything after attention on n rows: output projection,
  // residuals, norms and FFN. x: the layer's input rows, ctx: attention
  // context rows; `out` may alias `x`.
  void layer_tail(int64_t l, const float* x, const float* ctx, int64_t n, float* out, Workspace& ws,
                  core::ThreadPool* pool) const;
  // The same, with the FFN's output projection run in row blocks of
  // `blocks` (they sum to n) and done(r0, count) called as each block's rows
  // are final, so a caller can send them while the next block computes. Only
  // the last GEMM is split: its weights are the ones small enough to stay in
  // cache between blocks.
  void layer_tail(int64_t l, const float* x, const float* ctx, int64_t n, float* out, Workspace& ws,
                  core::ThreadPool* pool, std::span<const int64_t> blocks,
                  const std::function<void(int64_t r0, int64_t count)>& done) const;
  // Hugging Face's last hidden state from the last layer's output: GPT-2
  // applies ln_f (in place); BERT and ViT return x unchanged.
  void finish_hidden(core::Tensor& x, core::ThreadPool* pool) const;
  // Head on the last hidden state (as finish_hidden left it).
  core::Status head(const core::Tensor& last, bool last_row_only, ForwardOutput* out, core::ThreadPool* pool) const;

  core::Result<ForwardOutput> forward(const ModelInput& in, const ForwardOptions& opts, core::ThreadPool* pool) const;
  // Same, reusing the caller's buffers across calls (no allocation once warm).
  core::Result<ForwardOutput> forward(const ModelInput& in, const ForwardOptions& opts, core::ThreadPool* pool,
                                      Workspace& ws) const;

  // Room for `positions` positions (prompt plus new tokens), checked against
  // the memory available; too much is kResourceExhausted, never an abort.
  core::Result<KvCache> make_cache(int64_t positions, core::DType dtype = core::DType::kF32) const;
  float attention_scale(int64_t l) const;

 private:
  // A decoupled layer on one device: each sub-block on its feature slice.
  void decoupled_layer(int64_t l, core::Tensor& x, int64_t pos0, KvCache* cache, Workspace& ws,
                       core::ThreadPool* pool) const;
  void attention_block(int64_t l, const core::Tensor& in, int64_t pos0, KvCache* cache, Workspace& ws,
                       core::ThreadPool* pool) const;


  ModelConfig config_;
  ModelWeights weights_;
  std::shared_ptr<const Transformer> decode_layout_;
};

}  // namespace tessera::model
