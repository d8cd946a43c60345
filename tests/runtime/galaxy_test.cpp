// Strategies over real comm groups (inproc, ranks as threads), so the ring
// tile streams of §III-D run: the streamed collectives equal the whole ones;
// Galaxy and Voltage equal the single device with and without overlap;
// every strategy's estimate() gives exactly the bytes the comm layer counted
// and the FLOPs the kernels counted; and a compressed wire (--wire) gives
// the in-process emulation's bits, at the bytes estimate() predicts.
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
#include "../parallel/fixtures.h"
#include "kernels/flop_count.h"
#include "parallel/local_group.h"
#include "parallel/strategy.h"
#include "parallel/sub_sync.h"
#include "runtime/comm_sync.h"

namespace tessera::parallel {
namespace {

using runtime::CommSynchronizer;

using testing::fixture_input;
using testing::kData;
using testing::max_diff;
using testing::make_plan;
using testing::run_threads;

// Runs fn(rank, synchronizer) on k threads, each a rank of one inproc group.
std::vector<core::Status> run_ranks(int k, const std::function<core::Status(int, CommSynchronizer&)>& fn) {
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
    expect_all_ok(run_ranks(k, [&](int r, CommSynchronizer& sync) -> core::Status {
      // AllGather: every tile arrives once, with its owner's rows, in ring order.
      std::vector<float> mine;
      for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i)
        for (int64_t j = 0; j < cols; ++j) mine.push_back(value(r, i, j));
      for (const bool streamed : {true, false}) {
        std::vector<int> order;
        TESSERA_ASSIGN_OR_RETURN(auto tiles, streamed ? sync.allgather_tiles(mine, counts, cols)
                                                      : sync.allgather_tiles_whole(mine, counts, cols));
        while (!tiles->done()) {
          TESSERA_ASSIGN_OR_RETURN(const Tile t, tiles->next());
          order.push_back(t.owner);
          EXPECT_EQ(t.count, counts[static_cast<size_t>(t.owner)]);
          EXPECT_EQ(static_cast<int64_t>(t.rows.size()), t.count * cols);
          for (int64_t i = 0; i < t.count; ++i)
            for (int64_t j = 0; j < cols; ++j) EXPECT_EQ(t.rows[static_cast<size_t>(i * cols + j)], value(t.owner, i, j));
        }
        TESSERA_RETURN_IF_ERROR(tiles->finish());
        EXPECT_EQ(order, ring_order(r, k));
      }
      // ReduceScatter: our rows of the sum over ranks, both forms.
      const int64_t n = counts[static_cast<size_t>(r)] * cols;
      for (const bool streamed : {true, false}) {
        std::vector<float> mine_sum(static_cast<size_t>(n));
        TESSERA_ASSIGN_OR_RETURN(auto parts, streamed ? sync.reduce_scatter_parts(counts, cols, mine_sum)
                                                      : sync.reduce_scatter_parts_whole(counts, cols, mine_sum));
        while (!parts->done()) {
          TESSERA_ASSIGN_OR_RETURN(const PartialSlot slot, parts->next());
          const auto d = static_cast<size_t>(slot.dest);
          EXPECT_EQ(static_cast<int64_t>(slot.out.size()), counts[d] * cols);
          for (int64_t i = 0; i < counts[d]; ++i)
            for (int64_t j = 0; j < cols; ++j) slot.out[static_cast<size_t>(i * cols + j)] = value(r, at[d] + i, j);
          TESSERA_RETURN_IF_ERROR(parts->submit());
        }
        TESSERA_RETURN_IF_ERROR(parts->finish());
        for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            float want = 0.0f;
            for (int q = 0; q < k; ++q) want += value(q, at[static_cast<size_t>(r)] + i, j);
            EXPECT_NEAR(mine_sum[static_cast<size_t>(i * cols + j)], want, 1e-3f);
          }
      }
      // Both forms account the same ring traffic: every part but our own.
      const auto& sent = sync.stats().elements_sent;
      EXPECT_EQ(sent[static_cast<size_t>(CollectiveKind::kReduceScatter)],
                2 * (k > 1 ? (total - counts[static_cast<size_t>(r)]) * cols : 0));
      // Broadcast in parts from the last rank, both forms: every part arrives
      // once, our own first, and `all` ends up as the root's.
      const int root = k - 1;
      for (const bool streamed : {true, false}) {
        std::vector<float> all(static_cast<size_t>(total * cols), -1.0f);
        if (r == root)
          for (int64_t i = 0; i < total * cols; ++i) all[static_cast<size_t>(i)] = value(root, i / cols, i % cols);
        std::vector<int> parts;
        TESSERA_ASSIGN_OR_RETURN(auto tiles, streamed ? sync.broadcast_tiles(all, counts, cols, root)
                                                      : sync.broadcast_tiles_whole(all, counts, cols, root));
        while (!tiles->done()) {
          TESSERA_ASSIGN_OR_RETURN(const Tile t, tiles->next());
          parts.push_back(t.owner);
          EXPECT_EQ(t.count, counts[static_cast<size_t>(t.owner)]);
          for (int64_t i = 0; i < t.count; ++i)
            for (int64_t j = 0; j < cols; ++j)
              EXPECT_EQ(t.rows[static_cast<size_t>(i * cols + j)], value(root, at[static_cast<size_t>(t.owner)] + i, j));
        }
        TESSERA_RETURN_IF_ERROR(tiles->finish());
        EXPECT_EQ(parts, own_part_first(r, k));
        for (int64_t i = 0; i < total * cols; ++i)
          EXPECT_EQ(all[static_cast<size_t>(i)], value(root, i / cols, i % cols));
      }
      // Scatter in pieces of 1, 2 and 5 rows from the last rank: this rank's
      // rows arrive in order, piece by piece, into `mine`.
      for (const int64_t piece : {1, 2, 5}) {
        std::vector<float> all;
        if (r == root)
          for (int64_t i = 0; i < total * cols; ++i) all.push_back(value(root, i / cols, i % cols));
        const int64_t rows = counts[static_cast<size_t>(r)];
        std::vector<float> got(static_cast<size_t>(rows * cols), -1.0f);
        TESSERA_ASSIGN_OR_RETURN(auto tiles, sync.scatter_tiles(all, counts, cols, got, root, piece));
        int64_t seen = 0;
        while (!tiles->done()) {
          TESSERA_ASSIGN_OR_RETURN(const Tile t, tiles->next());
          EXPECT_EQ(t.owner, r);
          EXPECT_EQ(t.count, std::min(piece, rows - seen));
          EXPECT_EQ(t.rows.data(), got.data() + seen * cols);
          seen += t.count;
        }
        TESSERA_RETURN_IF_ERROR(tiles->finish());
        EXPECT_EQ(seen, rows);
        for (int64_t i = 0; i < rows * cols; ++i)
          EXPECT_EQ(got[static_cast<size_t>(i)], value(root, at[static_cast<size_t>(r)] + i / cols, i % cols));
      }
      // Three AllGathers in flight at once, each on its own stream, taken in
      // the opposite order: none takes another's messages.
      std::vector<std::unique_ptr<TileStream>> streams;
      for (int st = 0; st < 3; ++st) {
        std::vector<float> mine;
        for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i)
          for (int64_t j = 0; j < cols; ++j) mine.push_back(value(r, i, j) + static_cast<float>(st) * 100.0f);
        TESSERA_ASSIGN_OR_RETURN(auto tiles, sync.allgather_tiles(mine, counts, cols, st));
        streams.push_back(std::move(tiles));
      }
      for (int st = 2; st >= 0; --st) {
        TileStream& tiles = *streams[static_cast<size_t>(st)];
        while (!tiles.done()) {
          TESSERA_ASSIGN_OR_RETURN(const Tile t, tiles.next());
          for (int64_t i = 0; i < t.count; ++i)
            for (int64_t j = 0; j < cols; ++j)
              EXPECT_EQ(t.rows[static_cast<size_t>(i * cols + j)], value(t.owner, i, j) + static_cast<float>(st) * 100.0f);
        }
        TESSERA_RETURN_IF_ERROR(tiles.finish());
      }
      const std::vector<float> enough(static_cast<size_t>(counts[static_cast<size_t>(r)] * cols));
      EXPECT_FALSE(sync.allgather_tiles(enough, counts, cols, kMaxTileStreams).ok());
      EXPECT_FALSE(sync.allgather_tiles(enough, counts, cols, -1).ok());
      return core::ok_status();
    }));
  }
}

