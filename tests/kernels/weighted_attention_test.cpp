// Count-scaled attention (PRISM Eq. 12-15) equals attention over the matrix
// in which every key/value row is explicitly repeated by its count (Eq. 11),
// without and with the partition-aware causal mask (Eq. 17).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/weighted_attention.h"

namespace tessera::kernels {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// A device's keys as PRISM lays them out: own rows, then the means of the
// other partitions. Each key stands for the rows at `rows_of[j]` (global).
struct Layout {
  int64_t q_pos0 = 0, n_q = 0;
  std::vector<std::vector<int64_t>> rows_of;  // per key: the global rows it stands for
};

// Device 1 of 3: partitions [0, 9), [9, 14), [14, 21). Own rows 9..13; means
// of partition 0 in segments {3, 3, 3}, of partition 2 in {2, 5}.
Layout middle_partition() {
  Layout l;
  l.q_pos0 = 9;
  l.n_q = 5;
  for (int64_t i = 9; i < 14; ++i) l.rows_of.push_back({i});
  for (int64_t s = 0; s < 3; ++s) l.rows_of.push_back({3 * s, 3 * s + 1, 3 * s + 2});
  l.rows_of.push_back({14, 15});
  l.rows_of.push_back({16, 17, 18, 19, 20});
  return l;
}

// Reference in double over the duplicated matrix: each copy sits at the
// global row it stands for, and the causal mask is the ordinary one.
std::vector<double> duplicated_reference(const Layout& l, const std::vector<float>& q, const std::vector<float>& k,
                                         const std::vector<float>& v, int64_t heads, int64_t hd, float scale, bool causal) {
  const int64_t w = heads * hd;
  std::vector<int64_t> src, pos;  // per duplicated row: unique key index, position
  for (size_t j = 0; j < l.rows_of.size(); ++j)
    for (int64_t p : l.rows_of[j]) {
      src.push_back(static_cast<int64_t>(j));
      pos.push_back(p);
    }
  std::vector<double> out(static_cast<size_t>(l.n_q * w), 0.0);
  for (int64_t i = 0; i < l.n_q; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> s(src.size());
      double mx = -1e300;
      for (size_t d = 0; d < src.size(); ++d) {
        double dot = 0;
        for (int64_t e = 0; e < hd; ++e) dot += double(q[i * w + h * hd + e]) * k[src[d] * w + h * hd + e];
        s[d] = dot * scale;
        if (!causal || pos[d] <= l.q_pos0 + i) mx = std::max(mx, s[d]);
      }
      double sum = 0;
      for (size_t d = 0; d < src.size(); ++d) {
        s[d] = (!causal || pos[d] <= l.q_pos0 + i) ? std::exp(s[d] - mx) : 0.0;
        sum += s[d];
      }
      for (size_t d = 0; d < src.size(); ++d)
        for (int64_t e = 0; e < hd; ++e) out[i * w + h * hd + e] += s[d] / sum * v[src[d] * w + h * hd + e];
    }
  return out;
}

TEST(WeightedAttentionTest, EqualsAttentionOverTheDuplicatedMatrix) {
  const int64_t heads = 3, hd = 8, w = heads * hd;
  const Layout l = middle_partition();
  const int64_t n_kv = static_cast<int64_t>(l.rows_of.size());
  const auto q = random_vec(static_cast<size_t>(l.n_q * w), 1);
  const auto k = random_vec(static_cast<size_t>(n_kv * w), 2);
  const auto v = random_vec(static_cast<size_t>(n_kv * w), 3);
  std::vector<float> counts;
  std::vector<int64_t> key_pos;
  for (const auto& r : l.rows_of) {
    counts.push_back(static_cast<float>(r.size()));
    key_pos.push_back(r.back());  // a mean at its segment's last row gives Eq. 17
  }
  for (bool causal : {false, true}) {
    WeightedAttentionArgs a;
    a.q = q.data(); a.ldq = w; a.k = k.data(); a.ldk = w; a.v = v.data(); a.ldv = w;
    std::vector<float> out(static_cast<size_t>(l.n_q * w), -1.0f);
    a.out = out.data(); a.ldo = w;
    a.n_q = l.n_q; a.n_kv = n_kv; a.heads = heads; a.head_dim = hd; a.scale = 0.35f;
    a.counts = counts.data(); a.causal = causal; a.q_pos0 = l.q_pos0; a.key_pos = key_pos.data();
    std::vector<float> scratch(static_cast<size_t>(weighted_attention_scratch_floats(l.n_q, n_kv)));
    weighted_attention_f32(nullptr, a, scratch.data(), static_cast<int64_t>(scratch.size()));
    const auto want = duplicated_reference(l, q, k, v, heads, hd, a.scale, causal);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5) << "causal=" << causal << " i=" << i;
  }
}

