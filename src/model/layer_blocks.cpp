#include "model/layer_blocks.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/decoder_ops.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

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

AttentionIo shard_qkv_io(const HeadShard& s, const float* qkv, int64_t rows, float* out) {
  AttentionIo io;
  io.q = qkv;
  io.k = qkv + s.q_width();
  io.v = qkv + s.q_width() + s.kv_width();
  io.ldq = io.ldk = io.ldv = s.qkv_width();
  io.out = out;
  io.ldo = s.q_width();
  io.n_q = io.n_kv = rows;
  io.heads = s.heads();
  io.q_head0 = s.h0;
  return io;
}

void position_qk(const Transformer& m, int64_t l, const HeadShard& s, float* qkv, int64_t n, int64_t pos0,
                 core::ThreadPool* pool) {
  if (s.heads() == 0) return;
  position_heads(m, l, qkv, s.qkv_width(), n, pos0, s.heads(), false, pool);
  position_heads(m, l, qkv + s.q_width(), s.qkv_width(), n, pos0, s.kv_heads(), true, pool);
}

void attend_rows(const Transformer& m, int64_t l, const HeadShard& s, float* qkv, std::span<const int64_t> pos,
                 std::span<KvCache* const> caches, float* ctx, core::Tensor& scores, core::ThreadPool* pool) {
  TESSERA_CHECK(pos.size() == caches.size());
  const int64_t ld = s.qkv_width(), q = s.q_width(), kv = s.kv_width();
  if (q == 0) return;
  for (size_t i = 0; i < pos.size(); ++i) {
    float* row = qkv + static_cast<int64_t>(i) * ld;
    const int64_t p = pos[i];
    position_qk(m, l, s, row, 1, p, pool);
    store_kv(*caches[i], l, row, ld, q, kv, 1, p);
    AttentionIo io = shard_qkv_io(s, row, 1, ctx + static_cast<int64_t>(i) * q);
    io.q_pos0 = io.kv_pos0 = p;
    cache_io(*caches[i], l, kv, p + 1, io);
    const int64_t want = std::max<int64_t>(kernels::attention_scratch_floats(1, p + 1, s.heads()), 1);
    if (scores.empty() || scores.numel() < want) scores = core::Tensor::zeros_f32({want});
    kernels::attention_f32(pool, attention_args(m, l, io), scores.f32(), scores.numel());
  }
}

void layer_rows(const Transformer& m, int64_t l, float* x, std::span<const int64_t> pos, std::span<KvCache* const> caches,
                Workspace& ws, core::ThreadPool* pool) {
  const ModelConfig& c = m.config();
  TESSERA_CHECK_MSG(!c.decoupled(l), "layer_rows on decoupled layer " << l);
  const LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
  const auto b = static_cast<int64_t>(pos.size());
  ws.ensure(c, b, 1);
  m.layer_input(l, x, b, ws.a.f32(), pool);
  kernels::linear_rows_f32(pool, ws.a.f32(), b, w.qkv_w, w.qkv_b, kernels::Activation::kNone, nullptr, ws.qkv.f32());
  attend_rows(m, l, c.head_shard(0, c.heads), ws.qkv.f32(), pos, caches, ws.ctx.f32(), ws.scores, pool);
  m.layer_tail(l, x, ws.ctx.f32(), b, x, ws, pool);
}

void position_heads(const Transformer& m, int64_t l, float* x, int64_t ld, int64_t n, int64_t pos0, int64_t heads,
                    bool keys, core::ThreadPool* pool) {
  const ModelConfig& c = m.config();
  if (!c.llama_style() || heads == 0 || n == 0) return;
  const LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
  const int64_t d = c.head_dim();
  auto run = [&](int64_t b, int64_t e) {
    if (c.qk_norm)
      for (int64_t i = b; i < e; ++i)
        kernels::rmsnorm_f32(x + i * ld, d, x + i * ld, d, heads, d, (keys ? w.k_norm : w.q_norm).f32(), c.eps);
    kernels::rope_f32(x + b * ld, ld, e - b, heads, d, pos0 + b, c.rope_inv_freq.data());
  };
  if (pool == nullptr || n < 2) return run(0, n);
  pool->parallel_for(n, run);
}

void mlp_input(const Transformer& m, int64_t l, const float* in, int64_t n, float* out, core::Tensor& scratch,
               core::ThreadPool* pool) {
  const ModelConfig& c = m.config();
  const LayerWeights& w = m.weights().layers[static_cast<size_t>(l)];
  if (!c.llama_style()) {
    kernels::linear_rows_f32(pool, in, n, w.ffn_in_w, w.ffn_in_b, c.act, nullptr, out);
    return;
  }
  const int64_t cols = w.ffn_in_w.rows();  // 2 I'
  if (cols == 0 || n == 0) return;          // a device holding no FFN columns
  if (scratch.empty() || scratch.numel() < n * cols) scratch = core::Tensor::zeros_f32({std::max<int64_t>(n, 1), cols});
  kernels::linear_rows_f32(pool, in, n, w.ffn_in_w, w.ffn_in_b, kernels::Activation::kNone, nullptr, scratch.f32());
  kernels::swiglu_f32(pool, scratch.f32(), n, cols / 2, out);
}

