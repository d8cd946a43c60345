// Row-wise and element-wise kernels (f32). Each checks its arguments first.
#pragma once

#include <cstdint>

namespace tessera::core { class ThreadPool; }

namespace tessera::kernels {

enum class Activation { kNone, kGeluErf, kGeluTanh, kTanh, kRelu };

// x[i] = act(x[i]) for n elements.
void activation_f32(float* x, int64_t n, Activation act);
// y[r, :] = act(y[r, :] + bias) (+ residual[r, :] when given), rows x cols with
// row strides ldy / ldr. bias or residual may be null.
void bias_act_residual_f32(float* y, int64_t rows, int64_t cols, int64_t ldy, const float* bias,
                           Activation act, const float* residual, int64_t ldr);
// out = layernorm(x) * gamma + beta per row; in place allowed (out == x).
void layernorm_f32(const float* x, float* out, int64_t rows, int64_t cols, const float* gamma,
                   const float* beta, float eps);
// Numerically stable softmax of each row of length cols, in place.
void softmax_rows_f32(float* x, int64_t rows, int64_t cols);
// Index of the largest element (first on ties).
int64_t argmax_f32(const float* x, int64_t n);
// The sum of x[0, n) (n a multiple of 64) read as the decode kernels stream
// their weights: 64-byte vector loads, four sums apart (the streaming-read
// figure of the profile and of BM_StreamRead). One chain of scalar adds was
// bound by its adds: 7-9 GB/s on an Intel Xeon whose decode read 14.6.
float stream_sum_f32(const float* x, int64_t n);

// Splits rows over the pool (null pool = caller only).
void layernorm_f32_mt(core::ThreadPool* pool, const float* x, float* out, int64_t rows, int64_t cols,
                      const float* gamma, const float* beta, float eps);
void bias_act_residual_f32_mt(core::ThreadPool* pool, float* y, int64_t rows, int64_t cols, int64_t ldy,
                              const float* bias, Activation act, const float* residual, int64_t ldr);

}  // namespace tessera::kernels
