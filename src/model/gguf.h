// GGUF files (llama.cpp's format, versions 2 and 3): the magic "GGUF", a u32
// version, u64 tensor and key counts, typed key/value metadata, tensor infos
// (name, dimensions innermost first, ggml type, offset), then the data,
// aligned to general.alignment. Files are mmap'd, and every count, length,
// offset and size is checked against the file before anything is handed out
// (llama.cpp RPC is the warning: a parser that trusts its input is an exploit).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/quant.h"

namespace tessera::model {

// The ggml tensor types this reader knows the sizes of; get_f32 reads F32,
// F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kBF16 = 30,
};
const char* ggml_type_name(GgmlType t);
// The kernels' block type a ggml type is (Q8_0, Q4_0, Q4_K, Q6_K), if any; and back.
std::optional<kernels::WeightType> kernel_type(GgmlType t);
GgmlType ggml_type_of(kernels::WeightType t);

// The metadata value types.
enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;   // dimensions, innermost (the row length) first
  uint64_t offset = 0;       // into the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;
  int64_t row_length() const { return ne.empty() ? 0 : ne[0]; }
  int64_t rows() const;      // the product of the outer dimensions
};

class GgufFile {
 public:
  static core::Result<GgufFile> open(const std::string& path);
  // The same checks on bytes in memory (kept alive by the file).
  static core::Result<GgufFile> from_bytes(std::shared_ptr<const std::string> bytes, const std::string& name = "<memory>");

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  // Every key with its value as JSON (numbers, booleans, strings, arrays).
  const nlohmann::json& metadata() const { return meta_; }
  // The value's type as the file gives it (arrays: their element type in `elem`).
  bool has(const std::string& key) const { return meta_.contains(key); }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* tensor(const std::string& name) const;
  // A tensor as F32 [rows, row_length] (rank 1 for one dimension): F32,
  // F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K are read; other types get a clear error.
  core::Result<core::Tensor> get_f32(const std::string& name) const;
  // Drops the tensor's pages from resident memory (mmap'd files).
  void release(const std::string& name) const;

 private:
  core::Status parse(const uint8_t* base, size_t size);

  std::string path_;
  std::shared_ptr<const void> keep_;  // the mapping or the buffer
  size_t map_size_ = 0;               // > 0 when keep_ is an mmap of the file
  uint32_t version_ = 0;
  nlohmann::json meta_ = nlohmann::json::object();
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// Writes a GGUF v3 file: metadata in insertion order, then the tensors, each
// aligned to 32 bytes.
class GgufWriter {
 public:
  void add_string(const std::string& key, const std::string& v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  // `bytes` in `type`'s layout for dimensions `ne` (innermost first).
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, std::string bytes);
  core::Status write(const std::string& path) const;
  std::string serialize() const;

 private:
  std::string kv_;
  uint64_t kv_count_ = 0;
  struct Pending {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::string bytes;
  };
  std::vector<Pending> tensors_;
};

// Bytes of `n` elements of `t` (n a whole number of blocks), or an error for
// a type this reader does not know.
core::Result<size_t> ggml_nbytes(GgmlType t, int64_t n);

}  // namespace tessera::model
