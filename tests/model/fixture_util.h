// What the model tests share: the fixture folder, ids out of a fixture
// tensor, and the largest difference between two f32 tensors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tessera::model::testing {

inline const std::string kData = TESSERA_TEST_DATA;

inline std::vector<int64_t> ids_of(const core::Tensor& t) { return {t.i64(), t.i64() + t.numel()}; }

inline float max_abs_diff(const core::Tensor& got, const core::Tensor& want) {
  EXPECT_EQ(got.numel(), want.numel());
  float m = 0.0f;
  for (int64_t i = 0; i < std::min(got.numel(), want.numel()); ++i) m = std::max(m, std::fabs(got.f32()[i] - want.f32()[i]));
  return m;
}

}  // namespace tessera::model::testing
