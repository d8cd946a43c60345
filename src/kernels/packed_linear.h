// Dense-layer weights packed once, at load, into the layout the microkernel
// reads, and the driver (blocking, threading, fused epilogue) around the
// kernels. Microkernels come from libxsmm's JIT (libxsmm_smmdispatch); where
// it gives none, or TESSERA_GEMM=openblas, cblas_sgemm does the products.
//
// Panel form (libxsmm path): W [n, k] is cut into panels of kPanel output
// rows; each panel is a kPanel x k column-major block (the last one padded
// with zero rows, never read into y). Element W[r][c] lives at
//   data[(r / kPanel) * kPanel * k + c * kPanel + r % kPanel],
// so one weight row is read with stride kPanel (GPT-2's tied embedding does).
// In libxsmm's column-major terms a row-major x [m, k] (row stride ldx) is a
// k x m operand read in place and y [m, n] (stride ldy) an n x m one:
//   Y^T[panel, rows] = W_panel[kPanel, k] . X^T[k, rows].
// Row form (OpenBLAS path): W stays [n, k] row-major, as OpenBLAS re-packs it
// per call anyway and keeps its own heuristics for it.
// Quantized form (Q8_0, Q4_0, Q4_K, Q6_K; quant.h): W's rows as blocks, row-major. Up to
// kQuantDotRows input rows run on the quantized dot kernels; more rows widen
// one panel at a time to the panel form above (per thread, in L2) and run
// the F32 kernel on it, so a prompt costs about what it does in F32.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/quant.h"

namespace tessera::core { class ThreadPool; }

namespace tessera::kernels {

enum class GemmPath { kLibxsmm, kOpenBlas };

// The one place that decides the CPU path, once per process: OpenBLAS when
// TESSERA_GEMM=openblas or when libxsmm cannot JIT for this CPU, else libxsmm.
GemmPath gemm_path();
const char* gemm_path_name(GemmPath path);

// Rows of a weight matrix in any layout: element (r, c) at
// data[r * row_stride + c * col_stride]. Linear [out, in]: (ld, 1); GPT-2's
// Conv1D [in, out]: (1, ld). Or rows already in quantized blocks (a GGUF
// file's): `blocks` of type `block_type`, row r at blocks + r * block_stride
// bytes, holding just the k columns being packed.
struct WeightSource {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t row_stride = 0, col_stride = 1;
  const uint8_t* blocks = nullptr;
  WeightType block_type = WeightType::kF32;
  size_t block_stride = 0;
};

class PackedLinear {
 public:
  // Output rows per panel: 32 measured best on AVX-512 and AVX2 (see
  // docs/performance.md: 16 loses 10-50%, 48 and 64 gain nothing).
  static constexpr int64_t kPanel = 32;

  PackedLinear() = default;
  // Called with source ranges that packing has finished reading (a loader
  // drops those pages of its mapped file: peak memory stays ~1x the weights).
  using Consumed = std::function<void(const void* begin, size_t bytes)>;
  // W = the rows of `parts` stacked, k columns each (k >= 0; parts may be empty).
  // With `type` quantized, the rows are quantized (k must be a whole
  // number of blocks: holds(type, k); otherwise they stay F32). Parts that
  // are all blocks of one type are copied as they are, whatever `type`
  // says; block parts among others are widened first.
  static PackedLinear pack(std::span<const WeightSource> parts, int64_t k, GemmPath path = gemm_path(),
                           const Consumed& consumed = {}, WeightType type = WeightType::kF32);
  // Rows already in `type`'s blocks, copied.
  static PackedLinear from_blocks(WeightType type, const uint8_t* rows, int64_t n, int64_t k, GemmPath path = gemm_path());
  // A Linear-layout tensor [n, k].
  static PackedLinear pack(const core::Tensor& w, GemmPath path = gemm_path());

