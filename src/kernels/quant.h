// Quantized weight rows in llama.cpp's block formats, so that a GGUF file's
// blocks can be used as they are:
//   Q8_0: 32 weights per 34-byte block {f16 d; int8 q[32]}, w = d * q;
//   Q4_0: 32 weights per 18-byte block {f16 d; uint8 q[16]}, w = d * (n - 8),
//         weight j < 16 in q[j]'s low nibble, weight j + 16 in its high one;
//   Q4_K: 256 weights per 144-byte super-block {f16 d, dmin; uint8
//         scales[12]; uint8 q[128]}: 8 sub-blocks of 32, each with a 6-bit
//         scale s and min m, w = d * s * n - dmin * m (n in 0..15);
//   Q6_K: 256 weights per 210-byte super-block {uint8 ql[128], qh[64];
//         int8 scales[16]; f16 d}: 16 sub-blocks of 16, w = d * s * (n - 32)
//         (n in 0..63, low 4 bits in ql, high 2 in qh).
// The K-quant layouts are llama.cpp's (block_q4_K, block_q6_K), so a file's
// blocks are used as they are.
// The scalar functions here are the reference (quantisation as llama.cpp's
// quantize_row_*_ref); the vector kernels (QuantOps, one copy per
// instruction set from quant_ops.inc) are tested against them.
//
// The inputs of a quantized matrix are rounded to Q8_0 blocks (Q8_K blocks
// of 256 for the K-quants: f32 d, int8 q[256], int16 sums of 16), as
// llama.cpp does, so that a GGUF file computes what it computes in llama.cpp. Each
// block of a row is rounded alone: a product split over devices on block
// boundaries sees the single device's blocks and adds up to its sums within
// rounding. The decode path (few rows) multiplies the int8 blocks directly;
// the prefill path widens the rounded inputs and the weight panels to F32
// for the F32 GEMM; both compute the same products.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "kernels/simd.h"