// The first w of k ranks as a world of their own (a pair's decode on some of
// its prefill's devices): every collective gives what it defines, over the
// comm layer and over LocalGroup alike, with nothing sent to or by the ranks
// outside; with a lossy wire every member holds the same bits.
core::Status sub_collectives(Synchronizer& parent, int w, core::WireType wire, std::vector<std::vector<float>>& shared) {
  const int r = parent.rank();
  parent.set_wire(wire);
  if (r >= w) return core::ok_status();
  SubSynchronizer sync(parent, w);
  EXPECT_EQ(sync.world(), w);
  const bool exact = wire == core::WireType::kF32 || w == 1;
  const std::vector<int64_t> all_counts = {2, 0, 3, 1};
  const std::vector<int64_t> counts(all_counts.begin(), all_counts.begin() + w);
  const int64_t cols = 64, total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const std::vector<int64_t> at = row_offsets(counts);
  std::vector<float> mine;
  for (int64_t i = 0; i < counts[static_cast<size_t>(r)] * cols; ++i) mine.push_back(value(r, i / cols, i % cols));
  std::vector<float> all(static_cast<size_t>(total * cols), -1.0f);
  TESSERA_RETURN_IF_ERROR(sync.allgather_rows(mine, counts, cols, all));
  for (int q = 0; q < w; ++q)
    for (int64_t i = 0; i < counts[static_cast<size_t>(q)] * cols && exact; ++i)
      EXPECT_EQ(all[static_cast<size_t>(at[static_cast<size_t>(q)] * cols + i)], value(q, i / cols, i % cols));
  shared[static_cast<size_t>(r)] = all;
  std::vector<float> gathered(r == w - 1 ? static_cast<size_t>(total * cols) : 0, -1.0f);
  TESSERA_RETURN_IF_ERROR(sync.gather_rows(mine, counts, cols, gathered, w - 1));
  if (r == w - 1 && exact) {
    EXPECT_EQ(gathered, all);
  }
  std::vector<float> part(static_cast<size_t>(counts[static_cast<size_t>(r)] * cols), -1.0f);
  std::vector<float> source;
  if (r == 0)
    for (int64_t i = 0; i < total * cols; ++i) source.push_back(value(7, i / cols, i % cols));
  TESSERA_RETURN_IF_ERROR(sync.scatter_rows(source, counts, cols, part, 0));
  for (size_t i = 0; i < part.size() && exact; ++i)
    EXPECT_EQ(part[i], value(7, at[static_cast<size_t>(r)] + static_cast<int64_t>(i) / cols, static_cast<int64_t>(i) % cols));
  std::vector<float> full;
  for (int64_t i = 0; i < total * cols; ++i) full.push_back(value(r, i / cols, i % cols));
  TESSERA_RETURN_IF_ERROR(sync.reduce_scatter_rows(full, counts, cols, part));
  for (size_t i = 0; i < part.size() && exact; ++i) {
    float want = 0.0f;  // rank order, as the members sum
    for (int q = 0; q < w; ++q) want += value(q, at[static_cast<size_t>(r)] + static_cast<int64_t>(i) / cols, static_cast<int64_t>(i) % cols);
    EXPECT_EQ(part[i], want);
  }
  std::vector<float> sum;
  for (int64_t i = 0; i < 3 * cols; ++i) sum.push_back(value(r, i / cols, i % cols));
  TESSERA_RETURN_IF_ERROR(sync.allreduce_sum(sum));
  for (int64_t i = 0; i < 3 * cols && exact; ++i) {
    float want = 0.0f;
    for (int q = 0; q < w; ++q) want += value(q, i / cols, i % cols);
    EXPECT_EQ(sum[static_cast<size_t>(i)], want);
  }
  shared[static_cast<size_t>(r)].insert(shared[static_cast<size_t>(r)].end(), sum.begin(), sum.end());
  std::vector<float> b(static_cast<size_t>(2 * cols), -1.0f);
  if (r == w - 1)
    for (int64_t i = 0; i < 2 * cols; ++i) b[static_cast<size_t>(i)] = value(9, i / cols, i % cols);
  TESSERA_RETURN_IF_ERROR(sync.broadcast(b, w - 1));
  for (int64_t i = 0; i < 2 * cols && exact; ++i) EXPECT_EQ(b[static_cast<size_t>(i)], value(9, i / cols, i % cols));
  shared[static_cast<size_t>(r)].insert(shared[static_cast<size_t>(r)].end(), b.begin(), b.end());
  // Point to point inside; a peer outside is refused.
  if (w > 1) {
    std::vector<float> msg{1.0f, 2.0f, static_cast<float>(r)};
    TESSERA_RETURN_IF_ERROR(sync.send((r + 1) % w, msg));
    TESSERA_RETURN_IF_ERROR(sync.recv((r + w - 1) % w, msg));
    if (exact) {
      EXPECT_EQ(msg[2], static_cast<float>((r + w - 1) % w));
    }
  }
  EXPECT_FALSE(sync.send(w, std::vector<float>{1.0f}).ok());
  EXPECT_FALSE(sync.broadcast(b, w).ok());
  return core::ok_status();
}

