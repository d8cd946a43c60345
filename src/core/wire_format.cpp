#include "core/wire_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace tessera::core {

namespace {

int64_t blocks_per_row(int64_t cols) { return (cols + kWireBlock - 1) / kWireBlock; }

// One block of up to 32 values (the rest of the block is zero).
void encode_block(const float* x, int64_t n, uint8_t* out) {
  float amax = 0.0f;
  for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  // The scale is rounded to F16 first and the values divided by the rounded
  // scale, so the receiver's product is the nearest multiple it can hold.
  const uint16_t h = f32_to_f16(amax / 127.0f);
  const float d = f16_to_f32(h);
  const float id = d != 0.0f && std::isfinite(d) ? 1.0f / d : 0.0f;
  std::memcpy(out, &h, 2);
  for (int64_t j = 0; j < kWireBlock; ++j) {
    float v = j < n ? x[j] * id : 0.0f;
    if (!(v == v)) v = 0.0f;  // NaN: no integer to round to
    v = std::clamp(std::nearbyint(v), -127.0f, 127.0f);
    out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(v));
  }
}

void decode_block(const uint8_t* q, int64_t n, float* out) {
  uint16_t h;
  std::memcpy(&h, q, 2);
  const float d = f16_to_f32(h);
  for (int64_t j = 0; j < n; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(q[2 + j]));
}

}  // namespace

const char* wire_type_name(WireType t) {
  switch (t) {
    case WireType::kF32: return "f32";
    case WireType::kF16: return "f16";
    case WireType::kQ8: return "q8";
  }
  return "?";
}

Result<WireType> parse_wire_type(std::string_view name) {
  for (const WireType t : {WireType::kF32, WireType::kF16, WireType::kQ8})
    if (name == wire_type_name(t)) return t;
  return invalid_argument("unknown wire type '" + std::string(name) + "' (f32, f16 or q8)");
}

int64_t wire_row_bytes(WireType t, int64_t cols) {
  switch (t) {
    case WireType::kF32: return cols * 4;
    case WireType::kF16: return cols * 2;
    case WireType::kQ8: return blocks_per_row(cols) * kWireBlockBytes;
  }
  return 0;
}

int64_t wire_bytes(WireType t, int64_t rows, int64_t cols) { return rows * wire_row_bytes(t, cols); }

Tensor wire_encode(WireType t, const float* x, int64_t rows, int64_t cols) {
  TESSERA_CHECK(rows >= 0 && cols >= 0);
  switch (t) {
    case WireType::kF32: {
      Tensor out = Tensor::zeros_f32({rows, cols});
      if (rows * cols > 0) std::memcpy(out.f32(), x, static_cast<size_t>(rows * cols) * sizeof(float));
      return out;
    }
    case WireType::kF16: {
      Tensor out = Tensor::zeros(DType::kF16, {rows, cols});
      auto* h = static_cast<uint16_t*>(out.raw());
      for (int64_t i = 0; i < rows * cols; ++i) h[i] = f32_to_f16(x[i]);
      return out;
    }
    case WireType::kQ8: {
      const int64_t nb = blocks_per_row(cols), rb = wire_row_bytes(t, cols);
      Tensor out = Tensor::zeros(DType::kU8, {rows, rb});
      auto* q = static_cast<uint8_t*>(out.raw());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < nb; ++b)
          encode_block(x + r * cols + b * kWireBlock, std::min(kWireBlock, cols - b * kWireBlock),
                       q + r * rb + b * kWireBlockBytes);
      return out;
    }
  }
  TESSERA_CHECK(false);
  return {};
}

Status wire_decode(WireType t, const Tensor& enc, int64_t rows, int64_t cols, float* out) {
  const DType want = t == WireType::kF32 ? DType::kF32 : t == WireType::kF16 ? DType::kF16 : DType::kU8;
  const int64_t width = t == WireType::kQ8 ? wire_row_bytes(t, cols) : cols;
  if (enc.dtype() != want || enc.numel() != rows * width || (rows * width > 0 && enc.raw() == nullptr))
    return invalid_argument(std::string("received ") + dtype_name(enc.dtype()) + " of " + std::to_string(enc.numel()) +
                            " elements, expected " + std::to_string(rows) + " rows of " + std::to_string(cols) +
                            " values as " + wire_type_name(t));
  switch (t) {
    case WireType::kF32:
      if (rows * cols > 0) std::memcpy(out, enc.raw(), static_cast<size_t>(rows * cols) * sizeof(float));
      break;
    case WireType::kF16: {
      const auto* h = static_cast<const uint16_t*>(enc.raw());
      for (int64_t i = 0; i < rows * cols; ++i) out[i] = f16_to_f32(h[i]);
      break;
    }
    case WireType::kQ8: {
      const auto* q = static_cast<const uint8_t*>(enc.raw());
      const int64_t nb = blocks_per_row(cols);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < nb; ++b)
          decode_block(q + r * width + b * kWireBlockBytes, std::min(kWireBlock, cols - b * kWireBlock),
                       out + r * cols + b * kWireBlock);
      break;
    }
  }
  return ok_status();
}

void wire_round_trip(WireType t, float* x, int64_t rows, int64_t cols) {
  if (t == WireType::kF32 || rows * cols <= 0) return;
  const Tensor enc = wire_encode(t, x, rows, cols);
  TESSERA_CHECK(wire_decode(t, enc, rows, cols, x).ok());
}

}  // namespace tessera::core
