// The main() of a test binary whose tests start Session workers: the session
// forks this binary as `worker-job --job JSON --key-fd N --listen-fd M`, so the worker
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
    for (int i = 4; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--key-fd") == 0) {
        auto key = read_key_from_fd(std::atoi(argv[i + 1]));
        if (!key.ok()) return 3;
        env.key = *key;
      } else if (std::strcmp(argv[i], "--listen-fd") == 0) {
        env.bind_fd = std::atoi(argv[i + 1]);
      }
    }
    return run_worker(*job, env).ok() ? 0 : 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace tessera::runtime::testing
