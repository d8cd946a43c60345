// Activation encodings for the wire (--wire): what a rank sends in place of
// F32 rows, and what the receiver gets back. F16 halves the bytes. Q8 is
// Q8_0-style blocks (32 values, one F16 scale, 34 bytes): 0.266x of F32.
// Each row is encoded alone, padded to whole blocks, so a row arrives with
// the same bits however rows are grouped into messages. In core because the
// transport (comm) and the in-process emulation and estimates (parallel)
// both need it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"

namespace tessera::core {

enum class WireType : uint8_t { kF32 = 0, kF16 = 1, kQ8 = 2 };
inline constexpr int64_t kWireBlock = 32;
inline constexpr int64_t kWireBlockBytes = 34;

const char* wire_type_name(WireType t);  // "f32", "f16", "q8"
[[nodiscard]] Result<WireType> parse_wire_type(std::string_view name);

// Bytes of `rows` rows of `cols` values on the wire.
int64_t wire_row_bytes(WireType t, int64_t cols);
int64_t wire_bytes(WireType t, int64_t rows, int64_t cols);

// The tensor the transport carries for x[rows, cols]: F32 [rows, cols],
// F16 [rows, cols] or U8 [rows, wire_row_bytes].
Tensor wire_encode(WireType t, const float* x, int64_t rows, int64_t cols);
// Checks `t` is exactly what wire_encode makes for rows x cols, then writes
// rows * cols floats to `out`.
[[nodiscard]] Status wire_decode(WireType t, const Tensor& encoded, int64_t rows, int64_t cols, float* out);
// x = decode(encode(x)): what a receiver gets, for the sender's own copy
// (so every rank holds the same values) and for the in-process emulation.
void wire_round_trip(WireType t, float* x, int64_t rows, int64_t cols);

}  // namespace tessera::core
