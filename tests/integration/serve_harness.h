// The harness of the `tessera serve` tests (serve_test.cpp,
// serve_failover_test.cpp): a server as a real process on 127.0.0.1, a client
// for it, and what one device answers, computed in process.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "model/generate.h"
#include "model/transformer.h"
#include "runtime/serve_api.h"

namespace tessera::serve_testing {

using nlohmann::json;
using testing::kBin;
using testing::kData;
using testing::tmp;
using Clock = std::chrono::steady_clock;

// A `tessera ARGS` process with its stdout and stderr in `log`.
class Proc {
 public:
  Proc(const std::vector<std::string>& args, const std::string& log) : log_(log) {
    // Emptied here, before the fork: a log left by an earlier process of the
    // same pid (the name holds the test's pid) must not be read as this
    // one's (its "listening on" line gave a stale port).
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    pid_ = ::fork();
    if (pid_ != 0 && fd >= 0) ::close(fd);
    if (pid_ == 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv{const_cast<char*>("tessera")};
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(kBin.c_str(), argv.data());
      ::_exit(127);
    }
  }
  ~Proc() {
    if (pid_ > 0 && exit_code_ == kRunning) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  void signal(int sig) { ::kill(pid_, sig); }
  // The processes it started (serve's local workers): those whose parent
  // it is, from /proc/PID/stat ("pid (comm) state ppid ...").
  std::vector<pid_t> children() const {
    std::vector<pid_t> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      auto stat = core::read_file(e.path().string() + "/stat");
      if (!stat.ok()) continue;
      const size_t close = stat->rfind(')');
      if (close == std::string::npos) continue;
      std::stringstream ss(stat->substr(close + 1));
      std::string state;
      pid_t ppid = 0;
      if (ss >> state >> ppid && ppid == pid_) out.push_back(static_cast<pid_t>(std::stol(name)));
    }
    return out;
  }
  // The exit code (-1: killed by a signal), waiting up to 60 s.
  int wait_exit() {
    for (const auto end = Clock::now() + std::chrono::seconds(60); exit_code_ == kRunning && Clock::now() < end;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return exit_code_;
  }
  std::string log() const {
    auto r = core::read_file(log_);
    return r.ok() ? *r : std::string();
  }

 private:
  static constexpr int kRunning = -1000;
  std::string log_;
  pid_t pid_ = -1;
  int exit_code_ = kRunning;
};

// A server and a client for it; the port is the one it prints.
class Server {
 public:
  explicit Server(std::vector<std::string> args) {
    args.insert(args.begin(), "serve");
    args.insert(args.end(), {"--port", "0"});
    proc_ = std::make_unique<Proc>(args, tmp("serve-" + std::to_string(++count_) + ".log"));
    const std::string marker = "listening on http://127.0.0.1:";
    for (const auto end = Clock::now() + std::chrono::seconds(120); Clock::now() < end;) {
      const std::string log = proc_->log();
      if (const size_t at = log.find(marker); at != std::string::npos) {
        port_ = std::atoi(log.c_str() + at + marker.size());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  bool up() const { return port_ > 0; }
  httplib::Client client(const std::string& key = "") const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(std::chrono::seconds(120));
    if (!key.empty()) c.set_bearer_token_auth(key);
    return c;
  }
  httplib::Result post(const std::string& path, const json& body, const std::string& key = "") const {
    return client(key).Post(path, body.dump(), "application/json");
  }
  json health() const {
    auto r = client().Get("/health");
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  Proc& proc() { return *proc_; }
  // A TCP connection to the server (-1 when it cannot be made).
  int connect_raw() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    if (fd >= 0) ::close(fd);
    return -1;
  }
  // Sends `head` (a request line and headers) and nothing more; returns the
  // server's answer up to the end of its headers (or until it closes).
  std::string raw_head(const std::string& head) const {
    const int fd = connect_raw();
    std::string out;
    if (fd >= 0 && ::send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size())) {
      char buf[512];
      for (ssize_t n; out.find("\r\n\r\n") == std::string::npos && (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
        out.append(buf, static_cast<size_t>(n));
    }
    if (fd >= 0) ::close(fd);
    return out;
  }

 private:
  static inline int count_ = 0;
  std::unique_ptr<Proc> proc_;
  int port_ = -1;
};

inline model::Transformer load(const std::string& name) { return model::Transformer::load(kData + "/" + name).value(); }

// The rows of logits one device picks n greedy tokens from, and the tokens.
struct ReferenceLogits {
  std::vector<std::vector<float>> rows;
  std::vector<int64_t> tokens;
};
inline ReferenceLogits reference_logits(const std::vector<int64_t>& prompt, int64_t n) {
  const auto m = load("gpt2-tiny");
  ReferenceLogits out;
  model::GenerateOptions o;
  o.greedy = true;
  o.max_new_tokens = n;
  o.on_logits = [&](const float* row, int64_t vocab, int64_t token) {
    out.rows.emplace_back(row, row + vocab);
    out.tokens.push_back(token);
  };
  core::ThreadPool pool(1);
  EXPECT_TRUE(model::generate(m, prompt, o, &pool).ok());
  return out;
}

// The n greedy tokens one device gives the prompt.
inline std::vector<int64_t> reference_tokens(const std::vector<int64_t>& prompt, int64_t n) {
  return reference_logits(prompt, n).tokens;
}

inline model::ForwardOutput reference_forward(const std::string& name, const model::ModelInput& in) {
  const auto m = load(name);
  core::ThreadPool pool(1);
  return m.forward(in, {}, &pool).value();
}

// The token ids of a streamed completion, read from its events; `on_first`
// runs once the first token has arrived.
struct Stream {
  std::vector<int64_t> tokens;
  std::string finish;
  bool done = false;
  int events = 0;
};
inline Stream stream_completion(const Server& s, const json& body, const std::function<void()>& on_first = {}) {
  Stream out;
  std::string buf;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json(body).dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    for (size_t end; (end = buf.find("\n\n")) != std::string::npos; buf.erase(0, end + 2)) {
      const std::string ev = buf.substr(0, end);
      if (ev.rfind("data: ", 0) != 0) continue;
      ++out.events;
      if (ev == "data: [DONE]") {
        out.done = true;
        continue;
      }
      const json j = json::parse(ev.substr(6), nullptr, false);
      if (!j.contains("choices")) {
        out.finish = "error: " + ev;
        continue;
      }
      for (const auto& t : j["choices"][0]["token_ids"]) out.tokens.push_back(t.get<int64_t>());
      if (!j["choices"][0]["finish_reason"].is_null()) out.finish = j["choices"][0]["finish_reason"];
      if (on_first && out.tokens.size() == 1) on_first();
    }
    return true;
  };
  auto c = s.client();
  auto r = c.send(req);
  EXPECT_TRUE(r) << "no answer";
  if (r) {
    EXPECT_EQ(r->status, 200);
  }
  return out;
}

inline std::vector<float> embedding_of(const json& e) {
  if (e.is_array()) return e.get<std::vector<float>>();
  const std::string bytes = runtime::api::base64_decode(e.get<std::string>()).value();
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

inline void expect_near(const std::vector<float>& got, const core::Tensor& want) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), want.numel());
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got[static_cast<size_t>(i)], want.f32()[i], 1e-4f) << i;
}

inline const std::vector<int64_t> kPrompt = {17, 4, 99, 250, 3};

// A /metrics counter or gauge (-1 when absent).
inline double metric(const std::string& body, const std::string& name) {
  const size_t at = body.find("\n" + name + " ");
  return at == std::string::npos ? -1.0 : std::atof(body.c_str() + at + name.size() + 2);
}

// Four prompts of different lengths (their rows sit at different positions
// in a batched step) and what one device generates for each.
inline std::vector<std::vector<int64_t>> batch_prompts() {
  return {kPrompt, {17, 4}, {300, 2, 9, 9, 41, 77, 5, 61, 8}, {250}};
}

}  // namespace tessera::serve_testing
