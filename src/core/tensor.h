// A dense, row-major tensor: dtype, shape and a buffer that is either owned
// (64-byte aligned) or borrowed from something kept alive by `owner_`
// (an mmap'd file, a received message).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace tessera::core {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Owned, zero-initialised.
  static Tensor zeros(DType dtype, Shape shape);
  static Tensor zeros_f32(Shape shape) { return zeros(DType::kF32, std::move(shape)); }
  // Same, but running out of memory is an error instead of an abort: for
  // allocations whose size a request decides.
  static Result<Tensor> try_zeros(DType dtype, Shape shape);
  // Same, for a large buffer written from its front over a long time (a KV
  // cache): its pages come zeroed from the kernel when first touched, so
  // allocating costs nothing and a short generation in a long context pays
  // only for the positions it writes (memset faulted in all of them first);
  // huge pages where whole ones fit (core::alloc_lazy_zeroed).
  static Result<Tensor> try_zeros_lazy(DType dtype, Shape shape);
  // Borrowed: `data` must stay valid while `owner` lives.
  static Tensor borrow(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner);
  static Tensor from_f32(Shape shape, const std::vector<float>& values);
  static Tensor from_i64(Shape shape, const std::vector<int64_t>& values);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { TESSERA_CHECK(i < shape_.size()); return shape_[i]; }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  float* f32() { TESSERA_CHECK(dtype_ == DType::kF32); return static_cast<float*>(data_); }
  const float* f32() const { TESSERA_CHECK(dtype_ == DType::kF32); return static_cast<const float*>(data_); }
  int64_t* i64() { TESSERA_CHECK(dtype_ == DType::kI64); return static_cast<int64_t*>(data_); }
  const int64_t* i64() const { TESSERA_CHECK(dtype_ == DType::kI64); return static_cast<const int64_t*>(data_); }

  // Same buffer, new shape with the same element count.
  Tensor reshaped(Shape shape) const;
  // Deep copy into an owned buffer.
  Tensor clone() const;
  // Rows [begin, end) of the leading dimension, sharing the buffer.
  Tensor rows(int64_t begin, int64_t end) const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
};

}  // namespace tessera::core
