// The HTTP API's body parsers and helpers (runtime/serve_api.h): OpenAI's
// shapes accepted, unknown fields ignored, wrong types and sizes refused
// with a message, never an exception.
#include "runtime/serve_api.h"
#include "runtime/serve_admission.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "model/generate.h"
#include "model/tokenizer.h"

namespace tessera::runtime::api {
namespace {

const ApiLimits kLimits{512, 128, 8, 4};

TEST(ServeApiTest, CompletionDefaultsAndFields) {
  auto r = parse_completion(R"({"prompt":"hello","model":"x","logit_bias":{},"user":"u"})", kLimits);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r->prompt.text, "hello");
  EXPECT_EQ(r->max_tokens, 16);
  EXPECT_EQ(r->temperature, 1.0);
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->seed.has_value());

  r = parse_completion(R"({"prompt":[1,2,3],"max_tokens":5,"temperature":0,"top_p":0.5,"top_k":7,"seed":-3,
                          "stop":["a","bc"],"stream":true,"stream_options":{"include_usage":true},"n":1})",
                       kLimits);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prompt.ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(r->max_tokens, 5);
  EXPECT_EQ(r->temperature, 0.0);
  EXPECT_EQ(r->top_p, 0.5);
  EXPECT_EQ(r->top_k, 7);
  EXPECT_EQ(*r->seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r->stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  // A single-entry batch is the same prompt; a single stop string too.
  r = parse_completion(R"({"prompt":[[4,5]],"stop":"x"})", kLimits);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prompt.ids, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(r->stop, std::vector<std::string>{"x"});
}

TEST(ServeApiTest, CompletionRefusals) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "JSON"},
      {"[1,2]", "object"},
      {"{}", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":""})", "empty"},
      {R"({"prompt":[]})", "prompt"},
      {R"({"prompt":[1,"a"]})", "token ids"},
      {R"({"prompt":[512]})", "outside"},
      {R"({"prompt":[-1]})", "outside"},
      {R"({"prompt":[1.5]})", "token ids"},
      {R"({"prompt":["a","b"]})", "one prompt"},
      {R"({"prompt":"a","max_tokens":"5"})", "max_tokens"},
      {R"({"prompt":"a","max_tokens":-1})", "max_tokens"},
      {R"({"prompt":"a","max_tokens":129})", "max_tokens"},
      {R"({"prompt":[1,2,3],"max_tokens":126})", "positions"},
      {R"({"prompt":"a","temperature":"hot"})", "temperature"},
      {R"({"prompt":"a","temperature":3})", "temperature"},
      {R"({"prompt":"a","top_p":0})", "top_p"},
      {R"({"prompt":"a","top_k":-2})", "top_k"},
      {R"({"prompt":"a","seed":1.5})", "seed"},
      {R"({"prompt":"a","stream":"yes"})", "stream"},
      {R"({"prompt":"a","stop":[1]})", "stop"},
      {R"({"prompt":"a","stop":["a","b","c","d","e"]})", "stop"},
      {R"({"prompt":"a","stop":""})", "empty"},
      {R"({"prompt":"a","n":17})", "\"n\""},
      {R"({"prompt":"a","n":0})", "\"n\""},
      {R"({"prompt":"a","best_of":2})", "best_of"},
      {R"({"prompt":"a","stream_options":3})", "stream_options"},
      {R"({"prompt":"a","prompt":"b"})", "duplicate"},
  };
  for (const auto& [body, what] : cases) {
    auto r = parse_completion(body, kLimits);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << body << " -> " << r.status().message();
    // Every refusal is a client error (the server answers 400).
    const auto code = r.status().code();
    EXPECT_TRUE(code == core::ErrorCode::kInvalidArgument || code == core::ErrorCode::kParseError) << body;
  }
}