namespace tessera::kernels {

enum class WeightType : uint8_t { kF32 = 0, kQ8_0 = 1, kQ4_0 = 2, kQ4_K = 3, kQ6_K = 4 };

inline constexpr int64_t kQuantBlock = 32;   // weights per Q8_0 / Q4_0 block
inline constexpr int64_t kSuperBlock = 256;  // weights per Q4_K / Q6_K block (QK_K)
// One Q8_K input block: d (f32), 256 int8, the 16 sums of 16 (int16, as
// llama.cpp's bsums), then the 8 sums of 32 (int16: Q4_K's sub-blocks, so
// its kernels do not add the pairs for every weight row). (Putting the
// integers first, 64-byte aligned, so that no 512-bit load splits a cache
// line, measured no faster here: docs/quantization.md.)
inline constexpr size_t kQ8KD = 0, kQ8KQs = 4, kQ8KSums16 = 260, kQ8KSums32 = 292;
inline constexpr size_t kQ8KBytes = kQ8KSums32 + 16;

const char* weight_type_name(WeightType t);  // "f32", "q8_0", "q4_0", "q4_k", "q6_k"
[[nodiscard]] core::Result<WeightType> parse_weight_type(const std::string& s);
// Weights per block: 1 (F32), 32 or 256.
int64_t block_elems(WeightType t);
// Bytes of one block (F32: 4 bytes per weight, "block" of one).
size_t block_bytes(WeightType t);
// Whether rows of k weights can be held in `t`: k a whole number of blocks.
bool holds(WeightType t, int64_t k);
// Bytes of a row of k weights in `t` (F32 when `t` cannot hold k).
size_t row_bytes(WeightType t, int64_t k);
// Bytes of an input row of k as the dot kernels of `t` take it (Q8_0 or Q8_K blocks).
size_t input_row_bytes(WeightType t, int64_t k);

// Scalar reference. k is a multiple of block_elems(t). The K-quant
// quantisers are plain min/max ones (not llama.cpp's searched scales): any
// valid blocks compute the same on both sides.
void quantize_row_ref(WeightType t, const float* x, int64_t k, uint8_t* out);
void dequantize_row_ref(WeightType t, const uint8_t* q, int64_t k, float* out);
// sum_c X[c] * W[c] over nb blocks, X an input row in t's input blocks:
// each block's integer sums times the scales, added in F32 in order.
float dot_row_ref(WeightType t, const uint8_t* w, int64_t nb, const uint8_t* xq);
// The inputs of a quantized matrix as Q8_0 blocks, rounded as llama.cpp's
// vector quantiser rounds them (to nearest, ties to even; d = amax / 127):
// the scalar reference of QuantOps::quantize_input / round_input.
void quantize_input_ref(const float* x, int64_t k, uint8_t* out);
// As Q8_K blocks (quantize_row_q8_K_ref: the value of largest magnitude to
// -127, d = 1 / iscale in F32), which llama.cpp computes in scalar code on
// x86 too; the one implementation serves every instruction set.
void quantize_input_q8_k(const float* x, int64_t k, uint8_t* out);
void round_input_q8_k(const float* x, int64_t k, float* out);
// Either, by the weight type's input format.
void quantize_input_for(WeightType t, const float* x, int64_t k, uint8_t* out);

// dot(w, ldw, rows, nb, xq, m, ldxq, out, ldo) and dequant(w, nb, out); see QuantOps.
using QuantDotFn = void (*)(const uint8_t* w, size_t ldw, int64_t rows, int64_t nb, const uint8_t* xq, int64_t m,
                            size_t ldxq, float* out, int64_t ldo);
using QuantDequantFn = void (*)(const uint8_t* w, int64_t nb, float* out);
using QuantPanelFn = void (*)(const uint8_t* w, size_t ldw, int64_t nb, float* panel);

struct QuantOps {
  // out[i * ldo + r] = sum over nb blocks of X_i . W_r for r < rows and
  // i < m (m <= 8): W_r the blocks at w + r * ldw bytes, X_i the Q8_0 blocks
  // of input row i at xq + i * ldxq. Input row i gets the same bits whatever
  // m is (a batched decode step equals each sequence's own).
  QuantDotFn dot_q8_0, dot_q4_0;
  // nb blocks widened to 32 * nb floats.
  QuantDequantFn dequant_q8_0, dequant_q4_0;
  // The same for the K-quants: X_i in Q8_K blocks, nb super-blocks of 256.
  QuantDotFn dot_q4_K, dot_q6_K;
  QuantDequantFn dequant_q4_K, dequant_q6_K;
  // rows [32, k] row-major with row stride ld (k a multiple of 8) into
  // panel[c * 32 + r]: the panel form of PackedLinear (packed_linear.h).
  void (*rows_to_panel)(const float* rows, int64_t ld, int64_t k, float* panel);
  // 32 rows of nb blocks (row stride ldw bytes) widened straight into the
  // panel form, the same bits as dequant then rows_to_panel; null where the
  // instruction set has none (the caller does those two).
  QuantPanelFn panel_q8_0, panel_q4_0, panel_q4_K, panel_q6_K;
  // An input row of k (a multiple of 32) as Q8_0 blocks (quantize_input_ref),
  // and the same rounding widened back to F32 (the prefill path's inputs).
  void (*quantize_input)(const float* x, int64_t k, uint8_t* out);
  void (*round_input)(const float* x, int64_t k, float* out);
};
const QuantOps& quant_ops(Isa isa);
inline const QuantOps& quant_ops() { return quant_ops(best_isa()); }

// The kernels of one weight type.
QuantDotFn dot_fn(const QuantOps& ops, WeightType t);
QuantDequantFn dequant_fn(const QuantOps& ops, WeightType t);
QuantPanelFn panel_fn(const QuantOps& ops, WeightType t);  // null where QuantOps has none
// An input row rounded as t's dot kernels see it, widened to F32.
void round_input_for(const QuantOps& ops, WeightType t, const float* x, int64_t k, float* out);

// Most x rows one dot call takes (the decode path's row count).
inline constexpr int64_t kQuantDotRows = 8;

}  // namespace tessera::kernels
