// Exact layer assignment: the ILP of Viramontes & Davoodi (Eq. 1-10, with
// the pseudo layers of their §III-A) solved by COIN-OR CBC. A chain of units
// (source, embedding, the model's layers or blocks, head, destination) is
// assigned to devices, minimising T = Tc + Tx + Tw within each device's
// memory. docs/planner.md writes the formulation and maps it to this code.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "parallel/strategy.h"
#include "planner/profile.h"

namespace tessera::planner {

// One unit of the chain (a layer l of the paper).
struct IlpUnit {
  std::string name;
  int pinned = -1;                  // the device it must run on; -1: free
  int64_t model_unit = -1;          // the strategy's unit index (layer or block); -1: pseudo
  std::vector<double> compute_ms;   // t^c_{l,d} (Eq. 1), per device
  std::vector<double> load_ms;      // t^w_{l,d} (Eq. 2), per device
  int64_t weight_bytes = 0;         // w_l·α (Eq. 5), plus the unit's KV caches in a generation plan
  int64_t out_bytes = 0;            // what goes to the next unit's device (Eq. 3)
};

struct IlpProblem {
  int devices = 0;
  std::vector<IlpUnit> units;
  // xfer_ms[l][d][d']: t^x_{l,d,d'} (Eq. 3), 0 on the diagonal; infinite
  // where there is no link. One entry per unit but the last.
  std::vector<std::vector<std::vector<double>>> xfer_ms;
  // M_d less the activations a device needs once it runs anything (bytes;
  // infinite: no budget). Negative: the device cannot run any free unit.
  std::vector<double> budget;
};

// Which units: one per transformer layer, or attention and MLP blocks apart.
enum class UnitGranularity { kLayers, kBlocks };

// The chain of `s` (a ShareKind::kLayers strategy) for `c` at `rows` rows,
// priced on `p`: each unit's kernels, weight bytes, output bytes and the
// devices' activation bytes come from s.estimate() of plans that put that
// unit alone on a second device. with_load_time = false sets Tw to 0.
// ctx > 0: a generation; each unit's memory also holds its KV caches at
// that context (Tw still streams the weights only).
[[nodiscard]] core::Result<IlpProblem> build_unit_chain(const parallel::Strategy& s, const model::ModelConfig& c,
                                                        const ClusterProfile& p, int64_t rows, UnitGranularity g,
                                                        bool with_load_time = true, int64_t ctx = 0,
                                                        core::DType kv_dtype = core::DType::kF32,
                                                        core::WireType wire = core::WireType::kF32);

// T = Tc + Tx + Tw of an assignment (device of each unit), and whether it
// is feasible (pins, links and budgets).
struct IlpCost {
  double compute_ms = 0, transfer_ms = 0, load_ms = 0;
  double total() const { return compute_ms + transfer_ms + load_ms; }
};
IlpCost assignment_cost(const IlpProblem& pr, const std::vector<int>& device_of_unit);
bool assignment_feasible(const IlpProblem& pr, const std::vector<int>& device_of_unit);

enum class IlpStatus { kOptimal, kFeasible, kInfeasible, kNoSolution };
const char* ilp_status_name(IlpStatus s);

struct IlpOptions {
  double time_limit_s = 10;
  std::vector<int> warm_start;  // a feasible assignment (e.g. the DP's); empty: none
  std::string lp_file;          // when set, the model is written there in LP format
};

struct IlpResult {
  IlpStatus status = IlpStatus::kNoSolution;
  std::vector<int> device_of_unit;  // rounded x
  double objective_ms = 0;          // T recomputed from device_of_unit
  IlpCost cost;                     // its Tc, Tx and Tw
  double bound_ms = 0;              // CBC's best bound
  double gap = 0;                   // (objective - bound) / objective
  double solve_s = 0;
  int variables = 0, constraints = 0;
  std::string summary() const;      // one line: status, T, gap, time, size
};

// Solves the ILP with CBC. An error only for a malformed problem; an
// infeasible one is a result with status kInfeasible.
[[nodiscard]] core::Result<IlpResult> solve_ilp(const IlpProblem& pr, const IlpOptions& o = {});

// Every assignment of the free units (small problems only: the tests'
// exact reference). Status kOptimal or kInfeasible.
IlpResult brute_force(const IlpProblem& pr);

// The model units' devices (strategy's unit map) from a chain assignment, and back.
std::vector<int> model_unit_map(const IlpProblem& pr, const std::vector<int>& device_of_unit);
std::vector<int> chain_assignment(const IlpProblem& pr, const std::vector<int>& model_map);

}  // namespace tessera::planner
