#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/memory.h"

namespace tessera::core {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    TESSERA_CHECK_MSG(d >= 0, "negative dimension " << d);
    n *= d;
  }
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << ']';
  return os.str();
}

namespace {

// A tensor's bytes, with overflow checks: a request may ask for anything.
// Beyond 1 TiB no allocator here can succeed (and sanitizers abort instead
// of failing).
Result<uint64_t> checked_bytes(DType dtype, const Shape& shape) {
  constexpr uint64_t kMaxBytes = uint64_t{1} << 40;
  uint64_t bytes = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return invalid_argument("negative dimension " + std::to_string(d));
    if (d == 0) return uint64_t{0};
  }
  for (int64_t d : shape) {
    if (bytes > kMaxBytes / static_cast<uint64_t>(d)) return resource_exhausted("tensor " + shape_to_string(shape) + " is too large");
    bytes *= static_cast<uint64_t>(d);
  }
  return bytes;
}

}  // namespace

Result<Tensor> Tensor::try_zeros(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  TESSERA_ASSIGN_OR_RETURN(const uint64_t bytes, checked_bytes(dtype, t.shape_));
  size_t padded = ((bytes + 63) / 64) * 64;
  if (padded == 0) padded = 64;
  void* p = std::aligned_alloc(64, padded);
  if (p == nullptr) return resource_exhausted("out of memory allocating " + std::to_string(padded) + " bytes");
  std::memset(p, 0, padded);
  t.owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data_ = p;
  return t;
}

Result<Tensor> Tensor::try_zeros_lazy(DType dtype, Shape shape) {
  TESSERA_ASSIGN_OR_RETURN(const uint64_t bytes, checked_bytes(dtype, shape));
  // Below a few pages the heap is as good (and reuses memory).
  if (bytes < (uint64_t{1} << 20)) return try_zeros(dtype, std::move(shape));
  std::shared_ptr<void> p = alloc_lazy_zeroed(static_cast<size_t>(bytes));
  if (p == nullptr) return resource_exhausted("out of memory mapping " + std::to_string(bytes) + " bytes");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = p.get();
  t.owner_ = std::move(p);
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  auto t = try_zeros(dtype, std::move(shape));
  TESSERA_CHECK_MSG(t.ok(), t.status().to_string());
  return std::move(t).value();
}

Tensor Tensor::borrow(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

Tensor Tensor::from_f32(Shape shape, const std::vector<float>& values) {
  Tensor t = zeros(DType::kF32, std::move(shape));
  TESSERA_CHECK(static_cast<int64_t>(values.size()) == t.numel());
  if (!values.empty()) std::memcpy(t.data_, values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_i64(Shape shape, const std::vector<int64_t>& values) {
  Tensor t = zeros(DType::kI64, std::move(shape));
  TESSERA_CHECK(static_cast<int64_t>(values.size()) == t.numel());
  if (!values.empty()) std::memcpy(t.data_, values.data(), t.nbytes());
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  TESSERA_CHECK_MSG(shape_numel(shape) == numel(),
                    "reshape " << shape_to_string(shape_) << " -> " << shape_to_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = zeros(dtype_, shape_);
  if (nbytes() > 0) std::memcpy(t.data_, data_, nbytes());
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  TESSERA_CHECK(!shape_.empty());
  TESSERA_CHECK_MSG(0 <= begin && begin <= end && end <= shape_[0],
                    "rows [" << begin << "," << end << ") of " << shape_to_string(shape_));
  Tensor t = *this;
  t.shape_[0] = end - begin;
  const size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape_[0]);
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin) * row_bytes;
  return t;
}

}  // namespace tessera::core