  bool empty() const { return !data_ && !q_ && !parts_; }   // nothing loaded (a shard with 0 rows is not empty)
  int64_t rows() const { return n_; }     // outputs (n)
  int64_t cols() const { return k_; }     // inputs (k)
  int64_t dim(size_t i) const;            // as a [n, k] tensor
  GemmPath path() const { return path_; }
  WeightType type() const { return type_; }
  bool quantized() const { return type_ != WeightType::kF32; }
  // Quantized form: row r's blocks.
  const uint8_t* row_blocks(int64_t r) const { return qbase_ + static_cast<size_t>(r) * qrow_; }
  // Row ranges in different block types, stacked (a GGUF file's Q and K in
  // Q4_K with V in Q6_K): each range its own matrix, run one after another;
  // empty otherwise. type() is then the first range's.
  const std::vector<PackedLinear>& parts() const;
  // The packed buffer (weights, padding included), for paging hints; null
  // for stacked row ranges (parts(): each has its own).
  const void* raw() const { return quantized() ? static_cast<const void*>(qbase_) : base_; }
  size_t nbytes() const;

  // W[r][c] and a whole row (k floats, read with the layout's stride).
  float at(int64_t r, int64_t c) const;
  void copy_row(int64_t r, float* dst) const;
  // The [n, k] Linear-layout copy (tests, re-sharding).
  core::Tensor unpack() const;

  // Output rows [r0, r1) as a view on the same buffer (no copy).
  PackedLinear out_rows(int64_t r0, int64_t r1) const;

  // C[m, k] = A[m, r1 - r0] . W[r0:r1, :] (W not transposed; Voltage's Eq. 8
  // multiplies by W_K's rows this way). cblas_sgemm on the stored form.
  void matmul_rows(const float* a, int64_t m, int64_t lda, int64_t r0, int64_t r1, float* c, int64_t ldc) const;

 private:
  friend struct PackedAccess;
  // The row ranges stacked as one matrix (two or more; the same k).
  static PackedLinear stacked(std::vector<PackedLinear> parts);
  std::shared_ptr<const std::vector<PackedLinear>> parts_;  // stacked form
  // An empty quantized form of n rows (allocated, not filled).
  static PackedLinear blocks(WeightType type, int64_t n, int64_t k, GemmPath path);
  std::shared_ptr<float[]> data_;   // owner
  const float* base_ = nullptr;     // panel (or row) holding row `off_`
  int64_t n_ = 0, k_ = 0;
  int64_t off_ = 0;                 // panel form: the first row's index inside its panel
  int64_t ldw_ = 0;                 // row form: row stride
  GemmPath path_ = GemmPath::kOpenBlas;
  WeightType type_ = WeightType::kF32;
  std::shared_ptr<uint8_t[]> q_;    // quantized form: owner
  const uint8_t* qbase_ = nullptr;  // row 0 of the view
  size_t qrow_ = 0;                 // bytes per row
};

// A dense layer on packed weights: y = act(x W^T + bias) + residual, with
// strides. Bias, activation and residual run on each block of y right after
// the kernel wrote it, while it is in L1.
struct PackedLinearArgs {
  const float* x = nullptr;  // [m, k], row stride ldx
  int64_t m = 0, ldx = 0;
  const PackedLinear* w = nullptr;
  const float* bias = nullptr;      // [w->rows()] or null
  Activation act = Activation::kNone;
  const float* residual = nullptr;  // [m, n] added after the activation, or null
  int64_t ldr = 0;
  float* y = nullptr;  // [m, n], row stride ldy
  int64_t ldy = 0;
  // Only W's input columns [k0, k1) (k1 < 0: to the end); x then holds just
  // those columns. With accumulate, y += x W[:, k0:k1]^T (then the
  // epilogue), so a product split by columns adds up over calls as its
  // inputs arrive.
  int64_t k0 = 0, k1 = -1;
  bool accumulate = false;
};
// Splits panels (then row tiles) over the pool; null pool = the caller only.
void packed_linear_f32(core::ThreadPool* pool, const PackedLinearArgs& args);

}  // namespace tessera::kernels