TEST(ServeApiTest, EmbeddingInputForms) {
  auto r = parse_embedding(R"({"input":"one"})", kLimits);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->inputs.size(), 1u);
  EXPECT_FALSE(r->base64);
  r = parse_embedding(R"({"input":["a","b"],"encoding_format":"base64"})", kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->inputs.size(), 2u);
  EXPECT_TRUE(r->base64);
  r = parse_embedding(R"({"input":[1,2,3]})", kLimits);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->inputs.size(), 1u);
  EXPECT_EQ(r->inputs[0].ids.size(), 3u);
  r = parse_embedding(R"({"input":[[1],[2,3]],"dimensions":7})", kLimits);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->inputs.size(), 2u);
  EXPECT_EQ(r->inputs[1].ids, (std::vector<int64_t>{2, 3}));
  for (const char* bad : {R"({"input":null})", R"({"input":{}})", R"({"input":["a",1]})", R"({"input":[[1],"a",[]]})",
                          R"({"input":"a","encoding_format":"int8"})", R"({"input":["a","a","a","a","a","a","a","a","a"]})"})
    EXPECT_FALSE(parse_embedding(bad, kLimits).ok()) << bad;
}

TEST(ServeApiTest, ClassifyTextOrImage) {
  auto r = parse_classify(R"({"input":"text"})", kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->image.has_value());
  r = parse_classify(R"({"image":"data:image/png;base64,iVBORw=="})", kLimits);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->image->substr(1, 3), "PNG");
  for (const char* bad : {R"({})", R"({"input":"a","image":"AAAA"})", R"({"image":5})", R"({"image":"**"})", R"({"image":""})"})
    EXPECT_FALSE(parse_classify(bad, kLimits).ok()) << bad;
}

TEST(ServeApiTest, Base64RoundTrips) {
  std::mt19937 rng(7);
  for (size_t n = 0; n < 40; ++n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const std::string enc = base64_encode(bytes);
    EXPECT_EQ(enc.size() % 4, 0u);
    auto dec = base64_decode(enc);
    ASSERT_TRUE(dec.ok());
    EXPECT_EQ(*dec, bytes);
  }
  EXPECT_EQ(base64_encode("Man"), "TWFu");
  EXPECT_EQ(base64_decode("TWE").value(), "Ma");
  EXPECT_FALSE(base64_decode("T").ok());
  EXPECT_FALSE(base64_decode("TW!u").ok());
  EXPECT_FALSE(base64_decode("data:text/plain,abc").ok());
}

TEST(ServeApiTest, ErrorBodyHasOpenAIsShape) {
  const auto j = error_body("bad thing", "invalid_request_error");
  EXPECT_EQ(j["error"]["message"], "bad thing");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
}

// A generation resumed after k sampled tokens continues with the state
// pick_token would have reached: the same draws as one uninterrupted run.
TEST(ServeApiTest, AdvancedSeedContinuesTheSampling) {
  std::vector<float> logits(50);
  std::mt19937 rng(3);
  for (float& l : logits) l = std::uniform_real_distribution<float>(-2, 2)(rng);
  model::GenerateOptions o;
  o.greedy = false;
  o.top_k = 20;
  o.temperature = 0.8f;
  uint64_t state = 1234;
  std::vector<int64_t> whole;
  for (int i = 0; i < 12; ++i) whole.push_back(model::pick_token(logits.data(), 50, o, &state));
  for (int k : {0, 1, 5, 11}) {
    uint64_t resumed = advance_seed(1234, k);
    for (int i = k; i < 12; ++i) EXPECT_EQ(model::pick_token(logits.data(), 50, o, &resumed), whole[static_cast<size_t>(i)]) << k;
  }
}

TEST(ServeApiTest, StopScanHoldsBackPossibleStops) {
  const std::vector<std::string> stop = {"END", "\n\n"};
  auto s = scan_stop("hello E", stop, false);
  EXPECT_FALSE(s.stopped);
  EXPECT_EQ(s.sendable, 6u);  // "E" may start "END"
  s = scan_stop("hello EN", stop, false);
  EXPECT_EQ(s.sendable, 6u);
  s = scan_stop("hello ENX", stop, false);
  EXPECT_EQ(s.sendable, 9u);
  s = scan_stop("hello END more", stop, false);
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.sendable, 6u);
  s = scan_stop("a\n", stop, false);
  EXPECT_EQ(s.sendable, 1u);
  s = scan_stop("hello E", stop, true);  // the end: nothing is held back
  EXPECT_EQ(s.sendable, 7u);
  // An incomplete UTF-8 character (or the replacement for one) waits.
  s = scan_stop("ab\xC3", {}, false);
  EXPECT_EQ(s.sendable, 2u);
  s = scan_stop("ab\xC3\xA9", {}, false);
  EXPECT_EQ(s.sendable, 4u);
  s = scan_stop("ab\xEF\xBF\xBD", {}, false);
  EXPECT_EQ(s.sendable, 2u);
}

