// The pieces of a transformer layer that every way of running it shares: the
// attention arguments, and the two connective blocks (residual add and layer
// norm) after attention and after the MLP, for post-LN (BERT) and pre-LN
// (GPT-2, ViT) families in one place. The single device and every strategy
// that splits a layer (tp, sp, voltage, galaxy, prism) call these.
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/weighted_attention.h"
#include "model/transformer.h"

namespace tessera::model {

// Where one attention call reads and writes; heads = -1: all of the model's.
struct AttentionIo {
  const float* q = nullptr;
  int64_t ldq = 0;
  const float* k = nullptr;
  int64_t ldk = 0;
  const float* v = nullptr;
  int64_t ldv = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  int64_t n_q = 0, n_kv = 0, q_pos0 = 0, kv_pos0 = 0;
  int64_t heads = -1;
  int64_t q_head0 = 0;  // the model's index of the first query head (a shard's h0)
  const uint16_t* k_f16 = nullptr;  // an F16 cache's K and V, in place of k and v
  const uint16_t* v_f16 = nullptr;
};

// The KV cache, F32 or F16 alike. check_kv_dtype: whether the model's
// caches can hold `dtype` (F32 always; F16 except decoupled layers).
core::Status check_kv_dtype(const ModelConfig& c, core::DType dtype);
// Rows pos0..pos0+n-1 of layer l's caches, from K at columns [k_off, k_off + kv)
// and V at [k_off + kv, k_off + 2 kv) of `n` rows of `ld` floats.
void store_kv(KvCache& cache, int64_t l, const float* qkv, int64_t ld, int64_t k_off, int64_t kv, int64_t n, int64_t pos0);
// The same from K and V apart (`kv` floats a row; rows ldk and ldv apart).
void store_kv_rows(KvCache& cache, int64_t l, const float* k_rows, int64_t ldk, const float* v_rows, int64_t ldv,
                   int64_t kv, int64_t n, int64_t pos0);
// A pair's handover into a decoder's caches: layer l's K and V of positions
// 0..n-1 (`kv` floats a row), checked against the cache; a layer the cache
// does not hold (an empty tensor: another device's) is skipped.
[[nodiscard]] core::Status take_handover(KvCache& cache, int64_t l, const float* k_rows, int64_t ldk, const float* v_rows,
                                         int64_t ldv, int64_t kv, int64_t n);
// Attention in `io` over cache rows 0..n_kv-1 of layer l (kv elements a row).
void cache_io(const KvCache& cache, int64_t l, int64_t kv, int64_t n_kv, AttentionIo& io);

// Q|K|V fused in rows of 3 * width floats (width = heads * head_dim), with
// n_q = n_kv = rows; the context goes to `out` (row stride `width`).
AttentionIo fused_qkv_io(const float* qkv, int64_t width, int64_t rows, float* out);
// The same for a head shard's rows [Q | K | V] (HeadShard; grouped K/V).
AttentionIo shard_qkv_io(const HeadShard& s, const float* qkv, int64_t rows, float* out);

// Llama-style layers: q/k norms and rotary positions on a shard's fused QKV
// rows (n rows at positions pos0..); nothing for the other families.
void position_qk(const Transformer& m, int64_t l, const HeadShard& s, float* qkv, int64_t n, int64_t pos0,
                 core::ThreadPool* pool);

// Continuous batching: one step of several sequences, their rows together
// in qkv [pos.size(), s.qkv_width()], row i at position pos[i] with caches
// caches[i]. Positions, the K/V append and attention run row by row (each
// over its own cache); the context goes to ctx [rows, s.q_width()]. The
// caller runs the projections on all rows at once: the weights are read
// once for the batch, which is what batching buys.
void attend_rows(const Transformer& m, int64_t l, const HeadShard& s, float* qkv, std::span<const int64_t> pos,
                 std::span<KvCache* const> caches, float* ctx, core::Tensor& scores, core::ThreadPool* pool);
// Transformer::layer on such rows: x [pos.size(), F] in place, the whole
// layer (not a decoupled one) on this device.
void layer_rows(const Transformer& m, int64_t l, float* x, std::span<const int64_t> pos, std::span<KvCache* const> caches,
                Workspace& ws, core::ThreadPool* pool);

// The same for `heads` query heads (keys false) or K heads (keys true) at x
// (row stride ld) alone: for code that projects Q and K at different times.
void position_heads(const Transformer& m, int64_t l, float* x, int64_t ld, int64_t n, int64_t pos0, int64_t heads,
                    bool keys, core::ThreadPool* pool);

// The MLP's input projection and activation on n rows into `out` [n, I']
// (I' the FFN columns this device holds): Llama-style layers project
// [gate | up] into `scratch` (grown to [n, 2I']) and combine them.
void mlp_input(const Transformer& m, int64_t l, const float* in, int64_t n, float* out, core::Tensor& scratch,
               core::ThreadPool* pool);

// The family's norm on n rows of width `cols` (F): LayerNorm with gamma and
// beta, or RMSNorm with gamma (Llama-style). out may alias x.
void norm_rows(const ModelConfig& c, const core::Tensor& gamma, const core::Tensor& beta, const float* x, float* out,
               int64_t n, int64_t cols, core::ThreadPool* pool);

// Layer l's attention (heads, head size, scale, causality) over `io`.
kernels::AttentionArgs attention_args(const Transformer& m, int64_t l, const AttentionIo& io);
// The same for PRISM's count-weighted attention (counts and key positions
// are the caller's).
kernels::WeightedAttentionArgs weighted_attention_args(const Transformer& m, int64_t l, const AttentionIo& io);

// After attention, on n rows. `s` holds the attention output projection;
// with add_bias its bias and the layer input `x` are added here (strategies
// that sum partial projections over devices add them once, after the sum),
// otherwise `s` holds them already. Returns the MLP's input: post-LN
// families normalise `s` in place (LN1; `s` is then also the MLP's
// residual), pre-LN ones write LN2(s) to `mlp_in`.
const float* attention_residual(const Transformer& m, int64_t l, float* s, const float* x, bool add_bias, int64_t n,
                                float* mlp_in, core::ThreadPool* pool);

// After the MLP, on n rows. `s` holds the FFN output projection; with
// add_bias its bias and the MLP's residual `h` are added here. Writes the
// layer output to `out` (which may alias `s`): LN2(s) for post-LN families,
// `s` itself for pre-LN ones.
void mlp_residual(const Transformer& m, int64_t l, float* s, const float* h, bool add_bias, int64_t n, float* out,
                  core::ThreadPool* pool);

}  // namespace tessera::model
