// Jobs carry data, never paths: links travel inline, a daemon finds a model
// by name under its roots only, every field is bounded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/io.h"
#include "runtime/daemon.h"
#include "runtime/in_process.h"
#include "runtime/job.h"

namespace tessera::runtime {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / ("job-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

TEST(JobTest, LinksAreSpecsOrInlineMatricesNeverFiles) {
  EXPECT_TRUE(job_links("", 2).ok());
  EXPECT_TRUE(job_links("500mbit,1ms", 3).ok());
  // A worker never opens what a job names: these are refused as specs.
  for (const char* path : {"@/etc/passwd", "/dev/zero", "@/dev/zero", "links.json"})
    EXPECT_FALSE(job_links(path, 2).ok()) << path;
  // The terminal inlines a matrix file it was given.
  const std::string dir = temp_dir("links"), file = dir + "/m.json";
  ASSERT_TRUE(core::write_file(file, R"({"bandwidth_bps": [[0, 1e8], [2e8, 0]], "latency_ms": [[0, 1], [1, 0]]})").ok());
  auto text = inline_link_arg(file, 2);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(text->front(), '{');
  auto m = job_links(*text, 2);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_DOUBLE_EQ(m->link(1, 0).bandwidth_bps, 2e8);
  EXPECT_EQ(inline_link_arg("500mbit,1ms", 2).value(), "500mbit,1ms");
  EXPECT_FALSE(inline_link_arg(dir + "/missing.json", 2).ok());
}

TEST(JobTest, ModelsResolveOnlyUnderTheWorkersRoots) {
  const std::string root = temp_dir("root"), outside = temp_dir("outside");
  fs::create_directories(root + "/bert");
  fs::create_directories(root + "/nested/gpt2");
  fs::create_directories(outside + "/secret");
  ASSERT_TRUE(core::write_file(root + "/bert/config.json", "{}").ok());
  ASSERT_TRUE(core::write_file(root + "/nested/gpt2/config.json", "{}").ok());
  ASSERT_TRUE(core::write_file(outside + "/secret/config.json", "{}").ok());
  fs::create_directory_symlink(outside + "/secret", root + "/escape");
  const std::vector<std::string> roots = {root};
  EXPECT_EQ(resolve_model("bert", roots).value(), fs::canonical(root + "/bert").string());
  EXPECT_TRUE(resolve_model("nested/gpt2", roots).ok());
  for (const std::string& bad : std::vector<std::string>{"../outside", "/etc", outside + "/secret", "bert/../../x", "escape", "missing", ""})
    EXPECT_FALSE(resolve_model(bad, roots).ok()) << bad;
  EXPECT_FALSE(resolve_model("bert", {}).ok());  // a daemon without --models serves nothing
}

// Rank 1's job of a two-device group running `strategy` on `model`.
JobSpec rank1_job(const std::string& model, const std::string& strategy) {
  JobSpec job;
  job.rank = 1;
  job.endpoints = {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"};
  job.model_dir = model;
  job.plan.strategy = strategy;
  job.plan.world = 2;
  return job;
}

TEST(JobTest, EveryFieldIsBounded) {
  JobSpec job = rank1_job("bert", "tp");
  ASSERT_TRUE(JobSpec::from_json(job.to_json().dump()).ok());
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json j = job.to_json();
    j[key] = std::move(value);
    return JobSpec::from_json(j.dump());
  };
  EXPECT_FALSE(with("timeout_ms", 24ll * 3600 * 1000 + 1).ok());
  EXPECT_FALSE(with("timeout_ms", 0).ok());
  EXPECT_FALSE(with("heartbeat_ms", 10).ok());
  EXPECT_FALSE(with("heartbeat_ms", 3600000).ok());
  EXPECT_FALSE(with("run_timeout_ms", -1).ok());
  EXPECT_FALSE(with("run_timeout_ms", "1").ok());
  EXPECT_FALSE(with("run_timeout_ms", 24ll * 3600 * 1000 + 1).ok());
  auto run_timeout = with("run_timeout_ms", 1000);  // serve's failover timeout travels with the job
  ASSERT_TRUE(run_timeout.ok());
  EXPECT_EQ(run_timeout->run_timeout_ms, 1000);
  EXPECT_FALSE(with("threads", 100000).ok());
  // A speed of 1e-12 would make the daemon idle for years after one kernel.
  EXPECT_FALSE(with("device_speed", 1e-12).ok());
  EXPECT_FALSE(with("device_speed", 0).ok());
  EXPECT_FALSE(with("device_speed", 1.5).ok());
  EXPECT_TRUE(with("device_speed", 0.01).ok());
  EXPECT_FALSE(with("rank", 2).ok());
  EXPECT_FALSE(with("rank", "1").ok());
  EXPECT_FALSE(with("link", std::string(70000, '1')).ok());
  EXPECT_FALSE(with("model", "").ok());
  EXPECT_FALSE(with("group_id", std::string(300, 'g')).ok());
  EXPECT_FALSE(with("endpoints", nlohmann::json::array()).ok());
  EXPECT_FALSE(with("plan", nlohmann::json{{"strategy", "tp"}, {"world", 3}}).ok());  // not the group's size
  EXPECT_FALSE(JobSpec::from_json("[1,2]").ok());
  EXPECT_FALSE(JobSpec::from_json(std::string(2 << 20, ' ')).ok());
}

// A pair's decode plan travels inside the job's plan: a key holder's
// malformed or impossible one is refused when the job is read or when its
// plan is completed, before anything is loaded.
TEST(JobTest, APairsDecodePlanIsCheckedLikeThePlan) {
  JobSpec job = rank1_job("gpt2-tiny", "voltage");
  const auto config = model::load_config(std::string(TESSERA_TEST_DATA) + "/gpt2-tiny").value();
  auto with_decode = [&](nlohmann::json decode) -> core::Status {
    nlohmann::json j = job.to_json();
    j["plan"]["decode"] = std::move(decode);
    auto parsed = JobSpec::from_json(j.dump());
    if (!parsed.ok()) return parsed.status();
    return parsed->completed_plan(config).status();
  };
  EXPECT_TRUE(with_decode({{"strategy", "single"}, {"world", 1}}).ok());
  EXPECT_TRUE(with_decode({{"strategy", "tp"}, {"world", 2}}).ok());  // its shards loaded beside Voltage's layers
  const nlohmann::json single = {{"strategy", "single"}, {"world", 1}};
  for (const nlohmann::json& bad : std::vector<nlohmann::json>{
           {{"strategy", "single"}, {"world", 0}},                        // out of range
           {{"strategy", "single"}, {"world", 2}},                        // single runs on one device
           {{"strategy", "tp"}, {"world", 3}},                            // not the prefill's devices
           {{"strategy", "galaxy"}, {"world", 2}},                        // takes no handover
           {{"strategy", "voltage"}, {"world", 2}},                       // does not decode
           {{"strategy", "nope"}, {"world", 1}},                          // unknown
           {{"strategy", "single"}, {"world", 1}, {"decode", single}},    // no nesting
           {{"strategy", "single"}, {"world", 1}, {"options", {{"x", 1}}}},  // options single does not take
           {{"strategy", "single"}, {"world", 1}, {"ratios", {1, 2}}},      // shares for another device count
           nlohmann::json(3), nlohmann::json::array()}) {
    const core::Status st = with_decode(bad);
    EXPECT_FALSE(st.ok()) << bad.dump();
    EXPECT_FALSE(st.message().empty()) << bad.dump();
  }
  job.plan.strategy = "tp";  // tp hands no K/V over
  EXPECT_FALSE(with_decode(single).ok());
}

}  // namespace
}  // namespace tessera::runtime

namespace tessera {
namespace {

// Audit item 3, the forward's side: a config may allow prompts whose
// workspace cannot be allocated; such a request is refused with the need and
// what is available, before any layer allocates (an allocation failure there
// would abort). A request that fits passes.
TEST(RequestMemoryTest, ActivationsBeyondAvailableMemoryAreRefusedUpFront) {
  const model::ModelConfig c =
      model::parse_config(R"({"model_type": "bert", "hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 16384,
          "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 1048576})")
          .value();
  parallel::Plan single;
  single.strategy = "single";
  ASSERT_TRUE(parallel::complete_plan(single, c).ok());
  const auto huge = runtime::check_request_memory(single, c, c.max_positions);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.code(), core::ErrorCode::kResourceExhausted);
  EXPECT_NE(huge.message().find("MiB are available"), std::string::npos) << huge.to_string();
  EXPECT_TRUE(runtime::check_request_memory(single, c, 8).ok());
}

}  // namespace
}  // namespace tessera
