// `tessera serve`, the HTTP side: serve() and the signals, the Server's
// start and drain, its routes, admission and /health, and the error helpers.
// The endpoints that run the model are apart (serve_inference.cpp,
// serve_completions.cpp); the queue is serve_admission.h; the devices, the
// session, failover and generation are the Engine's, and the /metrics
// counters Metrics' (serve_engine.h); the request bodies are parsed by the
// pure functions of serve_api.h.
#include "runtime/serve.h"

#include "model/generate.h"

#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "core/duration.h"
#include "core/logging.h"
#include "runtime/serve_server.h"

namespace tessera::runtime {

namespace serve_detail {

// --- HTTP ------------------------------------------------------------------

int http_status(const Status& st, std::string* message) {
  *message = st.message();
  return api::http_status(st.code());
}

const char* error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    case 504: return "timeout";
    default: return "server_error";
  }
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(api::error_body(message, error_type(status)).dump(), "application/json");
}

namespace {
// An address as cpp-httplib writes it (inet_ntop) and its port.
bool address_of(const sockaddr_storage& a, std::string* ip, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    if (inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof(buf)) == nullptr) return false;
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof(buf)) == nullptr) return false;
    *port = ntohs(v6->sin6_port);
  } else {
    return false;
  }
  *ip = buf;
  return true;
}
}  // namespace

int connection_socket(const httplib::Request& req) {
  // A TCP connection is the one socket with both its addresses; the handler
  // runs while it is open, so the descriptor stays its own.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(e.path().filename().c_str());
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    std::string lip, pip;
    int lport = -1, pport = -1;
    if (address_of(local, &lip, &lport) && address_of(peer, &pip, &pport) && lport == req.local_port &&
        pport == req.remote_port && pip == req.remote_addr)
      return fd;
  }
  return -1;
}

bool client_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

namespace {
thread_local Clock::time_point t_request_start;
}  // namespace

Clock::time_point request_start() { return t_request_start; }
void set_request_start(Clock::time_point t) { t_request_start = t; }

namespace {

// httplib's task queue: every connection on a thread of its own, up to
// `max` at once (later ones wait for a slot). httplib serves a connection
// on one thread until it closes, so with a fixed pool a few idle or
// byte-a-second clients held every thread and starved /health and the
// completions alike; here they hold only their own.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max) : max_(std::max<size_t>(max, 1)) {}
  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> l(mu_);
    waiting_.push_back(std::move(fn));
    start_locked();
  }
  // After the listening socket closed: waits for every connection.
  void shutdown() override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return running_ == 0 && waiting_.empty(); });
  }

 private:
  void start_locked() {
    while (running_ < max_ && !waiting_.empty()) {
      try {
        std::thread([this, fn = waiting_.front()] {  // a copy: kept if no thread starts
          fn();
          std::lock_guard<std::mutex> l(mu_);
          --running_;
          start_locked();
          // Under the lock, so shutdown() returns (and the queue is deleted)
          // only after this thread has let go of it.
          cv_.notify_all();
        }).detach();
      } catch (const std::system_error& e) {  // out of threads: it waits for the next to end
        spdlog::warn("serve: no thread for a connection ({}); {} running", e.what(), running_);
        return;
      }
      ++running_;
      waiting_.pop_front();
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> waiting_;
  size_t running_ = 0;
};
}  // namespace

// --- the server --------------------------------------------------------------

Server::Server(const ServeOptions& opts)
    : opts_(opts), admission_(opts.queue, opts.max_batch), engine_(opts, metrics_),
      model_name_(std::filesystem::path(opts.cluster.options().model_dir).lexically_normal().filename().string()) {
  if (model_name_.empty())
    model_name_ = std::filesystem::path(opts.cluster.options().model_dir).lexically_normal().parent_path().filename().string();
}

