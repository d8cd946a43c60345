// The wire encodings (--wire) against their definitions: F16 is
// f32_to_f16 per value; Q8 blocks hold each value within half a step of
// the block's F16 scale; rows encode alone; sizes are as documented; and a
// tensor of the wrong type or size is refused, never read past its end.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/wire_format.h"

namespace tessera::core {
namespace {

std::vector<float> random_rows(int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

TEST(WireFormat, NamesAndSizes) {
  for (WireType t : {WireType::kF32, WireType::kF16, WireType::kQ8}) EXPECT_EQ(parse_wire_type(wire_type_name(t)).value(), t);
  EXPECT_FALSE(parse_wire_type("q4").ok());
  EXPECT_EQ(wire_row_bytes(WireType::kF32, 768), 3072);
  EXPECT_EQ(wire_row_bytes(WireType::kF16, 768), 1536);
  EXPECT_EQ(wire_row_bytes(WireType::kQ8, 768), 24 * 34);
  EXPECT_LE(static_cast<double>(wire_row_bytes(WireType::kQ8, 768)) / 3072.0, 0.27);
  EXPECT_EQ(wire_row_bytes(WireType::kQ8, 33), 2 * 34);  // padded to whole blocks
  EXPECT_EQ(wire_bytes(WireType::kQ8, 5, 64), 5 * 68);
  EXPECT_EQ(wire_bytes(WireType::kQ8, 0, 64), 0);
}

TEST(WireFormat, F32IsACopyAndF16IsRoundToNearest) {
  const int64_t rows = 3, cols = 70;
  const auto x = random_rows(rows * cols, 1, 3.0f);
  std::vector<float> y(x.size());
  ASSERT_TRUE(wire_decode(WireType::kF32, wire_encode(WireType::kF32, x.data(), rows, cols), rows, cols, y.data()).ok());
  EXPECT_EQ(x, y);
  const Tensor h = wire_encode(WireType::kF16, x.data(), rows, cols);
  EXPECT_EQ(h.dtype(), DType::kF16);
  EXPECT_EQ(h.nbytes(), static_cast<size_t>(rows * cols * 2));
  ASSERT_TRUE(wire_decode(WireType::kF16, h, rows, cols, y.data()).ok());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], f16_to_f32(f32_to_f16(x[i]))) << i;
}

TEST(WireFormat, Q8HoldsEveryValueWithinHalfAStep) {
  for (const int64_t cols : {int64_t{32}, int64_t{64}, int64_t{45}, int64_t{1}, int64_t{768}}) {
    const int64_t rows = 4;
    auto x = random_rows(rows * cols, static_cast<uint64_t>(cols), 5.0f);
    x[0] = 0.0f;
    if (cols >= 32)
      for (int64_t j = 0; j < 32; ++j) x[static_cast<size_t>(cols + j)] = 0.0f;  // an all-zero block
    const Tensor q = wire_encode(WireType::kQ8, x.data(), rows, cols);
    EXPECT_EQ(q.dtype(), DType::kU8);
    EXPECT_EQ(static_cast<int64_t>(q.nbytes()), wire_bytes(WireType::kQ8, rows, cols));
    std::vector<float> y(x.size(), -1.0f);
    ASSERT_TRUE(wire_decode(WireType::kQ8, q, rows, cols, y.data()).ok());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b * kWireBlock < cols; ++b) {
        const int64_t lo = b * kWireBlock, hi = std::min(cols, lo + kWireBlock);
        float amax = 0.0f;
        for (int64_t j = lo; j < hi; ++j) amax = std::max(amax, std::fabs(x[static_cast<size_t>(r * cols + j)]));
        const float step = f16_to_f32(f32_to_f16(amax / 127.0f));
        for (int64_t j = lo; j < hi; ++j) {
          const size_t i = static_cast<size_t>(r * cols + j);
          EXPECT_LE(std::fabs(y[i] - x[i]), 0.5f * step * (1 + 1e-5f) + 1e-30f) << cols << " " << i;
          if (x[i] == 0.0f) EXPECT_EQ(y[i], 0.0f);
        }
      }
    // In place, the same.
    std::vector<float> z = x;
    wire_round_trip(WireType::kQ8, z.data(), rows, cols);
    EXPECT_EQ(z, y);
  }
}

TEST(WireFormat, RowsEncodeAlone) {
  const int64_t cols = 40;
  const auto x = random_rows(3 * cols, 7, 1.0f);
  for (WireType t : {WireType::kF16, WireType::kQ8}) {
    std::vector<float> all = x, parts = x;
    wire_round_trip(t, all.data(), 3, cols);
    wire_round_trip(t, parts.data(), 1, cols);
    wire_round_trip(t, parts.data() + cols, 2, cols);
    EXPECT_EQ(all, parts) << wire_type_name(t);
  }
}

TEST(WireFormat, NonFiniteInputsDoNotCrash) {
  std::vector<float> x(64, 1.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  const Tensor q = wire_encode(WireType::kQ8, x.data(), 1, 64);
  std::vector<float> y(64);
  EXPECT_TRUE(wire_decode(WireType::kQ8, q, 1, 64, y.data()).ok());
  EXPECT_NEAR(y[0], 1.0f, 0.01f);  // the NaN's block keeps its other values
  EXPECT_EQ(y[3], 0.0f);
}

TEST(WireFormat, DecodeRefusesWhatDoesNotMatch) {
  const auto x = random_rows(2 * 64, 3, 1.0f);
  std::vector<float> y(2 * 64);
  const Tensor q = wire_encode(WireType::kQ8, x.data(), 2, 64);
  const Tensor h = wire_encode(WireType::kF16, x.data(), 2, 64);
  EXPECT_FALSE(wire_decode(WireType::kQ8, q, 2, 65, y.data()).ok());  // 3 blocks a row expected
  EXPECT_FALSE(wire_decode(WireType::kQ8, q, 1, 64, y.data()).ok());
  EXPECT_FALSE(wire_decode(WireType::kQ8, h, 2, 64, y.data()).ok());  // wrong type
  EXPECT_FALSE(wire_decode(WireType::kF16, q, 2, 64, y.data()).ok());
  EXPECT_FALSE(wire_decode(WireType::kF32, h, 2, 64, y.data()).ok());
  const Status st = wire_decode(WireType::kF16, h, 3, 64, y.data());
  EXPECT_NE(st.message().find("expected 3 rows of 64 values as f16"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tessera::core
