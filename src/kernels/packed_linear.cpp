#include "kernels/packed_linear.h"

#include <libxsmm.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/device_speed.h"
#include "core/check.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "kernels/flop_count.h"
#include "kernels/gemm.h"

namespace tessera::kernels {

namespace {

constexpr int64_t P = PackedLinear::kPanel;
// Rows per kernel call: fixed, so a new prompt length JITs at most one more
// (remainder) kernel per shape. 32 measured best at 64 and 128 rows (16 is
// as fast at 128 rows, 64 and 128 lose 5-20%; docs/performance.md).
constexpr int64_t kRowTile = 32;
// Products below this many multiply-adds run on the calling thread: waking
// the pool costs more than it saves.
constexpr int64_t kSerialMacs = 1 << 16;

GemmPath decide_path() {
  const char* env = std::getenv("TESSERA_GEMM");
  if (env != nullptr && std::string(env) == "openblas") return GemmPath::kOpenBlas;
  libxsmm_init();
  // libxsmm JITs for x86-64 from AVX2 on; below that it would call BLAS itself.
  if (libxsmm_get_target_archid() < LIBXSMM_X86_AVX2) return GemmPath::kOpenBlas;
  const libxsmm_blasint m = P, n = kRowTile, k = 64;
  const float alpha = 1.0f, beta = 0.0f;
  const int flags = LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  return libxsmm_smmdispatch(m, n, k, &m, &k, &m, &alpha, &beta, &flags, &prefetch) != nullptr ? GemmPath::kLibxsmm
                                                                                              : GemmPath::kOpenBlas;
}

// Y^T[m, n] = A[m, k] . X^T[k, n] for column-major operands (see the header);
// null when libxsmm has no kernel for the shape.
libxsmm_smmfunction dispatch(int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, bool accumulate) {
  const libxsmm_blasint mm = m, nn = n, kk = k, lda = P, ldb = ldx, ldc = ldy;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int flags = LIBXSMM_GEMM_FLAG_NONE, prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
  return libxsmm_smmdispatch(mm, nn, kk, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
}

// A run of weight rows inside one panel: global rows [row, row + cnt) of the
// view, stored from `a` (column-major, leading dimension P).
struct Segment {
  const float* a;
  int64_t row, cnt;
};

}  // namespace

GemmPath gemm_path() {
  static const GemmPath path = decide_path();
  return path;
}

const char* gemm_path_name(GemmPath path) { return path == GemmPath::kLibxsmm ? "libxsmm" : "openblas"; }

namespace {

std::shared_ptr<uint8_t[]> alloc_blocks(size_t bytes) {
  auto buf = core::alloc_large(bytes);
  TESSERA_CHECK(buf != nullptr);
  return buf;
}

// Rows [0, rows) of a quantized view widened to F32, row-major [rows, k1 - k0]
// from column k0 (both on block boundaries).
// With `ahead`, the next chunk of each row (as many bytes again) is
// prefetched meanwhile: a caller going over the rows in column chunks reads
// runs of a few hundred bytes per row, too short for the hardware prefetcher.
void widen_rows(const PackedLinear& w, int64_t r0, int64_t rows, int64_t k0, int64_t k1, float* out, int64_t ld,
                bool ahead = false) {
  const QuantDequantFn fn = dequant_fn(quant_ops(), w.type());
  const int64_t be = block_elems(w.type());
  const size_t skip = static_cast<size_t>(k0 / be) * block_bytes(w.type());
  const size_t bytes = static_cast<size_t>((k1 - k0) / be) * block_bytes(w.type());
  const size_t row_end = static_cast<size_t>(w.cols() / be) * block_bytes(w.type());
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* q = w.row_blocks(r0 + r);
    if (ahead)
      for (size_t at = skip + bytes; at < std::min(row_end, skip + 2 * bytes); at += 64) __builtin_prefetch(q + at);
    fn(q + skip, (k1 - k0) / be, out + r * ld);
  }
}

}  // namespace

PackedLinear PackedLinear::blocks(WeightType type, int64_t n, int64_t k, GemmPath path) {
  PackedLinear w;
  w.n_ = n;
  w.k_ = k;
  w.path_ = path;
  w.type_ = type;
  w.qrow_ = row_bytes(type, k);
  w.q_ = alloc_blocks(static_cast<size_t>(n) * w.qrow_);
  w.qbase_ = w.q_.get();
  return w;
}

PackedLinear PackedLinear::from_blocks(WeightType type, const uint8_t* rows, int64_t n, int64_t k, GemmPath path) {
  TESSERA_CHECK(type != WeightType::kF32 && holds(type, k) && n >= 0 && (rows != nullptr || n == 0));
  PackedLinear w = blocks(type, n, k, path);
  if (n > 0) std::memcpy(w.q_.get(), rows, static_cast<size_t>(n) * w.qrow_);
  return w;
}

PackedLinear PackedLinear::pack(std::span<const WeightSource> parts, int64_t k, GemmPath path, const Consumed& consumed,
                                WeightType type) {
  TESSERA_CHECK(k >= 0);
  int64_t n = 0;
  bool any_blocks = false, all_blocks = !parts.empty();
  for (const auto& s : parts) {
    const bool b = s.blocks != nullptr;
    TESSERA_CHECK(s.rows >= 0 && (b || s.data != nullptr || s.rows == 0 || k == 0));
    TESSERA_CHECK(!b || (s.block_type != WeightType::kF32 && holds(s.block_type, k) &&
                         s.block_stride >= row_bytes(s.block_type, k)));
    any_blocks |= b;
    all_blocks &= b && s.block_type == parts[0].block_type;
    n += s.rows;
  }
  bool blocks_only = !parts.empty();
  for (const auto& s : parts) blocks_only &= s.blocks != nullptr;
  if (blocks_only && !all_blocks && n > 0) {  // runs of one block type each, stacked
    std::vector<PackedLinear> runs;
    for (size_t i = 0; i < parts.size();) {
      size_t j = i + 1;
      while (j < parts.size() && parts[j].block_type == parts[i].block_type) ++j;
      runs.push_back(pack(parts.subspan(i, j - i), k, path, consumed, type));
      i = j;
    }
    return stacked(std::move(runs));
  }
  if (all_blocks && n > 0) {  // a file's blocks, copied row by row
    PackedLinear w = blocks(parts[0].block_type, n, k, path);
    int64_t r = 0;
    for (const auto& s : parts) {
      for (int64_t i = 0; i < s.rows; ++i, ++r)
        std::memcpy(w.q_.get() + static_cast<size_t>(r) * w.qrow_, s.blocks + static_cast<size_t>(i) * s.block_stride, w.qrow_);
      if (consumed && s.rows > 0) consumed(s.blocks, static_cast<size_t>(s.rows) * s.block_stride);
    }
    return w;
  }
  if (any_blocks) {  // mixed with F32 rows: every block part widened
    std::vector<std::vector<float>> widened;
    std::vector<WeightSource> f32;
    for (const auto& s : parts) {
      if (s.blocks == nullptr) {
        f32.push_back(s);
        continue;
      }
      widened.emplace_back(static_cast<size_t>(std::max<int64_t>(s.rows * k, 1)));
      for (int64_t i = 0; i < s.rows; ++i)
        dequantize_row_ref(s.block_type, s.blocks + static_cast<size_t>(i) * s.block_stride, k, widened.back().data() + i * k);
      f32.push_back({widened.back().data(), s.rows, k, 1});
    }
    return pack(f32, k, path, {}, type);
  }
  if (type != WeightType::kF32 && holds(type, k) && n > 0) {
    PackedLinear w = blocks(type, n, k, path);
    std::vector<float> row(static_cast<size_t>(k));
    int64_t r = 0;
    for (const auto& s : parts) {
      for (int64_t i = 0; i < s.rows; ++i, ++r) {
        const float* src = s.data + i * s.row_stride;
        if (s.col_stride == 1) {
          quantize_row_ref(type, src, k, w.q_.get() + static_cast<size_t>(r) * w.qrow_);
          continue;
        }
        for (int64_t c = 0; c < k; ++c) row[static_cast<size_t>(c)] = src[c * s.col_stride];
        quantize_row_ref(type, row.data(), k, w.q_.get() + static_cast<size_t>(r) * w.qrow_);
      }
      if (consumed && s.rows > 0) {
        const int64_t extent = s.col_stride == 1 ? s.rows * s.row_stride : k * s.col_stride;
        consumed(s.data, static_cast<size_t>(extent) * sizeof(float));
      }
    }
    return w;
  }
  PackedLinear w;
  w.n_ = n;
  w.k_ = k;
  w.path_ = path;
  const bool panels = path == GemmPath::kLibxsmm;
  const int64_t stored_rows = panels ? (n + P - 1) / P * P : n;
  const size_t count = static_cast<size_t>(std::max<int64_t>(stored_rows * k, 1));
  // Owned, 64-byte aligned: the kernels' loads stay within cache lines.
  const auto owner = core::alloc_large(count * sizeof(float));
  TESSERA_CHECK(owner != nullptr);
  float* buf = reinterpret_cast<float*>(owner.get());
  w.data_ = std::shared_ptr<float[]>(owner, buf);
  w.base_ = buf;
  w.ldw_ = k;
  if (panels && stored_rows > n) std::memset(buf + n / P * P * k, 0, static_cast<size_t>(P * k) * sizeof(float));
  // Where row r of the stacked matrix goes: element c at dst(r) + c * step.
  auto dst = [&](int64_t r) { return panels ? buf + (r / P) * P * k + r % P : buf + r * k; };
  const int64_t step = panels ? P : 1;
  int64_t r0 = 0;
  for (const auto& s : parts) {
    if (s.rows == 0 || k == 0) continue;
    if (s.row_stride == 1 && s.col_stride != 1) {
      // Column-major source (GPT-2's Conv1D): its rows are W's columns, so
      // walk them in order and hand each block back once it is read.
      constexpr int64_t kBlock = 64;
      for (int64_t c0 = 0; c0 < k; c0 += kBlock) {
        const int64_t c1 = std::min(k, c0 + kBlock);
        for (int64_t c = c0; c < c1; ++c) {
          const float* src = s.data + c * s.col_stride;
          for (int64_t i = 0; i < s.rows; ++i) dst(r0 + i)[c * step] = src[i];
        }
        if (consumed) consumed(s.data + c0 * s.col_stride, static_cast<size_t>((c1 - c0) * s.col_stride) * sizeof(float));
      }
    } else {
      for (int64_t i0 = 0; i0 < s.rows; i0 += P) {
        const int64_t i1 = std::min(s.rows, i0 + P);
        for (int64_t i = i0; i < i1; ++i) {
          const float* src = s.data + i * s.row_stride;
          float* d = dst(r0 + i);
          if (step == 1 && s.col_stride == 1) {
            std::memcpy(d, src, static_cast<size_t>(k) * sizeof(float));
          } else {
            for (int64_t c = 0; c < k; ++c) d[c * step] = src[c * s.col_stride];
          }
        }
        if (consumed) consumed(s.data + i0 * s.row_stride, static_cast<size_t>((i1 - i0) * s.row_stride) * sizeof(float));
      }
    }
    r0 += s.rows;
  }
  return w;
}

PackedLinear PackedLinear::stacked(std::vector<PackedLinear> parts) {
  std::vector<PackedLinear> kept;
  for (auto& p : parts)
    if (p.rows() > 0) kept.push_back(std::move(p));
  if (kept.size() == 1) return kept[0];
  TESSERA_CHECK(!kept.empty());
  PackedLinear w;
  w.k_ = kept[0].k_;
  w.path_ = kept[0].path_;
  w.type_ = kept[0].type_;
  for (const auto& p : kept) {
    TESSERA_CHECK(p.k_ == w.k_ && p.parts_ == nullptr);
    w.n_ += p.n_;
  }
  w.parts_ = std::make_shared<const std::vector<PackedLinear>>(std::move(kept));
  return w;
}

const std::vector<PackedLinear>& PackedLinear::parts() const {
  static const std::vector<PackedLinear> none;
  return parts_ ? *parts_ : none;
}

PackedLinear PackedLinear::pack(const core::Tensor& w, GemmPath path) {
  TESSERA_CHECK(w.rank() == 2);
  const WeightSource src{w.numel() > 0 ? w.f32() : nullptr, w.dim(0), w.dim(1), 1};
  return pack(std::span<const WeightSource>(&src, 1), w.dim(1), path);
}

int64_t PackedLinear::dim(size_t i) const {
  TESSERA_CHECK(i < 2);
  return i == 0 ? n_ : k_;
}

size_t PackedLinear::nbytes() const {
  if (empty()) return 0;
  if (parts_) {
    size_t s = 0;
    for (const auto& p : *parts_) s += p.nbytes();
    return s;
  }
  if (quantized()) return static_cast<size_t>(n_) * qrow_;
  const int64_t stored = path_ == GemmPath::kLibxsmm ? (off_ + n_ + P - 1) / P * P : n_;
  return static_cast<size_t>(stored * k_) * sizeof(float);
}

float PackedLinear::at(int64_t r, int64_t c) const {
  TESSERA_CHECK(!empty() && r >= 0 && r < n_ && c >= 0 && c < k_);
  if (parts_) {
    for (const auto& p : *parts_) {
      if (r < p.n_) return p.at(r, c);
      r -= p.n_;
    }
  }
  if (quantized()) {
    float block[kSuperBlock];
    const int64_t be = block_elems(type_), b0 = c / be * be;
    widen_rows(*this, r, 1, b0, b0 + be, block, be);
    return block[c - b0];
  }
  if (path_ == GemmPath::kOpenBlas) return base_[r * ldw_ + c];
  const int64_t g = off_ + r;
  return base_[(g / P) * P * k_ + c * P + g % P];
}

void PackedLinear::copy_row(int64_t r, float* dst) const {
  TESSERA_CHECK(!empty() && r >= 0 && r < n_ && dst != nullptr);
  if (parts_) {
    for (const auto& p : *parts_) {
      if (r < p.n_) return p.copy_row(r, dst);
      r -= p.n_;
    }
  }
  if (quantized()) {
    widen_rows(*this, r, 1, 0, k_, dst, k_);
    return;
  }
  if (path_ == GemmPath::kOpenBlas) {
    std::memcpy(dst, base_ + r * ldw_, static_cast<size_t>(k_) * sizeof(float));
    return;
  }
  const int64_t g = off_ + r;
  const float* src = base_ + (g / P) * P * k_ + g % P;
  for (int64_t c = 0; c < k_; ++c) dst[c] = src[c * P];
}

core::Tensor PackedLinear::unpack() const {
  TESSERA_CHECK(!empty());
  core::Tensor t = core::Tensor::zeros_f32({n_, k_});
  for (int64_t r = 0; r < n_; ++r) copy_row(r, t.f32() + r * k_);
  return t;
}

PackedLinear PackedLinear::out_rows(int64_t r0, int64_t r1) const {
  TESSERA_CHECK(!empty() && 0 <= r0 && r0 <= r1 && r1 <= n_);
  if (parts_) {  // the ranges the rows fall in, cut
    std::vector<PackedLinear> cut;
    int64_t at = 0;
    for (const auto& p : *parts_) {
      const int64_t b = std::max(r0, at), e = std::min(r1, at + p.n_);
      if (b < e) cut.push_back(p.out_rows(b - at, e - at));
      at += p.n_;
    }
    if (cut.empty()) return parts_->front().out_rows(0, 0);
    return stacked(std::move(cut));
  }
  PackedLinear v = *this;
  v.n_ = r1 - r0;
  if (quantized()) {
    v.qbase_ = qbase_ + static_cast<size_t>(r0) * qrow_;
  } else if (path_ == GemmPath::kOpenBlas) {
    v.base_ = base_ + r0 * ldw_;
  } else {
    const int64_t g = off_ + r0;
    v.base_ = base_ + (g / P) * P * k_;
    v.off_ = g % P;
  }
  return v;
}

void PackedLinear::matmul_rows(const float* a, int64_t m, int64_t lda, int64_t r0, int64_t r1, float* c,
                               int64_t ldc) const {
  TESSERA_CHECK(!empty() && 0 <= r0 && r0 <= r1 && r1 <= n_ && m >= 0);
  if (parts_) {  // each range's share of the sum, added
    std::vector<float> part(static_cast<size_t>(std::max<int64_t>(m * k_, 1)));
    bool first = true;
    int64_t at = 0;
    for (const auto& p : *parts_) {
      const int64_t b = std::max(r0, at), e = std::min(r1, at + p.n_);
      if (b < e) {
        float* out = first ? c : part.data();
        p.matmul_rows(a + (b - r0), m, lda, b - at, e - at, out, first ? ldc : k_);
        if (!first)
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < k_; ++j) c[i * ldc + j] += part[static_cast<size_t>(i * k_ + j)];
        first = false;
      }
      at += p.n_;
    }
    if (first)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + k_, 0.0f);
    return;
  }
  if (quantized()) {  // the rows widened, then as the row form
    std::vector<float> rows(static_cast<size_t>(std::max<int64_t>((r1 - r0) * k_, 1)));
    widen_rows(*this, r0, r1 - r0, 0, k_, rows.data(), k_);
    gemm_f32(false, false, m, k_, r1 - r0, 1.0f, a, lda, rows.data(), k_, 0.0f, c, ldc);
    return;
  }
  if (path_ == GemmPath::kOpenBlas) {
    gemm_f32(false, false, m, k_, r1 - r0, 1.0f, a, lda, base_ + r0 * ldw_, ldw_, 0.0f, c, ldc);
    return;
  }
  // A panel read as row-major [k, P] is W_panel^T: one product per panel,
  // accumulated (the first one overwrites c).
  float beta = 0.0f;
  for (int64_t r = r0; r < r1;) {
    const int64_t g = off_ + r, cnt = std::min(P - g % P, r1 - r);
    const float* panel = base_ + (g / P) * P * k_ + g % P;
    gemm_f32(false, true, m, k_, cnt, 1.0f, a + (r - r0), lda, panel, P, beta, c, ldc);
    beta = 1.0f;
    r += cnt;
  }
  if (r0 == r1) gemm_f32(false, true, m, k_, 0, 1.0f, a, lda, base_, P, 0.0f, c, ldc);
}

