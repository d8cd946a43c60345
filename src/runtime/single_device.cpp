#include "runtime/single_device.h"

#include "runtime/in_process.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <sstream>

#include "core/io.h"
#include "kernels/gemm.h"
#include "model/image.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using core::Tensor;

Result<std::vector<int64_t>> parse_id_list(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      return core::invalid_argument("'" + item + "' in the id list is not an integer");
    }
    if (used != item.size()) return core::invalid_argument("'" + item + "' in the id list is not an integer");
    ids.push_back(v);
  }
  if (ids.empty()) return core::invalid_argument("empty id list");
  return ids;
}

namespace {

int input_kinds(const RunRequest& r) {
  return !r.text.empty() + !r.ids.empty() + !r.image_path.empty() + !r.pixels_path.empty();
}

Result<Tensor> load_pixels(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(model::SafeTensorsFile f, model::SafeTensorsFile::open(path));
  if (!f.contains("pixel_values")) return core::not_found("'" + path + "' has no tensor 'pixel_values'");
  TESSERA_ASSIGN_OR_RETURN(Tensor t, f.get_f32("pixel_values"));
  return t.clone();
}

}  // namespace

Result<model::ModelInput> build_input(const model::Transformer& m, const RunRequest& req) {
  if (input_kinds(req) != 1) return core::invalid_argument("give exactly one input: --text, --ids, --image or --pixels");
  model::ModelInput in;
  const bool vit = m.config().takes_images();
  if (vit && (!req.text.empty() || !req.ids.empty())) return core::invalid_argument("a ViT model takes --image or --pixels");
  if (!vit && (!req.image_path.empty() || !req.pixels_path.empty()))
    return core::invalid_argument("a text model takes --text or --ids");
  if (!req.image_path.empty()) {
    TESSERA_ASSIGN_OR_RETURN(model::ImagePreprocess pp, model::load_image_preprocess(req.model_dir, static_cast<int>(m.config().image_size)));
    TESSERA_ASSIGN_OR_RETURN(in.pixels, model::load_image(req.image_path, pp));
  } else if (!req.pixels_path.empty()) {
    TESSERA_ASSIGN_OR_RETURN(in.pixels, load_pixels(req.pixels_path));
  } else if (!req.text.empty()) {
    TESSERA_ASSIGN_OR_RETURN(auto tok, model::load_tokenizer(req.model_dir));
    TESSERA_ASSIGN_OR_RETURN(in.ids, tok->encode(req.text, true));
  } else {
    in.ids = req.ids;
    in.token_types = req.token_types;
  }
  TESSERA_RETURN_IF_ERROR(m.validate_input(in));
  return in;
}

Result<RunResult> run_single(const RunRequest& req) {
  if (req.threads < 1 || req.threads > 256) return core::invalid_argument("--threads must be in [1, 256]");
  if (req.generate_tokens < 0) return core::invalid_argument("the number of tokens to generate must be >= 0");
  model::LoadOptions lo;
  lo.weights = req.weights;
  TESSERA_ASSIGN_OR_RETURN(model::Transformer m, model::Transformer::load(req.model_dir, lo));
  TESSERA_ASSIGN_OR_RETURN(model::ModelInput in, build_input(m, req));
  kernels::set_blas_threads(req.threads);
  core::ThreadPool pool(req.threads);
  RunResult r;
  r.config = m.config();
  r.input_ids = in.ids;
  core::Timer timer;
  if (req.generate_tokens > 0) {
    model::GenerateOptions g = req.gen;
    g.max_new_tokens = req.generate_tokens;
    TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> seq, model::generate(m, in.ids, g, &pool));
    r.generated.assign(seq.begin() + static_cast<std::ptrdiff_t>(in.ids.size()), seq.end());
    r.latency_ms = timer.ms();
    auto tok = model::load_tokenizer(req.model_dir);
    if (tok.ok()) {
      auto text = (*tok)->decode(r.generated, true);
      if (text.ok()) r.generated_text = *text;
    }
    return r;
  }
  parallel::Plan single = parallel::single_device_plan();
  TESSERA_RETURN_IF_ERROR(parallel::complete_plan(single, m.config()));
  TESSERA_RETURN_IF_ERROR(check_request_memory(single, m.config(), input_rows(m.config(), in)));
  TESSERA_ASSIGN_OR_RETURN(r.output, m.forward(in, {}, &pool));
  r.latency_ms = timer.ms();
  if (!req.dump_path.empty()) TESSERA_RETURN_IF_ERROR(write_dump(req.dump_path, r));
  return r;
}