TEST(SubSynchronizer, TheFirstRanksCollectAmongThemselves) {
  const int k = 4;
  for (const core::WireType wire : {core::WireType::kF32, core::WireType::kQ8})
    for (int w = 1; w <= k; ++w) {
      std::vector<std::vector<float>> comm_got(k), local_got(k);
      std::vector<int64_t> outside_sent(k, 0);
      expect_all_ok(run_ranks(k, [&](int r, CommSynchronizer& sync) -> core::Status {
        TESSERA_RETURN_IF_ERROR(sub_collectives(sync, w, wire, comm_got));
        outside_sent[static_cast<size_t>(r)] = static_cast<int64_t>(sync.group().stats().total.bytes_sent);
        return core::ok_status();
      }));
      LocalGroup group(k);
      std::vector<std::thread> threads;
      for (int r = 0; r < k; ++r)
        threads.emplace_back([&, r] {
          const std::unique_ptr<Synchronizer> sync = group.member(r);
          const core::Status st = sub_collectives(*sync, w, wire, local_got);
          EXPECT_TRUE(st.ok()) << st.to_string();
        });
      for (auto& t : threads) t.join();
      for (int r = 0; r < k; ++r) {
        if (r >= w) {
          EXPECT_EQ(outside_sent[static_cast<size_t>(r)], 0) << r;
          continue;
        }
        // Every member holds the same bits, on either synchronizer.
        EXPECT_EQ(comm_got[static_cast<size_t>(r)], comm_got[0]) << "rank " << r << " of " << w << " " << core::wire_type_name(wire);
        EXPECT_EQ(local_got[static_cast<size_t>(r)], comm_got[0]) << "rank " << r << " of " << w << " " << core::wire_type_name(wire);
      }
    }
}