TEST(ServeApiTest, StopFilterSendsWhatWasHeldBackAtTheEnd) {
  // "Done.\n" then an end-of-turn: the "\n" held back for "\n\n" is sent.
  StopFilter f({"\n\n"});
  EXPECT_EQ(f.add("Done."), "Done.");
  EXPECT_EQ(f.add("\n"), "");
  EXPECT_EQ(f.finish(""), "\n");
  EXPECT_FALSE(f.stopped());
  // A stop string ends the text; nothing after it, at the end neither.
  StopFilter g({"###"});
  EXPECT_EQ(g.add("a#"), "a");
  EXPECT_EQ(g.add("##b"), "");
  EXPECT_TRUE(g.stopped());
  EXPECT_EQ(g.add("c"), "");
  EXPECT_EQ(g.finish("d"), "");
  // The decoder's last bytes may complete a stop string: cut there.
  StopFilter h({"ab"});
  EXPECT_EQ(h.add("xa"), "x");
  EXPECT_EQ(h.finish("b tail"), "");
  EXPECT_TRUE(h.stopped());
  // An incomplete character waits for the next piece, and goes at the end.
  StopFilter u({});
  EXPECT_EQ(u.add("e\xC3"), "e");
  EXPECT_EQ(u.add("\xA9!"), "\xC3\xA9!");
  EXPECT_EQ(u.add("\xE2\x82"), "");
  EXPECT_EQ(u.finish(""), "\xE2\x82");
}

TEST(ServeApiTest, ChatMessagesAndFields) {
  auto r = parse_chat(R"({"messages":[{"role":"developer","content":"be kind"},
                                      {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]},
                                      {"role":"assistant","content":null,"tool_calls":[{"id":"c1"}]},
                                      {"role":"tool","content":"42","tool_call_id":"c1"}],
                          "tools":[{"type":"function"}],"max_completion_tokens":5,"temperature":0,"stop":"x","stream":true})",
                      kLimits);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0]["role"], "system");  // developer is read as system
  EXPECT_EQ(r->messages[1]["content"], "hi there");
  EXPECT_TRUE(r->messages[2]["content"].is_null());
  EXPECT_EQ(r->messages[2]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(r->messages[3]["tool_call_id"], "c1");
  EXPECT_EQ(r->tools.size(), 1u);
  EXPECT_TRUE(r->max_tokens_given);
  EXPECT_EQ(r->sampling.max_tokens, 5);
  EXPECT_EQ(r->sampling.temperature, 0.0);
  EXPECT_EQ(r->sampling.stop, (std::vector<std::string>{"x"}));
  EXPECT_TRUE(r->sampling.stream);
  // Tools and tool calls keep the client's key order (a template prints them with tojson).
  r = parse_chat(R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"z":1,"a":2}]}],
                     "tools":[{"type":"function","function":{"name":"f","parameters":{"zeta":1,"alpha":2}}}]})",
                 kLimits);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tools[0]["function"]["parameters"].dump(), R"({"zeta":1,"alpha":2})");
  EXPECT_EQ(r->messages[0]["tool_calls"][0].dump(), R"({"z":1,"a":2})");
  // Without a limit the answer may run to the end of the context.
  r = parse_chat(R"({"messages":[{"role":"user","content":"hi"}]})", kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->max_tokens_given);
  EXPECT_EQ(r->sampling.max_tokens, kLimits.max_positions);
  EXPECT_TRUE(r->tools.is_null());
}