Status write_dump(const std::string& path, const RunResult& r) {
  std::map<std::string, Tensor> tensors;
  if (!r.output.hidden.empty()) {
    const Tensor& h = r.output.hidden.back();
    tensors["hidden." + std::to_string(r.config.layers)] = h.reshaped({1, h.dim(0), h.dim(1)});
  }
  if (!r.output.logits.empty()) {
    const Tensor& l = r.output.logits;
    // HF shapes: [1, labels] for classifiers, [1, N, vocab] for the LM head.
    tensors["logits"] = r.config.causal() ? l.reshaped({1, l.dim(0), l.dim(1)}) : l;
  }
  if (!r.output.pooler.empty()) tensors["pooler_output"] = r.output.pooler;
  return model::write_safetensors(path, tensors);
}

namespace {

std::vector<std::pair<int64_t, float>> top_probs(const float* logits, int64_t n, int64_t k) {
  std::vector<float> p(logits, logits + n);
  const float mx = *std::max_element(p.begin(), p.end());
  float sum = 0.0f;
  for (float& v : p) sum += v = std::exp(v - mx);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  k = std::min(k, n);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  std::vector<std::pair<int64_t, float>> out;
  for (int64_t i = 0; i < k; ++i) out.push_back({order[i], p[order[i]] / sum});
  return out;
}

std::string label_of(const model::ModelConfig& c, int64_t i) {
  return i < c.num_labels() ? c.labels[static_cast<size_t>(i)] : std::to_string(i);
}

}  // namespace

std::string format_human(const RunResult& r) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(4);
  if (!r.generated.empty() || r.config.causal()) {
    if (!r.generated.empty()) {
      os << "generated:";
      for (int64_t id : r.generated) os << ' ' << id;
      os << '\n';
      if (!r.generated_text.empty()) os << "text: " << r.generated_text << '\n';
    } else if (!r.output.logits.empty()) {
      const Tensor& l = r.output.logits;
      os << "next token (top 5):\n";
      for (auto [id, p] : top_probs(l.f32() + (l.dim(0) - 1) * l.dim(1), l.dim(1), 5)) os << "  " << id << "  " << p << '\n';
    }
  } else if (!r.output.logits.empty()) {
    const Tensor& l = r.output.logits;
    const auto top = top_probs(l.f32(), l.dim(1), r.config.takes_images() ? 5 : l.dim(1));
    os << "label: " << label_of(r.config, top[0].first) << " (" << top[0].second << ")\n";
    for (auto [id, p] : top) os << "  " << label_of(r.config, id) << "  " << p << '\n';
  } else {
    os << "hidden state: [" << r.output.hidden.back().dim(0) << ", " << r.output.hidden.back().dim(1) << "]\n";
  }
  os.precision(2);
  os << "latency: " << r.latency_ms << " ms\n";
  return os.str();
}

nlohmann::json to_json(const RunResult& r) {
  nlohmann::json j;
  j["model_type"] = r.config.family;
  j["architecture"] = r.config.architecture;
  j["input_ids"] = r.input_ids;
  j["latency_ms"] = r.latency_ms;
  if (!r.generated.empty()) {
    j["generated_ids"] = r.generated;
    j["generated_text"] = r.generated_text;
  }
  if (!r.output.logits.empty()) {
    const Tensor& l = r.output.logits;
    const float* last = l.f32() + (l.dim(0) - 1) * l.dim(1);
    j["logits"] = std::vector<float>(last, last + l.dim(1));
    const auto top = top_probs(last, l.dim(1), std::min<int64_t>(5, l.dim(1)));
    nlohmann::json t = nlohmann::json::array();
    for (auto [id, p] : top) t.push_back({{"id", id}, {"label", label_of(r.config, id)}, {"prob", p}});
    j["top"] = t;
    if (!r.config.causal()) j["label"] = label_of(r.config, top[0].first);
  }
  return j;
}

}  // namespace tessera::runtime
