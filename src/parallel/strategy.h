// The distributed strategies on one engine. Each rank calls run_layers with
// its own (possibly sharded) model and a Synchronizer; rank 0 is the
// terminal, which embeds the input before and applies the head after.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "model/transformer.h"
#include "parallel/partition.h"
#include "parallel/sync.h"

namespace tessera::parallel {

enum class Strategy { kSingle, kTp, kSp, kVoltage, kPipeline, kPrism, kGalaxy };
core::Result<Strategy> parse_strategy(const std::string& name);
const char* strategy_name(Strategy s);

struct Plan {
  Strategy strategy = Strategy::kSingle;
  int world = 1;
  std::vector<double> ratios;  // rows (sp, voltage, prism) or heads (tp, galaxy); empty = equal
  std::vector<double> ffn_ratios;  // FFN columns (tp, galaxy); empty = as ratios
  LayerMap layers;             // pipeline; empty = contiguous equal ranges
  bool adaptive_order = true;  // Voltage Theorem 2; false = always Eq. (3)
  // PRISM: exactly one of the compression rate R (L_p = max(1, floor(N_p / R)))
  // or the segment means per partition L; 0 = unset.
  double prism_rate = 0.0;
  int64_t prism_segments = 0;
  // Overlap ring collectives with GEMMs: Galaxy's tiles (§III-D); Voltage's
  // K/V projection of each block of rows as it arrives.
  bool overlap = true;
};

// Fills defaults (equal ratios, contiguous layers) and checks the plan.
core::Status complete_plan(Plan& plan, const model::ModelConfig& config);
// What rank `rank` loads: layer set (pipeline), head/FFN shard (tp),
// embeddings and head (rank 0).
model::LoadOptions load_options(const Plan& plan, const model::ModelConfig& config, int rank);

// The head and FFN-column ranges of each rank under tensor parallelism
// (tp, and galaxy's MHA and MLP blocks: partitions A and B).
std::vector<Range> tp_head_ranges(const Plan& plan, const model::ModelConfig& config);
std::vector<Range> tp_ffn_ranges(const Plan& plan, const model::ModelConfig& config);

// Galaxy's connective blocks: an equal sequence partition S (§III-C).
std::vector<Range> galaxy_seq_ranges(int64_t n, int world);

// Runs every layer. Rank 0 passes the embedded input [n, F] and gets back the
// last layer's output [n, F] (before GPT-2's ln_f); other ranks pass and get
// an empty tensor. `n` is known to every rank.
core::Result<core::Tensor> run_layers(const model::Transformer& model, const Plan& plan, Synchronizer& sync,
                                      core::Tensor x, int64_t n, core::ThreadPool* pool);

// Per-strategy layer loops (one file each).
core::Result<core::Tensor> run_tp(const model::Transformer& model, const Plan& plan, Synchronizer& sync, core::Tensor x,
                                  int64_t n, core::ThreadPool* pool);
core::Result<core::Tensor> run_sp(const model::Transformer& model, const Plan& plan, Synchronizer& sync, core::Tensor x,
                                  int64_t n, core::ThreadPool* pool);
core::Result<core::Tensor> run_voltage(const model::Transformer& model, const Plan& plan, Synchronizer& sync,
                                       core::Tensor x, int64_t n, core::ThreadPool* pool);
core::Result<core::Tensor> run_pipeline(const model::Transformer& model, const Plan& plan, Synchronizer& sync,
                                        core::Tensor x, int64_t n, core::ThreadPool* pool);
core::Result<core::Tensor> run_galaxy(const model::Transformer& model, const Plan& plan, Synchronizer& sync,
                                      core::Tensor x, int64_t n, core::ThreadPool* pool);
core::Result<core::Tensor> run_prism(const model::Transformer& model, const Plan& plan, Synchronizer& sync,
                                     core::Tensor x, int64_t n, core::ThreadPool* pool);

}  // namespace tessera::parallel