TEST(ServeApiTest, BadChatRequestsSayWhatIsWrong) {
  for (const char* body : {R"({})", R"({"messages":[]})", R"({"messages":{}})", R"({"messages":["hi"]})",
                           R"({"messages":[{"content":"x"}]})", R"({"messages":[{"role":"king","content":"x"}]})",
                           R"({"messages":[{"role":"user"}]})", R"({"messages":[{"role":"user","content":5}]})",
                           R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
                           R"({"messages":[{"role":"user","content":"x","name":3}]})",
                           R"({"messages":[{"role":"user","content":"x"}],"tools":{}})",
                           R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})",
                           R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})"}) {
    auto r = parse_chat(body, kLimits);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), core::ErrorCode::kInvalidArgument) << body;
    EXPECT_FALSE(r.status().message().empty());
  }
  // What the server does not implement is refused, not ignored; its "off" values pass.
  for (const char* body : {R"({"prompt":"x","best_of":3})", R"({"prompt":"x","best_of":true})"}) {
    auto r = parse_completion(body, kLimits);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_NE(r.status().message().find("not supported"), std::string::npos) << body;
  }
  EXPECT_TRUE(parse_completion(R"({"prompt":"x","logprobs":null,"echo":false,"best_of":1,"n":1})", kLimits).ok());
  ApiLimits few = kLimits;
  few.max_messages = 1;
  EXPECT_FALSE(parse_chat(R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]})", few).ok());
}

// Log-probabilities: the legacy completions' "logprobs": N (and "echo"),
// chat's "logprobs": true with "top_logprobs": N; N at most 20.
TEST(ServeApiTest, LogprobsFields) {
  const auto completion = [](const char* fields) {
    return parse_completion(std::string(R"({"prompt":"x")") + fields + "}", kLimits);
  };
  EXPECT_EQ(completion("")->logprobs, -1);
  EXPECT_EQ(completion(R"(,"logprobs":null)")->logprobs, -1);
  EXPECT_EQ(completion(R"(,"logprobs":false)")->logprobs, -1);
  EXPECT_EQ(completion(R"(,"logprobs":0)")->logprobs, 0);
  EXPECT_EQ(completion(R"(,"logprobs":20)")->logprobs, 20);
  EXPECT_FALSE(completion("")->echo);
  EXPECT_TRUE(completion(R"(,"echo":true,"logprobs":1,"max_tokens":0)")->echo);
  EXPECT_FALSE(completion(R"(,"echo":"yes")").ok());
  // Echo's logits are held whole: a prompt too long for them is a 400, not an allocation.
  EXPECT_TRUE(check_echo_logits(1024, 128256).ok());
  const core::Status too_long = check_echo_logits(kMaxEchoLogits / 128256 + 1, 128256);
  EXPECT_EQ(too_long.code(), core::ErrorCode::kInvalidArgument);
  EXPECT_NE(too_long.message().find("echo"), std::string::npos);
  EXPECT_FALSE(check_echo_logits(INT64_MAX, 2).ok());
  for (const char* bad : {R"(,"logprobs":21)", R"(,"logprobs":-1)", R"(,"logprobs":1.5)", R"(,"logprobs":"3")",
                          R"(,"logprobs":true)", R"(,"top_logprobs":2)"}) {
    auto r = completion(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), core::ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("logprobs"), std::string::npos) << bad << " -> " << r.status().message();
  }
  const auto chat = [](const char* fields) {
    return parse_chat(std::string(R"({"messages":[{"role":"user","content":"x"}])") + fields + "}", kLimits);
  };
  EXPECT_EQ(chat("")->sampling.logprobs, -1);
  EXPECT_EQ(chat(R"(,"logprobs":false)")->sampling.logprobs, -1);
  EXPECT_EQ(chat(R"(,"logprobs":true)")->sampling.logprobs, 0);
  EXPECT_EQ(chat(R"(,"logprobs":true,"top_logprobs":5)")->sampling.logprobs, 5);
  EXPECT_EQ(chat(R"(,"logprobs":true,"top_logprobs":null)")->sampling.logprobs, 0);
  EXPECT_TRUE(chat(R"(,"echo":false)").ok());
  auto echoed = chat(R"(,"echo":true)");
  ASSERT_FALSE(echoed.ok());
  EXPECT_NE(echoed.status().message().find("not supported"), std::string::npos) << echoed.status().message();
  for (const char* bad : {R"(,"logprobs":2)", R"(,"top_logprobs":2)", R"(,"logprobs":false,"top_logprobs":2)",
                          R"(,"logprobs":true,"top_logprobs":21)", R"(,"logprobs":true,"top_logprobs":"2")"}) {
    auto r = chat(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), core::ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("logprobs"), std::string::npos) << bad << " -> " << r.status().message();
  }
}

