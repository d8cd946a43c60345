// Quantized weight rows in llama.cpp's block formats, so that a GGUF file's
// blocks can be used as they are:
//   Q8_0: 32 weights per 34-byte block {f16 d; int8 q[32]}, w = d * q;
//   Q4_0: 32 weights per 18-byte block {f16 d; uint8 q[16]}, w = d * (n - 8),
//         weight j < 16 in q[j]'s low nibble, weight j + 16 in its high one.
// The scalar functions here are the reference (quantisation as llama.cpp's
// quantize_row_*_ref); the vector kernels (QuantOps, one copy per
// instruction set from quant_ops.inc) are tested against them.
//
// The activations stay F32: a row of weights is widened to F32 in registers
// and multiplied there, so a product split over devices (on block
// boundaries) adds up to the single device's within rounding, and the decode
// path (few rows) and the prefill path (whole panels widened, then the F32
// GEMM) compute the same sums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "kernels/simd.h"

namespace tessera::kernels {

enum class WeightType : uint8_t { kF32 = 0, kQ8_0 = 1, kQ4_0 = 2 };

inline constexpr int64_t kQuantBlock = 32;  // weights per block, both types

const char* weight_type_name(WeightType t);  // "f32", "q8_0", "q4_0"
[[nodiscard]] core::Result<WeightType> parse_weight_type(const std::string& s);
bool valid_weight_type_code(uint8_t code);
// Bytes of one block (F32: 4 bytes per weight, "block" of one).
size_t block_bytes(WeightType t);
// Whether rows of k weights can be held in `t`: k a whole number of blocks.
bool holds(WeightType t, int64_t k);
// Bytes of a row of k weights in `t` (F32 when `t` cannot hold k).
size_t row_bytes(WeightType t, int64_t k);

// Scalar reference. k is a multiple of kQuantBlock.
void quantize_row_ref(WeightType t, const float* x, int64_t k, uint8_t* out);
void dequantize_row_ref(WeightType t, const uint8_t* q, int64_t k, float* out);
// sum_c x[c] * W[c] over k weights, accumulated block by block in F32.
float dot_row_ref(WeightType t, const uint8_t* q, int64_t k, const float* x);

struct QuantOps {
  // out[i] = sum_c x[i * ldx + c] * W[c] for i < m (m <= 8), over nb blocks.
  void (*dot_q8_0)(const uint8_t* w, int64_t nb, const float* x, int64_t m, int64_t ldx, float* out);
  void (*dot_q4_0)(const uint8_t* w, int64_t nb, const float* x, int64_t m, int64_t ldx, float* out);
  // nb blocks widened to 32 * nb floats.
  void (*dequant_q8_0)(const uint8_t* w, int64_t nb, float* out);
  void (*dequant_q4_0)(const uint8_t* w, int64_t nb, float* out);
};
const QuantOps& quant_ops(Isa isa);
inline const QuantOps& quant_ops() { return quant_ops(best_isa()); }

// Most x rows one dot call takes (the decode path's row count).
inline constexpr int64_t kQuantDotRows = 8;

}  // namespace tessera::kernels