TEST(WeightedAttentionTest, EqualsTheExistingKernelOnExplicitDuplicates) {
  // Non-causal: the duplicated matrix through attention_f32, an independent path.
  const int64_t heads = 2, hd = 16, w = heads * hd, n_q = 7;
  const std::vector<int64_t> g = {1, 1, 1, 4, 2, 7, 1, 3};
  const int64_t n_kv = static_cast<int64_t>(g.size());
  const auto q = random_vec(static_cast<size_t>(n_q * w), 4);
  const auto k = random_vec(static_cast<size_t>(n_kv * w), 5);
  const auto v = random_vec(static_cast<size_t>(n_kv * w), 6);
  std::vector<float> kd, vd, counts;
  for (int64_t j = 0; j < n_kv; ++j) {
    counts.push_back(static_cast<float>(g[static_cast<size_t>(j)]));
    for (int64_t c = 0; c < g[static_cast<size_t>(j)]; ++c) {
      kd.insert(kd.end(), k.begin() + j * w, k.begin() + (j + 1) * w);
      vd.insert(vd.end(), v.begin() + j * w, v.begin() + (j + 1) * w);
    }
  }
  const int64_t n_dup = static_cast<int64_t>(kd.size()) / w;
  AttentionArgs d;
  d.q = q.data(); d.ldq = w; d.k = kd.data(); d.ldk = w; d.v = vd.data(); d.ldv = w;
  std::vector<float> want(static_cast<size_t>(n_q * w)), got(static_cast<size_t>(n_q * w));
  d.out = want.data(); d.ldo = w; d.n_q = n_q; d.n_kv = n_dup; d.heads = heads; d.head_dim = hd; d.scale = 0.25f;
  std::vector<float> scratch(static_cast<size_t>(attention_scratch_floats(n_q, n_dup, heads)));
  attention_f32(nullptr, d, scratch.data(), static_cast<int64_t>(scratch.size()));
  WeightedAttentionArgs a;
  a.q = q.data(); a.ldq = w; a.k = k.data(); a.ldk = w; a.v = v.data(); a.ldv = w;
  a.out = got.data(); a.ldo = w; a.n_q = n_q; a.n_kv = n_kv; a.heads = heads; a.head_dim = hd; a.scale = 0.25f;
  a.counts = counts.data();
  weighted_attention_f32(nullptr, a, scratch.data(), static_cast<int64_t>(scratch.size()));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
}

TEST(WeightedAttentionTest, UnitCountsAndPositionsMatchPlainCausalAttention) {
  const int64_t heads = 2, hd = 4, w = heads * hd, n = 6;
  const auto q = random_vec(static_cast<size_t>(n * w), 7);
  const auto k = random_vec(static_cast<size_t>(n * w), 8);
  const auto v = random_vec(static_cast<size_t>(n * w), 9);
  std::vector<float> want(static_cast<size_t>(n * w)), got(static_cast<size_t>(n * w)), scratch(static_cast<size_t>(n * n * heads));
  AttentionArgs d;
  d.q = q.data(); d.ldq = w; d.k = k.data(); d.ldk = w; d.v = v.data(); d.ldv = w; d.out = want.data(); d.ldo = w;
  d.n_q = n; d.n_kv = n; d.heads = heads; d.head_dim = hd; d.scale = 0.5f; d.causal = true;
  attention_f32(nullptr, d, scratch.data(), static_cast<int64_t>(scratch.size()));
  WeightedAttentionArgs a;
  a.q = q.data(); a.ldq = w; a.k = k.data(); a.ldk = w; a.v = v.data(); a.ldv = w; a.out = got.data(); a.ldo = w;
  a.n_q = n; a.n_kv = n; a.heads = heads; a.head_dim = hd; a.scale = 0.5f; a.causal = true;  // null counts, null key_pos
  weighted_attention_f32(nullptr, a, scratch.data(), static_cast<int64_t>(scratch.size()));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
}

TEST(WeightedAttentionTest, RowThatSeesNoKeyIsZero) {
  float row[3] = {1.0f, 2.0f, 3.0f}, weights[3];
  const int64_t pos[3] = {5, 6, 7};
  weighted_softmax_rows_f32(row, 1, 3, nullptr, true, 4, pos, 0, weights);
  for (float x : row) EXPECT_EQ(x, 0.0f);
  float row2[2] = {1.0f, 150.0f};
  const float counts[2] = {2.0f, 0.0f};  // a zero count is never attended, however high its score
  weighted_softmax_rows_f32(row2, 1, 2, counts, false, 0, nullptr, 0, weights);
  EXPECT_FLOAT_EQ(row2[0], 1.0f);
  EXPECT_EQ(row2[1], 0.0f);
}

}  // namespace
}  // namespace tessera::kernels
