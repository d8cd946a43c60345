// DeTransformer's decoupled layer (paper 002, Eq. 2): sub-block i reads and
// writes only residual features [i*h/N, (i+1)*h/N), with full-width attention
// (all heads) and the full FFN; its norms have width h/N.
#include <cstring>

#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "model/layer_blocks.h"
#include "model/transformer.h"

namespace tessera::model {

using core::Tensor;
using kernels::Activation;

void Transformer::block(int64_t l, int64_t i, float* xi, int64_t n, int64_t pos0, KvCache* cache, Workspace& ws,
                        core::ThreadPool* pool) const {
  const ModelConfig& c = config_;
  const auto& blocks = weights_.layers[static_cast<size_t>(l)].blocks;
  TESSERA_CHECK_MSG(c.decoupled(l) && i >= 0 && i < static_cast<int64_t>(blocks.size()) &&
                        !blocks[static_cast<size_t>(i)].qkv_w.empty(),
                    "sub-block " << i << " of layer " << l << " is not loaded on this device");
  if (n == 0) return;
  const LayerWeights& w = blocks[static_cast<size_t>(i)];
  const int64_t H = c.hidden, Fr = c.block_width();
  ws.ensure(c, n, cache ? pos0 + n : n);
  // Attention's input: LN1(x_i) for pre-LN families, x_i itself for BERT.
  const float* in = xi;
  if (c.pre_layernorm()) {
    kernels::layernorm_f32_mt(pool, xi, ws.a.f32(), n, Fr, w.ln1_g.f32(), w.ln1_b.f32(), c.eps);
    in = ws.a.f32();
  }
  kernels::linear_rows_f32(pool, in, n, w.qkv_w, w.qkv_b, Activation::kNone, nullptr, ws.qkv.f32());
  AttentionIo io = fused_qkv_io(ws.qkv.f32(), H, n, ws.ctx.f32());
  io.q_pos0 = io.kv_pos0 = pos0;
  if (cache != nullptr) {
    Tensor& kt = cache->k[static_cast<size_t>(l)];
    Tensor& vt = cache->v[static_cast<size_t>(l)];
    TESSERA_CHECK_MSG(pos0 + n <= kt.dim(0) && kt.dim(1) == c.bp_div * H, "KV cache does not fit sub-block " << i);
    const int64_t ld = kt.dim(1);
    float* kc = kt.f32() + i * H;
    float* vc = vt.f32() + i * H;
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(kc + (pos0 + r) * ld, ws.qkv.f32() + r * 3 * H + H, static_cast<size_t>(H) * sizeof(float));
      std::memcpy(vc + (pos0 + r) * ld, ws.qkv.f32() + r * 3 * H + 2 * H, static_cast<size_t>(H) * sizeof(float));
    }
    io.k = kc;
    io.v = vc;
    io.ldk = io.ldv = ld;
    io.n_kv = pos0 + n;
    io.kv_pos0 = 0;
  }
  kernels::attention_f32(pool, attention_args(*this, l, io), ws.scores.f32(), ws.scores.numel());
  // s = ctx W_o + b_o + x_i, on the slice's width.
  float* s = ws.h.f32();
  kernels::linear_rows_f32(pool, ws.ctx.f32(), n, w.attn_out_w, w.attn_out_b, Activation::kNone, xi, s);
  const float* mlp_in = s;
  if (c.pre_layernorm()) {
    kernels::layernorm_f32_mt(pool, s, ws.a.f32(), n, Fr, w.ln2_g.f32(), w.ln2_b.f32(), c.eps);
    mlp_in = ws.a.f32();
  } else {
    kernels::layernorm_f32_mt(pool, s, s, n, Fr, w.ln1_g.f32(), w.ln1_b.f32(), c.eps);
  }
  kernels::linear_rows_f32(pool, mlp_in, n, w.ffn_in_w, w.ffn_in_b, c.act, nullptr, ws.ffn.f32());
  kernels::linear_rows_f32(pool, ws.ffn.f32(), n, w.ffn_out_w, w.ffn_out_b, Activation::kNone, s, xi);
  if (!c.pre_layernorm()) kernels::layernorm_f32_mt(pool, xi, xi, n, Fr, w.ln2_g.f32(), w.ln2_b.f32(), c.eps);
}

void Transformer::decoupled_layer(int64_t l, Tensor& x, int64_t pos0, KvCache* cache, Workspace& ws,
                                  core::ThreadPool* pool) const {
  const int64_t n = x.dim(0), H = config_.hidden, Fr = config_.block_width();
  TESSERA_CHECK(x.rank() == 2 && x.dim(1) == H);
  if (n == 0) return;
  if (ws.slice.empty() || ws.slice.numel() < n * Fr) ws.slice = Tensor::zeros_f32({n, Fr});
  float* xi = ws.slice.f32();
  const size_t row = static_cast<size_t>(Fr) * sizeof(float);
  for (int64_t i = 0; i < config_.bp_div; ++i) {
    for (int64_t r = 0; r < n; ++r) std::memcpy(xi + r * Fr, x.f32() + r * H + i * Fr, row);
    block(l, i, xi, n, pos0, cache, ws, pool);
    for (int64_t r = 0; r < n; ++r) std::memcpy(x.f32() + r * H + i * Fr, xi + r * Fr, row);
  }
}

}  // namespace tessera::model