// Gives the driver access to a view's layout without widening the public API.
struct PackedAccess {
  static std::vector<Segment> segments(const PackedLinear& w) {
    std::vector<Segment> out;
    for (int64_t r = 0; r < w.n_;) {
      const int64_t g = w.off_ + r, cnt = std::min(P - g % P, w.n_ - r);
      out.push_back({w.base_ + (g / P) * P * w.k_ + g % P, r, cnt});
      r += cnt;
    }
    return out;
  }
  static const float* base(const PackedLinear& w) { return w.base_; }
  static int64_t ldw(const PackedLinear& w) { return w.ldw_; }
};

namespace {

// Quantized weights (see the header): the dot kernels for a few rows, else
// each panel widened to F32 and multiplied as in the panel form.
void quantized_linear(core::ThreadPool* pool, const PackedLinearArgs& a, int64_t k0, int64_t k1) {
  const PackedLinear& w = *a.w;
  const int64_t m = a.m, n = w.rows(), k = k1 - k0;
  const int64_t be = block_elems(w.type());
  TESSERA_CHECK_MSG(k0 % be == 0 && k1 % be == 0,
                    "columns [" << k0 << ", " << k1 << ") of " << weight_type_name(w.type())
                                << " weights do not fall on " << be << "-column blocks");
  count_flops(2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  const bool epilogue = a.bias != nullptr || a.act != Activation::kNone || a.residual != nullptr;
  auto finish = [&](int64_t r0, int64_t rows, int64_t c0, int64_t cnt) {
    if (epilogue)
      bias_act_residual_f32(a.y + r0 * a.ldy + c0, rows, cnt, a.ldy, a.bias == nullptr ? nullptr : a.bias + c0, a.act,
                            a.residual == nullptr ? nullptr : a.residual + r0 * a.ldr + c0, a.ldr);
  };
  if (k == 0) {  // an empty sum, then the epilogue
    if (!a.accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(a.y + i * a.ldy, a.y + i * a.ldy + n, 0.0f);
    finish(0, m, 0, n);
    return;
  }
  const int threads = pool == nullptr ? 1 : pool->size();
  const bool serial = threads == 1 || m * n * k < kSerialMacs;
  const int64_t panels = (n + P - 1) / P;
  if (m <= kQuantDotRows) {
    const QuantOps& ops = quant_ops();
    const QuantDotFn dot = dot_fn(ops, w.type());
    const size_t skip = static_cast<size_t>(k0 / be) * block_bytes(w.type());
    // The inputs as Q8_0 (Q8_K) blocks, once for every weight row.
    const size_t ldq = input_row_bytes(w.type(), k);
    std::vector<uint8_t> xq(static_cast<size_t>(m) * ldq);
    for (int64_t i = 0; i < m; ++i) quantize_input_for(w.type(), a.x + i * a.ldx, k, xq.data() + i * ldq);
    const size_t ldw = w.rows() > 1 ? static_cast<size_t>(w.row_blocks(1) - w.row_blocks(0)) : 0;
    // kDotPanels panels a kernel call: each call lays its inputs out once
    // (prepare_rows), which a call per panel did 16 000 times a 1B token
    // (3% of its decode). Each row's sum is the same whatever the call's size.
    constexpr int64_t kDotPanels = 16, G = kDotPanels * P;
    auto rows_range = [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; p += kDotPanels) {
        const int64_t r0 = p * P, r1 = std::min(n, std::min(p1, p + kDotPanels) * P);
        float out[kQuantDotRows * G];  // [m, r1 - r0], leading dimension G
        dot(w.row_blocks(r0) + skip, ldw, r1 - r0, k / be, xq.data(), m, ldq, out, G);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t r = r0; r < r1; ++r) {
            float& y = a.y[i * a.ldy + r];
            y = a.accumulate ? y + out[i * G + (r - r0)] : out[i * G + (r - r0)];
          }
        finish(0, m, r0, r1 - r0);
      }
    };
    if (serial) rows_range(0, panels);
    else pool->parallel_for(panels, rows_range);
    return;
  }
  const int64_t tiles = (m + kRowTile - 1) / kRowTile;
  // The inputs rounded to Q8_0 (Q8_K) blocks, as the dot kernels see them, in
  // F32: split over the threads (one thread's rounding was a serial part of
  // every product), into a buffer not zeroed first (every value is written).
  const std::unique_ptr<float[]> xr_buf(new float[static_cast<size_t>(m * k)]);
  float* const xr = xr_buf.get();
  auto round_rows = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) round_input_for(quant_ops(), w.type(), a.x + i * a.ldx, k, xr + i * k);
  };
  if (serial) round_rows(0, m);
  else pool->parallel_for(m, round_rows);
  // Panel p widened into `panel` (column-major, leading dimension P): in one
  // pass by the instruction set's panel kernel, else (a short last panel, the
  // generic set) row by row kWiden columns at a time, so that the widened
  // rows are transposed from L1 (a whole [32, k] buffer of them made 128 x
  // 8192 x 2048 in Q8_0 6% slower; docs/quantization.md).
  constexpr int64_t kWiden = 256;  // a multiple of every block's width
  const QuantPanelFn to_panel = panel_fn(quant_ops(), w.type());
  const size_t ldw = n > 1 ? static_cast<size_t>(w.row_blocks(1) - w.row_blocks(0)) : 0;
  auto widen_panel = [&](int64_t p, std::vector<float>& rows, std::vector<float>& panel) {
    const int64_t r0 = p * P, cnt = std::min(P, n - r0);
    static_assert(P == 32, "rows_to_panel transposes 32-row panels");
    panel.resize(static_cast<size_t>(P * k));
    if (to_panel != nullptr && cnt == P) {  // widened and transposed in one pass
      to_panel(w.row_blocks(r0) + static_cast<size_t>(k0 / be) * block_bytes(w.type()), ldw, k / be, panel.data());
      return cnt;
    }
    rows.resize(static_cast<size_t>(P * kWiden));
    // A short last panel: zero rows, never read into y.
    std::fill(rows.begin() + cnt * kWiden, rows.end(), 0.0f);
    for (int64_t c = 0; c < k; c += kWiden) {
      const int64_t w_cols = std::min(kWiden, k - c);
      widen_rows(w, r0, cnt, k0 + c, k0 + c + w_cols, rows.data(), kWiden, true);
      quant_ops().rows_to_panel(rows.data(), kWiden, w_cols, panel.data() + c * P);
    }
    return cnt;
  };
  auto tile = [&](const float* panel, int64_t p, int64_t cnt, int64_t t) {
    const int64_t r0 = t * kRowTile, rows = std::min(kRowTile, m - r0);
    float* y = a.y + r0 * a.ldy + p * P;
    const float* x = xr + r0 * k;
    libxsmm_smmfunction fn = w.path() == GemmPath::kLibxsmm ? dispatch(cnt, rows, k, k, a.ldy, a.accumulate) : nullptr;
    if (fn != nullptr) fn(panel, x, y);
    else gemm_f32(false, false, rows, cnt, k, 1.0f, x, k, panel, P, a.accumulate ? 1.0f : 0.0f, y, a.ldy);
    finish(r0, rows, p * P, cnt);
  };
  auto panels_range = [&](int64_t p0, int64_t p1) {
    thread_local std::vector<float> rows, panel;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t cnt = widen_panel(p, rows, panel);
      for (int64_t t = 0; t < tiles; ++t) tile(panel.data(), p, cnt, t);
    }
  };
  if (serial || panels >= threads) {
    if (serial) panels_range(0, panels);
    else pool->parallel_for(panels, panels_range);
    return;
  }
  pool->parallel_for(tiles, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> rows, panel;
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t cnt = widen_panel(p, rows, panel);
      for (int64_t t = t0; t < t1; ++t) tile(panel.data(), p, cnt, t);
    }
  });
}

}  // namespace

