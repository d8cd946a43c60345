// Session::generate with worker processes (this binary is its own worker, as
// in custom_strategy_test): every strategy that decodes (the registry's
// Strategy::decodes) equals the single device token for token on every
// device count its plan accepts (up to a near-tie of the reference); the
// others refuse generation clearly and still run forwards. Seeded sampling
// equals, one long-lived session serves several requests and run()s in
// between, and heartbeats go on while the caller holds a token.
#include <gtest/gtest.h>

#include "worker_main.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "../parallel/generate_check.h"
#include "model/config.h"
#include "parallel/strategy.h"
#include "runtime/deployment.h"
#include "runtime/session.h"

namespace tessera {
namespace {

using parallel::testing::compare;
using parallel::testing::gpt2_12l;
using parallel::testing::margins;

// Whether the registry's strategy `name` takes a plan for `world` devices of
// the model with config `c`.
bool plan_completes(const std::string& name, int world, const model::ModelConfig& c) {
  parallel::Plan plan;
  plan.strategy = name;
  plan.world = world;
  return parallel::complete_plan(plan, c).ok();
}

std::unique_ptr<runtime::Session> start(const std::string& dir, const std::string& strategy, int k) {
  runtime::SessionOptions o;
  o.model_dir = dir;
  o.plan.strategy = strategy;
  o.plan.world = k;
  o.timeout_ms = 30000;
  auto s = runtime::Session::start(o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(SessionGenerateTest, ProcessesEqualTheSingleDeviceOverRepeatedRequests) {
  const std::string dir = gpt2_12l();
  auto m = model::Transformer::load(dir).value();
  model::GenerateOptions greedy;
  greedy.max_new_tokens = 16;
  greedy.eos_token_id = -1;
  model::GenerateOptions sampled = greedy;
  sampled.greedy = false;
  sampled.seed = 99;
  sampled.top_k = 50;
  sampled.temperature = 0.7f;
  const std::vector<std::vector<int64_t>> prompts = {{3, 1, 4, 1, 5, 9, 2, 6}, {42}};
  int near_ties = 0, runs = 0;
  std::vector<std::string> tested;
  for (const parallel::Strategy* strategy : parallel::strategies()) {
    if (!strategy->decodes()) continue;
    const std::string s = strategy->name();
    bool across_devices = false;
    for (int k = 2; k <= 4; ++k) {
      if (!plan_completes(s, k, m.config())) continue;
      across_devices = true;
      auto session = start(dir, s, k);
      ASSERT_NE(session, nullptr);
      for (const auto& prompt : prompts) {  // caches reset per request
        const auto want = model::generate(m, prompt, greedy, nullptr).value();
        auto got = session->generate(prompt, greedy);
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        const auto r = compare(want, *got, margins(m, want, prompt.size()), prompt.size(),
                               s + " K=" + std::to_string(k));
        near_ties += r.near_tie ? 1 : 0;
        ++runs;
        EXPECT_EQ(session->last_stats()["decode_steps"], static_cast<int64_t>(got->size() - prompt.size()) - 1);
        EXPECT_EQ(session->last_stats()["ranks"].size(), static_cast<size_t>(k));
      }
      const auto want = model::generate(m, prompts[0], sampled, nullptr).value();
      std::vector<int64_t> streamed;
      model::GenerateOptions so = sampled;
      so.on_token = [&](int64_t t) { streamed.push_back(t); };
      auto got = session->generate(prompts[0], so);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_EQ(*got, want) << s << " K=" << k;
      EXPECT_EQ(streamed, std::vector<int64_t>(want.begin() + 8, want.end()));
      // A forward on the same session after generations.
      runtime::RunRequest req;
      req.ids = prompts[0];
      auto fwd = session->run(req);
      ASSERT_TRUE(fwd.ok()) << fwd.status().to_string();
      const auto single = m.forward({prompts[0], {}, {}}, {}, nullptr).value();
      EXPECT_LT(parallel::testing::max_diff(fwd->output.logits, single.logits), 1e-3f);
    }
    // Only a one-device strategy decodes on none of 2..4 devices.
    if (across_devices) tested.push_back(s);
    else EXPECT_TRUE(plan_completes(s, 1, m.config())) << s << " decodes, but its plan takes no device count";
  }
  ASSERT_FALSE(tested.empty()) << "no strategy decodes across devices";
  std::cout << "decoded across devices:";
  for (const auto& s : tested) std::cout << " " << s;
  std::cout << "\nnear-ties (top-2 margin < 1e-4, rest not compared): " << near_ties << " of " << runs << " runs\n";
}

// The prefix cache (SessionOptions::prefix_slots): a prompt that starts
// with an earlier generation's tokens (a chat's next turn) prefills only the
// rest, in that generation's caches on every rank, and gives the tokens the
// single device gives without any cache. gpt2-copy is trained, so its
// greedy tokens are not a degenerate repeat.
TEST(SessionGenerateTest, PrefixCacheGivesTheSameTokensAndPrefillsOnlyTheRest) {
  const std::string dir = std::string(TESSERA_TEST_DATA) + "/gpt2-copy";
  auto m = model::Transformer::load(dir).value();
  model::GenerateOptions greedy;
  greedy.max_new_tokens = 8;
  greedy.eos_token_id = -1;
  int sessions = 0;
  // Each decoding strategy on 1 and 2 devices, and the pairs (Voltage's or
  // SP's prefill, the terminal's decode): a reused prefix is the decode
  // layout's chunk, the workers idle.
  std::vector<parallel::Plan> plans;
  for (const parallel::Strategy* strategy : parallel::strategies())
    for (int k = 1; k <= 2; ++k)
      if (strategy->decodes() && plan_completes(strategy->name(), k, m.config())) {
        parallel::Plan p;
        p.strategy = strategy->name();
        p.world = k;
        plans.push_back(p);
      }
  for (const char* prefill : {"voltage", "sp"}) {
    parallel::Plan p, d;
    p.strategy = prefill;
    p.world = 2;
    d.strategy = "single";
    d.world = 1;
    p.decode = std::make_shared<const parallel::Plan>(d);
    plans.push_back(p);
  }
  for (const parallel::Plan& plan : plans) {
    {
      const std::string label = plan.to_json().dump();
      runtime::SessionOptions o;
      o.model_dir = dir;
      o.plan = plan;
      o.timeout_ms = 30000;
      o.prefix_slots = 2;
      auto started = runtime::Session::start(o);
      ASSERT_TRUE(started.ok()) << label << ": " << started.status().to_string();
      runtime::Session& session = **started;
      ++sessions;
      // Each prompt, the prefix the cache should hold for it, and the result.
      auto turn = [&](const std::vector<int64_t>& prompt, int64_t cached) {
        const auto want = model::generate(m, prompt, greedy, nullptr).value();
        auto got = session.generate(prompt, greedy);
        EXPECT_TRUE(got.ok()) << label << ": " << got.status().to_string();
        if (!got.ok()) return std::vector<int64_t>();
        compare(want, *got, margins(m, want, prompt.size()), prompt.size(), label);
        EXPECT_EQ(session.last_stats()["prefix_cached_tokens"].get<int64_t>(), cached) << label;
        return *got;
      };
      std::vector<int64_t> p1;
      for (int i = 0; i < 24; ++i) p1.push_back(1 + (i * 7) % 60);
      const auto g1 = turn(p1, 0);
      ASSERT_EQ(g1.size(), p1.size() + 8) << label;
      // The next turn: all of g1 but its last token were computed.
      auto p2 = g1;
      p2.insert(p2.end(), {5, 6, 7});
      turn(p2, static_cast<int64_t>(g1.size()) - 1);
      // A prompt that leaves the cached tokens at position 10.
      std::vector<int64_t> p3(p1.begin(), p1.begin() + 10);
      p3.insert(p3.end(), {61, 62, 63, 2, 3});
      const auto g3 = turn(p3, 10);
      // Nothing in common: the other slot, started afresh.
      const auto g4 = turn({63, 1, 2, 3}, 0);
      // Both slots still hold their tokens.
      auto p5 = g3;
      p5.push_back(9);
      turn(p5, static_cast<int64_t>(g3.size()) - 1);
      auto p6 = g4;
      p6.push_back(9);
      turn(p6, static_cast<int64_t>(g4.size()) - 1);
      // A prompt that is a cached sequence itself still computes its last row.
      turn(std::vector<int64_t>(g4.begin(), g4.end() - 1), static_cast<int64_t>(g4.size()) - 2);
    }
  }
  EXPECT_GE(sessions, 5);  // single, tp, galaxy, pipeline on 2, and the pairs
}

// The plans a session test runs: each (strategy, devices), then Voltage's
// prefill on 2 devices with each (decode strategy, devices).
std::vector<parallel::Plan> session_plans(const std::vector<std::pair<std::string, int>>& plain,
                                          const std::vector<std::pair<std::string, int>>& voltage_decodes) {
  std::vector<parallel::Plan> plans;
  for (const auto& [s, k] : plain) {
    parallel::Plan p;
    p.strategy = s;
    p.world = k;
    plans.push_back(p);
  }
  for (const auto& [s, k] : voltage_decodes) {
    parallel::Plan pair, d;
    pair.strategy = "voltage";
    pair.world = 2;
    d.strategy = s;
    d.world = k;
    pair.decode = std::make_shared<const parallel::Plan>(d);
    plans.push_back(pair);
  }
  return plans;
}

// Continuous batching (SessionOptions::max_batch) with worker processes:
// four concurrent generate() calls, greedy and seeded, with prompts of
// different lengths (so their rows sit at different positions), each give
// the tokens one device gives alone. Every call holds its first token until
// all four have one, so that their steps meet in batches; every decode row
// is in exactly one step, and no step is over max_batch.
TEST(SessionGenerateTest, BatchedCallsEachGetTheirOwnTokens) {
  const std::string dir = gpt2_12l();
  auto m = model::Transformer::load(dir).value();
  const std::vector<std::vector<int64_t>> prompts = {{3, 1, 4, 1, 5, 9, 2, 6}, {42}, {7, 7, 8, 100, 3}, {250, 1, 2}};
  std::vector<model::GenerateOptions> opts(prompts.size());
  for (size_t i = 0; i < opts.size(); ++i) {
    opts[i].max_new_tokens = 10 + static_cast<int64_t>(i);
    opts[i].eos_token_id = -1;
    if (i % 2 == 1) {
      opts[i].greedy = false;
      opts[i].seed = 7 + i;
      opts[i].top_k = 40;
    }
  }
  // The pairs: Voltage's prefill, the terminal's decode or TP's on both (its
  // shards loaded beside Voltage's layers).
  const std::vector<parallel::Plan> plans =
      session_plans({{"single", 1}, {"tp", 2}, {"tp", 3}, {"pipeline", 2}}, {{"single", 1}, {"tp", 2}});
  for (const parallel::Plan& plan : plans) {
    const std::string label = plan.to_json().dump();
    std::mutex mu;
    std::vector<int> steps;  // rows of each batched step
    runtime::SessionOptions o;
    o.model_dir = dir;
    o.plan = plan;
    o.timeout_ms = 30000;
    o.max_batch = 3;  // four calls: one waits for a slot
    o.prefix_slots = 2;  // the slots are the prefix cache's too
    o.on_batch_step = [&](int rows) {
      std::lock_guard<std::mutex> l(mu);
      steps.push_back(rows);
    };
    auto started = runtime::Session::start(o);
    ASSERT_TRUE(started.ok()) << label << ": " << started.status().to_string();
    runtime::Session& session = **started;
    std::condition_variable cv;
    size_t first_tokens = 0;
    std::vector<core::Result<std::vector<int64_t>>> got(prompts.size(), core::internal_error("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i)
      threads.emplace_back([&, i] {
        model::GenerateOptions go = opts[i];
        bool first = true;
        go.on_token = [&](int64_t) {
          if (!first) return;
          first = false;
          std::unique_lock<std::mutex> l(mu);
          // The first three meet; the fourth has no slot until one ends.
          if (++first_tokens <= 3) cv.notify_all();
          cv.wait(l, [&] { return first_tokens >= 3; });
        };
        got[i] = session.generate(prompts[i], go);
      });
    for (auto& t : threads) t.join();
    int64_t rows = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << label << ": " << got[i].status().to_string();
      const auto want = model::generate(m, prompts[i], opts[i], nullptr).value();
      if (opts[i].greedy)
        compare(want, *got[i], margins(m, want, prompts[i].size()), prompts[i].size(), label + " call " + std::to_string(i));
      else
        EXPECT_EQ(*got[i], want) << label << " call " << i;
      rows += static_cast<int64_t>(got[i]->size() - prompts[i].size()) - 1;  // the first token is the prefill's
    }
    EXPECT_EQ(std::accumulate(steps.begin(), steps.end(), int64_t{0}), rows) << label;
    EXPECT_LE(*std::max_element(steps.begin(), steps.end()), 3) << label;
    std::cout << label << ": " << steps.size() << " batched steps for " << rows << " rows\n";
    // The prefix cache in the batch's slots: a call that continues the
    // last one's tokens prefills only its new token.
    auto a = session.generate(prompts[0], opts[0]);
    ASSERT_TRUE(a.ok()) << label << ": " << a.status().to_string();
    std::vector<int64_t> next = *a;
    next.push_back(5);
    int64_t cached = -1;
    auto b = session.generate(next, opts[0], &cached);
    ASSERT_TRUE(b.ok()) << label << ": " << b.status().to_string();
    EXPECT_EQ(cached, static_cast<int64_t>(a->size()) - 1) << label;
    const auto want = model::generate(m, next, opts[0], nullptr).value();
    compare(want, *b, margins(m, want, next.size()), next.size(), label + " after a cached prefix");
  }
}

// A prompt longer than SessionOptions::prefill_chunk is prefilled in chunks,
// while another sequence decodes: both get the single device's tokens, every
// decode row is in a batched step, and a pair's prefill stays whole.
TEST(SessionGenerateTest, LongPromptsArePrefilledInChunksWhileOthersDecode) {
  const std::string dir = gpt2_12l();
  auto m = model::Transformer::load(dir).value();
  const std::vector<int64_t> short_prompt = {42}, long_prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  model::GenerateOptions go;
  go.max_new_tokens = 12;
  go.eos_token_id = -1;
  const std::vector<parallel::Plan> plans = session_plans({{"single", 1}, {"tp", 2}, {"pipeline", 2}}, {{"single", 1}});
  for (const parallel::Plan& plan : plans) {
    const std::string label = plan.to_json().dump();
    std::mutex mu;
    int64_t step_rows = 0;
    runtime::SessionOptions o;
    o.model_dir = dir;
    o.plan = plan;
    o.timeout_ms = 30000;
    o.max_batch = 2;
    o.prefill_chunk = 3;
    o.on_batch_step = [&](int rows) {
      std::lock_guard<std::mutex> l(mu);
      step_rows += rows;
    };
    auto started = runtime::Session::start(o);
    ASSERT_TRUE(started.ok()) << label << ": " << started.status().to_string();
    runtime::Session& session = **started;
    std::condition_variable cv;
    bool decoding = false;
    core::Result<std::vector<int64_t>> a = core::internal_error("not run"), b = a;
    std::thread ta([&] {
      model::GenerateOptions ga = go;
      ga.on_token = [&](int64_t) {
        std::lock_guard<std::mutex> l(mu);
        decoding = true;
        cv.notify_all();
      };
      a = session.generate(short_prompt, ga);
    });
    std::thread tb([&] {  // the long prompt arrives while the short one decodes
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return decoding; });
      }
      b = session.generate(long_prompt, go);
    });
    ta.join();
    tb.join();
    ASSERT_TRUE(a.ok()) << label << ": " << a.status().to_string();
    ASSERT_TRUE(b.ok()) << label << ": " << b.status().to_string();
    for (const auto& [got, prompt] : {std::pair{&a, &short_prompt}, std::pair{&b, &long_prompt}}) {
      const auto want = model::generate(m, *prompt, go, nullptr).value();
      compare(want, **got, margins(m, want, prompt->size()), prompt->size(), label);
    }
    EXPECT_EQ(step_rows, 2 * (go.max_new_tokens - 1)) << label;  // the first token is each prefill's
    // The long prompt's prefill was the last: 11 rows in chunks of 3.
    EXPECT_EQ(session.last_stats().value("prefill_chunks", 0), plan.decode ? 1 : 4) << label;
  }
}

// A generation whose stop_requested turns true during a chunked prefill (a
// client gone, a deadline passed) ends after that chunk, with no token; the
// slot it held then serves the next call as if nothing had happened.
TEST(SessionGenerateTest, AChunkedPrefillStopsBetweenChunksWhenAsked) {
  const std::string dir = gpt2_12l();
  auto m = model::Transformer::load(dir).value();
  const std::vector<int64_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  model::GenerateOptions go;
  go.max_new_tokens = 4;
  go.eos_token_id = -1;
  for (const parallel::Plan& plan : session_plans({{"single", 1}, {"tp", 2}, {"pipeline", 2}}, {})) {
    const std::string label = plan.to_json().dump();
    runtime::SessionOptions o;
    o.model_dir = dir;
    o.plan = plan;
    o.timeout_ms = 30000;
    o.max_batch = 2;
    o.prefill_chunk = 3;
    o.prefix_slots = 2;  // the chunks done before the stop stay as a cached prefix
    auto started = runtime::Session::start(o);
    ASSERT_TRUE(started.ok()) << label << ": " << started.status().to_string();
    runtime::Session& session = **started;
    int asked = 0;
    model::GenerateOptions gone = go;
    gone.stop_requested = [&] { return ++asked >= 2; };  // true before the third chunk
    gone.on_token = [&](int64_t) { ADD_FAILURE() << label << ": a token after the stop"; };
    auto cut = session.generate(prompt, gone);
    ASSERT_TRUE(cut.ok()) << label << ": " << cut.status().to_string();
    EXPECT_EQ(*cut, prompt) << label;
    EXPECT_EQ(asked, 2) << label;
    EXPECT_EQ(session.last_stats().value("prefill_chunks", 0), 2) << label;
    auto whole = session.generate(prompt, go);
    ASSERT_TRUE(whole.ok()) << label << ": " << whole.status().to_string();
    EXPECT_EQ(session.last_stats().value("prefix_cached_tokens", -1), 6) << label;  // the two chunks done
    const auto want = model::generate(m, prompt, go, nullptr).value();
    compare(want, *whole, margins(m, want, prompt.size()), prompt.size(), label);
  }
}

// serve starts a failover's session on a request's thread, which ends with
// its connection: the workers must outlive that thread (a child's
// PR_SET_PDEATHSIG fires when the thread that forked it ends).
TEST(SessionGenerateTest, WorkersOutliveTheThreadThatStartedTheSession) {
  const std::string dir = gpt2_12l();
  std::unique_ptr<runtime::Session> session;
  std::thread([&] { session = start(dir, "tp", 3); }).join();
  ASSERT_NE(session, nullptr);
  model::GenerateOptions o;
  o.max_new_tokens = 4;
  o.eos_token_id = -1;
  // Long enough for a killed worker's loss to be seen: its heartbeats stop,
  // and the group notices a closed connection within its loss grace.
  for (int round = 0; round < 3; ++round) {
    auto got = session->generate({1, 2, 3}, o);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, model::generate(model::Transformer::load(dir).value(), {1, 2, 3}, o, nullptr).value());
  }
  EXPECT_TRUE(session->lost_workers().empty());
}

TEST(SessionGenerateTest, HeartbeatsGoOnWhileTheCallerHoldsAToken) {
  const std::string dir = gpt2_12l();
  auto session = start(dir, "tp", 2);
  ASSERT_NE(session, nullptr);
  model::GenerateOptions o;
  o.max_new_tokens = 3;
  o.eos_token_id = -1;
  bool slept = false;
  // Longer than a worker waits without hearing from the terminal
  // (heartbeat_ms * kMissedHeartbeats).
  const auto pause = std::chrono::milliseconds(runtime::JobSpec{}.heartbeat_ms * runtime::JobSpec::kMissedHeartbeats + 1000);
  o.on_token = [&](int64_t) {
    if (!slept) std::this_thread::sleep_for(pause);
    slept = true;
  };
  auto got = session->generate({1, 2, 3}, o);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  auto m = model::Transformer::load(dir).value();
  o.on_token = nullptr;
  EXPECT_EQ(got->size(), 6u);
  EXPECT_EQ(*got, model::generate(m, {1, 2, 3}, o, nullptr).value());
}

// This process's worker children (`worker-job` in their command line).
std::vector<pid_t> worker_children() {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) continue;
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    char state = 0;
    pid_t ppid = 0;
    if (!(rest >> state >> ppid) || ppid != ::getpid()) continue;
    std::ifstream cmd(e.path() / "cmdline");
    const std::string args((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (args.find("worker-job") != std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

TEST(SessionGenerateTest, AWorkerKilledMidGenerationIsAnErrorNotAHang) {
  auto session = start(gpt2_12l(), "pipeline", 2);
  ASSERT_NE(session, nullptr);
  const auto workers = worker_children();
  ASSERT_EQ(workers.size(), 1u);
  model::GenerateOptions o;
  o.max_new_tokens = 20;
  o.eos_token_id = -1;
  int seen = 0;
  o.on_token = [&](int64_t) {
    if (++seen == 3) ::kill(workers[0], SIGKILL);
  };
  auto got = session->generate({1, 2, 3}, o);
  EXPECT_FALSE(got.ok());
  EXPECT_EQ(seen, 3);
}

TEST(SessionGenerateTest, AStrategyWithoutADecoderIsAClearError) {
  // Every strategy that does not decode, where its plan takes two devices of
  // this model: generation is refused with a clear error, forwards still run.
  const std::string dir = parallel::testing::kData + "/gpt2-tiny";
  const model::ModelConfig config = model::load_config(dir).value();
  int tested = 0;
  for (const parallel::Strategy* strategy : parallel::strategies()) {
    if (strategy->decodes() || !plan_completes(strategy->name(), 2, config)) continue;
    ++tested;
    auto session = start(dir, strategy->name(), 2);
    ASSERT_NE(session, nullptr) << strategy->name();
    model::GenerateOptions o;
    auto got = session->generate({1, 2, 3}, o);
    ASSERT_FALSE(got.ok()) << strategy->name();
    EXPECT_NE(got.status().to_string().find("cannot generate across devices"), std::string::npos)
        << strategy->name() << ": " << got.status().to_string();
    runtime::RunRequest req;  // the session still serves forwards
    req.ids = {1, 2, 3};
    EXPECT_TRUE(session->run(req).ok()) << strategy->name();
    std::cout << strategy->name() << " refuses generation\n";
  }
  EXPECT_GT(tested, 0) << "every strategy decodes: nothing to refuse";
}

// Each prefix-cache slot is a whole set of KV caches on every rank, so the
// budget check counts them all: budgets that hold the weights and one set
// of caches start a one-slot session and refuse an eight-slot one, naming
// the device and its need.
TEST(SessionGenerateTest, PrefixCacheSlotsCountAgainstTheMemoryBudgets) {
  const std::string dir = std::string(TESSERA_TEST_DATA) + "/gpt2-copy";
  const model::ModelConfig c = model::load_config(dir).value();
  runtime::SessionOptions o;
  o.model_dir = dir;
  o.plan.strategy = "tp";
  o.plan.world = 2;
  o.timeout_ms = 30000;
  o.budget_ctx = c.max_positions;
  parallel::Plan plan = o.plan;
  ASSERT_TRUE(parallel::complete_plan(plan, c).ok());
  const auto one_set = runtime::predicted_memory(plan, c, c.max_rows(), o.budget_ctx, core::DType::kF32).value();
  int64_t kv = 0;
  for (int r = 0; r < 2; ++r) kv = std::max(kv, parallel::kv_cache_bytes(plan, c, r, o.budget_ctx, core::DType::kF32));
  ASSERT_GT(kv, 0);
  // Room for the weights, one set of caches and half of another.
  for (const int64_t need : one_set) o.memory_limits.push_back(need + kv / 2);
  o.prefix_slots = 8;
  auto eight = runtime::Session::start(o);
  ASSERT_FALSE(eight.ok());
  EXPECT_NE(eight.status().message().find("budget"), std::string::npos) << eight.status().to_string();
  o.prefix_slots = 1;
  auto one = runtime::Session::start(o);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  model::GenerateOptions greedy;
  greedy.max_new_tokens = 4;
  greedy.eos_token_id = -1;
  EXPECT_TRUE((*one)->generate({1, 2, 3, 4}, greedy).ok());
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::runtime::testing::main_with_workers(argc, argv);  // also a worker process of the tests above
}
