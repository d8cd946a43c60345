#include "model/safetensors.h"


#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/io.h"
#include "core/json.h"
#include "model/gguf.h"
#include "model/gguf_model.h"

namespace tessera::model {

using core::Result;
using core::Status;
using core::Tensor;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MiB, as the reference library
constexpr size_t kMaxRank = 8;

Result<TensorInfo> parse_entry(const std::string& name, const json& e, size_t data_size) {
  if (!e.is_object()) return core::parse_error("tensor '" + name + "': entry is not an object");
  if (!e.contains("dtype") || !e["dtype"].is_string())
    return core::parse_error("tensor '" + name + "': missing dtype");
  auto dt = core::parse_dtype(e["dtype"].get<std::string>());
  if (!dt) return core::parse_error("tensor '" + name + "': unsupported dtype " + e["dtype"].get<std::string>());
  if (!e.contains("shape") || !e["shape"].is_array() || e["shape"].size() > kMaxRank)
    return core::parse_error("tensor '" + name + "': missing or bad shape");
  TensorInfo info;
  info.dtype = *dt;
  unsigned __int128 numel = 1;
  for (const auto& d : e["shape"]) {
    if (!d.is_number_unsigned()) return core::parse_error("tensor '" + name + "': shape entry is not a non-negative integer");
    info.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    numel *= d.get<uint64_t>();
    if (numel > (1ull << 40)) return core::parse_error("tensor '" + name + "': shape too large");
  }
  const auto& off = e.contains("data_offsets") ? e["data_offsets"] : json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    return core::parse_error("tensor '" + name + "': missing or bad data_offsets");
  info.begin = off[0].get<uint64_t>();
  info.end = off[1].get<uint64_t>();
  if (info.begin > info.end || info.end > data_size)
    return core::out_of_range("tensor '" + name + "': data_offsets [" + std::to_string(info.begin) + "," +
                              std::to_string(info.end) + ") outside the data section of " +
                              std::to_string(data_size) + " bytes");
  const unsigned __int128 want = numel * core::dtype_size(info.dtype);
  if (want != info.end - info.begin)
    return core::parse_error("tensor '" + name + "': shape " + core::shape_to_string(info.shape) + " of " +
                             core::dtype_name(info.dtype) + " needs " + std::to_string(static_cast<uint64_t>(want)) +
                             " bytes but data_offsets span " + std::to_string(info.end - info.begin));
  return info;
}

Status check_overlaps(const std::map<std::string, TensorInfo>& infos) {
  // Empty tensors occupy no bytes, so they can overlap nothing; left in, an
  // empty tensor sorted between two overlapping ones would hide the overlap.
  std::vector<std::pair<const TensorInfo*, const std::string*>> sorted;
  for (const auto& [n, i] : infos)
    if (i.end > i.begin) sorted.push_back({&i, &n});
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.first->begin < b.first->begin; });
  // Compare with the furthest-reaching tensor so far, not only the neighbour.
  size_t reach = 0;
  const std::string* reach_name = nullptr;
  for (const auto& [info, name] : sorted) {
    if (reach_name != nullptr && info->begin < reach)
      return core::parse_error("tensors '" + *reach_name + "' and '" + *name + "' overlap in the data section");
    if (info->end > reach) {
      reach = info->end;
      reach_name = name;
    }
  }
  return core::ok_status();
}

}  // namespace