namespace {
template <typename Args>
Args fill_args(const Transformer& m, int64_t l, const AttentionIo& io) {
  const ModelConfig& c = m.config();
  Args a;
  a.q = io.q; a.ldq = io.ldq; a.k = io.k; a.ldk = io.ldk; a.v = io.v; a.ldv = io.ldv;
  if constexpr (requires { a.k_f16; }) {
    a.k_f16 = io.k_f16;
    a.v_f16 = io.v_f16;
  } else {
    TESSERA_CHECK(io.k_f16 == nullptr);  // weighted attention (PRISM) never reads a cache
  }
  a.out = io.out; a.ldo = io.ldo;
  a.n_q = io.n_q; a.n_kv = io.n_kv; a.q_pos0 = io.q_pos0; a.kv_pos0 = io.kv_pos0;
  a.heads = io.heads < 0 ? c.heads : io.heads;
  if constexpr (requires { a.kv_group; }) {
    a.kv_group = c.kv_group();
    a.q_head0 = io.q_head0;
  } else {
    TESSERA_CHECK(c.kv_group() == 1);  // weighted attention (PRISM) is for plain multi-head layers
  }
  a.head_dim = c.head_dim();
  a.scale = m.attention_scale(l);
  a.causal = c.causal();
  return a;
}
}  // namespace

core::Status check_kv_dtype(const ModelConfig& c, core::DType dtype) {
  if (dtype != core::DType::kF32 && dtype != core::DType::kF16)
    return core::invalid_argument(std::string("a KV cache of ") + core::dtype_name(dtype) + " (f32 or f16)");
  if (dtype == core::DType::kF16 && c.bp_div > 0)
    return core::unimplemented("an F16 KV cache is not implemented for decoupled (block_parallel) models: use --kv-type f32");
  return core::ok_status();
}

void store_kv(KvCache& cache, int64_t l, const float* qkv, int64_t ld, int64_t k_off, int64_t kv, int64_t n, int64_t pos0) {
  store_kv_rows(cache, l, qkv + k_off, ld, qkv + k_off + kv, ld, kv, n, pos0);
}

void store_kv_rows(KvCache& cache, int64_t l, const float* k_rows, int64_t ldk, const float* v_rows, int64_t ldv,
                   int64_t kv, int64_t n, int64_t pos0) {
  core::Tensor& k = cache.k[static_cast<size_t>(l)];
  core::Tensor& v = cache.v[static_cast<size_t>(l)];
  TESSERA_CHECK_MSG(pos0 + n <= k.dim(0) && k.dim(1) == kv, "KV cache too small for position " << pos0 + n - 1);
  if (k.dtype() == core::DType::kF16) {
    auto* kc = static_cast<uint16_t*>(k.raw()) + pos0 * kv;
    auto* vc = static_cast<uint16_t*>(v.raw()) + pos0 * kv;
    kernels::f32_rows_to_f16(k_rows, ldk, n, kv, kc, kv);
    kernels::f32_rows_to_f16(v_rows, ldv, n, kv, vc, kv);
    return;
  }
  float* kc = k.f32() + pos0 * kv;
  float* vc = v.f32() + pos0 * kv;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(kc + i * kv, k_rows + i * ldk, static_cast<size_t>(kv) * sizeof(float));
    std::memcpy(vc + i * kv, v_rows + i * ldv, static_cast<size_t>(kv) * sizeof(float));
  }
}

core::Status take_handover(KvCache& cache, int64_t l, const float* k_rows, int64_t ldk, const float* v_rows,
                          int64_t ldv, int64_t kv, int64_t n) {
  if (l < 0 || l >= static_cast<int64_t>(cache.k.size()))
    return core::invalid_argument("a handover of layer " + std::to_string(l) + ", which the model lacks");
  const core::Tensor& k = cache.k[static_cast<size_t>(l)];
  if (k.empty()) return core::ok_status();
  if (k.dim(1) != kv || n < 0 || n > k.dim(0))
    return core::invalid_argument("a handover of layer " + std::to_string(l) + " that does not fit its cache");
  store_kv_rows(cache, l, k_rows, ldk, v_rows, ldv, kv, n, 0);
  return core::ok_status();
}

void cache_io(const KvCache& cache, int64_t l, int64_t kv, int64_t n_kv, AttentionIo& io) {
  const core::Tensor& k = cache.k[static_cast<size_t>(l)];
  const core::Tensor& v = cache.v[static_cast<size_t>(l)];
  if (k.dtype() == core::DType::kF16) {
    io.k_f16 = static_cast<const uint16_t*>(k.raw());
    io.v_f16 = static_cast<const uint16_t*>(v.raw());
    io.k = io.v = nullptr;
  } else {
    io.k = k.f32();
    io.v = v.f32();
  }
  io.ldk = io.ldv = kv;
  io.n_kv = n_kv;
  io.kv_pos0 = 0;
}

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
