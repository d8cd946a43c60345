// What a daemon parses from a key holder: the job JSON (and the plan it
// describes, completed against a fixture config), a profile request, a ping
// and a link matrix.
#include "comm/link.h"
#include "core/json.h"
#include "fuzz_util.h"
#include "model/config.h"
#include "runtime/cluster_profile.h"
#include "runtime/job.h"

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
  if (auto j = tessera::core::parse_json(input, "fuzz"); j.ok()) {
    (void)tessera::runtime::is_ping(*j);
    if (tessera::runtime::is_profile_request(*j)) {
      auto p = tessera::runtime::ProfileJob::from_json(*j);
      if (p.ok()) {
        using Part = tessera::runtime::ProfileJob::Part;
        if (p->part == Part::kLinks &&
            (p->rank < 1 || p->rank >= static_cast<int>(p->endpoints.size()) || p->timeout_ms < 1))
          __builtin_trap();
        if (p->part == Part::kDevice && (p->threads < 1 || p->threads > 256 || p->rows < 1 || p->model.empty()))
          __builtin_trap();
        if (!tessera::runtime::ProfileJob::from_json(p->to_json()).ok()) __builtin_trap();  // what it accepts, it writes back
      }
    }
  }
  (void)tessera::comm::LinkMatrix::from_json(input, 1 + static_cast<int>(size % 4));
  return 0;
}
