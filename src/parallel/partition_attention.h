// Partitioned attention (Voltage's Algorithm 1), a kernel apart from any
// strategy: the attention output of a block of rows, by Eq. (3) or by the
// reordered Eq. (8). Voltage runs it; bench-attention times it (Fig. 6).
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/packed_linear.h"
#include "parallel/partition.h"

namespace tessera::parallel {

struct PartitionAttention {
  const float* x = nullptr;  // the whole layer input (after LN1 where the model has it), [n, f]
  int64_t n = 0, f = 0, heads = 0, head_dim = 0;
  Range rows;                       // this device's output rows
  const float* w_qkv = nullptr;     // [3f, f]: W_Q, W_K, W_V stacked, Linear layout
  const kernels::PackedLinear* packed_qkv = nullptr;  // the same packed (the model's); used when set
  const float* b_qkv = nullptr;     // [3f] or null
  float scale = 1.0f;
  bool causal = false;              // positions are the global row indices
  float* out = nullptr;             // [rows.size(), q_width]
  // Eq. (3): Q|K|V precomputed, [n, qkv_width()] (Q only where rows are
  // this device's); null = computed here.
  const float* qkv = nullptr;
  // Llama-style layers (Eq. 3 only): Q and K/V widths (0: f), query heads
  // per K/V head, and what turns projected rows into positioned ones (q/k
  // norms and RoPE at the rows' absolute positions r0..): called on the Q
  // block (`keys` false) or the K block (true) of rows with stride ld.
  int64_t q_width = 0, kv_width = 0, kv_group = 1;
  std::function<void(float* rows, int64_t ld, int64_t r0, int64_t count, bool keys)> position;
  int64_t qw() const { return q_width > 0 ? q_width : f; }
  int64_t kvw() const { return kv_width > 0 ? kv_width : f; }
  int64_t qkv_width() const { return qw() + 2 * kvw(); }
};

// Columns [col0, col0 + cols) of Q|K|V (0..qkv_width) for rows [r0, r0 +
// count) of a.x, into qkv ([n, qkv_width]), positioned (a.position) where
// they hold Q or K: lets a device project each block of rows as soon as it
// arrives (the ring overlap), while the next block travels.
void partition_project_f32(const PartitionAttention& a, int64_t r0, int64_t count, int64_t col0, int64_t cols,
                           float* qkv);

// Scratch floats `partition_attention_f32` needs (qkv_width 0: 3f).
int64_t partition_attention_scratch(int64_t n, int64_t f, int64_t p, int64_t qkv_width = 0);

// eq8 = false: Q_p K^T with K, V over all rows (Eq. 3); true: per head
// ((x_p W_Q) W_K^T) x^T and (S x) W_V (Eq. 8). The key bias only shifts each
// score row by a constant, which softmax ignores; S's rows sum to 1, so the
// value bias is added once after (S x) W_V. Both orders give the same result.
void partition_attention_f32(const PartitionAttention& a, bool eq8, float* scratch);

}  // namespace tessera::parallel