// "n" choices (1..16), each sampled from a seed of its own: choice 0 keeps
// the request's, so n = 1 draws as before.
TEST(ServeApiTest, ChoicesAndTheirSeeds) {
  EXPECT_EQ(parse_completion(R"({"prompt":"x"})", kLimits)->n, 1);
  EXPECT_EQ(parse_completion(R"({"prompt":"x","n":16})", kLimits)->n, 16);
  EXPECT_EQ(parse_chat(R"({"messages":[{"role":"user","content":"x"}],"n":3})", kLimits)->sampling.n, 3);
  EXPECT_FALSE(parse_completion(R"({"prompt":"x","n":"2"})", kLimits).ok());
  std::set<uint64_t> seeds;
  for (const uint64_t s : {uint64_t{0}, uint64_t{5}, ~uint64_t{0}}) {
    EXPECT_EQ(choice_seed(s, 0), s);
    for (int64_t i = 0; i < kMaxChoices; ++i) seeds.insert(choice_seed(s, i));
  }
  EXPECT_EQ(seeds.size(), static_cast<size_t>(3 * kMaxChoices));  // no two choices share a stream
}

// logit_bias: token ids (as OpenAI's string keys) to biases in [-100, 100];
// -100 bans the token.
TEST(ServeApiTest, LogitBias) {
  auto r = parse_completion(R"({"prompt":"x","logit_bias":{"5":2.5,"0":-100,"511":100}})", kLimits);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::map<int64_t, float> got(r->logit_bias.begin(), r->logit_bias.end());
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(got[5], 2.5f);
  EXPECT_EQ(got[511], 100.0f);
  EXPECT_TRUE(std::isinf(got[0]) && got[0] < 0);
  auto c = parse_chat(R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"7":-1}})", kLimits);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->sampling.logit_bias, (std::vector<std::pair<int64_t, float>>{{7, -1.0f}}));
  for (const char* bad : {R"({"prompt":"x","logit_bias":[1]})", R"({"prompt":"x","logit_bias":{"512":1}})",
                          R"({"prompt":"x","logit_bias":{"-1":1}})", R"({"prompt":"x","logit_bias":{"a":1}})",
                          R"({"prompt":"x","logit_bias":{"5x":1}})", R"({"prompt":"x","logit_bias":{"5":101}})",
                          R"({"prompt":"x","logit_bias":{"5":"1"}})", R"({"prompt":"x","logit_bias":{"5":1,"05":2}})"}) {
    auto b = parse_completion(bad, kLimits);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("logit_bias"), std::string::npos) << bad << " -> " << b.status().message();
  }
}

