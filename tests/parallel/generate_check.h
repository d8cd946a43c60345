// Decoding exactness checks shared by the thread and process tests: the
// single device's top-2 logit margins, and a token-for-token comparison
// that stops at the first near-tie (margin below 1e-4) of the reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "fixtures.h"
#include "model/gen_model.h"
#include "model/generate.h"
#include "model/safetensors.h"

namespace tessera::parallel::testing {

constexpr float kNearTie = 1e-4f;

inline std::vector<int64_t> ids_of(const core::Tensor& t) { return {t.i64(), t.i64() + t.numel()}; }

// The single device's top-2 logit margin at each generated step of `seq`.
inline std::vector<float> margins(const model::Transformer& m, const std::vector<int64_t>& seq, size_t prompt_len) {
  std::vector<float> out;
  for (size_t end = prompt_len; end < seq.size(); ++end) {
    model::ForwardOptions fo;
    fo.last_row_logits = true;
    auto f = m.forward({{seq.begin(), seq.begin() + static_cast<std::ptrdiff_t>(end)}, {}, {}}, fo, nullptr);
    EXPECT_TRUE(f.ok());
    std::vector<float> row(f->logits.f32(), f->logits.f32() + m.config().vocab);
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
    out.push_back(row[0] - row[1]);
  }
  return out;
}

struct Compared {
  size_t steps = 0;         // steps compared
  bool near_tie = false;    // stopped at a near-tie
};

// Token for token, up to the first near-tie of the reference.
inline Compared compare(const std::vector<int64_t>& want, const std::vector<int64_t>& got, const std::vector<float>& margin,
                 size_t prompt_len, const std::string& what) {
  Compared c;
  EXPECT_EQ(std::vector<int64_t>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(std::min(prompt_len, got.size()))),
            std::vector<int64_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(prompt_len)))
      << what;
  for (size_t i = prompt_len; i < want.size(); ++i) {
    if (margin[i - prompt_len] < kNearTie) {
      c.near_tie = true;
      return c;
    }
    if (i >= got.size()) {
      ADD_FAILURE() << what << ": stopped after " << got.size() << " ids, the single device made " << want.size();
      return c;
    }
    EXPECT_EQ(got[i], want[i]) << what << ": step " << i - prompt_len << " (margin " << margin[i - prompt_len] << ")";
    if (got[i] != want[i]) return c;
    ++c.steps;
  }
  EXPECT_EQ(got.size(), want.size()) << what;
  return c;
}

// Case i of the trained copy model (tests/data/gpt2-copy/cases.safetensors).
inline std::vector<int64_t> copy_case(int i) {
  auto cases = model::SafeTensorsFile::open(kData + "/gpt2-copy/cases.safetensors").value();
  return ids_of(cases.get("s" + std::to_string(i) + ".input_ids").value());
}

// The copy task over its first `cases` cases: from the first 33 ids (32
// tokens and the separator), greedy decoding must give the ids that follow.
// The fraction right; `generate` is the generation under test.
using GenerateFn = std::function<core::Result<std::vector<int64_t>>(const std::vector<int64_t>&, const model::GenerateOptions&)>;
inline double copy_accuracy(int cases, const GenerateFn& generate) {
  int64_t right = 0, total = 0;
  for (int i = 0; i < cases; ++i) {
    const auto ids = copy_case(i);
    const std::vector<int64_t> prompt(ids.begin(), ids.begin() + 33);
    model::GenerateOptions opts;
    opts.greedy = true;
    opts.max_new_tokens = static_cast<int64_t>(ids.size()) - 33;
    opts.eos_token_id = -1;
    auto got = generate(prompt, opts);
    EXPECT_TRUE(got.ok()) << got.status().to_string();
    if (!got.ok()) return 0.0;
    for (size_t j = 33; j < ids.size(); ++j, ++total) right += j < got->size() && (*got)[j] == ids[j];
  }
  return static_cast<double>(right) / static_cast<double>(total);
}

// A 12-layer GPT-2 with a small hidden size, generated once per test binary.
inline const std::string& gpt2_12l() {
  struct Removed {  // at exit, by the process that made it
    std::string dir;
    ~Removed() { std::error_code ec; std::filesystem::remove_all(dir, ec); }
  };
  static const Removed made{[] {
    const std::string d = ::testing::TempDir() + "/gen-gpt2-12l-" + std::to_string(::getpid());
    model::GenModelOptions o;
    o.preset = "gpt2";
    o.out_dir = d;
    o.layers = 12;
    o.hidden = 64;
    o.heads = 4;
    o.intermediate = 256;
    o.vocab = 512;
    o.seed = 3;
    const auto st = model::gen_model(o);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return d;
  }()};
  return made.dir;
}

}  // namespace tessera::parallel::testing
