// Helpers shared by the strategy tests: a fixture's input and the largest
// element-wise difference of two tensors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model/safetensors.h"
#include "model/transformer.h"

namespace tessera::parallel::testing {

inline const std::string kData = TESSERA_TEST_DATA;

inline float max_diff(const core::Tensor& a, const core::Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  float m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) m = std::max(m, std::fabs(a.f32()[i] - b.f32()[i]));
  return m;
}

// Input `name` (e.g. "s33") of tests/data/<family>/cases.safetensors; ViT has one image.
inline model::ModelInput fixture_input(const std::string& family, const std::string& name) {
  auto cases = model::SafeTensorsFile::open(kData + "/" + family + "/cases.safetensors").value();
  model::ModelInput in;
  if (family == "vit-tiny") {
    in.pixels = cases.get("c0.pixel_values").value();
    return in;
  }
  const auto ids = cases.get(name + ".input_ids").value();
  in.ids.assign(ids.i64(), ids.i64() + ids.numel());
  if (family == "bert-tiny") {
    const auto tt = cases.get(name + ".token_type_ids").value();
    in.token_types.assign(tt.i64(), tt.i64() + tt.numel());
  }
  return in;
}

}  // namespace tessera::parallel::testing
