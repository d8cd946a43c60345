// Element types as they appear in safetensors files and on the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tessera::core {

enum class DType : uint8_t { kF32 = 1, kF16 = 2, kBF16 = 3, kI64 = 4, kI32 = 5, kU8 = 6 };

size_t dtype_size(DType dt);
// Name as safetensors spells it: "F32", "F16", "BF16", "I64", "I32", "U8".
const char* dtype_name(DType dt);
std::optional<DType> parse_dtype(std::string_view name);
// Wire code check: true when `code` is one of the enum's values.
bool valid_dtype_code(uint8_t code);

float f16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t b);
uint16_t f32_to_f16(float f);
uint16_t f32_to_bf16(float f);

}  // namespace tessera::core
