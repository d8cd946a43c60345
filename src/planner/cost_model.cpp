#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "model/config.h"

namespace tessera::planner {

using parallel::CollectiveKind;

double work_ms(const parallel::Work& w, const DeviceProfile& d) { return work_ms(w, d, d.stream_gbps); }

double shared_stream_gbps(const ClusterProfile& p, int d, const std::vector<int>& busy) {
  const DeviceProfile& me = p.devices[static_cast<size_t>(d)];
  if (me.host < 0 || me.host_stream_gbps <= 0) return me.stream_gbps;
  // Shares by threads; another device's weighted by its speed, since an
  // emulated slower device idles that part of the time (core/device_speed.h).
  double demand = me.threads;
  bool shared = false;
  for (int b : busy) {
    const DeviceProfile& o = p.devices[static_cast<size_t>(b)];
    if (b == d || o.host != me.host) continue;
    demand += o.threads * std::clamp(o.speed, 1e-3, 1.0);
    shared = true;
  }
  if (!shared) return me.stream_gbps;
  return std::min(me.stream_gbps, me.host_stream_gbps * me.threads / demand);
}

ClusterProfile streaming_at_once(ClusterProfile p) {
  std::vector<int> all(static_cast<size_t>(p.size()));
  std::iota(all.begin(), all.end(), 0);
  std::vector<double> rate;
  for (int d = 0; d < p.size(); ++d) rate.push_back(shared_stream_gbps(p, d, all));
  for (int d = 0; d < p.size(); ++d) {
    p.devices[static_cast<size_t>(d)].stream_gbps = rate[static_cast<size_t>(d)];
    p.devices[static_cast<size_t>(d)].host = -1;
  }
  return p;
}

std::vector<double> phase_work_ms(const ClusterProfile& p, const std::vector<const std::vector<parallel::Work>*>& work) {
  const size_t K = work.size();
  std::vector<double> out(K, 0.0);
  std::vector<int> active;
  for (size_t d = 0; d < K; ++d)
    if (work[d] != nullptr && !work[d]->empty()) active.push_back(static_cast<int>(d));
  const auto full_ms = [&](int d, double stream) {
    double ms = 0;
    for (const auto& x : *work[static_cast<size_t>(d)]) ms += work_ms(x, p.devices[static_cast<size_t>(d)], stream);
    return ms;
  };
  // Processor sharing: each device's work advances at the rate of the set
  // still busy, and whoever finishes first leaves the others its share, so a
  // larger share streams alone at the end. `left` is the fraction not done.
  std::vector<double> left(K, 1.0), T(K, 0.0);
  double now = 0;
  while (!active.empty()) {
    bool shared = false;
    for (int d : active) {
      const double own = p.devices[static_cast<size_t>(d)].stream_gbps;
      const double rate = shared_stream_gbps(p, d, active);
      shared = shared || rate < own;
      T[static_cast<size_t>(d)] = full_ms(d, rate);
    }
    if (!shared) {  // nothing shared (any longer): each at its own rate
      for (int d : active) out[static_cast<size_t>(d)] = now + left[static_cast<size_t>(d)] * T[static_cast<size_t>(d)];
      break;
    }
    double dt = std::numeric_limits<double>::infinity();
    for (int d : active) dt = std::min(dt, left[static_cast<size_t>(d)] * T[static_cast<size_t>(d)]);
    now += dt;
    std::vector<int> still;
    for (int d : active) {
      const auto u = static_cast<size_t>(d);
      left[u] = T[u] > 0 ? left[u] - dt / T[u] : 0.0;
      if (left[u] > 1e-12) still.push_back(d);
      else out[u] = now;
    }
    // At least the device that set dt finishes (rounding aside): no loop.
    if (still.size() == active.size()) {
      const auto first = std::min_element(still.begin(), still.end(), [&](int a, int b) {
        return left[static_cast<size_t>(a)] * T[static_cast<size_t>(a)] < left[static_cast<size_t>(b)] * T[static_cast<size_t>(b)];
      });
      out[static_cast<size_t>(*first)] = now;
      still.erase(first);
    }
    active.swap(still);
  }
  return out;
}

double work_ms(const parallel::Work& w, const DeviceProfile& d, double stream_gbps) {
  double s = 0;
  switch (w.kind) {
    case parallel::WorkKind::kGemm: {
      const auto held_as = [&](kernels::WeightType t) {
        double t_s = w.flops / (d.gemm_gflops(w.m, w.k, w.n, t) * 1e9);
        // Nor faster than its weights stream in: in a model they are cold
        // when read. The profile's few rows cycle through copies that may
        // still sit in a large cache (a 1B model's decode ran at the stream
        // rate, 1.5x slower than its one-row samples said).
        if (stream_gbps > 0 && w.k > 0 && w.n > 0)
          t_s = std::max(t_s, static_cast<double>(w.n) * static_cast<double>(kernels::row_bytes(t, w.k)) / (stream_gbps * 1e9));
        return t_s;
      };
      // A mixed file's share in its other type at that type's rate (Q6_K's
      // one-row rate was 0.69x Q4_K's on the Intel Xeon); at the main type's
      // where the profile has no samples of it (F32's would be far too slow).
      s = w.mix_share > 0 && d.measured(w.mix) ? (1 - w.mix_share) * held_as(w.weights) + w.mix_share * held_as(w.mix)
                                              : held_as(w.weights);
      break;
    }
    case parallel::WorkKind::kAttention:
      // A step's one row over its caches reads them at the streaming rate,
      // two FLOPs per float read. (The one-row profile's attention rate is of
      // one row over one key: its overheads, not this arithmetic.)
      if (w.bytes > 0 && stream_gbps > 0) s = static_cast<double>(w.bytes) / (stream_gbps * 1e9);
      else s = w.flops / (std::max(d.attention_gflops, 1e-6) * 1e9);
      break;
    case parallel::WorkKind::kElementwise:
      // Read and write each float once.
      s = 2.0 * static_cast<double>(w.m * w.n) * 4.0 / (std::max(d.elementwise_gbps, 1e-6) * 1e9);
      break;
  }
  return 1e3 * s / std::max(d.speed, 1e-3);
}

int collective_steps(CollectiveKind kind, int participants) {
  const int p = std::max(participants, 2);
  switch (kind) {
    case CollectiveKind::kAllgather:
    case CollectiveKind::kReduceScatter: return p - 1;
    case CollectiveKind::kAllreduce: return 2 * (p - 1);
    case CollectiveKind::kBroadcast: return static_cast<int>(std::ceil(std::log2(static_cast<double>(p))));
    default: return 1;
  }
}

double transfer_ms(const parallel::Transfer& t, int from, const ClusterProfile& p) {
  if (t.peers.empty()) return 0;
  double lat = 0, bw = 1e300;
  for (int peer : t.peers) {
    // A device receiving its part hears its peers' latency as well.
    const LinkProfile& out = p.link(from, peer);
    lat = std::max({lat, out.latency_ms, p.link(peer, from).latency_ms});
    bw = std::min(bw, out.bandwidth_mbps > 0 ? out.bandwidth_mbps : 1e-6);
  }
  const int participants = static_cast<int>(t.peers.size()) + 1;
  return collective_steps(t.kind, participants) * lat + static_cast<double>(t.bytes_sent) * 8.0 / (bw * 1e6) * 1e3;
}

core::Status check_memory_budgets(const parallel::Schedule& s, const std::vector<int64_t>& budgets) {
  if (budgets.empty()) return core::ok_status();
  if (budgets.size() != s.devices.size())
    return core::invalid_argument("--memory-limit needs " + std::to_string(s.devices.size()) + " values, got " +
                                  std::to_string(budgets.size()));
  for (size_t d = 0; d < budgets.size(); ++d) {
    const int64_t need = s.devices[d].weight_bytes + s.devices[d].activation_bytes + s.devices[d].kv_bytes();
    if (budgets[d] > 0 && need > budgets[d])
      return core::resource_exhausted("device " + std::to_string(d) + " needs " + format_bytes(need) +
                                      " for this plan, its budget is " + format_bytes(budgets[d]));
  }
  return core::ok_status();
}

nlohmann::json Prediction::to_json() const {
  nlohmann::json d = nlohmann::json::array();
  for (const DevicePrediction& x : devices)
    d.push_back({{"compute_ms", x.compute_ms}, {"comm_ms", x.comm_ms}, {"wait_ms", x.wait_ms},
                 {"memory_bytes", x.memory_bytes}, {"budget_bytes", x.budget_bytes}});
  nlohmann::json j = {{"latency_ms", latency_ms}, {"compute_ms", compute_ms}, {"comm_ms", comm_ms},
                      {"bottleneck", bottleneck}, {"fits", fits}, {"devices", d}};
  if (!fits) j["why_not"] = why_not;
  return j;
}

// The terminal's own kernels, which no strategy estimates: the embedding
// (a gather and, for BERT, a norm; ViT's patch projection) and the head
// (GPT-2's final norm and LM head over every row; BERT's pooler and
// classifier; ViT's norm and classifier on the CLS row), as
// Transformer::embed and Transformer::head run them.
std::vector<parallel::Work> embed_work(const model::ModelConfig& c, int64_t n) {
  std::vector<parallel::Work> w;
  w.push_back(parallel::elementwise("embed", n, c.hidden));
  if (c.projects_embeddings()) w.push_back(parallel::gemm("project_in", n, c.token_width(), c.hidden));
  if (c.embed_norm) w.push_back(parallel::elementwise("norm", n, c.hidden));
  if (c.takes_images()) w.push_back(parallel::gemm("patches", n - 1, c.channels * c.patch_size * c.patch_size, c.hidden));
  return w;
}

std::vector<parallel::Work> head_work(const model::ModelConfig& c, int64_t n) {
  std::vector<parallel::Work> w;
  if (c.causal()) {
    w.push_back(parallel::elementwise("ln_f", n, c.hidden));
    if (c.projects_embeddings()) w.push_back(parallel::gemm("project_out", n, c.hidden, c.token_width()));
    if (c.head == model::HeadKind::kLmHead) {
      w.push_back(parallel::gemm("lm_head", n, c.token_width(), c.vocab));
      w.back().weights = c.head_type();
    }
    return w;
  }
  if (c.final_norm) w.push_back(parallel::elementwise("ln_f", 1, c.hidden));
  if (c.pooled_head) w.push_back(parallel::gemm("pooler", 1, c.hidden, c.hidden));
  if (c.head != model::HeadKind::kNone) w.push_back(parallel::gemm("classifier", 1, c.hidden, c.num_labels()));
  return w;
}

void add_terminal_work(Prediction& pred, const model::ModelConfig& c, const ClusterProfile& p, int64_t n, int64_t head_rows) {
  if (pred.devices.empty() || p.devices.empty()) return;
  double ms = 0;
  for (const auto& w : embed_work(c, n)) ms += work_ms(w, p.devices[0]);
  for (const auto& w : head_work(c, head_rows < 0 ? n : head_rows)) ms += work_ms(w, p.devices[0]);
  pred.latency_ms += ms;
  pred.devices[0].compute_ms += ms;
  pred.devices[0].end_ms += ms;
  if (pred.bottleneck == 0) pred.compute_ms += ms;
  pred.comm_ms = std::max(0.0, pred.latency_ms - pred.compute_ms);
}

void add_cache_allocation(Prediction& pred, const parallel::Schedule& s, const ClusterProfile& p, double touched) {
  const size_t K = std::min({s.devices.size(), pred.devices.size(), p.devices.size()});
  // Memory, not a kernel: --device-speed does not slow it.
  auto ms_of = [&](size_t d, int64_t bytes) {
    return p.devices[d].zero_gbps > 0 ? 1e3 * touched * static_cast<double>(bytes) / (p.devices[d].zero_gbps * 1e9) : 0.0;
  };
  size_t layers = 0;
  for (size_t d = 0; d < K; ++d) {
    const double ms = ms_of(d, s.devices[d].kv_bytes());
    pred.devices[d].compute_ms += ms;
    pred.devices[d].end_ms += ms;
    layers = std::max(layers, s.devices[d].kv_layer_bytes.size());
  }
  // Each layer's pages are faulted in as the prefill writes that layer, and
  // the devices go through the layers together (in lockstep, or one stage
  // after another): layer by layer the slowest holder waits for the rest. A
  // pipeline decode after a Voltage prefill thus costs the whole model's
  // caches, not the larger half.
  double path = 0;
  for (size_t l = 0; l < layers; ++l) {
    double slowest = 0;
    for (size_t d = 0; d < K; ++d)
      if (l < s.devices[d].kv_layer_bytes.size()) slowest = std::max(slowest, ms_of(d, s.devices[d].kv_layer_bytes[l]));
    path += slowest;
  }
  pred.latency_ms += path;
  pred.compute_ms += path;
}

core::Result<Prediction> predict(const parallel::Schedule& s, const ClusterProfile& p) {
  const int K = static_cast<int>(s.devices.size());
  if (K < 1 || K > p.size())
    return core::invalid_argument("the schedule has " + std::to_string(K) + " devices, the profile " + std::to_string(p.size()));
  const size_t phases = s.devices[0].phases.size();
  for (const auto& d : s.devices)
    if (d.phases.size() != phases) return core::internal_error("the devices' schedules do not line up phase by phase");
  Prediction out;
  out.devices.resize(static_cast<size_t>(K));
  std::vector<double> t(static_cast<size_t>(K), 0.0), w(static_cast<size_t>(K)), c(static_cast<size_t>(K));
  std::vector<const std::vector<parallel::Work>*> work;
  for (size_t i = 0; i < phases; ++i) {
    std::vector<int> part;
    bool overlapped = false;
    // The devices computing in this phase: those of one host share its
    // memory bandwidth (all of tp's devices at a step, one pipeline stage).
    work.clear();
    for (int d = 0; d < K; ++d) work.push_back(&s.devices[static_cast<size_t>(d)].phases[i].work);
    const std::vector<double> work_of = phase_work_ms(p, work);
    for (int d = 0; d < K; ++d) {
      const auto& ph = s.devices[static_cast<size_t>(d)].phases[i];
      double wd = work_of[static_cast<size_t>(d)], cd = 0;
      const DeviceProfile& dev = p.devices[static_cast<size_t>(d)];
      for (const auto& x : ph.transfers) {
        cd += transfer_ms(x, d, p);
        // Under overlap the transport encrypts what it sends and decrypts
        // what it receives (as much, in these symmetric exchanges) on the
        // cores the work runs on. Sequential exchanges have it in the
        // measured link.
        if (ph.overlapped && dev.crypto_gbps > 0) wd += 2.0 * static_cast<double>(x.bytes_sent) / (dev.crypto_gbps * 1e6);
      }
      w[static_cast<size_t>(d)] = wd;
      c[static_cast<size_t>(d)] = cd;
      out.devices[static_cast<size_t>(d)].compute_ms += wd;
      if (!ph.transfers.empty()) {
        part.push_back(d);
        overlapped = overlapped || ph.overlapped;
      }
    }
    // A device outside every transfer of the phase just computes.
    for (int d = 0; d < K; ++d)
      if (std::find(part.begin(), part.end(), d) == part.end()) t[static_cast<size_t>(d)] += w[static_cast<size_t>(d)];
    if (part.empty()) continue;
    // The participants meet: the collective lasts as long as its slowest
    // member's share; it starts when the last one is ready (sequential) or
    // at once, with the work running under it (overlapped).
    double C = 0, start = 0, ready = 0;
    for (int d : part) {
      const auto u = static_cast<size_t>(d);
      C = std::max(C, c[u]);
      start = std::max(start, overlapped ? t[u] : t[u] + w[u]);
      ready = std::max(ready, t[u] + w[u]);
    }
    const double end = overlapped ? std::max(start + C, ready) : start + C;
    const double exposed = end - ready;  // communication nobody's work hides
    for (int d : part) {
      const auto u = static_cast<size_t>(d);
      DevicePrediction& dp = out.devices[u];
      const double comm = overlapped ? exposed : C;
      dp.comm_ms += comm;
      dp.wait_ms += std::max(0.0, end - t[u] - w[u] - comm);
      t[u] = end;
    }
  }
  out.latency_ms = t[0];
  double least_wait = 1e300;
  for (int d = 0; d < K; ++d) {
    const auto u = static_cast<size_t>(d);
    DevicePrediction& dp = out.devices[u];
    dp.end_ms = t[u];
    dp.memory_bytes =
        s.devices[u].weight_bytes + s.devices[u].activation_bytes + s.devices[u].kv_bytes() + p.devices[u].runtime_bytes;
    dp.budget_bytes = p.devices[u].memory_bytes;
    if (dp.budget_bytes > 0 && dp.memory_bytes > dp.budget_bytes && out.fits) {
      out.fits = false;
      out.over_budget = d;
      out.why_not = "device " + std::to_string(d) + " needs " + format_bytes(dp.memory_bytes) + ", budget " +
                    format_bytes(dp.budget_bytes);
    }
    // The critical path runs through the device that waits least; among
    // equals, the one computing most.
    const double key = dp.wait_ms - 1e-9 * dp.compute_ms;
    if (dp.compute_ms > 0 && key < least_wait) least_wait = key, out.bottleneck = d;
  }
  out.compute_ms = out.devices[static_cast<size_t>(out.bottleneck)].compute_ms;
  out.comm_ms = std::max(0.0, out.latency_ms - out.compute_ms);
  return out;
}

}  // namespace tessera::planner
