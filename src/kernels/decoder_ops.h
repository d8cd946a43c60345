// Row kernels of today's decoder LLMs (Llama, Mistral, Qwen): RMSNorm, the
// gated SiLU MLP's combine and rotary position embeddings. Plain loops: they
// are O(rows x width) beside the GEMMs' O(rows x width^2), and the compiler
// vectorises them. Each checks its arguments first.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::core { class ThreadPool; }

namespace tessera::kernels {

// out = x / sqrt(mean(x^2) + eps) * gamma per row of `cols`, rows with row
// strides ldx / ldo (Llama's RMSNorm; the sum in double, as an fp32 model
// rounds it no worse). In place allowed (out == x).
void rmsnorm_f32(const float* x, int64_t ldx, float* out, int64_t ldo, int64_t rows, int64_t cols, const float* gamma,
                 float eps);
void rmsnorm_f32_mt(core::ThreadPool* pool, const float* x, int64_t ldx, float* out, int64_t ldo, int64_t rows,
                    int64_t cols, const float* gamma, float eps);

// out[r, j] = silu(gu[r, j]) * gu[r, I + j] for rows of [gate(I) | up(I)].
void swiglu_f32(core::ThreadPool* pool, const float* gu, int64_t rows, int64_t I, float* out);

// Rotary embedding, "rotate half" layout: in each head of head_dim floats,
// element i and i + head_dim/2 turn by angle pos * inv_freq[i], pos =
// pos0 + row. `x` holds rows of `heads` heads starting at column 0, row
// stride ld. inv_freq has head_dim/2 entries.
void rope_f32(float* x, int64_t ld, int64_t rows, int64_t heads, int64_t head_dim, int64_t pos0, const float* inv_freq);

}  // namespace tessera::kernels
