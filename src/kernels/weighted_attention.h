// Count-scaled attention (PRISM Eq. 12-15): each key stands for g_j identical
// keys, so its exponential is weighted by g_j instead of the key being
// duplicated (Eq. 11). A per-key position gives the partition-aware causal
// mask (Eq. 17). Scratch is supplied by the caller, as for attention_f32.
#pragma once

#include <cstdint>

namespace tessera::core { class ThreadPool; }

namespace tessera::kernels {

struct WeightedAttentionArgs {
  const float* q = nullptr;  // [n_q, heads*head_dim], row stride ldq
  int64_t ldq = 0;
  const float* k = nullptr;  // [n_kv, heads*head_dim], row stride ldk
  int64_t ldk = 0;
  const float* v = nullptr;  // [n_kv, heads*head_dim], row stride ldv
  int64_t ldv = 0;
  float* out = nullptr;  // [n_q, heads*head_dim], row stride ldo
  int64_t ldo = 0;
  int64_t n_q = 0, n_kv = 0, heads = 0, head_dim = 0;
  float scale = 1.0f;
  // Multiplicity g_j >= 0 of each key ([n_kv]); null means every key once.
  const float* counts = nullptr;
  // Causal: query i (position q_pos0 + i) sees key j only when
  // key_pos[j] <= q_pos0 + i; key_pos null means key j is at kv_pos0 + j.
  bool causal = false;
  int64_t q_pos0 = 0;
  const int64_t* key_pos = nullptr;
  int64_t kv_pos0 = 0;
};

// Floats of scratch needed: one head's n_q * n_kv scores and a row of n_kv
// key weights.
int64_t weighted_attention_scratch_floats(int64_t n_q, int64_t n_kv);

// Softmax of score rows [rows, n_kv] where key j's exponential is multiplied
// by counts[j] (null: 1) and keys the query may not see get weight 0. A row
// that sees no key with a positive count becomes zeros. `weights`: n_kv
// floats of scratch.
void weighted_softmax_rows_f32(float* scores, int64_t rows, int64_t n_kv, const float* counts, bool causal,
                               int64_t q_pos0, const int64_t* key_pos, int64_t kv_pos0, float* weights);

// out = softmax_g(scale * Q K^T) V per head; equals attention over the matrix
// in which key/value j is repeated counts[j] times.
void weighted_attention_f32(core::ThreadPool* pool, const WeightedAttentionArgs& args, float* scratch,
                            int64_t scratch_floats);

}  // namespace tessera::kernels
