#include "runtime/fidelity.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "core/io.h"
#include "kernels/gemm.h"
#include "model/tokenizer.h"
#include "runtime/in_process.h"

namespace tessera::runtime {

using core::Result;

namespace {

std::vector<int64_t> top1_rows(const core::Tensor& logits) {
  std::vector<int64_t> out;
  if (logits.empty()) return out;
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  for (int64_t r = 0; r < rows; ++r) out.push_back(kernels::argmax_f32(logits.f32() + r * cols, cols));
  return out;
}

std::vector<double> last_row_logp(const core::Tensor& logits) {
  if (logits.empty()) return {};
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  const float* x = logits.f32() + (rows - 1) * cols;
  double mx = x[0];
  for (int64_t c = 1; c < cols; ++c) mx = std::max(mx, static_cast<double>(x[c]));
  double sum = 0;
  for (int64_t c = 0; c < cols; ++c) sum += std::exp(x[c] - mx);
  std::vector<double> out(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c)] = x[c] - mx - std::log(sum);
  return out;
}

}  // namespace

nlohmann::json FidelityScores::to_json() const {
  auto opt = [](double v) { return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v); };
  return {{"samples", samples}, {"rows", rows}, {"cosine", cosine}, {"min_cosine", min_cosine},
          {"max_abs_err", max_abs_err}, {"top1_agreement", opt(top1_agreement)}, {"next_token_kl", opt(next_token_kl)},
          {"next_token_kl_max", opt(next_token_kl_max)}};
}

std::vector<model::ModelInput> random_inputs(const model::ModelConfig& c, int samples, int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<model::ModelInput> out(static_cast<size_t>(std::max(samples, 0)));
  for (auto& in : out) {
    if (c.takes_images()) {
      in.pixels = core::Tensor::zeros_f32({1, c.channels, c.image_size, c.image_size});
      for (int64_t i = 0; i < in.pixels.numel(); ++i) in.pixels.f32()[i] = nd(rng);
    } else {
      for (int64_t i = 0; i < rows; ++i) in.ids.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(c.vocab)));
    }
  }
  return out;
}

Result<std::vector<model::ModelInput>> calibration_inputs(const std::string& model_dir, const std::string& file) {
  TESSERA_ASSIGN_OR_RETURN(const model::ModelConfig c, model::load_config(model_dir));
  if (c.takes_images())
    return core::invalid_argument("--calibration: '" + model_dir + "' takes images, and the file holds text");
  TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(file));
  TESSERA_ASSIGN_OR_RETURN(auto tok, model::load_tokenizer(model_dir));
  std::vector<model::ModelInput> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    model::ModelInput in;
    TESSERA_ASSIGN_OR_RETURN(in.ids, tok->encode(line));
    if (static_cast<int64_t>(in.ids.size()) > c.max_positions) in.ids.resize(static_cast<size_t>(c.max_positions));
    if (!in.ids.empty()) out.push_back(std::move(in));
  }
  if (out.empty()) return core::invalid_argument("--calibration: '" + file + "' has no prompt (one per line)");
  return out;
}

Result<FidelityMeter> FidelityMeter::create(const std::string& model_dir, std::vector<model::ModelInput> inputs) {
  if (inputs.empty()) return core::invalid_argument("fidelity needs at least one input");
  FidelityMeter m;
  m.dir_ = model_dir;
  m.inputs_ = std::move(inputs);
  TESSERA_ASSIGN_OR_RETURN(const model::Transformer full, model::Transformer::load(model_dir));
  for (const auto& in : m.inputs_) {
    TESSERA_ASSIGN_OR_RETURN(const model::ForwardOutput out, full.forward(in, {}, nullptr));
    m.refs_.push_back({out.hidden.back(), top1_rows(out.logits), last_row_logp(out.logits)});
  }
  return m;
}

Result<FidelityScores> FidelityMeter::measure(const parallel::Plan& plan) {
  TESSERA_ASSIGN_OR_RETURN(const std::vector<model::Transformer> models, load_rank_models(dir_, plan));
  // Ranks are threads: each runs its GEMMs on one core (the caller's setting after).
  const int blas_before = kernels::blas_threads();
  kernels::set_blas_threads(1);
  struct Restore {
    int n;
    ~Restore() { kernels::set_blas_threads(n); }
  } restore{blas_before};
  FidelityScores s;
  double cosine_sum = 0, kl_sum = 0;
  int64_t top1_same = 0, top1_rows_seen = 0, kl_count = 0;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(const InProcessResult got, run_in_process(plan, models, inputs_[i]));
    const Reference& ref = refs_[i];
    const core::Tensor& a = ref.hidden;
    const core::Tensor& b = got.output.hidden.back();
    if (a.shape() != b.shape()) return core::internal_error("fidelity: the plan's hidden state has another shape");
    const int64_t rows = a.dim(0), cols = a.dim(1);
    for (int64_t r = 0; r < rows; ++r) {
      double dot = 0, na = 0, nb = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double x = a.f32()[r * cols + c], y = b.f32()[r * cols + c];
        dot += x * y;
        na += x * x;
        nb += y * y;
        s.max_abs_err = std::max(s.max_abs_err, std::fabs(x - y));
      }
      const double cos = na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : (na == nb ? 1.0 : 0.0);
      cosine_sum += cos;
      s.min_cosine = std::min(s.min_cosine, cos);
      ++s.rows;
    }
    if (const auto lp = last_row_logp(got.output.logits); !lp.empty() && lp.size() == ref.last_logp.size()) {
      double kl = 0;
      for (size_t c = 0; c < lp.size(); ++c) kl += std::exp(ref.last_logp[c]) * (ref.last_logp[c] - lp[c]);
      kl = std::max(kl, 0.0);  // KL >= 0; a tiny negative sum is rounding, and -1 means "no head"
      kl_sum += kl;
      s.next_token_kl_max = std::max(s.next_token_kl_max, kl);
      ++kl_count;
    }
    const auto top = top1_rows(got.output.logits);
    for (size_t r = 0; r < std::min(top.size(), ref.top1.size()); ++r) {
      top1_same += top[r] == ref.top1[r] ? 1 : 0;
      ++top1_rows_seen;
    }
  }
  s.samples = static_cast<int64_t>(inputs_.size());
  s.cosine = cosine_sum / static_cast<double>(std::max<int64_t>(s.rows, 1));
  if (kl_count > 0) s.next_token_kl = kl_sum / static_cast<double>(kl_count);
  if (top1_rows_seen > 0) s.top1_agreement = static_cast<double>(top1_same) / static_cast<double>(top1_rows_seen);
  return s;
}

Result<double> FidelityMeter::top1_disagreement(const parallel::Plan& plan) {
  const std::string key = plan.to_json().dump();
  if (const auto it = disagreement_.find(key); it != disagreement_.end()) return it->second;
  TESSERA_ASSIGN_OR_RETURN(const FidelityScores s, measure(plan));
  if (s.top1_agreement < 0) return core::unimplemented("--max-loss: the model has no head whose top-1 could be compared");
  const double loss = 1.0 - s.top1_agreement;
  disagreement_[key] = loss;
  return loss;
}

}  // namespace tessera::runtime
