// The main() of a test binary whose tests start Session workers: the session
// forks this binary as `worker-job --job JSON --key-fd N`, so the worker
// runs this process's code (strategies registered here included).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "runtime/worker.h"
#include "runtime/job.h"

namespace tessera::runtime::testing {

inline int main_with_workers(int argc, char** argv) {
  if (argc >= 4 && std::strcmp(argv[1], "worker-job") == 0) {
    auto job = JobSpec::from_json(argv[3]);
    if (!job.ok()) return 2;
    WorkerEnv env;
    if (argc >= 6 && std::strcmp(argv[4], "--key-fd") == 0) {
      auto key = read_key_from_fd(std::atoi(argv[5]));
      if (!key.ok()) return 3;
      env.key = *key;
    }
    return run_worker(*job, env).ok() ? 0 : 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace tessera::runtime::testing
