// Helpers shared by the comm tests: ranks as threads over inproc, ranks as
// forked processes over tcp, and reference checks for the collectives.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "comm/collectives.h"
#include "comm/group.h"
#include "core/io.h"

namespace tessera::comm::testing {

inline GroupOptions inproc_options(const std::string& name, int k, int rank) {
  GroupOptions o;
  o.rank = rank;
  for (int r = 0; r < k; ++r) o.endpoints.push_back("inproc://" + name + "-" + std::to_string(r));
  o.group_id = name;
  o.connect_timeout = Millis(10000);
  return o;
}

// Runs fn on k threads, each a rank of one inproc group; returns each
// rank's status (group creation failures included).
inline std::vector<core::Status> run_inproc(int k, const std::function<core::Status(Group&)>& fn,
                                            const std::function<void(GroupOptions&)>& tweak = {}) {
  static std::atomic<int> counter{0};
  std::string name = "g";
  name += std::to_string(::getpid());
  name += '-';
  name += std::to_string(counter++);
  auto ctx = std::make_shared<zmq::context_t>(1);
  std::vector<core::Status> out(static_cast<size_t>(k));
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      GroupOptions o = inproc_options(name, k, r);
      o.context = ctx;
      if (tweak) tweak(o);
      auto g = Group::create(o);
      if (!g.ok()) {
        out[r] = g.status();
        return;
      }
      out[r] = fn(**g);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

inline std::string statuses_to_string(const std::vector<core::Status>& v) {
  std::string s;
  for (size_t r = 0; r < v.size(); ++r) s += "rank " + std::to_string(r) + ": " + v[r].to_string() + "\n";
  return s;
}

inline bool all_ok(const std::vector<core::Status>& v) {
  for (const auto& s : v) {
    if (!s.ok()) return false;
  }
  return true;
}

// Forked children run fn(rank) and exit with its return value; the parent
// gets each child's exit code (128+signal if killed, -1 if it had to be
// killed at the deadline). The parent must not hold a zmq context while
// forking.
struct Children {
  std::vector<pid_t> pids;
};

inline Children fork_ranks(int k, const std::function<int(int)>& fn) {
  Children c;
  std::fflush(nullptr);
  for (int r = 0; r < k; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 100;
      try {
        code = fn(r);
      } catch (...) {
        code = 101;
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    c.pids.push_back(pid);
  }
  return c;
}

inline std::vector<int> wait_children(Children& c, std::chrono::seconds limit) {
  std::vector<int> codes(c.pids.size(), -1);
  std::vector<bool> done(c.pids.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  size_t left = c.pids.size();
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < c.pids.size(); ++i) {
      if (done[i]) continue;
      int st = 0;
      if (::waitpid(c.pids[i], &st, WNOHANG) == c.pids[i]) {
        done[i] = true;
        --left;
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < c.pids.size(); ++i) {
    if (!done[i]) {
      ::kill(c.pids[i], SIGKILL);
      ::waitpid(c.pids[i], nullptr, 0);
    }
  }
  return codes;
}

// "Computes" (a little arithmetic per step, never a wait on the group) until
// done() holds or `limit` passed; returns whether done() held. Tests use it
// to show that transfers progress while their caller is busy: nothing in
// the loop drives the transport.
template <typename Done>
bool compute_until(Done done, std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  volatile double acc = 0;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    for (int i = 0; i < 1000; ++i) acc = acc + i * 0.5;
    std::this_thread::yield();
  }
  return true;
}

// Exactly representable test values.
inline float value_of(int rank, int64_t row, int64_t col) {
  return static_cast<float>(rank * 1000 + row * 10 + col);
}

inline core::Tensor rows_tensor(int rank, int64_t rows, int64_t cols, int64_t row_base = 0) {
  core::Tensor t = core::Tensor::zeros_f32({rows, cols});
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < cols; ++c) t.f32()[i * cols + c] = value_of(rank, row_base + i, c);
  }
  return t;
}

#define TESSERA_EXPECT_OR_FAIL(cond, what)                                              \
  do {                                                                                  \
    if (!(cond)) return ::tessera::core::internal_error(std::string("check failed: ") + \
                                                        (what) + " (" #cond ")");       \
  } while (0)

// Every collective against a reference, with uneven and empty parts;
// `seed` varies the partition. Returns the first mismatch as an error.
inline core::Status check_all_collectives(Group& g, int seed, Millis timeout = Millis(20000)) {
  const int k = g.size(), r = g.rank();
  const int64_t cols = 3;
  std::vector<int64_t> counts(static_cast<size_t>(k));
  for (int j = 0; j < k; ++j) counts[j] = (j * 3 + seed) % 4;  // includes zeros
  std::vector<int64_t> off(static_cast<size_t>(k) + 1, 0);
  for (int j = 0; j < k; ++j) off[j + 1] = off[j] + counts[j];

  // allgatherv
  core::Tensor out;
  TESSERA_RETURN_IF_ERROR(allgatherv(g, AllgatherOptions{timeout, 1}, rows_tensor(r, counts[r], cols), counts, &out));
  TESSERA_EXPECT_OR_FAIL(out.dim(0) == off[k] && out.dim(1) == cols, "allgatherv shape");
  for (int j = 0; j < k; ++j) {
    for (int64_t i = 0; i < counts[j]; ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        TESSERA_EXPECT_OR_FAIL(out.f32()[(off[j] + i) * cols + c] == value_of(j, i, c), "allgatherv value");
      }
    }
  }
  // allgather, equal parts
  TESSERA_RETURN_IF_ERROR(allgather(g, AllgatherOptions{timeout, 2}, rows_tensor(r, 2, cols), &out));
  TESSERA_EXPECT_OR_FAIL(out.dim(0) == 2 * k, "allgather rows");
  for (int j = 0; j < k; ++j) TESSERA_EXPECT_OR_FAIL(out.f32()[(2 * j + 1) * cols + 2] == value_of(j, 1, 2), "allgather value");

  // gatherv to the last rank
  const int root = k - 1;
  core::Tensor gathered;
  TESSERA_RETURN_IF_ERROR(gatherv(g, GatherOptions{timeout, 3, root}, rows_tensor(r, counts[r], cols), counts, &gathered));
  if (r == root) {
    TESSERA_EXPECT_OR_FAIL(gathered.dim(0) == off[k], "gatherv rows");
    for (int j = 0; j < k; ++j) {
      for (int64_t i = 0; i < counts[j]; ++i) {
        TESSERA_EXPECT_OR_FAIL(gathered.f32()[(off[j] + i) * cols] == value_of(j, i, 0), "gatherv value");
      }
    }
  }
  // gather (equal) to rank 0
  TESSERA_RETURN_IF_ERROR(gather(g, GatherOptions{timeout, 4, 0}, rows_tensor(r, 1, cols), &gathered));
  if (r == 0) {
    for (int j = 0; j < k; ++j) TESSERA_EXPECT_OR_FAIL(gathered.f32()[j * cols + 1] == value_of(j, 0, 1), "gather value");
  }

  // broadcast from the middle rank; receivers start with nothing
  const int broot = k / 2;
  core::Tensor b = r == broot ? rows_tensor(broot, 5, 2) : core::Tensor();
  TESSERA_RETURN_IF_ERROR(broadcast(g, BroadcastOptions{timeout, 5, broot}, &b));
  TESSERA_EXPECT_OR_FAIL(b.dim(0) == 5 && b.dim(1) == 2, "broadcast shape");
  for (int64_t i = 0; i < 10; ++i) TESSERA_EXPECT_OR_FAIL(b.f32()[i] == value_of(broot, i / 2, i % 2), "broadcast value");

  // reduce_scatterv: rank j contributes value_of(j, row, c) for every row
  core::Tensor full = rows_tensor(r, off[k], cols);
  core::Tensor part;
  TESSERA_RETURN_IF_ERROR(reduce_scatterv(g, ReduceScatterOptions{timeout, 6}, full, counts, &part));
  TESSERA_EXPECT_OR_FAIL(part.dim(0) == counts[r] && part.dim(1) == cols, "reduce_scatterv shape");
  for (int64_t i = 0; i < counts[r]; ++i) {
    for (int64_t c = 0; c < cols; ++c) {
      float want = 0;
      for (int j = 0; j < k; ++j) want += value_of(j, off[r] + i, c);
      TESSERA_EXPECT_OR_FAIL(part.f32()[i * cols + c] == want, "reduce_scatterv value");
    }
  }
  // reduce_scatter, even split of 2k+1 rows (uneven by one)
  full = rows_tensor(r, 2 * k + 1, cols);
  TESSERA_RETURN_IF_ERROR(reduce_scatter(g, ReduceScatterOptions{timeout, 7}, full, &part));
  const auto split = even_split(2 * k + 1, k);
  TESSERA_EXPECT_OR_FAIL(part.dim(0) == split[r], "reduce_scatter rows");

  // allreduce of an odd-sized 2-D tensor
  core::Tensor a = core::Tensor::zeros_f32({7, 3});
  for (int64_t i = 0; i < 21; ++i) a.f32()[i] = static_cast<float>((r + 1) * (i + 1));
  TESSERA_RETURN_IF_ERROR(allreduce(g, AllreduceOptions{timeout, 8}, &a));
  TESSERA_EXPECT_OR_FAIL(a.dim(0) == 7 && a.dim(1) == 3, "allreduce shape");
  for (int64_t i = 0; i < 21; ++i) {
    TESSERA_EXPECT_OR_FAIL(a.f32()[i] == static_cast<float>((i + 1) * k * (k + 1) / 2), "allreduce value");
  }

  // everything empty
  std::vector<int64_t> zeros(static_cast<size_t>(k), 0);
  TESSERA_RETURN_IF_ERROR(allgatherv(g, AllgatherOptions{timeout, 9}, core::Tensor::zeros_f32({0, cols}), zeros, &out));
  TESSERA_EXPECT_OR_FAIL(out.dim(0) == 0, "empty allgatherv");
  TESSERA_RETURN_IF_ERROR(reduce_scatterv(g, ReduceScatterOptions{timeout, 9}, core::Tensor::zeros_f32({0, cols}), zeros, &part));
  TESSERA_EXPECT_OR_FAIL(part.dim(0) == 0, "empty reduce_scatterv");

  return barrier(g, BarrierOptions{timeout, 10});
}

}  // namespace tessera::comm::testing
