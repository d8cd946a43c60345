// How far a lossy plan (PRISM, a f16/q8 wire, weights quantized at load)
// moves a model's outputs from the exact single-device forward: one routine
// for `tessera fidelity` and for the planner's --max-loss gate. Plans run in
// this process, one thread per rank (run_in_process), so the figures depend
// on the arithmetic only, not on links or device speeds.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/transformer.h"
#include "parallel/strategy.h"

namespace tessera::runtime {

struct FidelityScores {
  int64_t samples = 0, rows = 0;  // rows: hidden-state rows compared
  double cosine = 1.0, min_cosine = 1.0, max_abs_err = 0.0;
  // Each logits row's top-1 (the next token of every position, the class of
  // a classifier) against the exact forward's; -1 when the model has no head.
  double top1_agreement = -1.0;
  // KL(exact || plan) of the last row's distribution (the next token); -1 without a head.
  double next_token_kl = -1.0, next_token_kl_max = -1.0;
  nlohmann::json to_json() const;
};

// Seeded inputs of `rows` token ids drawn uniformly from the vocabulary
// (image models: standard-normal pixels), as `tessera fidelity` has always used.
std::vector<model::ModelInput> random_inputs(const model::ModelConfig& c, int samples, int64_t rows, uint64_t seed);

// Calibration inputs from a text file: each non-empty line one prompt,
// tokenized with the model's tokenizer and cut at max_position_embeddings.
// Image models have no text to read: an error.
[[nodiscard]] core::Result<std::vector<model::ModelInput>> calibration_inputs(const std::string& model_dir,
                                                                            const std::string& file);

// The exact forward's outputs on a set of inputs, computed once; plans are
// then scored against them.
class FidelityMeter {
 public:
  [[nodiscard]] static core::Result<FidelityMeter> create(const std::string& model_dir,
                                                          std::vector<model::ModelInput> inputs);
  // `plan` (completed) on every input, its ranks loaded in its weight type.
  [[nodiscard]] core::Result<FidelityScores> measure(const parallel::Plan& plan);
  // 1 - top-1 agreement, the --max-loss measure; remembered per plan.
  [[nodiscard]] core::Result<double> top1_disagreement(const parallel::Plan& plan);
  size_t samples() const { return inputs_.size(); }

 private:
  struct Reference {
    core::Tensor hidden;
    std::vector<int64_t> top1;
    std::vector<double> last_logp;
  };
  std::string dir_;
  std::vector<model::ModelInput> inputs_;
  std::vector<Reference> refs_;
  std::map<std::string, double> disagreement_;  // by the plan's JSON
};

}  // namespace tessera::runtime
