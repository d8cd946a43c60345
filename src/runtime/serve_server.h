// Inside `tessera serve`: the Server class (the HTTP endpoints on cpp-httplib)
// and the error helpers its files share. Only declared here, so that its
// members are defined by what they serve: serve.cpp, serve_inference.cpp,
// serve_completions.cpp.
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/serve.h"
#include "runtime/serve_admission.h"
#include "runtime/serve_api.h"
#include "runtime/serve_engine.h"

namespace tessera::runtime::serve_detail {

// --- HTTP errors (serve.cpp) -------------------------------------------------

int http_status(const Status& st, std::string* message);
const char* error_type(int status);
void send_error(httplib::Response& res, int status, const std::string& message);
// When the request this thread serves arrived (set before routing; a
// request's helper threads set their own to it).
Clock::time_point request_start();
void set_request_start(Clock::time_point t);
// The socket of a request's connection, found by its two addresses
// (cpp-httplib 0.11 hands a handler no socket); -1 when it is not found.
int connection_socket(const httplib::Request& req);
// Whether the client has closed its side of `fd` (false for -1). cpp-httplib
// itself takes that as gone: it peeks before writing an answer and drops
// the answer to a half-closed client.
bool client_closed(int fd);

// --- the server ----------------------------------------------------------------

class Server {
 public:
  explicit Server(const ServeOptions& opts);

  Status run();
  // SIGTERM: no new requests; those admitted finish, then run() returns.
  void drain();

 private:
  // serve.cpp: the routes, admission, errors, /health, tokenizing.
  void routes();
  bool admit(httplib::Response& res);
  // Admits, waits for the model, runs `body`, and leaves.
  void admitted(httplib::Response& res, const std::function<void()>& body);
  void fail(httplib::Response& res, const Status& st);
  void health(httplib::Response& res);
  // Text -> ids with the model's tokenizer (400 without one).
  Result<std::vector<int64_t>> tokens(const api::Prompt& p, bool special) const;

  // serve_inference.cpp: one forward pass per input.
  Result<RunResult> forward(const model::ModelInput& in);
  void embeddings(const httplib::Request& req, httplib::Response& res);
  void classify(const httplib::Request& req, httplib::Response& res);
  // /tokenize and /detokenize: the model's tokenizer alone, no admission.
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);

  // serve_completions.cpp: generation.
  struct Generation;
  // Runs one completion; `emit(text, token)` gets each piece as it is
  // produced (token -1: trailing text only) and returns false when the
  // client is gone. Replays on failover from the tokens produced so far.
  // `conn`, the client's socket (-1: unknown), is also watched between the
  // chunks of a long prompt's prefill, before any token.
  Status generate(const api::CompletionRequest& r, Generation& g, Clock::time_point deadline, int conn,
                  const std::function<bool(const std::string&, int64_t)>& emit);
  // What a request's choices report as they run (each hook gets the
  // choice's index; false: the client is gone, stop).
  struct ChoiceHooks {
    std::function<bool(size_t)> start;                                // before the choice's first token (may be empty)
    std::function<bool(size_t, const std::string&, int64_t)> emit;    // as generate's
    std::function<bool(size_t)> done;                                 // after it ended well (may be empty)
  };
  // Generates choice i of `r` into gs[i], each with its own seed. Choices
  // run side by side, each a sequence of the batched steps, as far as the
  // batch has turns that no request in line waits for; the rest after them.
  // The first error, if any.
  Status run_choices(const api::CompletionRequest& r, std::vector<Generation>& gs, Clock::time_point deadline, int conn,
                     const ChoiceHooks& hooks);
  // "echo": the prompt's text in `g`, and with "logprobs" each prompt
  // token's (one forward pass over the prompt for its logits).
  Status echo_prompt(const api::CompletionRequest& r, Generation& g);
  struct Shape;  // a text or a chat completion's answer
  static json usage(const std::vector<Generation>& choices);
  Status check_generates() const;
  // The prompt in `g` generated and answered in `shape`, whole or streamed.
  void answer(const httplib::Request& req, const Shape& shape, const api::CompletionRequest& r,
              const std::shared_ptr<Generation>& g,
              httplib::Response& res);
  void completions(const httplib::Request& req, httplib::Response& res);
  // The messages rendered with the model's chat template, then as completions.
  void chat_completions(const httplib::Request& req, httplib::Response& res);

  const ServeOptions& opts_;
  Metrics metrics_;
  Admission admission_;
  Engine engine_;
  api::ApiLimits limits_;
  std::string model_name_;
  httplib::Server svr_;
  int listen_fd_ = -1;  // the listening socket, once bound (its backlog is raised)
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{0};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
};

}  // namespace tessera::runtime::serve_detail
