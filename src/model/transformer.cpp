#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/io.h"
#include "kernels/attention.h"
#include "kernels/decoder_ops.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "model/layer_blocks.h"

namespace tessera::model {

using core::Result;
using core::Status;
using core::Tensor;
using kernels::Activation;

namespace {

constexpr int64_t kScoreScratchCap = 16ll << 20;  // floats; more heads are run in groups

void ensure_rows(Tensor& t, int64_t rows, int64_t cols) {
  if (t.empty() || t.dim(0) < rows || t.dim(1) != cols) t = Tensor::zeros_f32({std::max<int64_t>(rows, 1), cols});
}

}  // namespace

void Workspace::ensure(const ModelConfig& c, int64_t n, int64_t n_kv) {
  ensure_rows(qkv, n, c.qkv_width());
  ensure_rows(ctx, n, c.q_width());
  ensure_rows(h, n, c.hidden);
  ensure_rows(a, n, c.hidden);
  ensure_rows(ffn, n, c.intermediate);
  if (c.llama_style()) ensure_rows(gate_up, n, 2 * c.intermediate);
  const int64_t want = std::max(n * n_kv, std::min(kernels::attention_scratch_floats(n, n_kv, c.heads), kScoreScratchCap));
  if (scores.empty() || scores.numel() < want) scores = Tensor::zeros_f32({std::max<int64_t>(want, 1)});
}

Result<Transformer> Transformer::load(const std::string& dir, const LoadOptions& opts) {
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, load_config(dir));
  TESSERA_ASSIGN_OR_RETURN(TensorStore store, TensorStore::open_dir(dir));
  TESSERA_ASSIGN_OR_RETURN(ModelWeights weights, load_weights(store, config, opts));
  return Transformer(std::move(config), std::move(weights));
}

