// The one sequence every inference follows, whatever runs the ranks: the
// terminal embeds, every rank runs the plan's layers, the terminal finishes
// the hidden state and applies the head. Session::run (worker processes),
// run_in_process (ranks as threads), fidelity and the tests all use it.
#pragma once

#include <functional>
#include <vector>

#include "core/status.h"
#include "model/generate.h"
#include "model/transformer.h"
#include "parallel/strategy.h"

namespace tessera::runtime {

// The terminal's side: embed `in`, call `started(n)` (a distributed terminal
// tells its workers the row count there), run the layers with `sync`, then
// ln_f (GPT-2) and the head. Returns HF's last hidden state and the head's
// outputs.
[[nodiscard]] core::Result<model::ForwardOutput> terminal_forward(
    const model::Transformer& model, const parallel::Plan& plan, parallel::Synchronizer& sync,
    const model::ModelInput& in, core::ThreadPool* pool, const std::function<core::Status(int64_t)>& started = {});

// Rows the model makes of `in` (text: its ids; ViT: patches + CLS).
int64_t input_rows(const model::ModelConfig& c, const model::ModelInput& in);

// Refuses a request of `rows` rows whose activations on the terminal (rank 0
// of `plan`, as estimate() counts them) exceed the memory available now: a
// config may allow prompts whose workspace would not fit, and failing to
// allocate it mid-layer would abort the process.
[[nodiscard]] core::Status check_request_memory(const parallel::Plan& plan, const model::ModelConfig& c, int64_t rows);

// What each rank loads under `plan` (completed), loaded from `dir`.
[[nodiscard]] core::Result<std::vector<model::Transformer>> load_rank_models(const std::string& dir,
                                                                             const parallel::Plan& plan);

struct InProcessResult {
  model::ForwardOutput output;
  std::vector<parallel::SyncStats> stats;  // per rank
};
// One inference with every rank a thread of this process (no network):
// models[r] is what rank r loaded.
[[nodiscard]] core::Result<InProcessResult> run_in_process(const parallel::Plan& plan,
                                                           const std::vector<model::Transformer>& models,
                                                           const model::ModelInput& in);

// One generation with every rank a thread: rank 0 runs model::generate_with
// over its decoder, the other ranks follow each chunk with theirs. Returns
// prompt + new ids, as model::generate.
[[nodiscard]] core::Result<std::vector<int64_t>> generate_in_process(const parallel::Plan& plan,
                                                                     const std::vector<model::Transformer>& models,
                                                                     const std::vector<int64_t>& prompt,
                                                                     const model::GenerateOptions& opts);

}  // namespace tessera::runtime
