// Decoupled models from the command line: run/--dump and generate on one
// device reproduce the reference fixtures, gen-model writes decoupled models,
// and `--strategy bp` with real worker processes equals the single device for
// every plan.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "cli_util.h"

namespace tessera {
namespace {

using testing::kData;
using testing::run;
using testing::tmp;

float max_diff(const core::Tensor& a, const core::Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  float m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) m = std::max(m, std::fabs(a.f32()[i] - b.f32()[i]));
  return m;
}

core::Tensor dumped(const std::string& path, const std::string& name) {
  return model::SafeTensorsFile::open(path).value().get(name).value();
}

std::string id_list(const core::Tensor& t) {
  std::string s;
  for (int64_t i = 0; i < t.numel(); ++i) s += (i ? "," : "") + std::to_string(t.i64()[i]);
  return s;
}

struct Fixture {
  const char* model;
  const char* input;
  bool bert;
};

TEST(BpProcessTest, EveryPlanEqualsTheSingleDeviceWithProcesses) {
  for (const Fixture& f : {Fixture{"bert-bp-tiny", "s7", true}, Fixture{"gpt2-bp-tiny", "s9", false}}) {
    const std::string dir = kData + "/" + f.model;
    auto cases = model::SafeTensorsFile::open(dir + "/cases.safetensors").value();
    std::string args = "--ids " + id_list(cases.get(std::string(f.input) + ".input_ids").value());
    if (f.bert) args += " --token-types " + id_list(cases.get(std::string(f.input) + ".token_type_ids").value());
    const std::string ref = tmp("ref.safetensors");
    auto r = run("run --model " + dir + " " + args + " --dump " + ref);
    ASSERT_EQ(r.code, 0) << r.err;
    // The single device reproduces the reference implementation.
    EXPECT_LT(max_diff(dumped(ref, "hidden.4"), cases.get(std::string(f.input) + ".hidden.4").value()), 1e-4f) << f.model;
    EXPECT_LT(max_diff(dumped(ref, "logits"), cases.get(std::string(f.input) + ".logits").value()), 1e-4f) << f.model;
    for (const char* plan : {"tp", "sp", "allgather"})
      for (const std::string& devices : {std::string("2 --partition 3,1"), std::string("3"), std::string("4")}) {
        const std::string got = tmp("got.safetensors");
        r = run("run --model " + dir + " " + args + " --strategy bp --bp-plan " + plan + " --devices " + devices + " --dump " + got);
        ASSERT_EQ(r.code, 0) << plan << " " << devices << ": " << r.err;
        EXPECT_LT(max_diff(dumped(ref, "hidden.4"), dumped(got, "hidden.4")), 1e-4f) << f.model << " " << plan << " " << devices;
        EXPECT_LT(max_diff(dumped(ref, "logits"), dumped(got, "logits")), 1e-4f) << f.model << " " << plan << " " << devices;
      }
  }
}

TEST(BpProcessTest, AutoPrintsEachPlansSumAndRunsTheChosenOne) {
  const std::string dir = kData + "/bert-bp-tiny";
  const std::string ref = tmp("ref.safetensors"), got = tmp("got.safetensors");
  ASSERT_EQ(run("run --model " + dir + " --ids 5,6,7,8,9,10,11,12 --dump " + ref).code, 0);
  auto r = run("run --model " + dir + " --ids 5,6,7,8,9,10,11,12 --strategy bp --devices 2 --link 100mbit --stats --dump " + got);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& options = j["plan"]["options"];
  ASSERT_TRUE(options.contains("auto_ms")) << r.out;
  for (const char* p : {"tp", "sp", "allgather"}) EXPECT_TRUE(options["auto_ms"][p].is_number()) << r.out;
  const std::string chosen = options["plan"].get<std::string>();
  for (const char* p : {"tp", "sp", "allgather"})
    EXPECT_LE(options["auto_ms"][chosen].get<double>(), options["auto_ms"][p].get<double>());
  EXPECT_LT(max_diff(dumped(ref, "hidden.4"), dumped(got, "hidden.4")), 1e-4f);
}

TEST(BpProcessTest, GenerateReproducesTheReferenceAndBpGenerationIsRefused) {
  const std::string dir = kData + "/gpt2-bp-tiny";
  auto cases = model::SafeTensorsFile::open(dir + "/cases.safetensors").value();
  const auto prompt = cases.get("generate.prompt").value(), want = cases.get("generate.output").value();
  auto r = run("generate --model " + dir + " --ids " + id_list(prompt) + " --greedy --max-new-tokens " +
               std::to_string(want.numel() - prompt.numel()));
  ASSERT_EQ(r.code, 0) << r.err;
  std::string tail;
  for (int64_t i = prompt.numel(); i < want.numel(); ++i) {
    if (!tail.empty()) tail += ",";
    tail += std::to_string(want.i64()[i]);
  }
  EXPECT_EQ(r.out, tail + "\n");
  r = run("run --model " + dir + " --ids 1,2,3 --strategy bp --devices 2 --generate 2 --greedy");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("strategy 'bp' cannot generate across devices"), std::string::npos) << r.err;
}

TEST(BpProcessTest, GenModelWritesDecoupledModels) {
  const std::string dir = tmp("gen-bp");
  auto r = run("gen-model --preset gpt2 --layers 4 --hidden 64 --heads 4 --vocab 512 --bp-div 4 --bp-original 1,3 --out " + dir);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string ref = tmp("ref.safetensors"), got = tmp("got.safetensors");
  ASSERT_EQ(run("run --model " + dir + " --ids 1,2,3,4,5 --dump " + ref).code, 0);
  for (const char* plan : {"tp", "sp", "allgather"}) {  // N = 4 over 3 devices: 2, 1, 1 sub-blocks
    r = run("run --model " + dir + " --ids 1,2,3,4,5 --strategy bp --bp-plan " + plan + " --devices 3 --dump " + got);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_LT(max_diff(dumped(ref, "hidden.4"), dumped(got, "hidden.4")), 1e-4f) << plan;
    EXPECT_LT(max_diff(dumped(ref, "logits"), dumped(got, "logits")), 1e-4f) << plan;
  }
  // One-line errors: N must divide h; original layers must exist; bp on an ordinary strategy.
  r = run("gen-model --preset gpt2 --layers 4 --hidden 64 --heads 4 --vocab 512 --bp-div 5 --out " + tmp("bad1"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("does not divide"), std::string::npos) << r.err;
  r = run("gen-model --preset gpt2 --layers 4 --hidden 64 --heads 4 --vocab 512 --bp-div 4 --bp-original 1,4 --out " + tmp("bad2"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("original layer 4 outside"), std::string::npos) << r.err;
  r = run("run --model " + dir + " --ids 1,2,3 --strategy tp --devices 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("decoupled"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessera
