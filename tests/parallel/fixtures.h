// Helpers shared by the strategy tests: a fixture's input and the largest
// element-wise difference of two tensors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model/safetensors.h"
#include "model/transformer.h"
#include "parallel/strategy.h"
#include "runtime/in_process.h"

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

// A plan of `strategy` on `world` devices with the given shares and options.
inline Plan make_plan(const std::string& strategy, int world, std::vector<double> ratios = {},
                      nlohmann::json options = nlohmann::json::object()) {
  Plan p;
  p.strategy = strategy;
  p.world = world;
  p.ratios = std::move(ratios);
  p.options = std::move(options);
  return p;
}

struct RunOut {
  core::Tensor hidden;  // as HF's last hidden state
  std::vector<SyncStats> stats;
};

// `plan` completed and run with every rank a thread (run_in_process).
inline RunOut run_threads(const std::string& dir, Plan plan, const model::ModelInput& in) {
  auto cfg = model::load_config(dir);
  EXPECT_TRUE(cfg.ok());
  const auto st = complete_plan(plan, *cfg);
  EXPECT_TRUE(st.ok()) << st.to_string();
  auto models = runtime::load_rank_models(dir, plan);
  EXPECT_TRUE(models.ok()) << models.status().to_string();
  auto got = runtime::run_in_process(plan, *models, in);
  EXPECT_TRUE(got.ok()) << got.status().to_string();
  if (!got.ok()) return {};
  return {got->output.hidden.back(), got->stats};
}

}  // namespace tessera::parallel::testing
