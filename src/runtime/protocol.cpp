#include "runtime/protocol.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "core/json.h"
#include "core/limits.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using core::Tensor;
using nlohmann::json;

namespace {

constexpr int kToTerminalTag = 1;  // worker -> terminal
constexpr int kToWorkerTag = 2;    // terminal -> worker
constexpr size_t kMaxControlBytes = 1 << 20;
// Larger than any row count or position a model takes; the receiver checks
// the exact bound against its model.
constexpr int64_t kMaxRows = int64_t{1} << 24;

constexpr std::array<const char*, kOpCount> kOpNames = {"ready", "error", "done",     "run", "stop",
                                                        "ping",  "generate", "decode", "end",  "step"};

Tensor json_tensor(const json& j) {
  const std::string s = j.dump();
  Tensor t = Tensor::zeros(core::DType::kU8, {static_cast<int64_t>(s.size())});
  std::memcpy(t.raw(), s.data(), s.size());
  return t;
}

Result<json> recv_json(comm::Group& g, int peer, int tag, comm::Millis timeout) {
  TESSERA_ASSIGN_OR_RETURN(Tensor t, g.recv(peer, tag, timeout));
  if (t.dtype() != core::DType::kU8 || t.rank() != 1 || t.nbytes() > kMaxControlBytes)
    return core::invalid_argument("malformed control message from rank " + std::to_string(peer));
  auto j = core::parse_json(std::string_view(static_cast<const char*>(t.raw()), t.nbytes()), "control message");
  if (!j.ok()) return core::invalid_argument("control message from rank " + std::to_string(peer) + " is not valid JSON");
  return std::move(*j);
}

Result<Op> op_field(const json& j) {
  if (!j.is_object()) return core::invalid_argument("a message must be a JSON object");
  TESSERA_ASSIGN_OR_RETURN(const std::string name, core::json_field_string(j, "op"));
  const auto op = op_from_name(name);
  if (!op) return core::invalid_argument("unknown message op '" + name.substr(0, 32) + "'");
  return *op;
}

Status check_figures(const json& j) {
  const auto bad = [] { return core::invalid_argument("malformed figures"); };
  if (!j.is_object()) return bad();
  for (const auto& [key, v] : j.items()) {
    if (v.is_number()) continue;
    if (!v.is_object()) return bad();
    for (const auto& [k2, v2] : v.items())
      if (!v2.is_number()) return bad();
  }
  return core::ok_status();
}

}  // namespace

const char* op_name(Op op) {
  const int i = static_cast<int>(op);
  return i >= 0 && i < kOpCount ? kOpNames[static_cast<size_t>(i)] : "?";
}

std::optional<Op> op_from_name(std::string_view name) {
  for (int i = 0; i < kOpCount; ++i)
    if (name == kOpNames[static_cast<size_t>(i)]) return static_cast<Op>(i);
  return std::nullopt;
}

Op op_of(const ToWorker& m) {
  return std::visit(Overloaded{[](const msg::Run&) { return Op::kRun; }, [](const msg::Stop&) { return Op::kStop; },
                               [](const msg::Ping&) { return Op::kPing; },
                               [](const msg::Generate&) { return Op::kGenerate; },
                               [](const msg::Decode&) { return Op::kDecode; }, [](const msg::End&) { return Op::kEnd; },
                               [](const msg::Step&) { return Op::kStep; }},
                    m);
}

Op op_of(const ToTerminal& m) {
  return std::visit(Overloaded{[](const msg::Ready&) { return Op::kReady; }, [](const msg::Error&) { return Op::kError; },
                               [](const msg::Done&) { return Op::kDone; }},
                    m);
}

json to_json(const ToWorker& m) {
  json j = std::visit(Overloaded{[](const msg::Run& r) { return json{{"n", r.n}}; },
                                 [](const msg::Generate& g) {
                   json j{{"positions", g.positions}, {"kv_f16", g.kv_f16}};
                   if (g.slot >= 0) j.update({{"slot", g.slot}, {"reuse", g.reuse}});
                   return j;
                 },
                                 [](const msg::Decode& d) { return json{{"n", d.n}, {"pos", d.pos}}; },
                                 [](const msg::Step& s) {
                                   json j{{"slots", s.slots}, {"pos", s.pos}};
                                   if (!s.groups.empty()) j["groups"] = s.groups;
                                   return j;
                                 },
                                 [](const auto&) { return json::object(); }},
                      m);
  j["op"] = op_name(op_of(m));
  return j;
}

