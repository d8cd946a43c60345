// The worker protocol, typed. Two channels:
//  - in a job's group, the terminal (rank 0) and each worker exchange the
//    messages below (ToWorker on one tag, ToTerminal on the other);
//  - on a daemon's control channel, a terminal sends a ControlRequest (a
//    ping, a profile request or a job) and the daemon answers {"ok": ...}.
// Every message is built from JSON that came from another process, so every
// field is checked on the way in (types and bounds); the receiver then
// checks what only it knows (rows against its model, ranks against its group).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "comm/group.h"
#include "core/status.h"
#include "runtime/cluster_profile.h"
#include "runtime/job.h"

namespace tessera::runtime {

// One dispatch per message kind: an overload set for std::visit, so that a
// message added to a variant does not compile until each side handles it.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// The op of every group message. The values and names are the wire format:
// ProtocolTest pins them, so a change here is a protocol change.
enum class Op : int {
  kReady = 0,     // worker: loaded its part
  kError = 1,     // worker: could not load
  kDone = 2,      // worker: a run or a generation ended; its figures
  kRun = 3,       // terminal: run the layers on n rows
  kStop = 4,      // terminal: the session ends
  kPing = 5,      // terminal: still here (heartbeat)
  kGenerate = 6,  // terminal: a generation of `positions` positions starts
  kDecode = 7,    // terminal: one chunk of n rows at position pos
  kEnd = 8,       // terminal: the generation ended
  kStep = 9,      // terminal: one batched decode step of several slots' sequences
};
inline constexpr int kOpCount = 10;
const char* op_name(Op op);
std::optional<Op> op_from_name(std::string_view name);

namespace msg {
// Terminal -> worker.
struct Run { int64_t n = 0; };
struct Stop {};
struct Ping {};
// The prefix cache (serve --prefix-cache-mb): slot >= 0 keeps the
// generation's decoder in that slot after "end"; reuse continues the slot's
// caches (the terminal decides which positions are still valid) rather than
// making new ones.
constexpr int64_t kMaxPrefixSlots = 8;
// Slots in all: the prefix cache's, or a batch's sequences (serve
// --max-batch: every sequence of a batch keeps its caches in a slot).
constexpr int64_t kMaxSlots = 32;
struct Generate {
  int64_t positions = 0;
  bool kv_f16 = false;  // F16 KV caches (--kv-type f16)
  int64_t slot = -1;    // -1: no prefix cache
  bool reuse = false;
};
struct Decode { int64_t n = 0, pos = 0; };
struct End {};
// Continuous batching: one decode row of each slot's sequence, slots[i] at
// position pos[i] (parallel::step_rows). Each slot holds a generation's
// decoder ("generate" with the slot, its prefill, then "end"); the slots
// are distinct, 1..kMaxSlots of them. With `groups` (2..kMaxDevices row
// counts that add up to the slots), one call of overlapped steps
// (parallel::step_stages): the slots in order, group g at stage g.
struct Step {
  std::vector<int64_t> slots, pos;
  std::vector<int64_t> groups;
};
// Worker -> terminal.
struct Ready { int64_t weight_bytes = 0; double load_ms = 0; };
struct Error { std::string message; };
// A rank's figures (session stats): every value a number, or an object of
// numbers, so that printing or summing them cannot throw.
struct Done { nlohmann::json figures = nlohmann::json::object(); };
}  // namespace msg

using ToWorker = std::variant<msg::Run, msg::Stop, msg::Ping, msg::Generate, msg::Decode, msg::End, msg::Step>;
using ToTerminal = std::variant<msg::Ready, msg::Error, msg::Done>;

Op op_of(const ToWorker& m);
Op op_of(const ToTerminal& m);
nlohmann::json to_json(const ToWorker& m);
nlohmann::json to_json(const ToTerminal& m);
// Types and bounds that hold whatever the model (rows >= 1, positions >= 1).
[[nodiscard]] core::Result<ToWorker> to_worker_from_json(const nlohmann::json& j);
[[nodiscard]] core::Result<ToTerminal> to_terminal_from_json(const nlohmann::json& j);

// Over a group: the terminal sends ToWorker and receives ToTerminal, a worker
// the other way round; a frame that is not a well-formed message is an error
// naming the peer. Control messages are at most 1 MiB.
[[nodiscard]] core::Status send_to_worker(comm::Group& g, int worker, const ToWorker& m, comm::Millis timeout);
[[nodiscard]] core::Result<ToWorker> recv_from_terminal(comm::Group& g, comm::Millis timeout);
[[nodiscard]] core::Status send_to_terminal(comm::Group& g, const ToTerminal& m, comm::Millis timeout);
[[nodiscard]] core::Result<ToTerminal> recv_from_worker(comm::Group& g, int worker, comm::Millis timeout);

// A daemon's control channel: what a terminal may ask.
struct PingRequest {};
// Its text, for callers that send a ping without building a request.
inline constexpr const char* kPingRequest = R"({"ping":true})";
using ControlRequest = std::variant<PingRequest, ProfileJob, JobSpec>;
std::string to_text(const ControlRequest& r);
[[nodiscard]] core::Result<ControlRequest> parse_control_request(std::string_view text);
// A daemon's answer: the JSON object when it says {"ok": true}, else a
// network error "worker EP refused to WHAT: <its error>".
[[nodiscard]] core::Result<nlohmann::json> daemon_answer(const std::string& endpoint, const std::string& answer,
                                                         const std::string& what);
nlohmann::json ok_answer();
nlohmann::json refusal(const std::string& why);

}  // namespace tessera::runtime
