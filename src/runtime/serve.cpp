// `tessera serve`, the HTTP side, in two parts:
//   Admission  the bounded request queue (429 with Retry-After when full);
//   Server     the HTTP endpoints on cpp-httplib, limits, streaming, SIGTERM.
// The devices, the session, failover and generation are the Engine's, and
// the /metrics counters Metrics' (serve_engine.h); the request bodies are
// parsed by the pure functions of serve_api.h.
#include "runtime/serve.h"

#include <httplib.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "comm/control.h"
#include "core/duration.h"
#include "core/logging.h"
#include "model/generate.h"
#include "model/image.h"
#include "model/tokenizer.h"
#include "runtime/serve_api.h"
#include "runtime/serve_engine.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

using tessera::runtime::Device;
using serve_detail::DeviceView;
using serve_detail::Engine;
using serve_detail::Metrics;

// --- the queue -------------------------------------------------------------

// At most `capacity` requests are admitted (running or waiting); the model
// runs one at a time, in the order they were admitted.
class Admission {
 public:
  explicit Admission(int capacity) : capacity_(capacity) {}
  bool try_admit() {
    std::lock_guard<std::mutex> l(mu_);
    if (admitted_ >= capacity_) return false;
    ++admitted_;
    return true;
  }
  void leave() {
    std::lock_guard<std::mutex> l(mu_);
    --admitted_;
  }
  int depth() const {
    std::lock_guard<std::mutex> l(mu_);
    return admitted_;
  }
  // Waits for the model (FIFO) until `deadline`; false when it passed.
  bool acquire(Clock::time_point deadline) {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t ticket = next_++;
    if (cv_.wait_until(l, deadline, [&] { return serving_ == ticket; })) return true;
    abandoned_.push_back(ticket);  // skipped when its turn comes
    return false;
  }
  void release() {
    std::lock_guard<std::mutex> l(mu_);
    ++serving_;
    while (std::find(abandoned_.begin(), abandoned_.end(), serving_) != abandoned_.end()) {
      abandoned_.erase(std::find(abandoned_.begin(), abandoned_.end(), serving_));
      ++serving_;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int capacity_;
  int admitted_ = 0;
  uint64_t next_ = 0, serving_ = 0;
  std::vector<uint64_t> abandoned_;
};

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

thread_local Clock::time_point t_request_start;

class Server {
 public:
  explicit Server(const ServeOptions& opts)
      : opts_(opts), admission_(opts.queue), engine_(opts, metrics_),
        model_name_(std::filesystem::path(opts.cluster.options().model_dir).lexically_normal().filename().string()) {
    if (model_name_.empty())
      model_name_ = std::filesystem::path(opts.cluster.options().model_dir).lexically_normal().parent_path().filename().string();
  }

  Status run() {
    TESSERA_RETURN_IF_ERROR(engine_.start());
    const auto& c = engine_.config();
    limits_.vocab = c.vocab;
    limits_.max_positions = c.max_positions;
    routes();
    const int port = opts_.port == 0 ? svr_.bind_to_any_port(opts_.host) : (svr_.bind_to_port(opts_.host, opts_.port) ? opts_.port : -1);
    if (port < 0) return core::network_error("cannot listen on " + opts_.host + ":" + std::to_string(opts_.port));
    if (draining_) {  // SIGTERM while loading
      engine_.stop();
      return core::ok_status();
    }
    if (opts_.on_listening) opts_.on_listening(opts_.host, port);
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

  // SIGTERM: no new requests; those admitted finish, then run() returns.
  void drain() {
    draining_ = true;
    spdlog::info("serve: draining");
    svr_.stop();
  }

 private:
  void routes() {
    // One model runs at a time; the HTTP threads beyond the queue answer
    // 429, /health and /metrics while it is full.
    const size_t threads = static_cast<size_t>(opts_.queue) + 4;
    svr_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    svr_.set_payload_max_length(static_cast<size_t>(opts_.max_body_bytes));
    svr_.set_read_timeout(std::chrono::seconds(30));
    svr_.set_write_timeout(std::chrono::seconds(30));
    svr_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      t_request_start = Clock::now();
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
      metrics_.request(res.status, std::chrono::duration<double>(Clock::now() - t_request_start).count());
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
    svr_.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
      admitted(res, [&] { embeddings(req, res); });
    });
    svr_.Post("/v1/classify", [this](const httplib::Request& req, httplib::Response& res) {
      admitted(res, [&] { classify(req, res); });
    });
  }

  bool admit(httplib::Response& res) {
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

  // Admits, waits for the model, runs `body`, and leaves.
  void admitted(httplib::Response& res, const std::function<void()>& body) {
    if (!admit(res)) return;
    const auto deadline = Clock::now() + std::chrono::milliseconds(opts_.deadline_ms);
    if (admission_.acquire(deadline)) {
      body();
      admission_.release();
    } else {
      send_error(res, 504, "the request's deadline passed while it waited in the queue");
    }
    admission_.leave();
  }

  void fail(httplib::Response& res, const Status& st) {
    std::string message;
    const int status = http_status(st, &message);
    send_error(res, status, message);
  }

  void health(httplib::Response& res) {
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

  // Text -> ids with the model's tokenizer (400 without one).
  Result<std::vector<int64_t>> tokens(const api::Prompt& p, bool special) const {
    if (!p.text) return p.ids;
    if (engine_.tokenizer() == nullptr) return core::invalid_argument("this model has no tokenizer: send token ids");
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> ids, engine_.tokenizer()->encode(*p.text, special));
    if (ids.empty()) return core::invalid_argument("the text has no tokens");
    if (static_cast<int64_t>(ids.size()) > limits_.max_positions)
      return core::invalid_argument("the text has " + std::to_string(ids.size()) + " tokens; the model takes at most " +
                                    std::to_string(limits_.max_positions));
    return ids;
  }

  Result<RunResult> forward(const model::ModelInput& in) {
    RunResult out;
    TESSERA_RETURN_IF_ERROR(engine_.with_failover([&](Session& s) {
      TESSERA_ASSIGN_OR_RETURN(out, s.run_input(in));
      engine_.count_bytes();
      return core::ok_status();
    }));
    return out;
  }

  void embeddings(const httplib::Request& req, httplib::Response& res) {
    const auto& c = engine_.config();
    if (c.family == model::Family::kVit) return send_error(res, 400, "embeddings take text; this model takes images");
    auto r = api::parse_embedding(req.body, limits_);
    if (!r.ok()) return fail(res, r.status());
    std::vector<model::ModelInput> inputs;
    for (const auto& p : r->inputs) {
      auto ids = tokens(p, true);
      if (!ids.ok()) return fail(res, ids.status());
      inputs.push_back({*ids, {}, {}});
    }
    json data = json::array();
    int64_t used = 0;
    std::string pooling;
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto out = forward(inputs[i]);
      if (!out.ok()) return fail(res, out.status());
      used += static_cast<int64_t>(inputs[i].ids.size());
      // BERT's pooler (dense + tanh on [CLS]) where the model has one; else the mean of the last hidden state.
      std::vector<float> v(static_cast<size_t>(c.hidden), 0.0f);
      if (!out->output.pooler.empty()) {
        pooling = "pooler";
        std::copy(out->output.pooler.f32(), out->output.pooler.f32() + c.hidden, v.begin());
      } else {
        pooling = "mean";
        const core::Tensor& h = out->output.hidden.back();
        for (int64_t row = 0; row < h.dim(0); ++row)
          for (int64_t f = 0; f < c.hidden; ++f) v[static_cast<size_t>(f)] += h.f32()[row * c.hidden + f] / static_cast<float>(h.dim(0));
      }
      json e = {{"object", "embedding"}, {"index", i}};
      if (r->base64) e["embedding"] = api::base64_encode(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
      else e["embedding"] = v;
      data.push_back(e);
    }
    res.set_content(json{{"object", "list"}, {"data", data}, {"model", model_name_}, {"pooling", pooling},
                         {"usage", {{"prompt_tokens", used}, {"total_tokens", used}}}}
                        .dump(),
                    "application/json");
  }

  void classify(const httplib::Request& req, httplib::Response& res) {
    const auto& c = engine_.config();
    if (c.num_labels() == 0 || c.family == model::Family::kGpt2)
      return send_error(res, 400, "this model has no classification head");
    auto r = api::parse_classify(req.body, limits_);
    if (!r.ok()) return fail(res, r.status());
    std::vector<model::ModelInput> inputs;
    const bool vit = c.family == model::Family::kVit;
    if (vit != r->image.has_value())
      return send_error(res, 400, vit ? "this model classifies images: send \"image\"" : "this model classifies text: send \"input\"");
    if (vit) {
      auto pp = model::load_image_preprocess(opts_.cluster.options().model_dir, static_cast<int>(c.image_size));
      if (!pp.ok()) return fail(res, pp.status());
      auto px = model::decode_image(*r->image, *pp, "the image");
      if (!px.ok()) return send_error(res, 400, px.status().message());
      inputs.push_back({{}, {}, *px});
    } else {
      for (const auto& p : r->inputs) {
        auto ids = tokens(p, true);
        if (!ids.ok()) return fail(res, ids.status());
        inputs.push_back({*ids, {}, {}});
      }
    }
    json data = json::array();
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto out = forward(inputs[i]);
      if (!out.ok()) return fail(res, out.status());
      const core::Tensor& l = out->output.logits;
      const int64_t n = l.dim(1);
      std::vector<double> p(static_cast<size_t>(n));
      const float mx = *std::max_element(l.f32(), l.f32() + n);
      double sum = 0.0;
      for (int64_t k = 0; k < n; ++k) sum += p[static_cast<size_t>(k)] = std::exp(static_cast<double>(l.f32()[k] - mx));
      json labels = json::array();
      for (int64_t k = 0; k < n; ++k)
        labels.push_back({{"label", k < c.num_labels() ? c.labels[static_cast<size_t>(k)] : std::to_string(k)},
                          {"score", p[static_cast<size_t>(k)] / sum}, {"logit", l.f32()[k]}});
      std::stable_sort(labels.begin(), labels.end(), [](const json& a, const json& b) { return a["score"].get<double>() > b["score"].get<double>(); });
      data.push_back({{"index", i}, {"label", labels[0]["label"]}, {"score", labels[0]["score"]}, {"labels", labels}});
    }
    res.set_content(json{{"object", "list"}, {"model", model_name_}, {"data", data}}.dump(), "application/json");
  }

  // --- completions --------------------------------------------------------

  struct Generation {
    std::vector<int64_t> prompt, tokens;
    std::string finish = "length";
  };

  // Runs one completion; `emit(text, token)` gets each piece as it is
  // produced (token -1: trailing text only) and returns false when the
  // client is gone. Replays on failover from the tokens produced so far.
  Status generate(const api::CompletionRequest& r, Generation& g, Clock::time_point deadline,
                  const std::function<bool(const std::string&, int64_t)>& emit) {
    model::GenerateOptions o;
    o.greedy = r.temperature == 0.0;
    o.temperature = o.greedy ? 1.0f : static_cast<float>(r.temperature);
    o.top_p = static_cast<float>(r.top_p);
    o.top_k = r.top_k;
    const uint64_t seed = r.seed ? *r.seed : std::random_device{}();
    const int64_t room = engine_.config().max_positions - static_cast<int64_t>(g.prompt.size());
    const int64_t max_new = std::min(r.max_tokens, room);
    std::string sent_text;
    size_t sent = 0;
    bool stop = false, gone = false, late = false;
    const auto on_token = [&](int64_t id) {
      g.tokens.push_back(id);
      std::string delta;
      if (engine_.tokenizer() != nullptr) {
        auto text = engine_.tokenizer()->decode(g.tokens, true);
        if (text.ok()) {
          const api::StopScan s = api::scan_stop(*text, r.stop, false);
          if (s.sendable > sent) delta = text->substr(sent, s.sendable - sent);
          sent = std::max(sent, s.sendable);
          sent_text = text->substr(0, sent);
          if (s.stopped) stop = true;
        }
      }
      if (id == engine_.config().eos_token_id) stop = true;
      if (!emit(delta, id)) gone = true;
      if (Clock::now() > deadline) late = true;
    };
    o.on_token = on_token;
    o.stop_requested = [&] { return stop || gone || late; };
    Status st = engine_.with_failover([&](Session& s) {
      const int64_t done = static_cast<int64_t>(g.tokens.size());
      if (done >= max_new || stop || gone || late) return core::ok_status();
      model::GenerateOptions step = o;
      step.max_new_tokens = max_new - done;
      step.seed = o.greedy ? seed : api::advance_seed(seed, done);
      std::vector<int64_t> seq = g.prompt;
      seq.insert(seq.end(), g.tokens.begin(), g.tokens.end());
      return engine_.generate(s, seq, step).status();
    });
    if (!st.ok()) return st;
    if (late && !stop) return core::timeout_error("the request's deadline passed during generation");
    if (stop) g.finish = "stop";
    if (!stop && engine_.tokenizer() != nullptr) {  // what was held back for a stop string that never came
      auto text = engine_.tokenizer()->decode(g.tokens, true);
      if (text.ok() && text->size() > sent) emit(text->substr(sent), -1);
    }
    return core::ok_status();
  }

  json completion_json(const std::string& id, const json& choice) const {
    return {{"id", id}, {"object", "text_completion"}, {"created", static_cast<int64_t>(std::time(nullptr))},
            {"model", model_name_}, {"choices", json::array({choice})}};
  }

  static json usage(const Generation& g) {
    const auto p = static_cast<int64_t>(g.prompt.size()), n = static_cast<int64_t>(g.tokens.size());
    return {{"prompt_tokens", p}, {"completion_tokens", n}, {"total_tokens", p + n}};
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    const auto& c = engine_.config();
    if (c.family != model::Family::kGpt2 || c.head != model::HeadKind::kLmHead)
      return send_error(res, 400, "this model does not generate text (completions need a GPT-2 LM head)");
    auto r = api::parse_completion(req.body, limits_);
    if (!r.ok()) return fail(res, r.status());
    auto g = std::make_shared<Generation>();
    auto ids = tokens(r->prompt, false);
    if (!ids.ok()) return fail(res, ids.status());
    g->prompt = *ids;
    if (static_cast<int64_t>(g->prompt.size()) + r->max_tokens > c.max_positions)
      return send_error(res, 400, "the prompt's " + std::to_string(g->prompt.size()) + " tokens plus max_tokens " +
                                      std::to_string(r->max_tokens) + " exceed the model's " + std::to_string(c.max_positions) +
                                      " positions");
    const std::string id = "cmpl-" + std::to_string(++next_id_);
    if (!r->stream) {
      return admitted(res, [&] {
        std::string text;
        const auto deadline = Clock::now() + std::chrono::milliseconds(opts_.deadline_ms);
        const Status st = generate(*r, *g, deadline, [&](const std::string& t, int64_t) {
          text += t;
          return true;
        });
        if (!st.ok()) return fail(res, st);
        json choice = {{"index", 0}, {"text", text}, {"token_ids", g->tokens}, {"logprobs", nullptr}, {"finish_reason", g->finish}};
        json body = completion_json(id, choice);
        body["usage"] = usage(*g);
        res.set_content(body.dump(), "application/json");
      });
    }
    if (!admit(res)) return;
    // Streamed: the generation runs in the content provider, after the
    // headers; an error past that point is one last event before [DONE].
    const auto request = std::make_shared<api::CompletionRequest>(*r);
    const auto deadline = Clock::now() + std::chrono::milliseconds(opts_.deadline_ms);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, request, g, id, deadline](size_t, httplib::DataSink& sink) {
          const auto event = [&](const json& j) {
            const std::string s = "data: " + j.dump() + "\n\n";
            return sink.write(s.data(), s.size());
          };
          const auto choice = [](const std::string& text, const json& token_ids, const json& finish) {
            return json{{"index", 0}, {"text", text}, {"token_ids", token_ids}, {"logprobs", nullptr}, {"finish_reason", finish}};
          };
          bool alive = true;
          Status st = core::ok_status();
          if (!admission_.acquire(deadline)) {
            st = core::timeout_error("the request's deadline passed while it waited in the queue");
          } else {
            st = generate(*request, *g, deadline, [&](const std::string& text, int64_t token) {
              alive = alive && event(completion_json(id, choice(text, token < 0 ? json::array() : json::array({token}), nullptr)));
              return alive;
            });
            admission_.release();
          }
          if (alive) {
            if (st.ok()) {
              json last = completion_json(id, choice("", json::array(), g->finish));
              if (request->include_usage) last["usage"] = usage(*g);
              event(last);
            } else {
              std::string message;
              const int status = http_status(st, &message);
              event(api::error_body(message, error_type(status)));
            }
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
          }
          sink.done();
          return true;
        },
        [this](bool) { admission_.leave(); });
  }

  const ServeOptions& opts_;
  Metrics metrics_;
  Admission admission_;
  Engine engine_;
  api::ApiLimits limits_;
  std::string model_name_;
  httplib::Server svr_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{0};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
};

// SIGTERM and SIGINT: the handler only writes a byte that a thread waits for
// (any thread may take the signal: OpenBLAS's exist before main).
int g_signal_pipe[2] = {-1, -1};
void on_signal(int) {
  const char b = 1;
  (void)!::write(g_signal_pipe[1], &b, 1);
}

}  // namespace

Status serve(const ServeOptions& opts) {
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
  Server server(opts);
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
  Status st = server.run();
  done = true;
  signals.join();
  return st;
}

}  // namespace tessera::runtime
