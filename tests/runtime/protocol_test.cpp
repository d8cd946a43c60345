// The typed worker protocol (runtime/protocol.h): the op values and names
// are the wire format and are pinned here; every message round-trips; a
// message with a wrong field, an unknown op or an op of the other direction
// is refused with a Status, never an exception.
#include "runtime/protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera::runtime {
namespace {

using nlohmann::json;

TEST(ProtocolTest, OpValuesAndNamesArePinned) {
  const std::vector<std::pair<Op, std::string>> pinned = {
      {Op::kReady, "ready"}, {Op::kError, "error"}, {Op::kDone, "done"},         {Op::kRun, "run"},  {Op::kStop, "stop"},
      {Op::kPing, "ping"},   {Op::kGenerate, "generate"}, {Op::kDecode, "decode"}, {Op::kEnd, "end"},
      {Op::kStep, "step"}};
  ASSERT_EQ(static_cast<int>(pinned.size()), kOpCount);
  for (size_t i = 0; i < pinned.size(); ++i) {
    EXPECT_EQ(static_cast<int>(pinned[i].first), static_cast<int>(i));
    EXPECT_EQ(op_name(pinned[i].first), pinned[i].second);
    EXPECT_EQ(op_from_name(pinned[i].second), pinned[i].first);
  }
  EXPECT_FALSE(op_from_name("RUN").has_value());
  EXPECT_FALSE(op_from_name("").has_value());
}

TEST(ProtocolTest, EveryMessageRoundTrips) {
  const std::vector<ToWorker> to_worker = {msg::Run{7}, msg::Stop{}, msg::Ping{}, msg::Generate{64}, msg::Decode{3, 60},
                                           msg::End{}, msg::Generate{64, true, 0, false},
                                           msg::Generate{64, false, msg::kMaxSlots - 1, true},
                                           msg::Step{{0, 5, msg::kMaxSlots - 1}, {12, 0, 100}, {}},
                                           msg::Step{{0, 5, 7}, {12, 0, 100}, {2, 0, 1}}};
  for (const ToWorker& m : to_worker) {
    const json j = to_json(m);
    EXPECT_EQ(j["op"], op_name(op_of(m)));
    auto back = to_worker_from_json(j);
    ASSERT_TRUE(back.ok()) << j.dump() << ": " << back.status().to_string();
    EXPECT_EQ(to_json(*back), j);
  }
  const std::vector<ToTerminal> to_terminal = {msg::Ready{1234, 5.5}, msg::Error{"no weights"},
                                               msg::Done{json{{"rank", 2}, {"compute_ms", 1.5}, {"bytes_sent_by_kind", {{"allgather", 10}}}}}};
  for (const ToTerminal& m : to_terminal) {
    const json j = to_json(m);
    auto back = to_terminal_from_json(j);
    ASSERT_TRUE(back.ok()) << j.dump() << ": " << back.status().to_string();
    EXPECT_EQ(to_json(*back), j);
  }
}

TEST(ProtocolTest, BadMessagesAreRefused) {
  const std::vector<std::string> to_worker_bad = {
      R"([1])",                               // not an object
      R"({})",                                // no op
      R"({"op": 3})",                         // op not a string
      R"({"op": "jump"})",                    // unknown op
      R"({"op": "ready", "weight_bytes": 1, "load_ms": 1})",  // the other direction
      R"({"op": "run"})",                     // missing n
      R"({"op": "run", "n": 0})",             // no rows
      R"({"op": "run", "n": "5"})",           // wrong type
      R"({"op": "run", "n": 1e300})",         // absurd
      R"({"op": "decode", "n": 1, "pos": -1})",
      R"({"op": "generate", "positions": 0})",
      R"({"op": "generate", "positions": 8, "slot": 32})",   // past the slots (msg::kMaxSlots)
      R"({"op": "generate", "positions": 8, "slot": -2})",
      R"({"op": "generate", "positions": 8, "slot": 0, "reuse": 1})",  // not a bool
      R"({"op": "generate", "positions": 8, "reuse": true})",  // reuse of no slot
      R"({"op": "step"})",                                      // no rows
      R"({"op": "step", "slots": [], "pos": []})",
      R"({"op": "step", "slots": [0, 1], "pos": [3]})",         // unequal
      R"({"op": "step", "slots": [1, 1], "pos": [3, 4]})",      // a slot twice
      R"({"op": "step", "slots": [32], "pos": [3]})",           // past the slots
      R"({"op": "step", "slots": [0], "pos": [-1]})",
      R"({"op": "step", "slots": [0], "pos": [1.5]})",
      R"({"op": "step", "slots": [0, 1], "pos": [3, 4], "groups": [2]})",       // one group: not overlapped
      R"({"op": "step", "slots": [0, 1], "pos": [3, 4], "groups": [1, 0]})",    // groups of fewer rows than slots
      R"({"op": "step", "slots": [0, 1], "pos": [3, 4], "groups": [3, -1]})",
      R"({"op": "step", "slots": [0, 1], "pos": [3, 4], "groups": [1, 1.0]})",
      R"({"op": "step", "slots": [0, 1], "pos": [3, 4], "groups": {"a": 1}})",
      R"({"op": "step", "slots": "0", "pos": [1]})",
      R"({"op": "step", "slots": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,0], "pos": [0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]})",
  };
  for (const std::string& text : to_worker_bad) {
    const json j = json::parse(text);
    EXPECT_FALSE(to_worker_from_json(j).ok()) << text;
  }
  const std::vector<std::string> to_terminal_bad = {
      R"({"op": "run", "n": 1})",                             // the other direction
      R"({"op": "ready", "weight_bytes": -1, "load_ms": 1})",  // negative
      R"({"op": "ready", "weight_bytes": 1})",                 // missing load_ms
      R"({"op": "done", "rank": "1"})",                        // a figure that is not a number
      R"({"op": "done", "rank": 1, "x": {"y": [1]}})",         // nested deeper than one object of numbers
  };
  for (const std::string& text : to_terminal_bad) {
    const json j = json::parse(text);
    EXPECT_FALSE(to_terminal_from_json(j).ok()) << text;
  }
}

TEST(ProtocolTest, ControlRequestsParseToTheirType) {
  auto ping = parse_control_request(kPingRequest);
  ASSERT_TRUE(ping.ok());
  EXPECT_TRUE(std::holds_alternative<PingRequest>(*ping));

  ProfileJob p;
  p.part = ProfileJob::Part::kDevice;
  p.model = "bert";
  auto profile = parse_control_request(to_text(ControlRequest{p}));
  ASSERT_TRUE(profile.ok()) << profile.status().to_string();
  ASSERT_TRUE(std::holds_alternative<ProfileJob>(*profile));
  EXPECT_EQ(std::get<ProfileJob>(*profile).model, "bert");

  JobSpec job;
  job.rank = 1;
  job.endpoints = {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"};
  job.model_dir = "gpt2";
  job.plan.strategy = "tp";
  job.plan.world = 2;
  auto parsed = parse_control_request(to_text(ControlRequest{job}));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  ASSERT_TRUE(std::holds_alternative<JobSpec>(*parsed));
  EXPECT_EQ(std::get<JobSpec>(*parsed).to_json(), job.to_json());

  for (const char* bad : {"", "not json", "[]", R"({"ping": true, "x": 1})", R"({"profile": 3})", R"({"rank": 1})"})
    EXPECT_FALSE(parse_control_request(bad).ok()) << bad;
  EXPECT_FALSE(parse_control_request(std::string(2 << 20, ' ')).ok());
}

TEST(ProtocolTest, DaemonAnswers) {
  EXPECT_TRUE(daemon_answer("ep", ok_answer().dump(), "x").ok());
  const auto refused = daemon_answer("tcp://h:1", refusal("no such model").dump(), "take the job");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), core::ErrorCode::kNetwork);
  EXPECT_NE(refused.status().message().find("no such model"), std::string::npos);
  EXPECT_FALSE(daemon_answer("ep", "garbage", "x").ok());
}

}  // namespace
}  // namespace tessera::runtime
