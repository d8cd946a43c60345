// `tessera serve`'s /v1/completions and /v1/chat/completions: the
// generation loop (stop strings, end-of-turn ids, deadline, replay on
// failover) and the answer, whole or streamed, in OpenAI's two shapes. Apart from
// serve.cpp (routes and admission) and serve_inference.cpp (one-shot passes).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "model/chat.h"
#include "model/generate.h"
#include "model/tokenizer.h"
#include "runtime/serve_server.h"

namespace tessera::runtime::serve_detail {

struct Server::Generation {
  std::vector<int64_t> prompt, tokens;
  std::string finish = "length";
  // With "logprobs": each token's, and where its text starts in the answer
  // (in characters); a stream sends each entry once.
  bool want_logprobs = false;
  // "echo": the prompt's text, whose tokens' entries (the first has no
  // logprob: NaN) come first in `logprobs`.
  std::string echo_text;
  std::vector<model::TokenLogprobs> logprobs;
  std::vector<int64_t> text_offsets;
  size_t logprobs_sent = 0;
};

namespace {

json token_entry(const model::Tokenizer* tok, int64_t id, float logprob) {
  api::LogprobToken t = api::logprob_token(tok, id);
  json bytes = json::array();
  for (const unsigned char c : t.bytes) bytes.push_back(static_cast<int>(c));
  return {{"token", std::move(t.text)}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

int64_t characters(const std::string& utf8) {
  return std::count_if(utf8.begin(), utf8.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

}  // namespace

Status Server::generate(const api::CompletionRequest& r, Generation& g, Clock::time_point deadline, int conn,
                        const std::function<bool(const std::string&, int64_t)>& emit) {
  model::GenerateOptions o;
  o.greedy = r.temperature == 0.0;
  o.temperature = o.greedy ? 1.0f : static_cast<float>(r.temperature);
  o.top_p = static_cast<float>(r.top_p);
  o.top_k = r.top_k;
  o.logit_bias = r.logit_bias;
  const uint64_t seed = r.seed ? *r.seed : std::random_device{}();
  o.ctx_size = limits_.max_positions;
  o.kv_dtype = opts_.kv_dtype;
  const int64_t room = limits_.max_positions - static_cast<int64_t>(g.prompt.size());
  const int64_t max_new = std::min(r.max_tokens, room);
  // The text grows by whole characters only (a byte-level token can end
  // inside one): what the stream decoder releases, scanned for stop strings.
  std::optional<model::StreamDecoder> decoder;
  if (engine_.tokenizer() != nullptr) decoder.emplace(*engine_.tokenizer());
  api::StopFilter filter(r.stop);
  int64_t chars = characters(g.echo_text);  // in the answer's text
  bool stop = false, gone = false, late = false;
  g.want_logprobs = r.logprobs >= 0;
  if (g.want_logprobs)
    o.on_logits = [&](const float* logits, int64_t vocab, int64_t id) {
      g.logprobs.push_back(model::token_logprobs(logits, vocab, id, r.logprobs));
    };
  // Replays after a failover count on from the tokens already made.
  Clock::time_point last = request_start();
  const auto on_token = [&](int64_t id) {
    const Clock::time_point now = Clock::now();
    metrics_.token(g.tokens.empty(), std::chrono::duration<double>(now - last).count());
    last = now;
    g.tokens.push_back(id);
    g.text_offsets.push_back(chars);
    std::string delta;
    if (decoder) {
      std::string piece;
      if (auto p = decoder->step(id); p.ok()) piece = std::move(*p), chars += characters(piece);
      delta = filter.add(piece);
      if (filter.stopped()) stop = true;
    }
    if (engine_.ends_turn(id)) stop = true;
    if (!emit(delta, id)) gone = true;
    if (Clock::now() > deadline) late = true;
  };
  o.on_token = on_token;
  o.stop_requested = [&] {
    late = late || Clock::now() > deadline;
    gone = gone || client_closed(conn);
    return stop || gone || late;
  };
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
  // What was held back (an unfinished character, or the start of a stop
  // string that never came) ends the answer, after an end-of-turn too.
  if (decoder && !filter.stopped()) {
    std::string tail;
    if (auto t = decoder->flush(); t.ok()) tail = std::move(*t);
    if (std::string rest = filter.finish(tail); !rest.empty()) emit(rest, -1);
    if (filter.stopped()) stop = true;
  }
  if (stop) g.finish = "stop";
  return core::ok_status();
}

Status Server::echo_prompt(const api::CompletionRequest& r, Generation& g) {
  if (!r.echo) return core::ok_status();
  const model::Tokenizer* tok = engine_.tokenizer();
  if (r.prompt.text) {
    g.echo_text = *r.prompt.text;
  } else if (tok != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(g.echo_text, tok->decode(g.prompt, false));
  }
  g.want_logprobs = r.logprobs >= 0;
  if (!g.want_logprobs) return core::ok_status();
  const auto n = static_cast<int64_t>(g.prompt.size());
  const int64_t vocab = engine_.config().vocab;
  TESSERA_RETURN_IF_ERROR(api::check_echo_logits(n, vocab));
  TESSERA_ASSIGN_OR_RETURN(const RunResult out, forward({g.prompt, {}, {}}));
  const core::Tensor& l = out.output.logits;
  if (l.numel() != n * vocab)
    return core::internal_error("the prompt's forward gave " + std::to_string(l.numel()) + " logits for " + std::to_string(n) +
                                " rows");
  // Each prompt token's place in the echoed text, in characters.
  std::optional<model::StreamDecoder> decoder;
  if (tok != nullptr) decoder.emplace(*tok, false);
  int64_t chars = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = g.prompt[static_cast<size_t>(i)];
    model::TokenLogprobs t;
    t.token = id;
    t.logprob = std::numeric_limits<float>::quiet_NaN();  // the first token has nothing before it
    if (i > 0) t = model::token_logprobs(l.f32() + (i - 1) * vocab, vocab, id, r.logprobs);
    g.logprobs.push_back(std::move(t));
    g.text_offsets.push_back(chars);
    if (decoder)
      if (auto piece = decoder->step(id); piece.ok()) chars += characters(*piece);
  }
  return core::ok_status();
}

// What the answer looks like: OpenAI's text completion or chat completion,
// whole or as stream events.
struct Server::Shape {
  bool chat = false;
  std::string id;
  std::string model;

  json envelope(const char* object, json choice) const {
    return {{"id", id}, {"object", object}, {"created", static_cast<int64_t>(std::time(nullptr))},
            {"model", model}, {"choices", json::array({std::move(choice)})}};
  }
  // The log-probabilities of tokens [from, to) in this API's shape: chat's
  // list of entries, the legacy completions' parallel lists.
  json logprobs(const Generation& g, size_t from, size_t to, const model::Tokenizer* tok) const {
    if (chat) {
      json content = json::array();
      for (size_t i = from; i < to; ++i) {
        const model::TokenLogprobs& t = g.logprobs[i];
        json e = token_entry(tok, t.token, t.logprob), top = json::array();
        for (const auto& [id, lp] : t.top) top.push_back(token_entry(tok, id, lp));
        e["top_logprobs"] = std::move(top);
        content.push_back(std::move(e));
      }
      return {{"content", std::move(content)}, {"refusal", nullptr}};
    }
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (size_t i = from; i < to; ++i) {
      const model::TokenLogprobs& t = g.logprobs[i];
      tokens.push_back(api::logprob_token(tok, t.token).text);
      const bool first_echoed = std::isnan(t.logprob);  // "echo": the prompt's first token
      lps.push_back(first_echoed ? json(nullptr) : json(t.logprob));
      json top = json::object();
      for (const auto& [id, lp] : t.top) top[api::logprob_token(tok, id).text] = lp;
      tops.push_back(first_echoed ? json(nullptr) : std::move(top));
      offsets.push_back(i < g.text_offsets.size() ? g.text_offsets[i] : 0);
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }
  // Those not streamed yet (null when none, or none were asked for).
  json unsent_logprobs(Generation& g, const model::Tokenizer* tok) const {
    if (!g.want_logprobs || g.logprobs_sent >= g.logprobs.size()) return nullptr;
    json j = logprobs(g, g.logprobs_sent, g.logprobs.size(), tok);
    g.logprobs_sent = g.logprobs.size();
    return j;
  }
  // A streamed piece of choice `index`: `text` and its token (none for
  // trailing text), or the choice's last event with the finish reason.
  json chunk(int64_t index, const std::string& text, const json& token_ids, const json& finish, json logprobs = nullptr) const {
    if (!chat)
      return envelope("text_completion", {{"index", index}, {"text", text}, {"token_ids", token_ids},
                                          {"logprobs", std::move(logprobs)}, {"finish_reason", finish}});
    json delta = finish.is_null() ? json{{"content", text}} : json::object();
    return envelope("chat.completion.chunk",
                    {{"index", index}, {"delta", delta}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}});
  }
  // A chat stream's choice opens with the assistant's role.
  std::optional<json> opening(int64_t index) const {
    if (!chat) return std::nullopt;
    return envelope("chat.completion.chunk", {{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                              {"logprobs", nullptr}, {"finish_reason", nullptr}});
  }
  // The whole answer: choice i is generated[i] after the echoed prompt.
  json whole(const std::vector<std::string>& generated, const std::vector<Generation>& gs, const model::Tokenizer* tok) const {
    json choices = json::array();
    for (size_t i = 0; i < gs.size(); ++i) {
      const Generation& g = gs[i];
      const std::string text = g.echo_text + generated[i];
      const json lp = g.want_logprobs ? logprobs(g, 0, g.logprobs.size(), tok) : json(nullptr);
      choices.push_back(chat ? json{{"index", i}, {"message", {{"role", "assistant"}, {"content", text}}},
                                    {"logprobs", lp}, {"finish_reason", g.finish}}
                             : json{{"index", i}, {"text", text}, {"token_ids", g.tokens}, {"logprobs", lp},
                                    {"finish_reason", g.finish}});
    }
    json body = envelope(chat ? "chat.completion" : "text_completion", nullptr);
    body["choices"] = std::move(choices);
    body["usage"] = usage(gs);
    return body;
  }
};

json Server::usage(const std::vector<Generation>& gs) {
  const auto p = gs.empty() ? int64_t{0} : static_cast<int64_t>(gs[0].prompt.size());
  int64_t n = 0;
  for (const Generation& g : gs) n += static_cast<int64_t>(g.tokens.size());
  return {{"prompt_tokens", p}, {"completion_tokens", n}, {"total_tokens", p + n}};
}

namespace {

// Choice i's request: its own seed, so that its draws differ from the others'.
api::CompletionRequest for_choice(const api::CompletionRequest& r, int64_t i) {
  api::CompletionRequest c = r;
  if (r.seed) c.seed = api::choice_seed(*r.seed, i);
  return c;
}

}  // namespace

Status Server::run_choices(const api::CompletionRequest& r, std::vector<Generation>& gs, Clock::time_point deadline,
                           int conn, const ChoiceHooks& hooks) {
  const int extra = gs.size() > 1 ? admission_.try_acquire_more(static_cast<int>(gs.size()) - 1) : 0;
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first = core::ok_status();
  const Clock::time_point started = request_start();
  const auto work = [&] {
    set_request_start(started);
    for (size_t i; (i = next++) < gs.size();) {
      {
        std::lock_guard<std::mutex> l(mu);
        if (!first.ok()) return;
      }
      if (client_closed(conn) || (hooks.start && !hooks.start(i))) return;
      Status st = generate(for_choice(r, static_cast<int64_t>(i)), gs[i], deadline, conn,
                           [&](const std::string& t, int64_t id) { return hooks.emit(i, t, id); });
      if (st.ok() && hooks.done && !hooks.done(i)) return;
      if (!st.ok()) {
        std::lock_guard<std::mutex> l(mu);
        if (first.ok()) first = std::move(st);
        return;
      }
    }
  };
  // A helper's exception is the request's error, not the process's end.
  const auto helper = [&] {
    try {
      work();
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> l(mu);
      if (first.ok()) first = core::internal_error(std::string("a choice failed: ") + e.what());
    }
  };
  std::vector<std::thread> helpers;
  for (int k = 0; k < extra; ++k) {
    try {
      helpers.emplace_back(helper);
    } catch (const std::system_error&) {
      break;  // no thread: fewer choices side by side
    }
  }
  helper();  // this thread's share, its exception caught like a helper's (the helpers must be joined)
  for (std::thread& t : helpers) t.join();
  for (int k = 0; k < extra; ++k) admission_.release();
  return first;
}

Status Server::check_generates() const {
  const auto& c = engine_.config();
  if (!c.causal_lm()) return core::invalid_argument("this model does not generate text (completions need a causal LM head)");
  return core::ok_status();
}

void Server::completions(const httplib::Request& req, httplib::Response& res) {
  if (const Status st = check_generates(); !st.ok()) return fail(res, st);
  auto r = api::parse_completion(req.body, limits_);
  if (!r.ok()) return fail(res, r.status());
  auto g = std::make_shared<Generation>();
  auto ids = tokens(r->prompt, false);
  if (!ids.ok()) return fail(res, ids.status());
  g->prompt = *ids;
  const int64_t ctx = limits_.max_positions;
  if (static_cast<int64_t>(g->prompt.size()) + r->max_tokens > ctx)
    return send_error(res, 400, "the prompt's " + std::to_string(g->prompt.size()) + " tokens plus max_tokens " +
                                    std::to_string(r->max_tokens) + " exceed the context of " + std::to_string(ctx) +
                                    " positions");
  answer(req, Shape{false, "cmpl-" + std::to_string(++next_id_), model_name_}, *r, g, res);
}

void Server::chat_completions(const httplib::Request& req, httplib::Response& res) {
  if (const Status st = check_generates(); !st.ok()) return fail(res, st);
  const model::ChatTemplate* tmpl = engine_.chat_template();
  if (tmpl == nullptr || engine_.tokenizer() == nullptr)
    return send_error(res, 400, "this model has no chat template (tokenizer_config.json's chat_template): use /v1/completions");
  auto r = api::parse_chat(req.body, limits_);
  if (!r.ok()) return fail(res, r.status());
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (!r->tools.is_null()) extra["tools"] = r->tools;
  auto prompt = tmpl->render_ordered(r->messages, true, extra);
  if (!prompt.ok()) return send_error(res, 400, "the chat template: " + prompt.status().message());
  auto g = std::make_shared<Generation>();
  auto ids = model::chat_prompt_ids(*engine_.tokenizer(), *prompt, tmpl->bos_token());
  if (!ids.ok()) return fail(res, ids.status());
  g->prompt = *ids;
  const int64_t ctx = limits_.max_positions;
  const auto used = static_cast<int64_t>(g->prompt.size());
  if (used >= ctx || (r->max_tokens_given && used + r->sampling.max_tokens > ctx))
    return send_error(res, 400, "the conversation's " + std::to_string(used) + " tokens" +
                                    (r->max_tokens_given ? " plus max_tokens " + std::to_string(r->sampling.max_tokens) : "") +
                                    " exceed the context of " + std::to_string(ctx) + " positions");
  answer(req, Shape{true, "chatcmpl-" + std::to_string(++next_id_), model_name_}, r->sampling, g, res);
}

void Server::answer(const httplib::Request& req, const Shape& shape, const api::CompletionRequest& r,
                    const std::shared_ptr<Generation>& g, httplib::Response& res) {
  if (!r.stream) {
    // A client that leaves is seen at the next token (a stream sees it when
    // a write fails); its request stops there and frees the model.
    const int conn = connection_socket(req);
    return admitted(res, [&] {
      if (client_closed(conn)) {  // it left while the request waited in the queue
        metrics_.abandoned();
        return send_error(res, 499, "the client closed the connection");
      }
      const auto deadline = Clock::now() + std::chrono::milliseconds(opts_.deadline_ms);
      if (const Status echoed = echo_prompt(r, *g); !echoed.ok()) return fail(res, echoed);
      // Each choice from the prompt (and its echo).
      std::vector<Generation> gs(static_cast<size_t>(r.n), *g);
      std::vector<std::string> texts(gs.size());
      ChoiceHooks hooks;
      hooks.emit = [&](size_t i, const std::string& t, int64_t) {
        texts[i] += t;
        return !client_closed(conn);
      };
      const Status st = run_choices(r, gs, deadline, conn, hooks);
      if (client_closed(conn)) {
        metrics_.abandoned();
        return send_error(res, 499, "the client closed the connection");
      }
      if (!st.ok()) return fail(res, st);
      res.set_content(shape.whole(texts, gs, engine_.tokenizer()).dump(), "application/json");
    });
  }
  if (!admit(res)) return;
  // Streamed: the generation runs in the content provider, after the
  // headers; an error past that point is one last event before [DONE].
  const auto request = std::make_shared<api::CompletionRequest>(r);
  const auto deadline = Clock::now() + std::chrono::milliseconds(opts_.deadline_ms);
  // The queue is left once the tokens are made, before the last events are
  // written: a client that sends its next request on [DONE] must find the
  // slot free (it raced the releaser below and got 429s).
  const auto left = std::make_shared<std::atomic<bool>>(false);
  const auto leave = [this, left] {
    if (!left->exchange(true)) admission_.leave();
  };
  res.set_header("Cache-Control", "no-cache");
  // The provider runs on this connection's thread while it is open.
  const int conn = connection_socket(req);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, request, g, shape, deadline, leave, conn](size_t, httplib::DataSink& sink) {
        const auto event = [&](const json& j) {
          const std::string s = "data: " + j.dump() + "\n\n";
          return sink.write(s.data(), s.size());
        };
        const model::Tokenizer* tok = engine_.tokenizer();
        // Choices may run side by side (run_choices): their events go out
        // one at a time, and `alive` is shared.
        std::mutex events;
        bool alive = true;
        Status st = core::ok_status();
        std::vector<Generation> gs;
        size_t finished = 0, last_choice = 0;
        if (!admission_.acquire(deadline)) {
          st = core::timeout_error("the request's deadline passed while it waited in the queue");
        } else try {
          st = echo_prompt(*request, *g);
          if (st.ok()) gs.assign(static_cast<size_t>(request->n), *g);
          // Each choice but the last to finish ends with its finish event
          // here; the last one after the queue is left (below).
          ChoiceHooks hooks;
          hooks.start = [&](size_t i) {
            std::lock_guard<std::mutex> l(events);
            Generation& c = gs[i];
            const auto index = static_cast<int64_t>(i);
            if (const auto first = shape.opening(index)) alive = alive && event(*first);
            if (alive && (!c.echo_text.empty() || c.logprobs_sent < c.logprobs.size()))
              alive = event(shape.chunk(index, c.echo_text, json::array(), nullptr, shape.unsent_logprobs(c, tok)));
            return alive;
          };
          hooks.emit = [&](size_t i, const std::string& text, int64_t token) {
            std::lock_guard<std::mutex> l(events);
            if (shape.chat && text.empty()) return alive;  // a chat delta carries text (its logprobs wait)
            alive = alive && event(shape.chunk(static_cast<int64_t>(i), text, token < 0 ? json::array() : json::array({token}),
                                               nullptr, shape.unsent_logprobs(gs[i], tok)));
            return alive;
          };
          hooks.done = [&](size_t i) {
            std::lock_guard<std::mutex> l(events);
            if (++finished == gs.size()) {
              last_choice = i;
              return alive;
            }
            alive = alive && event(shape.chunk(static_cast<int64_t>(i), "", json::array(), gs[i].finish,
                                               shape.unsent_logprobs(gs[i], tok)));
            return alive;
          };
          if (st.ok() && !gs.empty()) st = run_choices(*request, gs, deadline, conn, hooks);
          admission_.release();
        } catch (const std::exception& e) {
          // A provider runs outside httplib's handler: an exception here
          // would end the process. It ends the stream with an error instead.
          admission_.release();
          st = core::internal_error(std::string("the request failed: ") + e.what());
        }
        leave();
        if (alive) {
          if (!st.ok()) {
            std::string message;
            const int status = http_status(st, &message);
            event(api::error_body(message, error_type(status)));
          } else if (!gs.empty() && finished == gs.size()) {  // (a client that closed its side stops the choices early)
            Generation& c = gs[last_choice];
            json last = shape.chunk(static_cast<int64_t>(last_choice), "", json::array(), c.finish, shape.unsent_logprobs(c, tok));
            if (request->include_usage) last["usage"] = usage(gs);
            event(last);
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
        }
        sink.done();
        return true;
      },
      [leave](bool) { leave(); });
}

}  // namespace tessera::runtime::serve_detail