Status Server::run() {
  TESSERA_RETURN_IF_ERROR(engine_.start());
  const auto& c = engine_.config();
  limits_.vocab = c.vocab;
  // Text models: prompt plus max_tokens fit the context (causal LMs) or the model.
  limits_.max_positions = c.causal_lm() ? model::context_size(c, opts_.ctx_size) : c.max_positions;
  routes();
  const int port = opts_.port == 0 ? svr_.bind_to_any_port(opts_.host) : (svr_.bind_to_port(opts_.host, opts_.port) ? opts_.port : -1);
  if (port < 0) return core::network_error("cannot listen on " + opts_.host + ":" + std::to_string(opts_.port));
  // httplib listens with a backlog of 5: a burst of connections overflows
  // it and each one past it waits a second for its SYN to be sent again.
  // listen() again on the bound socket only raises the backlog.
  if (listen_fd_ >= 0 && ::listen(listen_fd_, 1024) != 0) spdlog::warn("serve: cannot raise the listen backlog");
  if (draining_) {  // SIGTERM while loading
    engine_.stop();
    return core::ok_status();
  }
  std::printf("listening on http://%s:%d\n", opts_.host.c_str(), port);
  std::fflush(stdout);
  spdlog::info("serve: listening on http://{}:{}", opts_.host, port);
  std::thread readmit([this] {
    std::unique_lock<std::mutex> l(stop_mu_);
    while (!stop_cv_.wait_for(l, std::chrono::milliseconds(opts_.readmit_ms), [this] { return stopped_; })) {
      l.unlock();
      engine_.probe_dropped();
      l.lock();
    }
  });
  const bool ok = svr_.listen_after_bind();  // returns after stop(), the requests in flight answered
  {
    std::lock_guard<std::mutex> l(stop_mu_);
    stopped_ = true;
  }
  stop_cv_.notify_all();
  readmit.join();
  engine_.stop();
  return ok ? core::ok_status() : core::network_error("the HTTP server failed");
}

void Server::drain() {
  draining_ = true;
  spdlog::info("serve: draining");
  svr_.stop();
}

void Server::routes() {
  // One model runs at a time (--queue admits, the rest get 429); the
  // connections each have a thread (ConnectionThreads), so slow clients
  // never hold up /health, /metrics or a completion.
  const size_t connections = static_cast<size_t>(opts_.max_connections);
  svr_.new_task_queue = [connections] { return new ConnectionThreads(connections); };
  svr_.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  svr_.set_payload_max_length(static_cast<size_t>(opts_.max_body_bytes));
  svr_.set_read_timeout(std::chrono::seconds(30));
  svr_.set_write_timeout(std::chrono::seconds(30));
  svr_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    t_request_start = Clock::now();
    // The declared body size is judged from the header, before any of the
    // body is read: an oversize one would otherwise be read (and dropped)
    // until the read timeout.
    if (req.has_header("Content-Length")) {
      const std::string v = req.get_header_value("Content-Length");
      const bool digits = !v.empty() && v.size() <= 18 && v.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoll(v) > opts_.max_body_bytes) {
        res.set_header("Connection", "close");
        if (!digits) send_error(res, 400, "Content-Length is not a byte count");
        else send_error(res, 413, "the request body is over the server's limit");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!opts_.api_key.empty() && req.path != "/health" &&
        req.get_header_value("Authorization") != "Bearer " + opts_.api_key) {
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, 401, "a valid API key is required (Authorization: Bearer KEY)");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr_.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return;
    if (res.status == 413) send_error(res, 413, "the request body is over the server's limit");
    else if (res.status == 404) send_error(res, 404, "no such endpoint");
    else send_error(res, res.status, "request failed");
  });
  svr_.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    // A request refused before routing (a bad request line, an over-long
    // URI) never set its start: it took no time of ours, not the clock's
    // age or the previous request's on this connection.
    const Clock::time_point start = t_request_start;
    t_request_start = Clock::time_point{};
    const double s = start == Clock::time_point{} ? 0.0 : std::chrono::duration<double>(Clock::now() - start).count();
    metrics_.request(res.status, s);
  });
  svr_.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
  svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const DeviceView v = engine_.view();
    const int active = static_cast<int>(std::count_if(v.devices.begin(), v.devices.end(), [](const Device& d) { return d.active; }));
    res.set_content(metrics_.render(admission_.depth(), active, static_cast<int>(v.devices.size()) - active),
                    "text/plain; version=0.0.4");
  });
  svr_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", model_name_}, {"object", "model"}, {"created", 0}, {"owned_by", "tessera"}};
    res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
  });
  svr_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { completions(req, res); });
  svr_.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { chat_completions(req, res); });
  svr_.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
    admitted(res, [&] { embeddings(req, res); });
  });
  svr_.Post("/v1/classify", [this](const httplib::Request& req, httplib::Response& res) {
    admitted(res, [&] { classify(req, res); });
  });
  svr_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
  svr_.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) { detokenize(req, res); });
  // A known endpoint asked with the wrong method: 405 with the one that works, not 404.
  const auto wrong_method = [](const char* allow) {
    return [allow](const httplib::Request&, httplib::Response& res) {
      res.set_header("Allow", allow);
      send_error(res, 405, std::string("this endpoint takes ") + allow);
    };
  };
  for (const char* path : {"/health", "/metrics", "/v1/models"}) {
    svr_.Post(path, wrong_method("GET"));
    svr_.Put(path, wrong_method("GET"));
    svr_.Delete(path, wrong_method("GET"));
  }
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/classify", "/tokenize", "/detokenize"}) {
    svr_.Get(path, wrong_method("POST"));
    svr_.Put(path, wrong_method("POST"));
    svr_.Delete(path, wrong_method("POST"));
  }
}

