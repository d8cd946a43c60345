// `tessera serve` as a real process on 127.0.0.1, spoken to over HTTP:
// answers equal the single device (computed here, in process), the limits
// answer 429/413/401/400, hostile and departing clients cost the others
// nothing, and SIGTERM drains (failover: serve_failover_test.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <map>
#include <sstream>

#include "model/image.h"
#include "serve_harness.h"

namespace tessera {
namespace {

using namespace serve_testing;

TEST(ServeTest, CompletionsEqualTheSingleDevice) {
  Server s({"--model", kData + "/gpt2-tiny", "--devices", "2", "--strategy", "tp"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const auto want = reference_tokens(kPrompt, 20);
  auto r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 20}, {"temperature", 0}, {"extra_field", {1, 2}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int64_t>>(), want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], kPrompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 20);

  const Stream st = stream_completion(s, {{"prompt", kPrompt}, {"max_tokens", 20}, {"temperature", 0}, {"stream", true}});
  EXPECT_EQ(st.tokens, want);
  EXPECT_EQ(st.finish, "length");
  EXPECT_TRUE(st.done);

  // Seeded sampling: the same seed gives the same tokens.
  const json sampled = {{"prompt", kPrompt}, {"max_tokens", 10}, {"temperature", 0.9}, {"top_k", 40}, {"seed", 5}};
  auto a = s.post("/v1/completions", sampled), b = s.post("/v1/completions", sampled);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(json::parse(a->body)["choices"][0]["token_ids"], json::parse(b->body)["choices"][0]["token_ids"]);

  auto models = s.client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "gpt2-tiny");
  const json h = s.health();
  EXPECT_EQ(h["status"], "ok") << h.dump();
  EXPECT_EQ(h["devices"].size(), 2u);
  auto metrics = s.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("tessera_requests_total{status=\"200\"}"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("tessera_request_duration_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
  // Every token generated is a request's first (TTFT) or follows another (inter-token).
  const auto number = [&](const std::string& name) {
    const size_t at = metrics->body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::atof(metrics->body.c_str() + at + name.size() + 2);
  };
  const double tokens = number("tessera_tokens_generated_total");
  EXPECT_GE(tokens, 40) << metrics->body;
  EXPECT_EQ(number("tessera_time_to_first_token_seconds_count") + number("tessera_inter_token_seconds_count"), tokens);
  EXPECT_GT(number("tessera_time_to_first_token_seconds_count"), 0);
  s.proc().signal(SIGTERM);
  EXPECT_EQ(s.proc().wait_exit(), 0) << s.proc().log();
}


// Continuous batching (--max-batch): concurrent clients, streamed and
// whole, each get the tokens one device gives their prompt alone, and
// /metrics counts every decode row in the batch occupancy.
void batched_completions(const std::vector<std::string>& plan) {
  std::vector<std::string> args{"--model", kData + "/gpt2-tiny", "--max-batch", "4", "--link", "1gbit,1ms"};
  args.insert(args.end(), plan.begin(), plan.end());
  Server s(args);
  ASSERT_TRUE(s.up()) << s.proc().log();
  const auto prompts = batch_prompts();
  const int64_t n = 24;
  std::vector<std::vector<int64_t>> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      const json body = {{"prompt", prompts[i]}, {"max_tokens", n}, {"temperature", 0}, {"stream", i % 2 == 0}};
      if (i % 2 == 0) {
        got[i] = stream_completion(s, body).tokens;
      } else if (auto r = s.post("/v1/completions", body); r && r->status == 200) {
        got[i] = json::parse(r->body)["choices"][0]["token_ids"].get<std::vector<int64_t>>();
      }
    });
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], reference_tokens(prompts[i], n)) << "client " << i;
  auto metrics = s.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  // Each generation's first token comes from its prefill, every other from one batched step.
  EXPECT_EQ(metric(metrics->body, "tessera_batch_occupancy_sum"), static_cast<double>(prompts.size() * (n - 1)))
      << metrics->body;
  EXPECT_GT(metric(metrics->body, "tessera_batch_occupancy_count"), 0) << metrics->body;
  EXPECT_EQ(metric(metrics->body, "tessera_failovers_total"), 0) << metrics->body << s.proc().log();
  s.proc().signal(SIGTERM);
  EXPECT_EQ(s.proc().wait_exit(), 0) << s.proc().log();
}

TEST(ServeTest, BatchedCompletionsEachEqualTheSingleDevice) { batched_completions({"--devices", "2", "--strategy", "tp"}); }