Status SafeTensorsFile::parse(const char* base, size_t size) {
  const std::string& name = path_;
  if (size < 8) return core::parse_error("'" + name + "': file too short for a safetensors header (" + std::to_string(size) + " bytes)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(base[i]);
  if (header_len > kMaxHeaderBytes) return core::parse_error("'" + name + "': header length " + std::to_string(header_len) + " is too large");
  if (header_len > size - 8)
    return core::parse_error("'" + name + "': header length " + std::to_string(header_len) + " runs past the end of the file (" +
                             std::to_string(size) + " bytes)");
  auto parsed = core::parse_json(std::string_view(base + 8, header_len), "'" + name + "': header");
  if (!parsed.ok()) return parsed.status();
  const json& header = *parsed;
  if (!header.is_object()) return core::parse_error("'" + name + "': header is not valid JSON (not an object)");
  data_ = base + 8 + header_len;
  data_size_ = size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return core::parse_error("'" + name + "': __metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m)
        if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    auto info = parse_entry(it.key(), it.value(), data_size_);
    if (!info.ok()) return info.status().with_context("'" + name + "'");
    infos_[it.key()] = *info;
  }
  return check_overlaps(infos_).with_context("'" + name + "'");
}

Result<SafeTensorsFile> SafeTensorsFile::from_bytes(std::shared_ptr<const std::string> bytes, const std::string& name) {
  SafeTensorsFile f;
  f.path_ = name;
  TESSERA_RETURN_IF_ERROR(f.parse(bytes->data(), bytes->size()));
  f.mapping_ = std::const_pointer_cast<std::string>(bytes);
  return f;
}

Result<SafeTensorsFile> SafeTensorsFile::open(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(core::MappedFile map, core::map_file(path));
  SafeTensorsFile f;
  f.path_ = path;
  f.mapping_ = std::const_pointer_cast<void>(map.data);
  f.map_size_ = map.size;
  TESSERA_RETURN_IF_ERROR(f.parse(static_cast<const char*>(map.data.get()), map.size));
  return f;
}

std::vector<std::string> SafeTensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : infos_) out.push_back(n);
  return out;
}

const TensorInfo* SafeTensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  return it == infos_.end() ? nullptr : &it->second;
}

Result<Tensor> SafeTensorsFile::get(const std::string& name) const {
  const TensorInfo* i = info(name);
  if (i == nullptr) return core::not_found("tensor '" + name + "' not in '" + path_ + "'");
  return Tensor::borrow(i->dtype, i->shape, const_cast<char*>(data_ + i->begin), mapping_);
}

void SafeTensorsFile::release(const std::string& name) const {
  const TensorInfo* i = info(name);
  if (i != nullptr) release_bytes(data_ + i->begin, i->end - i->begin);
}

void SafeTensorsFile::release_bytes(const void* p, size_t bytes) const {
  const auto* b = static_cast<const char*>(p);
  const auto* base = static_cast<const char*>(mapping_.get());
  if (map_size_ == 0 || bytes == 0 || b < base || b + bytes > base + map_size_) return;
  // Whole pages covering the range: the mapping is read-only and private,
  // so dropping a page a neighbour shares only costs that neighbour a re-read.
  core::drop_pages(b, bytes);
}

Result<Tensor> SafeTensorsFile::get_f32(const std::string& name) const {
  TESSERA_ASSIGN_OR_RETURN(Tensor t, get(name));
  const uintptr_t addr = reinterpret_cast<uintptr_t>(t.raw());
  if (t.dtype() == core::DType::kF32 && addr % alignof(float) == 0) return t;
  Tensor out = Tensor::zeros_f32(t.shape());
  const int64_t n = t.numel();
  const auto* src = static_cast<const unsigned char*>(t.raw());
  float* dst = out.f32();
  switch (t.dtype()) {
    case core::DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); break;
    case core::DType::kF16:
    case core::DType::kBF16:
      for (int64_t j = 0; j < n; ++j) {
        uint16_t h;
        std::memcpy(&h, src + 2 * j, 2);
        dst[j] = t.dtype() == core::DType::kF16 ? core::f16_to_f32(h) : core::bf16_to_f32(h);
      }
      break;
    default:
      return core::invalid_argument("tensor '" + name + "' has dtype " + core::dtype_name(t.dtype()) +
                                    "; expected a floating-point type (F32, F16, BF16)");
  }
  return out;
}

Status write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", core::dtype_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // align the data section
  std::string out;
  out.reserve(8 + h.size() + offset);
  const uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += h;
  for (const auto& [name, t] : tensors) out.append(static_cast<const char*>(t.raw()), t.nbytes());
  return core::write_file(path, out);
}