bool Server::admit(httplib::Response& res) {
  if (draining_) {
    send_error(res, 503, "the server is shutting down");
    return false;
  }
  if (!admission_.try_admit()) {
    res.set_header("Retry-After", "1");
    send_error(res, 429, "the request queue is full (" + std::to_string(opts_.queue) + " requests); retry later");
    return false;
  }
  return true;
}

void Server::admitted(httplib::Response& res, const std::function<void()>& body) {
  if (!admit(res)) return;
  // Guards: a body that throws (httplib answers 500) still gives its turn
  // and its place back, or with --max-batch 1 every later request would wait.
  struct Leave {
    Admission& a;
    ~Leave() { a.leave(); }
  } leave{admission_};
  const auto deadline = Clock::now() + std::chrono::milliseconds(opts_.deadline_ms);
  if (!admission_.acquire(deadline))
    return send_error(res, 504, "the request's deadline passed while it waited in the queue");
  struct Release {
    Admission& a;
    ~Release() { a.release(); }
  } release{admission_};
  body();
}

void Server::fail(httplib::Response& res, const Status& st) {
  std::string message;
  const int status = http_status(st, &message);
  send_error(res, status, message);
}

void Server::health(httplib::Response& res) {
  const DeviceView v = engine_.view();
  json devices = json::array();
  for (size_t d = 0; d < v.devices.size(); ++d) {
    const auto rank = std::find(v.members.begin(), v.members.end(), static_cast<int>(d));
    json e = {{"name", v.devices[d].name}, {"state", !v.devices[d].active ? "dropped" : rank != v.members.end() ? "active" : "idle"}};
    if (rank != v.members.end()) e["rank"] = rank - v.members.begin();
    devices.push_back(e);
  }
  const bool dropped = std::any_of(v.devices.begin(), v.devices.end(), [](const Device& d) { return !d.active; });
  const char* state = draining_ ? "draining" : !v.serving ? "unavailable" : dropped ? "degraded" : "ok";
  res.set_content(json{{"status", state}, {"model", model_name_}, {"strategy", v.strategy}, {"devices", devices},
                       {"queue_depth", admission_.depth()}, {"failovers", metrics_.failovers()}}
                      .dump(),
                  "application/json");
}

Result<std::vector<int64_t>> Server::tokens(const api::Prompt& p, bool special) const {
  if (!p.text) return p.ids;
  if (engine_.tokenizer() == nullptr) return core::invalid_argument("this model has no tokenizer: send token ids");
  TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> ids, engine_.tokenizer()->encode(*p.text, special));
  if (ids.empty()) return core::invalid_argument("the text has no tokens");
  if (static_cast<int64_t>(ids.size()) > limits_.max_positions)
    return core::invalid_argument("the text has " + std::to_string(ids.size()) + " tokens; the model takes at most " +
                                  std::to_string(limits_.max_positions));
  return ids;
}

}  // namespace serve_detail

namespace {

// SIGTERM and SIGINT: the handler only writes a byte that a thread waits for
// (any thread may take the signal: OpenBLAS's exist before main).
int g_signal_pipe[2] = {-1, -1};
void on_signal(int) {
  const char b = 1;
  (void)!::write(g_signal_pipe[1], &b, 1);
}

}  // namespace

core::Status serve(const ServeOptions& opts) {
  if (opts.queue < 1 || opts.queue > 4096) return core::invalid_argument("--queue must be in [1, 4096]");
  if (opts.max_body_bytes < 1024) return core::invalid_argument("--max-body must be at least 1024 bytes");
  TESSERA_RETURN_IF_ERROR(core::check_duration(std::chrono::milliseconds(opts.deadline_ms), "--deadline"));
  TESSERA_RETURN_IF_ERROR(core::check_duration(std::chrono::milliseconds(opts.failover_ms), "--failover-timeout"));
  if (g_signal_pipe[0] < 0 && ::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    return core::internal_error("pipe failed: " + std::string(std::strerror(errno)));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  serve_detail::Server server(opts);
  std::atomic<bool> done{false};
  std::thread signals([&] {
    while (!done) {
      pollfd p{g_signal_pipe[0], POLLIN, 0};
      if (::poll(&p, 1, 200) > 0) {
        char b;
        while (::read(g_signal_pipe[0], &b, 1) > 0) {
        }
        server.drain();
        return;
      }
    }
  });
  core::Status st = server.run();
  done = true;
  signals.join();
  return st;
}

}  // namespace tessera::runtime
