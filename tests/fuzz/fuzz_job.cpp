// What a daemon parses from a key holder: the job JSON (and the plan it
// describes, completed against a fixture config) and a link matrix.
#include "comm/link.h"
#include "fuzz_util.h"
#include "model/config.h"
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
  (void)tessera::comm::LinkMatrix::from_json(input, 1 + static_cast<int>(size % 4));
  return 0;
}