struct CommRun {
  core::Tensor hidden;  // HF's last hidden state, from rank 0
  std::vector<comm::CommStats> comm;
  std::vector<double> flops;  // what the kernels counted inside run_layers
};

// A plan on k threads over inproc.
CommRun run_comm_threads(const std::string& dir, Plan plan, const model::ModelInput& in) {
  auto cfg = model::load_config(dir).value();
  EXPECT_TRUE(complete_plan(plan, cfg).ok());
  CommRun out;
  out.comm.resize(static_cast<size_t>(plan.world));
  out.flops.resize(static_cast<size_t>(plan.world));
  expect_all_ok(run_ranks(plan.world, [&](int r, CommSynchronizer& sync) -> core::Status {
    TESSERA_ASSIGN_OR_RETURN(model::Transformer m, model::Transformer::load(dir, load_options(plan, cfg, r)));
    core::Tensor x;
    if (r == 0) {
      TESSERA_ASSIGN_OR_RETURN(x, m.embed(in));
    }
    const int64_t n = in.pixels.empty() ? static_cast<int64_t>(in.ids.size()) : cfg.max_rows();
    sync.group().reset_stats();
    kernels::reset_thread_flops();
    TESSERA_ASSIGN_OR_RETURN(core::Tensor y, run_layers(m, plan, sync, x, n, nullptr));
    out.flops[static_cast<size_t>(r)] = kernels::thread_flops();
    out.comm[static_cast<size_t>(r)] = sync.group().stats();
    if (r == 0) {
      m.finish_hidden(y, nullptr);
      out.hidden = y;
    }
    return core::ok_status();
  }));
  return out;
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
          const Plan plan = make_plan("galaxy", k, split.heads, {{"ffn_ratios", split.ffn}, {"overlap", overlap}});
          EXPECT_LT(max_diff(run_comm_threads(dir, plan, in).hidden, single.hidden.back()), 1e-4f)
              << c.family << " " << c.input << " K=" << k << " A[0]=" << split.heads[0] << " overlap=" << overlap;
        }
  }
}