// A pipeline of 2 processes keeps a group of the streams at each stage
// (overlapped steps): the same tokens, every row counted once.
TEST(ServeTest, OverlappedPipelineCompletionsEachEqualTheSingleDevice) {
  batched_completions({"--devices", "2", "--strategy", "pipeline"});
}

// The events of an SSE body, "[DONE]" excluded (which must end it).
std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  bool done = false;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    out.push_back(json::parse(data));
  }
  EXPECT_TRUE(done) << body;
  return out;
}

// /v1/chat/completions on 2 devices: the messages rendered by the model's
// template (ChatML, written out here by hand) answer what /v1/completions
// answers for that text; streamed and whole agree; usage, max_tokens and
// stop hold; bad messages get 400 and the server keeps serving.
// "logprobs" on /v1/completions: each token's log-probability and its top
// alternatives under the distribution one device computes (in process
// here; tp on 2 serves), whole, streamed, echoed, and with a logit_bias. gpt2-tiny has no tokenizer, so
// tokens read "token_id:N".
TEST(ServeTest, LogprobsAreThoseOfTheSingleDevice) {
  Server s({"--model", kData + "/gpt2-tiny", "--devices", "2", "--strategy", "tp"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const int64_t n = 8, top = 3;
  const ReferenceLogits ref = reference_logits(kPrompt, n);
  ASSERT_EQ(ref.rows.size(), static_cast<size_t>(n));
  const json body = {{"prompt", kPrompt}, {"max_tokens", n}, {"temperature", 0}, {"logprobs", top}};
  auto r = s.post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json whole = json::parse(r->body)["choices"][0];
  EXPECT_EQ(whole["token_ids"].get<std::vector<int64_t>>(), ref.tokens);
  const json& lp = whole["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(n)) << lp.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), static_cast<size_t>(n));
  ASSERT_EQ(lp["top_logprobs"].size(), static_cast<size_t>(n));
  ASSERT_EQ(lp["text_offset"].size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<float>& row = ref.rows[static_cast<size_t>(i)];
    const auto vocab = static_cast<int64_t>(row.size());
    const model::TokenLogprobs all = model::token_logprobs(row.data(), vocab, ref.tokens[static_cast<size_t>(i)], vocab);
    std::map<std::string, float> by_name;
    for (const auto& [id, v] : all.top) by_name["token_id:" + std::to_string(id)] = v;
    EXPECT_EQ(lp["tokens"][static_cast<size_t>(i)], "token_id:" + std::to_string(ref.tokens[static_cast<size_t>(i)]));
    EXPECT_NEAR(lp["token_logprobs"][static_cast<size_t>(i)].get<double>(), all.logprob, 1e-4) << i;
    // The alternatives: `top` of them, each with its own log-probability, none
    // below the reference's top-th (near-ties may swap which one is listed).
    const json& alts = lp["top_logprobs"][static_cast<size_t>(i)];
    ASSERT_EQ(alts.size(), static_cast<size_t>(top)) << alts.dump();
    for (const auto& [name, v] : alts.items()) {
      ASSERT_TRUE(by_name.contains(name)) << name;
      EXPECT_NEAR(v.get<double>(), by_name[name], 1e-4) << name;
      EXPECT_GE(v.get<double>(), all.top[static_cast<size_t>(top - 1)].second - 1e-4) << name;
    }
  }

  // Streamed: each token's event carries its own entry, the same figures.
  json streamed_body = body;
  streamed_body["stream"] = true;
  r = s.post("/v1/completions", streamed_body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<double> streamed;
  for (const json& e : sse_events(r->body)) {
    if (!e.contains("choices")) continue;
    const json& c = e["choices"][0];
    if (c["logprobs"].is_null()) continue;
    EXPECT_EQ(c["logprobs"]["token_logprobs"].size(), c["token_ids"].size()) << e.dump();
    for (const json& v : c["logprobs"]["token_logprobs"]) streamed.push_back(v.get<double>());
  }
  ASSERT_EQ(streamed.size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(streamed[static_cast<size_t>(i)], lp["token_logprobs"][static_cast<size_t>(i)].get<double>(), 1e-6);
  // Without "logprobs" the field stays null.
  r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_TRUE(r);
  EXPECT_TRUE(json::parse(r->body)["choices"][0]["logprobs"].is_null()) << r->body;

  // logit_bias -100 bans the first greedy token: the pick is its row's next
  // best, and its logprob still the model's own.
  std::vector<float> row0 = ref.rows[0];
  row0[static_cast<size_t>(ref.tokens[0])] = -INFINITY;
  const int64_t next_best = std::max_element(row0.begin(), row0.end()) - row0.begin();
  r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 0},
                                 {"logit_bias", {{std::to_string(ref.tokens[0]), -100}}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json banned = json::parse(r->body)["choices"][0];
  EXPECT_EQ(banned["token_ids"], json::array({next_best}));
  const auto vocab0 = static_cast<int64_t>(ref.rows[0].size());
  EXPECT_NEAR(banned["logprobs"]["token_logprobs"][0].get<double>(),
              model::token_logprobs(ref.rows[0].data(), vocab0, next_best, 0).logprob, 1e-4);

  // "echo" (how evaluation harnesses score a text): the prompt's tokens come
  // first, each with its log-probability given the tokens before it (the
  // first has none), from the single device's forward over every row; then
  // the new tokens, as without echo.
  r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 2}, {"temperature", 0}, {"logprobs", 1}, {"echo", true}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json echoed = json::parse(r->body)["choices"][0]["logprobs"];
  const size_t p = kPrompt.size();
  ASSERT_EQ(echoed["token_logprobs"].size(), p + 2) << echoed.dump();
  EXPECT_TRUE(echoed["token_logprobs"][0].is_null());
  EXPECT_TRUE(echoed["top_logprobs"][0].is_null());
  const core::Tensor logits = reference_forward("gpt2-tiny", {kPrompt, {}, {}}).logits;
  const int64_t vocab = logits.numel() / static_cast<int64_t>(p);  // [p, V]
  for (size_t i = 1; i < p; ++i) {
    EXPECT_EQ(echoed["tokens"][i], "token_id:" + std::to_string(kPrompt[i]));
    const float want = model::token_logprobs(logits.f32() + static_cast<int64_t>(i - 1) * vocab, vocab, kPrompt[i], 0).logprob;
    EXPECT_NEAR(echoed["token_logprobs"][i].get<double>(), want, 1e-4) << i;
    EXPECT_EQ(echoed["top_logprobs"][i].size(), 1u);
  }
  for (size_t i = 0; i < 2; ++i)
    EXPECT_NEAR(echoed["token_logprobs"][p + i].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-6) << i;
}

// "n": several choices of one prompt, each the generation its own seed
// gives (api::choice_seed: choice 0 keeps the request's), whole and
// streamed; greedy choices are all the single device's.
// With --max-batch the choices run side by side, each a sequence of the
// batched steps: the same tokens.
void several_choices(const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = {"--model", kData + "/gpt2-tiny", "--devices", "2", "--strategy", "tp"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  Server s(args);
  ASSERT_TRUE(s.up()) << s.proc().log();
  const auto tokens_of = [&](const json& body) {
    auto r = s.post("/v1/completions", body);
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    return r ? json::parse(r->body) : json();
  };
  const json sampled = {{"prompt", kPrompt}, {"max_tokens", 10}, {"temperature", 0.9}, {"seed", 5}};
  json three = sampled;
  three["n"] = 3;
  const json whole = tokens_of(three);
  ASSERT_EQ(whole["choices"].size(), 3u) << whole.dump();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < 3; ++i) {
    const json& c = whole["choices"][i];
    EXPECT_EQ(c["index"], i);
    json alone = sampled;
    alone["seed"] = static_cast<int64_t>(runtime::api::choice_seed(5, static_cast<int64_t>(i)));  // the API reads int64
    EXPECT_EQ(c["token_ids"], tokens_of(alone)["choices"][0]["token_ids"]) << i;
    completion_tokens += static_cast<int64_t>(c["token_ids"].size());
  }
  EXPECT_NE(whole["choices"][0]["token_ids"], whole["choices"][1]["token_ids"]);
  EXPECT_EQ(whole["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(whole["usage"]["prompt_tokens"], kPrompt.size());

  // Streamed: each event names its choice; a finish event each.
  json streamed_body = three;
  streamed_body["stream"] = true;
  auto r = s.post("/v1/completions", streamed_body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<std::vector<int64_t>> streamed(3);
  int finishes = 0;
  for (const json& e : sse_events(r->body)) {
    if (!e.contains("choices")) continue;
    const json& c = e["choices"][0];
    const auto i = c["index"].get<size_t>();
    ASSERT_LT(i, 3u);
    for (const json& t : c["token_ids"]) streamed[i].push_back(t.get<int64_t>());
    finishes += !c["finish_reason"].is_null();
  }
  EXPECT_EQ(finishes, 3);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(json(streamed[i]), whole["choices"][i]["token_ids"]) << i;

  // Greedy: every choice is the single device's.
  const json greedy = tokens_of({{"prompt", kPrompt}, {"max_tokens", 6}, {"temperature", 0}, {"n", 2}});
  ASSERT_EQ(greedy["choices"].size(), 2u);
  for (const json& c : greedy["choices"]) EXPECT_EQ(c["token_ids"].get<std::vector<int64_t>>(), reference_tokens(kPrompt, 6));
}

TEST(ServeTest, SeveralChoicesEachAreTheirSeedsGeneration) {
  several_choices({});
  several_choices({"--max-batch", "4"});
}

TEST(ServeTest, ChatCompletionsRenderTheTemplate) {
  Server s({"--model", kData + "/gpt2-chat", "--devices", "2", "--strategy", "tp"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const json messages = json::array({{{"role", "system"}, {"content", "You are terse."}},
                                     {{"role", "user"}, {"content", "Say hello to the world"}}});
  const std::string rendered =
      "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay hello to the world<|im_end|>\n<|im_start|>assistant\n";
  auto plain = s.post("/v1/completions", {{"prompt", rendered}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  const json want = json::parse(plain->body);

  // /tokenize counts the text as /v1/completions does; /detokenize gives it back.
  auto tk = s.post("/tokenize", {{"content", rendered}});
  ASSERT_TRUE(tk);
  ASSERT_EQ(tk->status, 200) << tk->body;
  const json tokenized = json::parse(tk->body);
  EXPECT_EQ(tokenized["count"], want["usage"]["prompt_tokens"]);
  EXPECT_EQ(tokenized["tokens"].size(), tokenized["count"].get<size_t>());
  tk = s.post("/detokenize", {{"tokens", tokenized["tokens"]}});
  ASSERT_TRUE(tk);
  ASSERT_EQ(tk->status, 200) << tk->body;
  EXPECT_EQ(json::parse(tk->body)["content"], rendered);

  auto r = s.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json got = json::parse(r->body);
  EXPECT_EQ(got["object"], "chat.completion");
  EXPECT_EQ(got["choices"][0]["message"]["role"], "assistant");
  const std::string content = got["choices"][0]["message"]["content"];
  EXPECT_EQ(content, want["choices"][0]["text"]);
  EXPECT_EQ(got["choices"][0]["finish_reason"], want["choices"][0]["finish_reason"]);
  EXPECT_EQ(got["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"]);
  EXPECT_EQ(got["usage"]["completion_tokens"], want["usage"]["completion_tokens"]);
  EXPECT_EQ(got["usage"]["total_tokens"],
            got["usage"]["prompt_tokens"].get<int64_t>() + got["usage"]["completion_tokens"].get<int64_t>());
  if (got["choices"][0]["finish_reason"] == "length") {
    EXPECT_EQ(got["usage"]["completion_tokens"], 8);
  }

  // Streamed: the role first, the same text in deltas, the finish reason and usage last.
  r = s.post("/v1/chat/completions", {{"messages", messages}, {"max_completion_tokens", 8}, {"temperature", 0},
                                      {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::vector<json> events = sse_events(r->body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  for (size_t i = 1; i + 1 < events.size(); ++i) streamed += events[i]["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(streamed, content);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], got["choices"][0]["finish_reason"]);
  EXPECT_EQ(events.back()["usage"], got["usage"]);

  // Two choices: greedy, both the same answer.
  r = s.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"n", 2}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json two = json::parse(r->body);
  ASSERT_EQ(two["choices"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(two["choices"][i]["index"], i);
    EXPECT_EQ(two["choices"][i]["message"]["content"], content);
  }
  EXPECT_EQ(two["usage"]["completion_tokens"], 2 * got["usage"]["completion_tokens"].get<int64_t>());

  // "logprobs" with "top_logprobs", streamed: every token's entry arrives
  // once (a token with no text yet waits for the next event), and a greedy
  // token is its row's most likely, the first alternative.
  r = s.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"stream", true},
                                      {"logprobs", true}, {"top_logprobs", 2}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<json> entries;
  for (const json& e : sse_events(r->body)) {
    if (!e.contains("choices") || e["choices"][0]["logprobs"].is_null()) continue;
    for (const json& x : e["choices"][0]["logprobs"]["content"]) entries.push_back(x);
  }
  EXPECT_EQ(static_cast<int64_t>(entries.size()), got["usage"]["completion_tokens"].get<int64_t>());
  for (const json& x : entries) {
    ASSERT_EQ(x["top_logprobs"].size(), 2u) << x.dump();
    EXPECT_EQ(x["token"], x["top_logprobs"][0]["token"]) << x.dump();
    EXPECT_EQ(x["logprob"], x["top_logprobs"][0]["logprob"]) << x.dump();
    EXPECT_LE(x["logprob"].get<double>(), 0.0);
    EXPECT_GE(x["top_logprobs"][0]["logprob"].get<double>(), x["top_logprobs"][1]["logprob"].get<double>());
    std::string bytes;
    for (const json& b : x["bytes"]) bytes.push_back(static_cast<char>(b.get<int>()));
    EXPECT_EQ(bytes, x["token"].get<std::string>());
  }

  // max_tokens and stop are honoured.
  r = s.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 2}, {"temperature", 0}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_LE(json::parse(r->body)["usage"]["completion_tokens"].get<int64_t>(), 2);
  if (content.size() >= 3) {
    const std::string stop = content.substr(1, 2);
    r = s.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"stop", stop}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(j["choices"][0]["message"]["content"], content.substr(0, content.find(stop)));
  }

  // Bad messages: 400 with OpenAI's error body, and the server goes on.
  for (const json& bad : {json{{"messages", json::array()}}, json{{"messages", "hi"}},
                          json{{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}},
                          json{{"messages", json::array({{{"role", "user"}}})}},
                          json{{"messages", json::array({{{"role", "user"}, {"content", 3}}})}},
                          json{{"messages", messages}, {"max_tokens", 100000}}}) {
    r = s.post("/v1/chat/completions", bad);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad.dump() << " " << r->body;
    EXPECT_TRUE(json::parse(r->body).contains("error")) << r->body;
  }
  // A known endpoint with the wrong method: 405 and the method that works.
  auto g = s.client().Get("/v1/chat/completions");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 405);
  EXPECT_EQ(g->get_header_value("Allow"), "POST");
  auto p = s.client().Post("/health", "", "application/json");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 405);
  EXPECT_EQ(s.health()["status"], "ok");
}

// --prefix-cache-mb: a 2-turn chat (each turn sends the whole history; the
// fixture's 128 positions hold no third)
// answers as the server without the cache does, and /metrics counts the
// turns whose history came from the cache.
// With tp, and with a pair (Voltage's prefill, the terminal's decode: a
// second turn's reused prefix is the terminal's alone).
TEST(ServeTest, PrefixCacheAnswersAChatAsWithoutItAndCountsItsHits) {
  std::vector<std::vector<std::string>> answers;
  for (const std::vector<std::string>& plan : {std::vector<std::string>{"--strategy", "tp"},
                                              std::vector<std::string>{"--strategy", "voltage", "--decode-strategy", "single"}}) {
    for (const bool cached : {false, true}) {
      std::vector<std::string> args = {"--model", kData + "/gpt2-chat", "--devices", "2"};
      args.insert(args.end(), plan.begin(), plan.end());
      if (cached) args.insert(args.end(), {"--prefix-cache-mb", "64"});
      Server s(args);
      ASSERT_TRUE(s.up()) << s.proc().log();
      json messages = json::array();
      std::vector<std::string> got;
      for (const char* user : {"Say hello", "Again"}) {
        messages.push_back({{"role", "user"}, {"content", user}});
        auto r = s.post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 4}, {"temperature", 0}});
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const std::string content = json::parse(r->body)["choices"][0]["message"]["content"];
        got.push_back(content);
        messages.push_back({{"role", "assistant"}, {"content", content}});
      }
      answers.push_back(got);
      auto m = s.client().Get("/metrics");
      ASSERT_TRUE(m);
      const auto counter = [&](const std::string& name) {
        const size_t at = m->body.find("\n" + name + " ");
        return at == std::string::npos ? int64_t{-1} : std::atoll(m->body.c_str() + at + name.size() + 2);
      };
      EXPECT_EQ(counter("tessera_prefix_cache_lookups_total"), cached ? 2 : 0);
      EXPECT_EQ(counter("tessera_prefix_cache_hits_total"), cached ? 1 : 0);  // the second turn
      if (cached) {
        EXPECT_GT(counter("tessera_prefix_cache_tokens_total"), 40);  // the first turn's 47 prompt tokens, and more
      }
    }
  }
  for (size_t i = 1; i < answers.size(); ++i) EXPECT_EQ(answers[i], answers[0]) << i;
}

TEST(ServeTest, EmbeddingsAndClassificationEqualTheSingleDevice) {
  Server s({"--model", kData + "/bert-tiny", "--devices", "2", "--strategy", "tp"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const std::vector<int64_t> a = {101, 7, 300, 41, 102}, b = {101, 9, 102};
  auto r = s.post("/v1/embeddings", {{"input", {a, b}}, {"model", "bert-tiny"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["pooling"], "pooler");
  ASSERT_EQ(j["data"].size(), 2u);
  expect_near(embedding_of(j["data"][0]["embedding"]), reference_forward("bert-tiny", {a, {}, {}}).pooler);
  expect_near(embedding_of(j["data"][1]["embedding"]), reference_forward("bert-tiny", {b, {}, {}}).pooler);
  r = s.post("/v1/embeddings", {{"input", a}, {"encoding_format", "base64"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  expect_near(embedding_of(json::parse(r->body)["data"][0]["embedding"]), reference_forward("bert-tiny", {a, {}, {}}).pooler);

  r = s.post("/v1/classify", {{"input", {a}}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  const core::Tensor logits = reference_forward("bert-tiny", {a, {}, {}}).logits;
  for (const auto& l : j["data"][0]["labels"]) {
    const int k = l["label"].get<std::string>().back() - '0';
    EXPECT_NEAR(l["logit"].get<float>(), logits.f32()[k], 1e-4f);
  }
  EXPECT_GE(j["data"][0]["score"].get<double>(), j["data"][0]["labels"][2]["score"].get<double>());
}

TEST(ServeTest, ImageClassificationEqualsTheSingleDevice) {
  Server s({"--model", kData + "/vit-tiny", "--devices", "2", "--strategy", "tp"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const std::string png = core::read_file(kData + "/../fuzz/corpus/fuzz_image/rgb.png").value();
  auto r = s.post("/v1/classify", {{"image", runtime::api::base64_encode(png)}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto pp = model::load_image_preprocess(kData + "/vit-tiny", 32).value();
  const core::Tensor logits = reference_forward("vit-tiny", {{}, {}, model::decode_image(png, pp, "png").value()}).logits;
  const json j = json::parse(r->body);
  ASSERT_EQ(j["data"][0]["labels"].size(), 10u);
  for (const auto& l : j["data"][0]["labels"]) {
    const int k = l["label"].get<std::string>().back() - '0';
    EXPECT_NEAR(l["logit"].get<float>(), logits.f32()[k], 1e-4f);
  }
  // An image that does not decode is the client's error.
  r = s.post("/v1/classify", {{"image", runtime::api::base64_encode("not an image at all")}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
}

TEST(ServeTest, BadRequestsGet400AndDoNotDisturbOthers) {
  Server s({"--model", kData + "/gpt2-tiny", "--devices", "1"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const auto want = reference_tokens(kPrompt, 8);
  const json good = {{"prompt", kPrompt}, {"max_tokens", 8}, {"temperature", 0}};
  for (const std::string& bad : {std::string("{"), std::string("[]"), std::string(R"({"prompt":5})"),
                                 std::string(R"({"prompt":[1],"max_tokens":"many"})"), std::string(R"({"prompt":[100000]})"),
                                 std::string(R"({"prompt":[1,2],"max_tokens":127})"),
                                 std::string(R"({"prompt":"text, but this model has no tokenizer"})")}) {
    auto r = s.client().Post("/v1/completions", bad, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad << " -> " << r->body;
    const json e = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(e["error"]["message"].is_string()) << r->body;
    EXPECT_EQ(e["error"]["type"], "invalid_request_error") << r->body;
    auto ok = s.post("/v1/completions", good);
    ASSERT_TRUE(ok);
    ASSERT_EQ(ok->status, 200) << ok->body;
    EXPECT_EQ(json::parse(ok->body)["choices"][0]["token_ids"].get<std::vector<int64_t>>(), want);
  }
  // Embeddings of GPT-2 (mean pooling) work; classification does not exist,
  // nor (without a tokenizer) /tokenize and /detokenize.
  auto r = s.post("/v1/classify", {{"input", kPrompt}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  for (const char* path : {"/tokenize", "/detokenize"}) {
    r = s.post(path, {{"content", "x"}, {"tokens", kPrompt}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << path << " " << r->body;
  }
  r = s.post("/v1/embeddings", {{"input", kPrompt}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["pooling"], "mean");
}

TEST(ServeTest, BodyOverTheLimitGets413) {
  const auto began = Clock::now();
  Server s({"--model", kData + "/gpt2-tiny", "--devices", "1", "--max-body", "2048"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  std::vector<int64_t> many(1500, 1);
  auto r = s.post("/v1/completions", {{"prompt", many}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413) << r->body;
  EXPECT_TRUE(json::parse(r->body, nullptr, false)["error"]["message"].is_string()) << r->body;
  // Judged from the header alone, before any body: an oversize declaration
  // gets its 413 and a malformed one a 400 (the body is never sent here).
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ";
  EXPECT_EQ(s.raw_head(head + "1000000000\r\n\r\n").rfind("HTTP/1.1 413", 0), 0u);
  EXPECT_EQ(s.raw_head(head + "-5\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // A request line httplib refuses before routing counts no time: the
  // durations add up to less than this test has run (not the clock's age).
  EXPECT_EQ(s.raw_head("GARBAGE\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  const std::string name = "\ntessera_request_duration_seconds_sum ";
  const size_t at = m->body.find(name);
  ASSERT_NE(at, std::string::npos) << m->body;
  EXPECT_LT(std::atof(m->body.c_str() + at + name.size()), std::chrono::duration<double>(Clock::now() - began).count())
      << m->body;
}

// Connections that hold a thread: idle ones, ones stuck in their request
// line, and ones that declared a huge body. Each connection has its own
// thread (--max-connections), so none of them delays /health or a
// completion; before, 20 such clients took every HTTP thread for 30 s.
TEST(ServeTest, IdleAndSlowConnectionsDoNotStarveOthers) {
  Server s({"--model", kData + "/gpt2-tiny", "--devices", "1", "--queue", "2"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  std::vector<int> held;
  auto open = [&](const std::string& first_bytes) {
    const int fd = s.connect_raw();
    ASSERT_GE(fd, 0);
    if (!first_bytes.empty()) {
      ASSERT_EQ(::send(fd, first_bytes.data(), first_bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(first_bytes.size()));
    }
    held.push_back(fd);
  };
  for (int i = 0; i < 100; ++i) open("");
  for (int i = 0; i < 20; ++i) open("GET /health HTTP/1.1\r\nHo");
  for (int i = 0; i < 20; ++i) open("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n");
  // Answered while all of them stay open (a starved server times out here).
  httplib::Client c = s.client();
  c.set_read_timeout(std::chrono::seconds(20));
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto r = c.Post("/v1/completions", json{{"prompt", kPrompt}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  for (int fd : held) ::close(fd);
}

// Whole (not streamed) completions whose clients left stop at the next
// token or, still queued, never start: the model is free for the next
// client (before, each ran all its tokens for nobody).
// One at a time (two of the three wait in the queue), and batched (all three
// decode together and each leaves the batch at its next step).
TEST(ServeTest, AbandonedWholeCompletionsStop) {
  for (const char* batch : {"1", "3"}) {
    SCOPED_TRACE(std::string("--max-batch ") + batch);
    // 5 ms links: every token takes at least 10 ms, 100 tokens a second or more.
    Server s({"--model", kData + "/gpt2-tiny", "--devices", "2", "--strategy", "tp", "--link", "1gbit,5ms", "--max-batch", batch});
    ASSERT_TRUE(s.up()) << s.proc().log();
    const std::string body = json{{"prompt", kPrompt}, {"max_tokens", 100}, {"temperature", 0}}.dump();
    const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    std::vector<int> fds;
    for (int i = 0; i < 3; ++i) {
      fds.push_back(s.connect_raw());
      ASSERT_GE(fds.back(), 0);
      ASSERT_EQ(::send(fds.back(), request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    }
    // All three admitted (generating, or queued behind the one), then their clients leave.
    bool admitted = false;
    for (const auto end = Clock::now() + std::chrono::seconds(60); !admitted && Clock::now() < end;) {
      admitted = s.health().value("queue_depth", 0) >= 3;
      if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(admitted) << s.proc().log();
    for (int fd : fds) ::close(fd);
    bool stopped = false;
    std::string metrics;
    for (const auto end = Clock::now() + std::chrono::seconds(60); !stopped && Clock::now() < end;) {
      auto m = s.client().Get("/metrics");
      metrics = m ? m->body : "";
      stopped = metrics.find("tessera_requests_abandoned_total 3") != std::string::npos;
      if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(stopped) << metrics;
    auto r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["token_ids"].get<std::vector<int64_t>>(), reference_tokens(kPrompt, 4));
  }
}

// A client that leaves while its long prompt is prefilled in chunks is seen
// between two chunks: its request ends there, before any token (before, the
// whole prompt was prefilled and a first token made for no one).
TEST(ServeTest, AClientThatLeavesDuringAChunkedPrefillGetsNoToken) {
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    // 120 chunks of one row over 5 ms links: over a second of prefill.
    Server s({"--model", kData + "/gpt2-tiny", "--devices", "2", "--strategy", "tp", "--link", "1gbit,5ms",
              "--max-batch", "2", "--prefill-chunk", "1"});
    ASSERT_TRUE(s.up()) << s.proc().log();
    std::vector<int64_t> prompt;
    for (int i = 0; i < 120; ++i) prompt.push_back(kPrompt[static_cast<size_t>(i) % kPrompt.size()]);
    const std::string body = json{{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"stream", stream}}.dump();
    const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    const int fd = s.connect_raw();
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    const auto queue_depth_is = [&](int want) {
      for (const auto end = Clock::now() + std::chrono::seconds(60); Clock::now() < end;) {
        if (s.health().value("queue_depth", -1) == want) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return false;
    };
    ASSERT_TRUE(queue_depth_is(1)) << s.proc().log();
    ::close(fd);
    ASSERT_TRUE(queue_depth_is(0)) << s.proc().log();
    auto m = s.client().Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_NE(m->body.find("tessera_tokens_generated_total 0\n"), std::string::npos) << m->body;
    auto r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["token_ids"].get<std::vector<int64_t>>(), reference_tokens(kPrompt, 4));
  }
}

TEST(ServeTest, MissingKeyGets401) {
  const std::string key_file = tmp("api.key");
  ASSERT_TRUE(core::write_file(key_file, "s3cret-key\n").ok());
  Server s({"--model", kData + "/gpt2-tiny", "--devices", "1", "--api-key", key_file});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const json body = {{"prompt", kPrompt}, {"max_tokens", 2}};
  for (const std::string& key : {std::string(), std::string("wrong"), std::string("s3cret-key\n")}) {
    auto r = s.post("/v1/completions", body, key);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << "key '" << key << "'";
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
  }
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 401);
  auto r = s.post("/v1/completions", body, "s3cret-key");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(s.client().Get("/health")->status, 200);  // for load balancers
}

// A request kept in flight by slow emulated links (every message waits
// 300 ms), seen through /health before the next step.
class SlowServer : public Server {
 public:
  explicit SlowServer(const std::vector<std::string>& extra)
      : Server(with(extra, {"--model", kData + "/bert-tiny", "--devices", "2", "--strategy", "tp", "--link", "1gbit,300ms"})) {}
  bool wait_in_flight(int n) {
    for (const auto end = Clock::now() + std::chrono::seconds(60); Clock::now() < end;) {
      const json h = health();
      if (h.is_object() && h.value("queue_depth", 0) >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  static std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
};

TEST(ServeTest, QueueOverflowGets429) {
  SlowServer s({"--queue", "1"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const std::vector<int64_t> ids = {101, 5, 6, 102};
  auto first = std::async(std::launch::async, [&] { return s.post("/v1/embeddings", {{"input", ids}}); });
  ASSERT_TRUE(s.wait_in_flight(1));
  auto r = s.post("/v1/embeddings", {{"input", ids}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_error");
  auto a = first.get();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 200) << a->body;
  expect_near(embedding_of(json::parse(a->body)["data"][0]["embedding"]), reference_forward("bert-tiny", {ids, {}, {}}).pooler);
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("tessera_requests_total{status=\"429\"} 1"), std::string::npos) << m->body;
}

TEST(ServeTest, SigtermDrainsTheRequestInFlightThenExitsZero) {
  SlowServer s({});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const std::vector<int64_t> ids = {101, 42, 43, 44, 102};
  auto first = std::async(std::launch::async, [&] { return s.post("/v1/embeddings", {{"input", ids}}); });
  ASSERT_TRUE(s.wait_in_flight(1));
  s.proc().signal(SIGTERM);
  auto a = first.get();
  ASSERT_TRUE(a) << s.proc().log();
  EXPECT_EQ(a->status, 200) << a->body;
  expect_near(embedding_of(json::parse(a->body)["data"][0]["embedding"]), reference_forward("bert-tiny", {ids, {}, {}}).pooler);
  EXPECT_EQ(s.proc().wait_exit(), 0) << s.proc().log();
  EXPECT_NE(s.proc().log().find("draining"), std::string::npos);
}

}  // namespace
}  // namespace tessera
