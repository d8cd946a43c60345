#include "model/layer_blocks.h"

#include <cstring>

#include "core/check.h"
#include "kernels/decoder_ops.h"
#include "kernels/elementwise.h"

namespace tessera::model {

AttentionIo fused_qkv_io(const float* qkv, int64_t width, int64_t rows, float* out) {
  AttentionIo io;
  io.q = qkv;
  io.k = qkv + width;
  io.v = qkv + 2 * width;
  io.ldq = io.ldk = io.ldv = 3 * width;
  io.out = out;
  io.ldo = width;
  io.n_q = io.n_kv = rows;
  return io;
}

void norm_rows(const ModelConfig& c, const core::Tensor& gamma, const core::Tensor& beta, const float* x, float* out,
               int64_t n, int64_t cols, core::ThreadPool* pool) {
  if (c.llama_style()) return kernels::rmsnorm_f32_mt(pool, x, cols, out, cols, n, cols, gamma.f32(), c.eps);
  kernels::layernorm_f32_mt(pool, x, out, n, cols, gamma.f32(), beta.f32(), c.eps);
}

namespace {
template <typename Args>
Args fill_args(const Transformer& m, int64_t l, const AttentionIo& io) {
  const ModelConfig& c = m.config();
  Args a;
  a.q = io.q; a.ldq = io.ldq; a.k = io.k; a.ldk = io.ldk; a.v = io.v; a.ldv = io.ldv;
  a.out = io.out; a.ldo = io.ldo;
  a.n_q = io.n_q; a.n_kv = io.n_kv; a.q_pos0 = io.q_pos0; a.kv_pos0 = io.kv_pos0;
  a.heads = io.heads < 0 ? c.heads : io.heads;
  // Grouped K/V heads are read whole; a subset of heads (a shard) is for
  // plain multi-head layers only.
  TESSERA_CHECK(io.heads < 0 || c.kv_head_count() == c.heads);
  if constexpr (requires { a.kv_heads; })
    if (io.heads < 0 && c.kv_head_count() != c.heads) a.kv_heads = c.kv_head_count();
  a.head_dim = c.head_dim();
  a.scale = m.attention_scale(l);
  a.causal = c.causal();
  return a;
}
}  // namespace

kernels::AttentionArgs attention_args(const Transformer& m, int64_t l, const AttentionIo& io) {
  return fill_args<kernels::AttentionArgs>(m, l, io);
}

kernels::WeightedAttentionArgs weighted_attention_args(const Transformer& m, int64_t l, const AttentionIo& io) {
  return fill_args<kernels::WeightedAttentionArgs>(m, l, io);
}

const float* attention_residual(const Transformer& m, int64_t l, float* s, const float* x, bool add_bias, int64_t n,
                                float* mlp_in, core::ThreadPool* pool) {
  const ModelConfig& c = m.config();
  const LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
  const int64_t F = c.hidden;
  if (add_bias)
    kernels::bias_act_residual_f32_mt(pool, s, n, F, F, w.attn_out_b.f32(), kernels::Activation::kNone, x, F);
  if (c.pre_layernorm()) {
    norm_rows(c, w.ln2_g, w.ln2_b, s, mlp_in, n, F, pool);
    return mlp_in;
  }
  kernels::layernorm_f32_mt(pool, s, s, n, F, w.ln1_g.f32(), w.ln1_b.f32(), c.eps);
  return s;
}

void mlp_residual(const Transformer& m, int64_t l, float* s, const float* h, bool add_bias, int64_t n, float* out,
                  core::ThreadPool* pool) {
  const ModelConfig& c = m.config();
  const LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
  const int64_t F = c.hidden;
  if (add_bias)
    kernels::bias_act_residual_f32_mt(pool, s, n, F, F, w.ffn_out_b.f32(), kernels::Activation::kNone, h, F);
  if (!c.pre_layernorm()) {
    kernels::layernorm_f32_mt(pool, s, out, n, F, w.ln2_g.f32(), w.ln2_b.f32(), c.eps);
  } else if (out != s && n > 0) {
    std::memcpy(out, s, static_cast<size_t>(n * F) * sizeof(float));
  }
}

}  // namespace tessera::model
