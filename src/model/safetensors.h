// safetensors files: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}}, then the data. Files are mmap'd and
// every header field is validated before any tensor is handed out.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/quant.h"

namespace tessera::model {

struct TensorInfo {
  core::DType dtype;
  core::Shape shape;
  size_t begin = 0;  // offsets into the data section
  size_t end = 0;
};

class SafeTensorsFile {
 public:
  // Maps and validates the file (header size, JSON, dtypes, shapes, offsets
  // inside the data section, no overlaps).
  static core::Result<SafeTensorsFile> open(const std::string& path);
  // Same validation on bytes in memory (the buffer is kept alive).
  static core::Result<SafeTensorsFile> from_bytes(std::shared_ptr<const std::string> bytes,
                                                  const std::string& name = "<memory>");

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const TensorInfo* info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A view of the tensor's bytes (no copy); it keeps the mapping alive.
  core::Result<core::Tensor> get(const std::string& name) const;
  // The tensor as f32: F32 is borrowed, F16/BF16 are converted into a copy.
  core::Result<core::Tensor> get_f32(const std::string& name) const;
  // Drops the tensor's pages from this process's resident memory once a copy
  // was made (mmap'd files only; a no-op otherwise). Views stay valid: the
  // pages are read from the file again if touched.
  void release(const std::string& name) const;
  // The same for any byte range; ranges outside this file's mapping are ignored.
  void release_bytes(const void* p, size_t bytes) const;

 private:
  core::Status parse(const char* base, size_t size);

  std::string path_;
  std::shared_ptr<void> mapping_;
  size_t map_size_ = 0;         // > 0 when mapping_ is an mmap of the file
  const char* data_ = nullptr;  // start of the data section
  size_t data_size_ = 0;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any dtype) in safetensors format, names sorted.
core::Status write_safetensors(const std::string& path, const std::map<std::string, core::Tensor>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// A set of files: a single model.safetensors or the shards listed in
// model.safetensors.index.json ({"weight_map": {name: file}}); or a GGUF
// file (`dir` names it), its tensors under Hugging Face names
// (model/gguf_model.h), each read as F32 in Hugging Face layout on request.
class TensorStore {
 public:
  static core::Result<TensorStore> open_dir(const std::string& dir);
  bool contains(const std::string& name) const { return where_.count(name) != 0 || virtual_.count(name) != 0; }
  std::vector<std::string> names() const;
  const TensorInfo* info(const std::string& name) const;
  core::Result<core::Tensor> get_f32(const std::string& name) const;
  void release(const std::string& name) const;  // see SafeTensorsFile::release
  void release_bytes(const void* p, size_t bytes) const;
  // A GGUF file's most common block type of the layers' matrices (F32 for
  // other files), and a matrix as the file's own blocks in Linear layout
  // [out, in] where it has them (gguf_blocks), else nullopt.
  kernels::WeightType block_type() const { return block_type_; }
  struct Blocks {
    kernels::WeightType type = kernels::WeightType::kF32;
    int64_t rows = 0, k = 0;
    const uint8_t* data = nullptr;
    std::shared_ptr<const void> keep;  // what `data` points into
  };
  core::Result<std::optional<Blocks>> blocks(const std::string& name) const;

 private:
  core::Status add_gguf(const std::string& path);
  struct Virtual {
    TensorInfo info;
    std::function<core::Result<core::Tensor>()> read;
    std::function<void()> drop;
    std::function<core::Result<std::optional<Blocks>>()> blocks;
  };
  kernels::WeightType block_type_ = kernels::WeightType::kF32;
  std::vector<SafeTensorsFile> files_;
  std::map<std::string, size_t> where_;
  std::map<std::string, Virtual> virtual_;
};

}  // namespace tessera::model