json to_json(const ToTerminal& m) {
  json j = std::visit(
      Overloaded{[](const msg::Ready& r) { return json{{"weight_bytes", r.weight_bytes}, {"load_ms", r.load_ms}}; },
                 [](const msg::Error& e) { return json{{"message", e.message}}; },
                 [](const msg::Done& d) { return d.figures; }},
      m);
  j["op"] = op_name(op_of(m));
  return j;
}

Result<ToWorker> to_worker_from_json(const json& j) {
  TESSERA_ASSIGN_OR_RETURN(const Op op, op_field(j));
  switch (op) {
    case Op::kRun: {
      TESSERA_ASSIGN_OR_RETURN(const int64_t n, core::json_field_int(j, "n", 1, kMaxRows));
      return ToWorker{msg::Run{n}};
    }
    case Op::kStop: return ToWorker{msg::Stop{}};
    case Op::kPing: return ToWorker{msg::Ping{}};
    case Op::kGenerate: {
      TESSERA_ASSIGN_OR_RETURN(const int64_t positions, core::json_field_int(j, "positions", 1, kMaxRows));
      // Absent: F32 (a terminal that predates --kv-type).
      const auto f16 = j.find("kv_f16");
      if (f16 != j.end() && !f16->is_boolean()) return core::parse_error("'kv_f16' is not true or false");
      // Absent: no prefix cache (a terminal that predates it).
      TESSERA_ASSIGN_OR_RETURN(const int64_t slot, core::json_field_int(j, "slot", -1, msg::kMaxSlots - 1, -1));
      const auto reuse = j.find("reuse");
      if (reuse != j.end() && !reuse->is_boolean()) return core::parse_error("'reuse' is not true or false");
      const bool again = reuse != j.end() && reuse->get<bool>();
      if (again && slot < 0) return core::invalid_argument("'reuse' without a prefix-cache slot");
      return ToWorker{msg::Generate{positions, f16 != j.end() && f16->get<bool>(), slot, again}};
    }
    case Op::kDecode: {
      TESSERA_ASSIGN_OR_RETURN(const int64_t n, core::json_field_int(j, "n", 1, kMaxRows));
      TESSERA_ASSIGN_OR_RETURN(const int64_t pos, core::json_field_int(j, "pos", 0, kMaxRows));
      return ToWorker{msg::Decode{n, pos}};
    }
    case Op::kEnd: return ToWorker{msg::End{}};
    case Op::kStep: {
      // Two arrays of equal length, 1..kMaxSlots integers: distinct slots in range, positions in range.
      const auto slots = j.find("slots"), pos = j.find("pos");
      if (slots == j.end() || pos == j.end() || !slots->is_array() || !pos->is_array() || slots->size() != pos->size() ||
          slots->empty() || slots->size() > static_cast<size_t>(msg::kMaxSlots))
        return core::parse_error("'slots' and 'pos' must be arrays of 1.." + std::to_string(msg::kMaxSlots) +
                                 " integers, as many of each");
      msg::Step s;
      for (size_t i = 0; i < slots->size(); ++i) {
        const json& a = (*slots)[i];
        const json& b = (*pos)[i];
        if (!a.is_number_integer() || !b.is_number_integer()) return core::parse_error("a step's slots and positions are integers");
        const auto slot = a.get<int64_t>(), p = b.get<int64_t>();
        if (slot < 0 || slot >= msg::kMaxSlots || p < 0 || p >= kMaxRows)
          return core::out_of_range("a step of slot " + std::to_string(slot) + " at position " + std::to_string(p));
        if (std::find(s.slots.begin(), s.slots.end(), slot) != s.slots.end())
          return core::invalid_argument("slot " + std::to_string(slot) + " twice in one step");
        s.slots.push_back(slot);
        s.pos.push_back(p);
      }
      // Overlapped steps: 2..kMaxDevices group sizes that add up to the slots.
      if (const auto groups = j.find("groups"); groups != j.end()) {
        if (!groups->is_array() || groups->size() < 2 || groups->size() > static_cast<size_t>(core::kMaxDevices))
          return core::parse_error("'groups' must be an array of 2.." + std::to_string(core::kMaxDevices) + " row counts");
        int64_t total = 0;
        for (const json& g : *groups) {
          if (!g.is_number_integer() || g.get<int64_t>() < 0 || g.get<int64_t>() > msg::kMaxSlots)
            return core::parse_error("a step's groups are row counts in 0.." + std::to_string(msg::kMaxSlots));
          total += g.get<int64_t>();
          s.groups.push_back(g.get<int64_t>());
        }
        if (total != static_cast<int64_t>(s.slots.size()))
          return core::invalid_argument("a step's groups hold " + std::to_string(total) + " rows, its slots " +
                                        std::to_string(s.slots.size()));
      }
      return ToWorker{std::move(s)};
    }
    default: break;
  }
  return core::invalid_argument(std::string("'") + op_name(op) + "' is not a request to a worker");
}