// Voltage's overlap (Q, K, V of each arriving part; each device's rows sent
// in blocks, one AllGather stream per block) over real rings: exact too,
// with blocks of no rows (more blocks than rows, a device without rows).
TEST(GalaxyTest, VoltageOverlapEqualsSingleDevice) {
  for (const char* family : {"bert-tiny", "gpt2-tiny"}) {
    const std::string dir = kData + "/" + family;
    const auto in = fixture_input(family, family == std::string("bert-tiny") ? "s33" : "s13");
    const auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
    for (int k = 1; k <= 4; ++k) {
      const std::vector<double> ratios = k == 3 ? std::vector<double>{1, 0, 2} : std::vector<double>{};
      EXPECT_LT(max_diff(run_comm_threads(dir, make_plan("voltage", k, ratios, {{"overlap", false}}), in).hidden,
                         single.hidden.back()),
                1e-4f)
          << family << " K=" << k << " no overlap";
      for (int chunks : {1, 2, 3, 8}) {
        const Plan plan = make_plan("voltage", k, ratios, {{"overlap", true}, {"chunks", chunks}});
        EXPECT_LT(max_diff(run_comm_threads(dir, plan, in).hidden, single.hidden.back()), 1e-4f)
            << family << " K=" << k << " chunks=" << chunks;
      }
    }
  }
}

TEST(GalaxyTest, ShardsFollowPartitionsAAndB) {
  auto cfg = model::load_config(kData + "/bert-tiny").value();  // 4 heads, FFN 128 wide
  Plan plan = make_plan("galaxy", 2, {3, 1}, {{"ffn_ratios", {1, 3}}});
  ASSERT_TRUE(complete_plan(plan, cfg).ok());
  const auto a = head_ranges(cfg, plan.ratios), b = ffn_ranges(cfg, plan.options["ffn_ratios"].get<std::vector<double>>());
  EXPECT_EQ(a[0].size(), cfg.heads * 3 / 4);
  EXPECT_EQ(b[1].size(), cfg.intermediate * 3 / 4);
  const auto o = load_options(plan, cfg, 1);
  EXPECT_EQ(o.head_begin, a[1].begin);
  EXPECT_EQ(o.head_end, a[1].end);
  EXPECT_EQ(o.ffn_begin, b[1].begin);
  EXPECT_EQ(o.ffn_end, b[1].end);
  EXPECT_FALSE(o.embeddings);
  // A separate FFN partition is for the sharded strategies only.
  Plan bad = make_plan("voltage", 2, {}, {{"ffn_ratios", {1, 1}}});
  EXPECT_FALSE(complete_plan(bad, cfg).ok());
}