Status Transformer::validate_input(const ModelInput& in) const {
  const ModelConfig& c = config_;
  if (c.takes_images()) {
    if (in.pixels.empty()) return core::invalid_argument("ViT needs an image (pixel_values)");
    if (in.pixels.dtype() != core::DType::kF32) return core::invalid_argument("pixel_values must be F32");
    const core::Shape want{1, c.channels, c.image_size, c.image_size};
    if (in.pixels.shape() != want)
      return core::invalid_argument("pixel_values has shape " + core::shape_to_string(in.pixels.shape()) +
                                    ", expected " + core::shape_to_string(want));
    return core::ok_status();
  }
  if (in.ids.empty()) return core::invalid_argument("empty input: no token ids");
  const int64_t n = static_cast<int64_t>(in.ids.size());
  if (n > c.max_positions)
    return core::out_of_range("sequence of " + std::to_string(n) + " tokens is longer than max_position_embeddings (" +
                              std::to_string(c.max_positions) + ")");
  if (c.sliding_window > 0 && n > c.sliding_window)
    return core::out_of_range("sequence of " + std::to_string(n) + " tokens is longer than the sliding_window (" +
                              std::to_string(c.sliding_window) + "), which is not implemented");
  for (int64_t id : in.ids)
    if (id < 0 || id >= c.vocab)
      return core::out_of_range("token id " + std::to_string(id) + " outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
  if (!in.token_types.empty()) {
    if (!c.has_token_types()) return core::invalid_argument("token types are only for models with a token-type table (BERT)");
    if (in.token_types.size() != in.ids.size())
      return core::invalid_argument(std::to_string(in.token_types.size()) + " token types for " + std::to_string(n) + " tokens");
    for (int64_t t : in.token_types)
      if (t < 0 || t >= c.type_vocab)
        return core::out_of_range("token type " + std::to_string(t) + " outside [0, " + std::to_string(c.type_vocab) + ")");
  }
  return core::ok_status();
}

Result<Tensor> Transformer::embed(const ModelInput& in, int64_t pos0) const {
  const ModelConfig& c = config_;
  const ModelWeights& w = weights_;
  const int64_t F = c.hidden;
  if (c.learned_positions || c.takes_images() ? w.pos_emb.empty() : w.word_emb.empty() && w.lm_head_w.empty())
    return core::internal_error("embeddings are not loaded on this device");
  if (c.takes_images()) {
    TESSERA_RETURN_IF_ERROR(validate_input(in));
    const int64_t p = c.patch_size, side = c.image_size / p, np = side * side, C = c.channels;
    const int64_t patch_len = C * p * p;
    Tensor patches = Tensor::zeros_f32({np, patch_len});
    const float* px = in.pixels.f32();
    for (int64_t py = 0; py < side; ++py)
      for (int64_t pxi = 0; pxi < side; ++pxi) {
        float* row = patches.f32() + (py * side + pxi) * patch_len;
        for (int64_t ch = 0; ch < C; ++ch)
          for (int64_t ky = 0; ky < p; ++ky)
            std::memcpy(row + (ch * p + ky) * p, px + (ch * c.image_size + py * p + ky) * c.image_size + pxi * p,
                        static_cast<size_t>(p) * sizeof(float));
      }
    Tensor x = Tensor::zeros_f32({np + 1, F});
    std::memcpy(x.f32(), w.cls_token.f32(), static_cast<size_t>(F) * sizeof(float));
    kernels::linear_rows_f32(nullptr, patches.f32(), np, w.patch_w, w.patch_b, Activation::kNone, nullptr, x.f32() + F);
    const float* pos = w.pos_emb.f32();
    for (int64_t i = 0; i < (np + 1) * F; ++i) x.f32()[i] += pos[i];
    return x;
  }
  const int64_t n = static_cast<int64_t>(in.ids.size());
  if (n == 0) return core::invalid_argument("empty input: no token ids");
  if (pos0 < 0 || pos0 + n > c.max_positions)
    return core::out_of_range("positions " + std::to_string(pos0) + ".." + std::to_string(pos0 + n - 1) +
                              " exceed max_position_embeddings (" + std::to_string(c.max_positions) + ")");
  for (int64_t id : in.ids)
    if (id < 0 || id >= c.vocab) return core::out_of_range("token id " + std::to_string(id) + " outside the vocabulary");
  Tensor x = Tensor::zeros_f32({n, F});
  if (c.projects_embeddings()) {  // OPT-350m: narrower token rows, projected to F
    Tensor tokens = Tensor::zeros_f32({n, c.token_width()});
    for (int64_t i = 0; i < n; ++i) w.word_row(in.ids[static_cast<size_t>(i)], tokens.f32() + i * c.token_width());
    kernels::linear_rows_f32(nullptr, tokens.f32(), n, w.project_in_w, Tensor(), Activation::kNone, nullptr, x.f32());
  }
  for (int64_t i = 0; i < n; ++i) {
    float* row = x.f32() + i * F;
    if (!c.projects_embeddings()) w.word_row(in.ids[static_cast<size_t>(i)], row);
    if (c.learned_positions) {  // (rotary positions are applied in attention)
      const float* pe = w.pos_emb.f32() + (pos0 + i + c.position_offset) * F;
      for (int64_t j = 0; j < F; ++j) row[j] += pe[j];
    }
    if (c.has_token_types()) {
      const int64_t tt = in.token_types.empty() ? 0 : in.token_types[static_cast<size_t>(i)];
      if (tt < 0 || tt >= c.type_vocab) return core::out_of_range("token type " + std::to_string(tt) + " out of range");
      const float* te = w.type_emb.f32() + tt * F;
      for (int64_t j = 0; j < F; ++j) row[j] += te[j];
    }
  }
  if (c.embed_norm) kernels::layernorm_f32(x.f32(), x.f32(), n, F, w.emb_ln_g.f32(), w.emb_ln_b.f32(), c.eps);
  return x;
}

float Transformer::attention_scale(int64_t l) const {
  float s = 1.0f;
  if (config_.scale_attn_weights) s = 1.0f / std::sqrt(static_cast<float>(config_.head_dim()));
  if (config_.scale_attn_by_inverse_layer_idx) s /= static_cast<float>(l + 1);
  return s;
}

Result<KvCache> Transformer::make_cache(int64_t positions, core::DType dtype) const {
  TESSERA_RETURN_IF_ERROR(check_kv_dtype(config_, dtype));
  if (positions < 1 || positions > config_.max_positions)
    return core::out_of_range("a KV cache of " + std::to_string(positions) + " positions (the model has " +
                              std::to_string(config_.max_positions) + ")");
  // Checked before allocating: the request decides the size, and a failed
  // allocation must be an answer, not an abort.
  if (config_.sliding_window > 0 && positions > config_.sliding_window)
    return core::out_of_range("a KV cache of " + std::to_string(positions) + " positions is longer than the sliding_window (" +
                              std::to_string(config_.sliding_window) + "), which is not implemented");
  auto width = [&](int64_t l) { return config_.decoupled(l) ? config_.bp_div * config_.hidden : config_.kv_width(); };
  double need = 0;
  for (int64_t l = 0; l < config_.layers; ++l)
    need += 2.0 * static_cast<double>(positions) * static_cast<double>(width(l)) * static_cast<double>(core::dtype_size(dtype));
  const uint64_t avail = core::available_memory_bytes();
  if (avail > 0 && need > static_cast<double>(avail))
    return core::resource_exhausted("the KV cache for " + std::to_string(positions) + " positions needs " +
                                    std::to_string(static_cast<uint64_t>(need / (1 << 20))) + " MiB; " +
                                    std::to_string(avail >> 20) + " MiB available");
  KvCache cache;
  for (int64_t l = 0; l < config_.layers; ++l) {
    TESSERA_ASSIGN_OR_RETURN(Tensor k, Tensor::try_zeros_lazy(dtype, {positions, width(l)}));
    TESSERA_ASSIGN_OR_RETURN(Tensor v, Tensor::try_zeros_lazy(dtype, {positions, width(l)}));
    cache.k.push_back(std::move(k));
    cache.v.push_back(std::move(v));
  }
  return cache;
}

// ws.ctx = attention(in W_qkv^T + b) for the rows of `in`.
void Transformer::attention_block(int64_t l, const Tensor& in, int64_t pos0, KvCache* cache, Workspace& ws,
                                  core::ThreadPool* pool) const {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  const HeadShard all = config_.head_shard(0, config_.heads);
  const int64_t n = in.dim(0), Q = all.q_width(), KV = all.kv_width(), ld = all.qkv_width();
  float* qkv = ws.qkv.f32();
  kernels::linear_rows_f32(pool, in.f32(), n, w.qkv_w, w.qkv_b, Activation::kNone, nullptr, qkv);
  position_qk(*this, l, all, qkv, n, pos0, pool);
  AttentionIo io = shard_qkv_io(all, qkv, n, ws.ctx.f32());
  io.q_pos0 = io.kv_pos0 = pos0;
  if (cache != nullptr) {
    store_kv(*cache, l, qkv, ld, Q, KV, n, pos0);
    cache_io(*cache, l, KV, pos0 + n, io);
  }
  const kernels::AttentionArgs a = attention_args(*this, l, io);
  kernels::attention_f32(pool, a, ws.scores.f32(), ws.scores.numel());
}

void Transformer::layer_input(int64_t l, const float* x, int64_t n, float* out, core::ThreadPool* pool) const {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  if (config_.pre_layernorm()) {
    norm_rows(config_, w.ln1_g, w.ln1_b, x, out, n, config_.hidden, pool);
  } else if (out != x && n > 0) {
    std::memcpy(out, x, static_cast<size_t>(n * config_.hidden) * sizeof(float));
  }
}

void Transformer::layer_tail(int64_t l, const float* x, const float* ctx, int64_t n, float* out, Workspace& ws,
                             core::ThreadPool* pool) const {
  const int64_t all[] = {n};
  layer_tail(l, x, ctx, n, out, ws, pool, all, {});
}

void Transformer::layer_tail(int64_t l, const float* x, const float* ctx, int64_t n, float* out, Workspace& ws,
                             core::ThreadPool* pool, std::span<const int64_t> blocks,
                             const std::function<void(int64_t, int64_t)>& done) const {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  TESSERA_CHECK(std::accumulate(blocks.begin(), blocks.end(), int64_t{0}) == n);
  if (n == 0) return;
  ws.ensure(config_, n, 1);
  // Output projection with its bias and residual fused, then the blocks.
  const int64_t F = config_.hidden, I = config_.intermediate;
  float* h = ws.h.f32();
  kernels::linear_rows_f32(pool, ctx, n, w.attn_out_w, w.attn_out_b, Activation::kNone, x, h);
  const float* mlp_in = attention_residual(*this, l, h, x, false, n, ws.a.f32(), pool);
  mlp_input(*this, l, mlp_in, n, ws.ffn.f32(), ws.gate_up, pool);
  int64_t r0 = 0;
  for (const int64_t rows : blocks) {
    TESSERA_CHECK(rows >= 0);
    if (rows > 0) {
      kernels::linear_rows_f32(pool, ws.ffn.f32() + r0 * I, rows, w.ffn_out_w, w.ffn_out_b, Activation::kNone,
                               h + r0 * F, out + r0 * F);
      mlp_residual(*this, l, out + r0 * F, h + r0 * F, false, rows, out + r0 * F, pool);
    }
    if (done) done(r0, rows);
    r0 += rows;
  }
}

void Transformer::layer(int64_t l, Tensor& x, int64_t pos0, KvCache* cache, Workspace& ws, core::ThreadPool* pool) const {
  if (config_.decoupled(l)) return decoupled_layer(l, x, pos0, cache, ws, pool);
  TESSERA_CHECK_MSG(!weights_.layers[static_cast<size_t>(l)].qkv_w.empty(), "layer " << l << " is not loaded on this device");
  const int64_t n = x.dim(0);
  TESSERA_CHECK(x.rank() == 2 && x.dim(1) == config_.hidden);
  if (n == 0) return;
  ws.ensure(config_, n, cache ? pos0 + n : n);
  layer_input(l, x.f32(), n, ws.a.f32(), pool);
  attention_block(l, ws.a.rows(0, n), pos0, cache, ws, pool);
  layer_tail(l, x.f32(), ws.ctx.f32(), n, x.f32(), ws, pool);
}

void Transformer::finish_hidden(Tensor& x, core::ThreadPool* pool) const {
  if (!config_.causal()) return;
  if (config_.final_norm)  // (OPT post-LN has none)
    norm_rows(config_, weights_.final_ln_g, weights_.final_ln_b, x.f32(), x.f32(), x.dim(0), config_.hidden, pool);
  if (config_.projects_embeddings()) {  // OPT-350m: back to the token width
    Tensor out = Tensor::zeros_f32({x.dim(0), config_.token_width()});
    kernels::linear_rows_f32(pool, x.f32(), x.dim(0), weights_.project_out_w, Tensor(), Activation::kNone, nullptr, out.f32());
    x = std::move(out);
  }
}

Status Transformer::head(const Tensor& last, bool last_row_only, ForwardOutput* out, core::ThreadPool* pool) const {
  const ModelConfig& c = config_;
  const ModelWeights& w = weights_;
  const int64_t F = c.hidden, n = last.dim(0);
  if (c.causal()) {
    if (c.head != HeadKind::kLmHead) return core::ok_status();
    if (w.lm_head_w.empty()) return core::internal_error("the LM head is not loaded on this device");
    const int64_t rows = last_row_only ? 1 : n, width = last.dim(1);  // F, or OPT's token width
    out->logits = Tensor::zeros_f32({rows, c.vocab});
    kernels::linear_rows_f32(pool, last.f32() + (n - rows) * width, rows, w.lm_head_w, Tensor(), Activation::kNone, nullptr,
                             out->logits.f32());
    return core::ok_status();
  }
  // BERT pools the raw CLS row; ViT normalises first.
  Tensor cls = Tensor::zeros_f32({1, F});
  std::memcpy(cls.f32(), last.f32(), static_cast<size_t>(F) * sizeof(float));
  if (c.final_norm) {
    if (w.final_ln_g.empty()) return core::internal_error("the final layer norm is not loaded on this device");
    kernels::layernorm_f32(cls.f32(), cls.f32(), 1, F, w.final_ln_g.f32(), w.final_ln_b.f32(), c.eps);
  }
  if (!w.pooler_w.empty()) {
    out->pooler = Tensor::zeros_f32({1, F});
    kernels::linear_rows_f32(nullptr, cls.f32(), 1, w.pooler_w, w.pooler_b, Activation::kTanh, nullptr, out->pooler.f32());
  }
  if (c.head == HeadKind::kNone) return core::ok_status();
  if (w.classifier_w.empty()) return core::internal_error("the classifier is not loaded on this device");
  const Tensor& feat = c.pooled_head ? out->pooler : cls;
  out->logits = Tensor::zeros_f32({1, c.num_labels()});
  kernels::linear_rows_f32(nullptr, feat.f32(), 1, w.classifier_w, w.classifier_b, Activation::kNone, nullptr, out->logits.f32());
  return core::ok_status();
}

Result<ForwardOutput> Transformer::forward(const ModelInput& in, const ForwardOptions& opts, core::ThreadPool* pool) const {
  Workspace ws;
  return forward(in, opts, pool, ws);
}

Result<ForwardOutput> Transformer::forward(const ModelInput& in, const ForwardOptions& opts, core::ThreadPool* pool,
                                           Workspace& ws) const {
  TESSERA_RETURN_IF_ERROR(validate_input(in));
  TESSERA_ASSIGN_OR_RETURN(Tensor x, embed(in, 0));
  ForwardOutput out;
  if (opts.all_hidden) out.hidden.push_back(x.clone());
  for (int64_t l = 0; l < config_.layers; ++l) {
    layer(l, x, 0, nullptr, ws, pool);
    if (opts.all_hidden && l + 1 < config_.layers) out.hidden.push_back(x.clone());
  }
  finish_hidden(x, pool);
  out.hidden.push_back(x);
  if (opts.logits) TESSERA_RETURN_IF_ERROR(head(x, opts.last_row_logits, &out, pool));
  return out;
}

}  // namespace tessera::model