Status TensorStore::add_gguf(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  auto f = std::make_shared<const GgufFile>(std::move(file));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<GgufMapped> map, gguf_tensor_map(*f));
  block_type_ = gguf_weight_type(*f);
  for (const GgufMapped& m : map) {
    Virtual v;
    v.info.dtype = core::DType::kF32;
    v.info.shape = m.shape;
    v.read = [f, m] { return gguf_read(*f, m); };
    v.drop = [f, m] { f->release(m.gguf_name); };
    v.blocks = [f, m]() -> Result<std::optional<Blocks>> {
      TESSERA_ASSIGN_OR_RETURN(std::optional<GgufBlocks> b, gguf_blocks(*f, m));
      if (!b) return std::optional<Blocks>();
      // The file stays mapped while the blocks are in use.
      std::shared_ptr<const void> keep = b->keep ? b->keep : std::shared_ptr<const void>(f, f.get());
      return std::optional<Blocks>(Blocks{b->type, b->rows, b->k, b->data, std::move(keep)});
    };
    if (!virtual_.emplace(m.hf_name, std::move(v)).second)
      return core::invalid_argument("GGUF: two tensors map to '" + m.hf_name + "'");
  }
  return core::ok_status();
}

Result<TensorStore> TensorStore::open_dir(const std::string& dir) {
  TensorStore store;
  if (is_gguf_path(dir)) {
    TESSERA_RETURN_IF_ERROR(store.add_gguf(dir));
    return store;
  }
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string single = dir + "/model.safetensors";
  std::vector<std::string> files;
  if (core::file_exists(single)) {
    files.push_back(single);
  } else if (core::file_exists(index)) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, core::read_file(index));
    auto parsed = core::parse_json(text, "'" + index + "'");
    if (!parsed.ok()) return parsed.status();
    const json& j = *parsed;
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return core::parse_error("'" + index + "': not valid JSON with a weight_map object");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return core::parse_error("'" + index + "': weight_map value is not a file name");
      const std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
        return core::parse_error("'" + index + "': shard name '" + f + "' must be a plain file name");
      if (std::find(files.begin(), files.end(), dir + "/" + f) == files.end()) files.push_back(dir + "/" + f);
    }
  } else {
    return core::not_found("no model.safetensors or model.safetensors.index.json in '" + dir + "'");
  }
  for (const auto& f : files) {
    TESSERA_ASSIGN_OR_RETURN(SafeTensorsFile file, SafeTensorsFile::open(f));
    for (const auto& n : file.names()) {
      if (store.where_.count(n)) return core::parse_error("tensor '" + n + "' appears in more than one shard");
      store.where_[n] = store.files_.size();
    }
    store.files_.push_back(std::move(file));
  }
  return store;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : where_) out.push_back(n);
  for (const auto& [n, v] : virtual_) out.push_back(n);
  return out;
}

const TensorInfo* TensorStore::info(const std::string& name) const {
  if (auto v = virtual_.find(name); v != virtual_.end()) return &v->second.info;
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second].info(name);
}

Result<Tensor> TensorStore::get_f32(const std::string& name) const {
  if (auto v = virtual_.find(name); v != virtual_.end()) return v->second.read();
  auto it = where_.find(name);
  if (it == where_.end()) return core::not_found("missing tensor '" + name + "'");
  return files_[it->second].get_f32(name);
}

Result<std::optional<TensorStore::Blocks>> TensorStore::blocks(const std::string& name) const {
  if (auto v = virtual_.find(name); v != virtual_.end() && v->second.blocks) return v->second.blocks();
  if (!contains(name)) return core::not_found("missing tensor '" + name + "'");
  return std::optional<Blocks>();
}

void TensorStore::release(const std::string& name) const {
  if (auto v = virtual_.find(name); v != virtual_.end()) return v->second.drop();
  auto it = where_.find(name);
  if (it != where_.end()) files_[it->second].release(name);
}

void TensorStore::release_bytes(const void* p, size_t bytes) const {
  for (const auto& f : files_) f.release_bytes(p, bytes);
}

}  // namespace tessera::model