// estimate() is what run() does: for every registered strategy, K = 1..4,
// BERT, GPT-2, ViT, decoupled models, Llama, Qwen3 (GQA, MQA) and OPT,
// uneven partitions, the bytes each rank sends per
// collective equal what the comm layer counted, exactly; and the FLOPs equal
// what the kernels counted.
TEST(EstimateTest, BytesEqualCommStatsAndFlopsEqualTheKernels) {
  struct Case {
    const char* family;
    const char* input;
  };
  const Case cases[] = {{"bert-tiny", "s33"},    {"gpt2-tiny", "s13"},      {"vit-tiny", "c0"},
                        {"bert-bp-tiny", "s16"}, {"gpt2-bp-tiny", "s9"},    {"llama-tiny", "s37"},
                        {"qwen3-tiny", "s37"},   {"qwen3-mqa-tiny", "s7"}, {"opt-postln-tiny", "s37"}};
  const std::vector<double> partitions[] = {{1}, {3, 1}, {1, 0, 2}, {4, 1, 2, 1}};
  int checked = 0;
  for (const auto& c : cases) {
    const std::string dir = kData + "/" + c.family;
    const auto cfg = model::load_config(dir).value();
    const auto in = fixture_input(c.family, c.input);
    const int64_t n = in.pixels.empty() ? static_cast<int64_t>(in.ids.size()) : cfg.max_rows();
    for (const Strategy* s : strategies()) {
      if (s->name().rfind("test-", 0) == 0) continue;
      if (cfg.bp_div > 0 && !s->runs_decoupled()) continue;  // decoupled models: bp and single
      std::vector<nlohmann::json> variants = {nlohmann::json::object()};
      if (s->name() == "prism") variants = {{{"rate", 1.0}}, {{"rate", 4.0}}};
      if (s->name() == "voltage")
        variants = {{{"overlap", true}, {"adaptive_order", true}}, {{"overlap", false}, {"adaptive_order", true}},
                    {{"overlap", true}, {"adaptive_order", false}}, {{"overlap", true}, {"chunks", 3}}};
      if (s->name() == "bp") variants = {{{"plan", "tp"}}, {{"plan", "sp"}}, {{"plan", "allgather"}}};
      if (s->name() == "galaxy") variants = {{{"overlap", true}}, {{"overlap", false}, {"ffn_ratios", "1"}}};
      for (int k = 1; k <= (s->name() == "single" ? 1 : 4); ++k)
        for (nlohmann::json options : variants) {
          if (options.contains("ffn_ratios")) {  // the FFN split reversed
            std::vector<double> rev(partitions[k - 1].rbegin(), partitions[k - 1].rend());
            options["ffn_ratios"] = rev;
          }
          Plan plan = make_plan(s->name(), k, partitions[k - 1], options);
          if (cfg.llama_style() && !s->takes_llama_layers(plan)) continue;  // refused (DecoderStrategyTest)
          ASSERT_TRUE(complete_plan(plan, cfg).ok()) << s->name();
          const auto sched = estimate(plan, cfg, n);
          ASSERT_TRUE(sched.ok()) << sched.status().to_string();
          const CommRun run = run_comm_threads(dir, plan, in);
          for (int r = 0; r < k; ++r) {
            const auto& dev = sched->devices[static_cast<size_t>(r)];
            std::array<int64_t, comm::kOpKindCount> want{};
            for (int kind = 0; kind < static_cast<int>(CollectiveKind::kCount); ++kind)
              want[static_cast<size_t>(runtime::comm_op_of(static_cast<CollectiveKind>(kind)))] +=
                  dev.bytes_sent(static_cast<CollectiveKind>(kind));
            for (int op = 0; op < comm::kOpKindCount; ++op)
              EXPECT_EQ(static_cast<int64_t>(run.comm[static_cast<size_t>(r)].per_op[static_cast<size_t>(op)].traffic.bytes_sent),
                        want[static_cast<size_t>(op)])
                  << s->name() << " " << options.dump() << " " << c.family << " K=" << k << " rank " << r << " "
                  << comm::op_name(static_cast<comm::OpKind>(op));
            EXPECT_DOUBLE_EQ(run.flops[static_cast<size_t>(r)], dev.flops())
                << s->name() << " " << options.dump() << " " << c.family << " K=" << k << " rank " << r;
            ++checked;
          }
        }
    }
  }
  EXPECT_GT(checked, 100);
}

