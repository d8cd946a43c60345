// What a daemon or a worker parses from a key holder: the job JSON (and the
// plan it describes, completed against a fixture config), every control
// request (ping, profile, job), the group's messages both ways, and a link
// matrix.
#include "comm/link.h"
#include "core/json.h"
#include "fuzz_util.h"
#include "model/config.h"
#include "runtime/cluster_profile.h"
#include "runtime/job.h"
#include "runtime/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  static const auto config = tessera::model::load_config(std::string(TESSERA_TEST_DATA) + "/gpt2-tiny");
  const std::string input = tessera::fuzz::text(data, size);
  auto job = tessera::runtime::JobSpec::from_json(input);
  if (job.ok()) {
    if (job->rank < 0 || job->rank >= static_cast<int>(job->endpoints.size()) || job->timeout_ms < 1) __builtin_trap();
    if (config.ok()) (void)job->completed_plan(config.value());
    (void)tessera::runtime::job_links(job->link, static_cast<int>(job->endpoints.size()));
    (void)tessera::runtime::JobSpec::from_json(job->to_json().dump());
  }
  // The control channel: one typed request per text, each written back as it was read.
  if (auto r = tessera::runtime::parse_control_request(input); r.ok()) {
    using tessera::runtime::ProfileJob;
    if (const auto* p = std::get_if<ProfileJob>(&*r)) {
      if (p->part == ProfileJob::Part::kLinks &&
          (p->rank < 1 || p->rank >= static_cast<int>(p->endpoints.size()) || p->timeout_ms < 1))
        __builtin_trap();
      if (p->part == ProfileJob::Part::kDevice && (p->threads < 1 || p->threads > 256 || p->rows < 1 || p->model.empty()))
        __builtin_trap();
    }
    if (!tessera::runtime::parse_control_request(tessera::runtime::to_text(*r)).ok()) __builtin_trap();
  }
  // The group's messages, both ways: in bounds, and what is accepted round-trips.
  if (auto j = tessera::core::parse_json(input, "fuzz"); j.ok()) {
    if (auto m = tessera::runtime::to_worker_from_json(*j); m.ok()) {
      if (const auto* d = std::get_if<tessera::runtime::msg::Decode>(&*m); d && (d->n < 1 || d->pos < 0)) __builtin_trap();
      if (const auto* r = std::get_if<tessera::runtime::msg::Run>(&*m); r && r->n < 1) __builtin_trap();
      if (const auto* g = std::get_if<tessera::runtime::msg::Generate>(&*m);
          g && (g->slot < -1 || g->slot >= tessera::runtime::msg::kMaxSlots || (g->reuse && g->slot < 0)))
        __builtin_trap();
      if (const auto* s = std::get_if<tessera::runtime::msg::Step>(&*m)) {
        // 1..kMaxSlots rows, as many positions, distinct slots in range, positions >= 0.
        if (s->slots.empty() || s->slots.size() != s->pos.size() ||
            s->slots.size() > static_cast<size_t>(tessera::runtime::msg::kMaxSlots))
          __builtin_trap();
        for (size_t i = 0; i < s->slots.size(); ++i) {
          if (s->slots[i] < 0 || s->slots[i] >= tessera::runtime::msg::kMaxSlots || s->pos[i] < 0) __builtin_trap();
          for (size_t k = 0; k < i; ++k)
            if (s->slots[k] == s->slots[i]) __builtin_trap();
        }
      }
      auto back = tessera::runtime::to_worker_from_json(tessera::runtime::to_json(*m));
      if (!back.ok() || tessera::runtime::op_of(*back) != tessera::runtime::op_of(*m)) __builtin_trap();
    }
    if (auto m = tessera::runtime::to_terminal_from_json(*j); m.ok()) {
      if (const auto* d = std::get_if<tessera::runtime::msg::Done>(&*m))
        for (const auto& [k, v] : d->figures.items())
          if (!v.is_number() && !v.is_object()) __builtin_trap();
      if (!tessera::runtime::to_terminal_from_json(tessera::runtime::to_json(*m)).ok()) __builtin_trap();
    }
  }
  (void)tessera::comm::LinkMatrix::from_json(input, 1 + static_cast<int>(size % 4));
  return 0;
}
