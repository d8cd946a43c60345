// Galaxy over real comm groups (inproc, ranks as threads), so the ring tile
// overlap of §III-D runs: the overlapped collectives equal the plain ones,
// and Galaxy equals the single device on the fixtures with and without
// overlap, for K = 1..4 and uneven head (A) and FFN (B) partitions; so does
// Voltage with its overlapped K/V projection.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <numeric>
#include <thread>
#include <zmq.hpp>

#include "comm/group.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "parallel/comm_sync.h"
#include "parallel/strategy.h"
#include "fixtures.h"

namespace tessera::parallel {
namespace {

using testing::fixture_input;
using testing::kData;
using testing::max_diff;

// Runs fn(rank, synchronizer) on k threads, each a rank of one inproc group.
std::vector<core::Status> run_ranks(int k, const std::function<core::Status(int, Synchronizer&)>& fn) {
  static std::atomic<int> counter{0};
  const std::string name = "galaxy-" + std::to_string(counter++);
  auto ctx = std::make_shared<zmq::context_t>(1);
  std::vector<core::Status> out(static_cast<size_t>(k));
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      comm::GroupOptions o;
      o.rank = r;
      for (int q = 0; q < k; ++q) o.endpoints.push_back("inproc://" + name + "-" + std::to_string(q));
      o.group_id = name;
      o.context = ctx;
      auto g = comm::Group::create(o);
      if (!g.ok()) {
        out[static_cast<size_t>(r)] = g.status();
        return;
      }
      CommSynchronizer sync(**g, std::chrono::seconds(30));
      out[static_cast<size_t>(r)] = fn(r, sync);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void expect_all_ok(const std::vector<core::Status>& st) {
  for (size_t r = 0; r < st.size(); ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
}

// Rank r's contribution to row i, column j: distinct for every triple.
float value(int r, int64_t i, int64_t j) { return static_cast<float>(r * 1000 + i * 10 + j) * 0.01f; }

TEST(GalaxyCollectives, OverlappedRingsEqualPlainCollectives) {
  const std::vector<std::vector<int64_t>> shapes = {{3}, {2, 2}, {3, 0}, {1, 2, 3}, {0, 4, 1, 0}, {2, 1, 1, 2, 3}};
  const int64_t cols = 5;
  for (const auto& counts : shapes) {
    const int k = static_cast<int>(counts.size());
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const std::vector<int64_t> at = row_offsets(counts);
    expect_all_ok(run_ranks(k, [&](int r, Synchronizer& sync) -> core::Status {
      // AllGather: every tile arrives once, with its owner's rows, in ring order.
      std::vector<float> mine;
      for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i)
        for (int64_t j = 0; j < cols; ++j) mine.push_back(value(r, i, j));
      std::vector<int> order;
      TESSERA_RETURN_IF_ERROR(sync.allgather_rows_overlapped(mine.data(), counts, cols,
                                                             [&](int owner, const float* rows, int64_t cnt) {
        order.push_back(owner);
        EXPECT_EQ(cnt, counts[static_cast<size_t>(owner)]);
        for (int64_t i = 0; i < cnt; ++i)
          for (int64_t j = 0; j < cols; ++j) EXPECT_EQ(rows[i * cols + j], value(owner, i, j));
      }));
      for (int s = 0; s < k; ++s) EXPECT_EQ(order[static_cast<size_t>(s)], ((r - s) % k + k) % k);
      // ReduceScatter: our rows of the sum over ranks, both forms.
      auto partial = [&](int dest, float* out) {
        for (int64_t i = 0; i < counts[static_cast<size_t>(dest)]; ++i)
          for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = value(r, at[static_cast<size_t>(dest)] + i, j);
      };
      const int64_t n = counts[static_cast<size_t>(r)] * cols;
      std::vector<float> ring(static_cast<size_t>(n)), plain(static_cast<size_t>(n));
      TESSERA_RETURN_IF_ERROR(sync.reduce_scatter_rows_overlapped(counts, cols, partial, ring.data()));
      TESSERA_RETURN_IF_ERROR(sync.partials_then_reduce_scatter(counts, cols, partial, plain.data()));
      for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          float want = 0.0f;
          for (int q = 0; q < k; ++q) want += value(q, at[static_cast<size_t>(r)] + i, j);
          EXPECT_NEAR(ring[static_cast<size_t>(i * cols + j)], want, 1e-3f);
          EXPECT_NEAR(plain[static_cast<size_t>(i * cols + j)], want, 1e-3f);
        }
      // Both forms account the same ring traffic: every part but our own.
      const auto& sent = sync.stats().elements_sent;
      EXPECT_EQ(sent[static_cast<size_t>(CollectiveKind::kReduceScatter)],
                2 * (k > 1 ? (total - counts[static_cast<size_t>(r)]) * cols : 0));
      // Broadcast in parts from the last rank, both forms: every part arrives
      // once, our own first, and `all` ends up as the root's.
      const int root = k - 1;
      for (const bool overlapped : {true, false}) {
        std::vector<float> all(static_cast<size_t>(total * cols), -1.0f);
        if (r == root)
          for (int64_t i = 0; i < total * cols; ++i) all[static_cast<size_t>(i)] = value(root, i / cols, i % cols);
        std::vector<int> parts;
        auto tile = [&](int owner, const float* rows, int64_t cnt) {
          parts.push_back(owner);
          EXPECT_EQ(cnt, counts[static_cast<size_t>(owner)]);
          for (int64_t i = 0; i < cnt; ++i)
            for (int64_t j = 0; j < cols; ++j)
              EXPECT_EQ(rows[i * cols + j], value(root, at[static_cast<size_t>(owner)] + i, j));
        };
        if (overlapped) {
          TESSERA_RETURN_IF_ERROR(sync.broadcast_rows_overlapped(all.data(), counts, cols, root, tile));
        } else {
          TESSERA_RETURN_IF_ERROR(sync.broadcast_rows_then_tiles(all.data(), counts, cols, root, tile));
        }
        EXPECT_EQ(parts, own_part_first(r, k));
        for (int64_t i = 0; i < total * cols; ++i)
          EXPECT_EQ(all[static_cast<size_t>(i)], value(root, i / cols, i % cols));
      }
      if (r == root) {
        EXPECT_EQ(sent[static_cast<size_t>(CollectiveKind::kBroadcast)], 2 * total * cols * (k - 1));
      }
      return core::ok_status();
    }));
  }
}


// A plan on k threads over inproc; returns HF's last hidden state from rank 0.
core::Tensor run_comm_threads(const std::string& dir, Plan plan, const model::ModelInput& in) {
  auto cfg = model::load_config(dir).value();
  EXPECT_TRUE(complete_plan(plan, cfg).ok());
  core::Tensor hidden;
  expect_all_ok(run_ranks(plan.world, [&](int r, Synchronizer& sync) -> core::Status {
    TESSERA_ASSIGN_OR_RETURN(model::Transformer m, model::Transformer::load(dir, load_options(plan, cfg, r)));
    core::Tensor x;
    if (r == 0) {
      TESSERA_ASSIGN_OR_RETURN(x, m.embed(in));
    }
    const int64_t n = in.pixels.empty() ? static_cast<int64_t>(in.ids.size()) : cfg.max_rows();
    TESSERA_ASSIGN_OR_RETURN(core::Tensor y, run_layers(m, plan, sync, x, n, nullptr));
    if (r == 0) {
      m.finish_hidden(y, nullptr);
      hidden = y;
    }
    return core::ok_status();
  }));
  return hidden;
}


TEST(GalaxyTest, EqualsSingleDeviceWithAndWithoutOverlap) {
  struct Case {
    const char* family;
    const char* input;
  };
  // N = 33, 13 are not divisible by K; N = 1 < K leaves ranks without rows.
  const Case cases[] = {{"bert-tiny", "s33"}, {"gpt2-tiny", "s13"}, {"gpt2-tiny", "s1"}, {"vit-tiny", "c0"}};
  struct Split {
    std::vector<double> heads, ffn;  // partitions A and B
  };
  const std::vector<Split> splits[] = {
      {{{1}, {1}}},
      {{{1, 1}, {1, 1}}, {{3, 1}, {1, 2}}},
      {{{1, 1, 1}, {1, 1, 1}}, {{1, 0, 2}, {2, 1, 1}}},
      {{{1, 1, 1, 1}, {1, 1, 1, 1}}, {{2, 1, 0, 1}, {1, 3, 1, 2}}},
  };
  for (const auto& c : cases) {
    const std::string dir = kData + "/" + c.family;
    const auto in = fixture_input(c.family, c.input);
    const auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
    for (int k = 1; k <= 4; ++k)
      for (const Split& split : splits[k - 1])
        for (bool overlap : {true, false}) {
          Plan plan;
          plan.strategy = Strategy::kGalaxy;
          plan.world = k;
          plan.ratios = split.heads;
          plan.ffn_ratios = split.ffn;
          plan.overlap = overlap;
          EXPECT_LT(max_diff(run_comm_threads(dir, plan, in), single.hidden.back()), 1e-4f)
              << c.family << " " << c.input << " K=" << k << " A[0]=" << split.heads[0] << " overlap=" << overlap;
        }
  }
}

// Voltage's overlap (K/V of each arriving block) over real rings: exact too.
TEST(GalaxyTest, VoltageOverlapEqualsSingleDevice) {
  for (const char* family : {"bert-tiny", "gpt2-tiny"}) {
    const std::string dir = kData + "/" + family;
    const auto in = fixture_input(family, family == std::string("bert-tiny") ? "s33" : "s13");
    const auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
    for (int k = 1; k <= 3; ++k)
      for (bool overlap : {true, false}) {
        Plan plan;
        plan.strategy = Strategy::kVoltage;
        plan.world = k;
        plan.ratios = k == 3 ? std::vector<double>{1, 0, 2} : std::vector<double>{};
        plan.overlap = overlap;
        EXPECT_LT(max_diff(run_comm_threads(dir, plan, in), single.hidden.back()), 1e-4f)
            << family << " K=" << k << " overlap=" << overlap;
      }
  }
}

TEST(GalaxyTest, ShardsFollowPartitionsAAndB) {
  auto cfg = model::load_config(kData + "/bert-tiny").value();  // 4 heads, FFN 128 wide
  Plan plan;
  plan.strategy = Strategy::kGalaxy;
  plan.world = 2;
  plan.ratios = {3, 1};
  plan.ffn_ratios = {1, 3};
  ASSERT_TRUE(complete_plan(plan, cfg).ok());
  const auto a = tp_head_ranges(plan, cfg), b = tp_ffn_ranges(plan, cfg);
  EXPECT_EQ(a[0].size(), cfg.heads * 3 / 4);
  EXPECT_EQ(b[1].size(), cfg.intermediate * 3 / 4);
  const auto o = load_options(plan, cfg, 1);
  EXPECT_EQ(o.head_begin, a[1].begin);
  EXPECT_EQ(o.head_end, a[1].end);
  EXPECT_EQ(o.ffn_begin, b[1].begin);
  EXPECT_EQ(o.ffn_end, b[1].end);
  EXPECT_FALSE(o.embeddings);
  // S is always equal, whatever A and B are.
  EXPECT_EQ(range_sizes(galaxy_seq_ranges(10, 3)), (std::vector<int64_t>{4, 3, 3}));
  // A separate FFN partition is for the sharded strategies only.
  Plan bad;
  bad.strategy = Strategy::kVoltage;
  bad.world = 2;
  bad.ffn_ratios = {1, 1};
  EXPECT_FALSE(complete_plan(bad, cfg).ok());
}

}  // namespace
}  // namespace tessera::parallel
