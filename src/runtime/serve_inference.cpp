// `tessera serve`'s one-shot endpoints: /v1/embeddings and /v1/classify, one
// forward pass per input, answered whole; /tokenize and /detokenize. Apart
// from serve.cpp (routes and admission) and serve_completions.cpp
// (generation, streaming).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/image.h"
#include "model/tokenizer.h"
#include "runtime/serve_server.h"

namespace tessera::runtime::serve_detail {

Result<RunResult> Server::forward(const model::ModelInput& in) {
  RunResult out;
  TESSERA_RETURN_IF_ERROR(engine_.with_failover([&](Session& s) {
    TESSERA_ASSIGN_OR_RETURN(out, s.run_input(in));
    engine_.count_bytes(s);
    return core::ok_status();
  }));
  return out;
}

void Server::embeddings(const httplib::Request& req, httplib::Response& res) {
  const auto& c = engine_.config();
  if (c.takes_images()) return send_error(res, 400, "embeddings take text; this model takes images");
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

void Server::classify(const httplib::Request& req, httplib::Response& res) {
  const auto& c = engine_.config();
  if (c.num_labels() == 0 || c.causal())
    return send_error(res, 400, "this model has no classification head");
  auto r = api::parse_classify(req.body, limits_);
  if (!r.ok()) return fail(res, r.status());
  std::vector<model::ModelInput> inputs;
  const bool vit = c.takes_images();
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

void Server::tokenize(const httplib::Request& req, httplib::Response& res) {
  const model::Tokenizer* tok = engine_.tokenizer();
  if (tok == nullptr) return send_error(res, 400, "this model has no tokenizer");
  auto r = api::parse_tokenize(req.body);
  if (!r.ok()) return fail(res, r.status());
  auto ids = tok->encode(r->text, r->add_special);
  if (!ids.ok()) return send_error(res, 400, ids.status().message());
  res.set_content(json{{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", limits_.max_positions}}.dump(),
                  "application/json");
}

void Server::detokenize(const httplib::Request& req, httplib::Response& res) {
  const model::Tokenizer* tok = engine_.tokenizer();
  if (tok == nullptr) return send_error(res, 400, "this model has no tokenizer");
  auto ids = api::parse_detokenize(req.body, limits_);
  if (!ids.ok()) return fail(res, ids.status());
  auto text = tok->decode(*ids, false);
  if (!text.ok()) return send_error(res, 400, text.status().message());
  // llama.cpp answers "content", vLLM "prompt".
  res.set_content(json{{"content", *text}, {"prompt", *text}}.dump(), "application/json");
}

}  // namespace tessera::runtime::serve_detail