// A log-probability's token: its text, or "bytes:\xNN..." for part of a
// character (two such tokens stay apart), and its own bytes either way.
TEST(ServeApiTest, LogprobTokensOfPartialCharacters) {
  auto tok = model::load_tokenizer_json(std::string(TESSERA_TEST_DATA) + "/tokenizers/bytelevel_bpe/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  const auto ids = (*tok)->encode("\u00E9").value();  // C3 A9
  ASSERT_EQ(ids.size(), 2u);
  const LogprobToken first = logprob_token(tok->get(), ids[0]), second = logprob_token(tok->get(), ids[1]);
  EXPECT_EQ(first.text, "bytes:\\xc3");
  EXPECT_EQ(first.bytes, "\xC3");
  EXPECT_EQ(second.text, "bytes:\\xa9");
  EXPECT_EQ(second.bytes, "\xA9");
  const auto hello = (*tok)->encode("Hello").value();
  ASSERT_FALSE(hello.empty());
  const LogprobToken whole = logprob_token(tok->get(), hello[0]);
  EXPECT_EQ(whole.text, (*tok)->decode({hello[0]}).value());
  EXPECT_EQ(whole.bytes, whole.text);
  const LogprobToken none = logprob_token(nullptr, 7);
  EXPECT_EQ(none.text, "token_id:7");
}

// A request's extra choices take turns at the model up to --max-batch, at
// once or not at all, and give them back.
TEST(ServeAdmissionTest, ExtraTurnsUpToTheConcurrency) {
  serve_detail::Admission a(8, 3);
  const auto later = serve_detail::Clock::now() + std::chrono::hours(1);
  ASSERT_TRUE(a.try_admit());
  ASSERT_TRUE(a.acquire(later));
  EXPECT_EQ(a.try_acquire_more(5), 2);  // 3 run at once
  EXPECT_EQ(a.try_acquire_more(1), 0);
  a.release();
  a.release();
  EXPECT_EQ(a.try_acquire_more(1), 1);
  EXPECT_EQ(a.try_acquire_more(0), 0);
  EXPECT_EQ(a.try_acquire_more(4), 1);
  ASSERT_TRUE(a.try_admit());
  EXPECT_FALSE(a.acquire(serve_detail::Clock::now()));  // all 3 turns taken: no turn by a deadline already past
  a.release();
  EXPECT_TRUE(a.acquire(later));
  serve_detail::Admission one(8, 1);  // no --max-batch: choices one after another
  ASSERT_TRUE(one.acquire(later));
  EXPECT_EQ(one.try_acquire_more(3), 0);
}

// /tokenize takes llama.cpp's or vLLM's field names; /detokenize a list of
// the model's ids.
TEST(ServeApiTest, TokenizeAndDetokenizeBodies) {
  auto t = parse_tokenize(R"({"content":"hi there"})");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->text, "hi there");
  EXPECT_FALSE(t->add_special);
  t = parse_tokenize(R"({"prompt":"","add_special_tokens":true})");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->text, "");
  EXPECT_TRUE(t->add_special);
  EXPECT_TRUE(parse_tokenize(R"({"content":"x","add_special":true})")->add_special);
  for (const char* bad : {R"({})", R"({"content":"a","prompt":"b"})", R"({"content":5})", R"({"prompt":["a"]})",
                          R"({"content":"a","add_special":"yes"})", "[]"}) {
    auto r = parse_tokenize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), core::ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(parse_detokenize(R"({"tokens":[3,0,511]})", kLimits).value(), (std::vector<int64_t>{3, 0, 511}));
  EXPECT_TRUE(parse_detokenize(R"({"tokens":[]})", kLimits)->empty());
  for (const char* bad : {R"({})", R"({"tokens":"abc"})", R"({"tokens":[512]})", R"({"tokens":[-1]})", R"({"tokens":[1.5]})"}) {
    auto r = parse_detokenize(bad, kLimits);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), core::ErrorCode::kInvalidArgument) << bad;
  }
}

// The HTTP status travels as the Status's code, never inside its message.
TEST(ServeApiTest, ErrorCodesMapToHttpStatuses) {
  EXPECT_EQ(http_status(core::ErrorCode::kInvalidArgument), 400);
  EXPECT_EQ(http_status(core::ErrorCode::kParseError), 400);
  EXPECT_EQ(http_status(core::ErrorCode::kOutOfRange), 400);
  EXPECT_EQ(http_status(core::ErrorCode::kUnavailable), 503);
  EXPECT_EQ(http_status(core::ErrorCode::kNetwork), 503);
  EXPECT_EQ(http_status(core::ErrorCode::kResourceExhausted), 503);
  EXPECT_EQ(http_status(core::ErrorCode::kTimeout), 504);
  EXPECT_EQ(http_status(core::ErrorCode::kInternal), 500);
  // A message that looks like a status is just a message.
  const core::Status st = core::invalid_argument("HTTP 503: not really");
  EXPECT_EQ(http_status(st.code()), 400);
}

}  // namespace
}  // namespace tessera::runtime::api
