// Multi-head scaled dot-product attention over strided Q, K, V (e.g. the
// column blocks of a fused QKV buffer). Scratch is supplied by the caller so
// the hot loop never allocates.
#pragma once

#include <cstdint>

namespace tessera::core { class ThreadPool; }

namespace tessera::kernels {

struct AttentionArgs {
  const float* q = nullptr;  // [n_q, heads*head_dim], row stride ldq
  int64_t ldq = 0;
  const float* k = nullptr;  // [n_kv, kv_heads*head_dim], row stride ldk
  int64_t ldk = 0;
  const float* v = nullptr;  // [n_kv, kv_heads*head_dim], row stride ldv
  int64_t ldv = 0;
  float* out = nullptr;  // [n_q, heads*head_dim], row stride ldo
  int64_t ldo = 0;
  int64_t n_q = 0, n_kv = 0, heads = 0, head_dim = 0;
  // Grouped-query attention: kv_group query heads share one K/V head (0 or
  // 1: plain multi-head attention). q_head0 is the model's index of the
  // first query head here (a shard's), so query head h reads K/V column
  // block (q_head0 + h) / kv_group - q_head0 / kv_group.
  int64_t kv_group = 0;
  int64_t q_head0 = 0;
  // An F16 KV cache: K and V as IEEE half rows (same strides, in elements),
  // read in place of k and v; each head's block is widened to F32 first.
  const uint16_t* k_f16 = nullptr;
  const uint16_t* v_f16 = nullptr;
  float scale = 1.0f;
  // Causal: query i (global position q_pos0 + i) sees key j (position
  // kv_pos0 + j) only when kv_pos0 + j <= q_pos0 + i.
  bool causal = false;
  int64_t q_pos0 = 0;
  int64_t kv_pos0 = 0;
};

// Half <-> float rows (F16C where the CPU has it; the scalar core/dtype.h
// conversion is the reference): `rows` rows of `cols` elements, strides in elements.
void f16_rows_to_f32(const uint16_t* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst);
void f32_rows_to_f16(const float* src, int64_t ld_src, int64_t rows, int64_t cols, uint16_t* dst, int64_t ld_dst);

// Floats of scratch that let all heads run in one pass; less also works
// (heads are then processed in groups), down to one head's n_q * n_kv.
int64_t attention_scratch_floats(int64_t n_q, int64_t n_kv, int64_t heads);

void attention_f32(core::ThreadPool* pool, const AttentionArgs& args, float* scratch, int64_t scratch_floats);

// Softmax of score rows [rows, n_kv] for queries at positions q_pos0.. and
// keys at kv_pos0..; with `causal`, keys after the query get weight 0.
void attention_softmax_rows_f32(float* scores, int64_t rows, int64_t n_kv, bool causal, int64_t q_pos0, int64_t kv_pos0);

// Masks then normalises one row of scores in place (used by strategies that
// build their own score rows). Entries with visible[j] == false get weight 0.
void masked_softmax_row_f32(float* row, int64_t n, int64_t visible_end);

}  // namespace tessera::kernels