// --wire over the comm layer equals LocalGroup's emulation bit for bit, for
// every strategy on 2 and 3 ranks: fidelity measured in one process is what
// the devices get.
TEST(WireTest, TheCommLayerGivesTheEmulationsBits) {
  const std::string dir = kData + "/gpt2-tiny";
  model::ModelInput in;
  in.ids = {5, 90, 3, 200, 17, 44, 8, 301, 12, 77, 6, 13, 2, 99, 41, 7};
  int ran = 0;
  for (const core::WireType w : {core::WireType::kF16, core::WireType::kQ8})
    for (const Strategy* s : strategies()) {
      if (s->name() == "single" || s->name().rfind("test-", 0) == 0) continue;
      for (const std::vector<double>& ratios : {std::vector<double>{1, 2}, std::vector<double>{2, 1, 1}}) {
        Plan plan = make_plan(s->name(), static_cast<int>(ratios.size()), ratios);
        plan.wire = w;
        if (!complete_plan(plan, model::load_config(dir).value()).ok()) continue;
        const CommRun comm = run_comm_threads(dir, plan, in);
        const auto local = run_threads(dir, plan, in);
        ASSERT_FALSE(comm.hidden.empty() || local.hidden.empty()) << s->name();
        EXPECT_EQ(max_diff(comm.hidden, local.hidden), 0.0f)
            << s->name() << " on " << ratios.size() << " wire " << core::wire_type_name(w);
        ++ran;
      }
    }
  EXPECT_GE(ran, 16);
}

// The bytes each rank sends with a compressed wire are what estimate()
// says, exactly (rows of whole blocks), and q8 sends at most 0.27x the
// bytes of f32 (the bound for TP and Voltage).
TEST(WireTest, BytesAreTheEstimatesAndQ8SendsAQuarter) {
  const std::string dir = kData + "/gpt2-tiny";
  const auto cfg = model::load_config(dir).value();
  model::ModelInput in;
  in.ids = {5, 90, 3, 200, 17, 44, 8, 301, 12, 77, 6, 13, 2, 99, 41, 7};
  const int64_t n = static_cast<int64_t>(in.ids.size());
  for (const char* strategy : {"tp", "voltage", "sp", "galaxy", "pipeline"})
    for (const int k : {2, 4}) {
      std::array<uint64_t, 3> total{};
      for (const core::WireType w : {core::WireType::kF32, core::WireType::kF16, core::WireType::kQ8}) {
        Plan plan = make_plan(strategy, k);
        plan.wire = w;
        ASSERT_TRUE(complete_plan(plan, cfg).ok()) << strategy;
        const auto sched = estimate(plan, cfg, n);
        ASSERT_TRUE(sched.ok());
        const CommRun run = run_comm_threads(dir, plan, in);
        for (int r = 0; r < k; ++r) {
          const auto& dev = sched->devices[static_cast<size_t>(r)];
          const auto& st = run.comm[static_cast<size_t>(r)];
          EXPECT_EQ(static_cast<int64_t>(st.total.bytes_sent), dev.bytes_sent())
              << strategy << " K=" << k << " rank " << r << " wire " << core::wire_type_name(w);
          total[static_cast<size_t>(w)] += st.total.bytes_sent;
        }
      }
      EXPECT_GT(total[0], 0u) << strategy;
      EXPECT_EQ(total[1] * 2, total[0]) << strategy << " K=" << k;
      EXPECT_LE(static_cast<double>(total[2]), 0.27 * static_cast<double>(total[0])) << strategy << " K=" << k;
    }
}

}  // namespace
}  // namespace tessera::parallel