void packed_linear_f32(core::ThreadPool* pool, const PackedLinearArgs& a) {
  core::KernelClock clock;  // --device-speed (core/device_speed.h)
  TESSERA_CHECK(a.w != nullptr && !a.w->empty());
  const PackedLinear& w = *a.w;
  const int64_t k0 = a.k0, k1 = a.k1 < 0 ? w.cols() : a.k1;
  TESSERA_CHECK(k0 >= 0 && k0 <= k1 && k1 <= w.cols());
  const int64_t m = a.m, n = w.rows(), k = k1 - k0;
  TESSERA_CHECK(m >= 0 && (a.x != nullptr || m == 0) && (a.y != nullptr || m == 0 || n == 0));
  TESSERA_CHECK(a.ldx >= k && a.ldy >= n && (a.residual == nullptr || a.ldr >= n));
  if (m == 0 || n == 0) return;
  if (!w.parts().empty()) {  // each row range into its columns of y
    int64_t at = 0;
    for (const PackedLinear& p : w.parts()) {
      PackedLinearArgs pa = a;
      pa.w = &p;
      pa.y = a.y + at;
      if (a.bias != nullptr) pa.bias = a.bias + at;
      if (a.residual != nullptr) pa.residual = a.residual + at;
      packed_linear_f32(pool, pa);
      at += p.rows();
    }
    return;
  }
  if (w.quantized()) {
    quantized_linear(pool, a, k0, k1);
    return;
  }
  if (w.path() == GemmPath::kOpenBlas && (a.accumulate || k0 > 0 || k < w.cols())) {
    // Part of the sum: the stored rows from column k0, then the epilogue.
    gemm_f32(false, true, m, n, k, 1.0f, a.x, a.ldx, PackedAccess::base(w) + k0, PackedAccess::ldw(w),
             a.accumulate ? 1.0f : 0.0f, a.y, a.ldy);
    if (a.bias != nullptr || a.act != Activation::kNone || a.residual != nullptr)
      bias_act_residual_f32(a.y, m, n, a.ldy, a.bias, a.act, a.residual, a.ldr);
    return;
  }
  if (w.path() == GemmPath::kOpenBlas) {
    // Row form: OpenBLAS with its own threads and linear_f32's heuristics.
    LinearArgs la;
    la.x = a.x; la.m = m; la.k = k; la.ldx = a.ldx;
    la.w = PackedAccess::base(w); la.n = n; la.ldw = PackedAccess::ldw(w);
    la.bias = a.bias; la.act = a.act; la.residual = a.residual; la.ldr = a.ldr; la.y = a.y; la.ldy = a.ldy;
    linear_f32(pool, la);
    return;
  }
  if (k == 0) {  // an empty sum, then the epilogue
    if (!a.accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(a.y + i * a.ldy, a.y + i * a.ldy + n, 0.0f);
    bias_act_residual_f32(a.y, m, n, a.ldy, a.bias, a.act, a.residual, a.ldr);
    return;
  }
  // Counted once here (the caller's thread), like every product (flop_count.h).
  count_flops(2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  const std::vector<Segment> segs = PackedAccess::segments(w);
  const int64_t tiles = (m + kRowTile - 1) / kRowTile, last_rows = m - (tiles - 1) * kRowTile;
  // At most three panel heights (first, full, last) times two tile heights.
  struct Kernel {
    int64_t cnt, rows;
    libxsmm_smmfunction fn;
  };
  std::vector<Kernel> kernels;
  auto kernel_for = [&](int64_t cnt, int64_t rows) {
    for (const auto& kn : kernels)
      if (kn.cnt == cnt && kn.rows == rows) return kn.fn;
    kernels.push_back({cnt, rows, dispatch(cnt, rows, k, a.ldx, a.ldy, a.accumulate)});
    return kernels.back().fn;
  };
  for (const auto& s : segs) {
    kernel_for(s.cnt, std::min(kRowTile, m));
    kernel_for(s.cnt, last_rows);
  }
  auto block = [&](const Segment& s, int64_t t) {
    const int64_t r0 = t * kRowTile, rows = std::min(kRowTile, m - r0);
    float* y = a.y + r0 * a.ldy + s.row;
    const float* x = a.x + r0 * a.ldx;
    libxsmm_smmfunction fn = nullptr;
    for (const auto& kn : kernels)
      if (kn.cnt == s.cnt && kn.rows == rows) fn = kn.fn;
    const float* panel = s.a + k0 * P;  // column k0 of the column-major panel
    if (fn != nullptr) {
      fn(panel, x, y);
    } else {  // no JIT kernel for this shape: the panel through cblas_sgemm
      gemm_f32(false, false, rows, s.cnt, k, 1.0f, x, a.ldx, panel, P, a.accumulate ? 1.0f : 0.0f, y,
               a.ldy);  // panel = [k, P] row-major
      count_flops(-2.0 * static_cast<double>(rows) * static_cast<double>(s.cnt) * static_cast<double>(k));  // counted above
    }
    if (a.bias != nullptr || a.act != Activation::kNone || a.residual != nullptr)
      bias_act_residual_f32(y, rows, s.cnt, a.ldy, a.bias == nullptr ? nullptr : a.bias + s.row, a.act,
                            a.residual == nullptr ? nullptr : a.residual + r0 * a.ldr + s.row, a.ldr);
  };
  const int64_t nseg = static_cast<int64_t>(segs.size());
  // Panels outer, row tiles inner: each panel is read from memory once and
  // stays in L2 for every tile, and x (at most a few hundred KB) stays in L2
  // (BERT-base, 128 rows: 10% faster than tiles outer, bench-local).
  auto panels_range = [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t t = 0; t < tiles; ++t) block(segs[static_cast<size_t>(p)], t);
  };
  const int threads = pool == nullptr ? 1 : pool->size();
  if (threads == 1 || m * n * k < kSerialMacs) {
    panels_range(0, nseg);
  } else if (nseg >= threads) {
    // By panels: each thread reads only its share of the weights (decode
    // is bound by that read) and all of x.
    pool->parallel_for(nseg, panels_range);
  } else {
    pool->parallel_for(tiles, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t p = 0; p < nseg; ++p) block(segs[static_cast<size_t>(p)], t);
    });
  }
}

}  // namespace tessera::kernels