Result<ToTerminal> to_terminal_from_json(const json& j) {
  TESSERA_ASSIGN_OR_RETURN(const Op op, op_field(j));
  switch (op) {
    case Op::kReady: {
      TESSERA_ASSIGN_OR_RETURN(const int64_t bytes, core::json_field_int(j, "weight_bytes", 0, int64_t{1} << 50));
      TESSERA_ASSIGN_OR_RETURN(const double ms, core::json_field_number(j, "load_ms", 0, 1e9));
      return ToTerminal{msg::Ready{bytes, ms}};
    }
    case Op::kError: {
      TESSERA_ASSIGN_OR_RETURN(std::string message, core::json_field_string(j, "message", std::string("failed")));
      if (message.size() > 4096) message.resize(4096);
      return ToTerminal{msg::Error{std::move(message)}};
    }
    case Op::kDone: {
      msg::Done d;
      d.figures = j;
      d.figures.erase("op");
      TESSERA_RETURN_IF_ERROR(check_figures(d.figures));
      return ToTerminal{std::move(d)};
    }
    default: break;
  }
  return core::invalid_argument(std::string("'") + op_name(op) + "' is not a reply to the terminal");
}

Status send_to_worker(comm::Group& g, int worker, const ToWorker& m, comm::Millis timeout) {
  return g.send(worker, kToWorkerTag, json_tensor(to_json(m)), timeout);
}

Result<ToWorker> recv_from_terminal(comm::Group& g, comm::Millis timeout) {
  TESSERA_ASSIGN_OR_RETURN(const json j, recv_json(g, 0, kToWorkerTag, timeout));
  auto m = to_worker_from_json(j);
  if (!m.ok()) return m.status().with_context("a request from the terminal");
  return m;
}

Status send_to_terminal(comm::Group& g, const ToTerminal& m, comm::Millis timeout) {
  return g.send(0, kToTerminalTag, json_tensor(to_json(m)), timeout);
}

Result<ToTerminal> recv_from_worker(comm::Group& g, int worker, comm::Millis timeout) {
  TESSERA_ASSIGN_OR_RETURN(const json j, recv_json(g, worker, kToTerminalTag, timeout));
  auto m = to_terminal_from_json(j);
  if (!m.ok()) return m.status().with_context("worker " + std::to_string(worker));
  return m;
}

std::string to_text(const ControlRequest& r) {
  return std::visit(Overloaded{[](const PingRequest&) { return json{{"ping", true}}.dump(); },
                               [](const ProfileJob& p) { return p.to_json().dump(); },
                               [](const JobSpec& s) { return s.to_json().dump(); }},
                    r);
}

Result<ControlRequest> parse_control_request(std::string_view text) {
  if (text.size() > kMaxControlBytes) return core::invalid_argument("control request larger than 1 MiB");
  TESSERA_ASSIGN_OR_RETURN(const json j, core::parse_json(text, "control request"));
  if (!j.is_object()) return core::parse_error("control request is not a JSON object");
  if (j.size() == 1 && j.contains("ping")) return ControlRequest{PingRequest{}};
  if (j.contains("profile")) {
    TESSERA_ASSIGN_OR_RETURN(ProfileJob p, ProfileJob::from_json(j));
    return ControlRequest{std::move(p)};
  }
  TESSERA_ASSIGN_OR_RETURN(JobSpec s, JobSpec::from_object(j));
  return ControlRequest{std::move(s)};
}

Result<json> daemon_answer(const std::string& endpoint, const std::string& answer, const std::string& what) {
  const json a = json::parse(answer, nullptr, false);
  if (a.is_object() && a.contains("ok") && a["ok"] == true) return a;
  const bool has_error = a.is_object() && a.contains("error") && a["error"].is_string();
  return core::network_error("worker " + endpoint + " refused to " + what + ": " +
                             (has_error ? a["error"].get<std::string>() : std::string("bad answer")));
}

json ok_answer() { return {{"ok", true}}; }
json refusal(const std::string& why) { return {{"ok", false}, {"error", why}}; }

}  // namespace tessera::runtime
