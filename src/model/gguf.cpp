#include "model/gguf.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/dtype.h"
#include "core/io.h"
#include "kernels/quant.h"

namespace tessera::model {

using core::Result;
using core::Status;
using nlohmann::json;

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kMaxTensors = 1 << 20;
constexpr uint64_t kMaxKeys = 1 << 20;
constexpr int kMaxDims = 4;
constexpr int64_t kMaxElements = int64_t{1} << 40;
constexpr uint32_t kDefaultAlignment = 32;

struct TypeSize {
  GgmlType type;
  const char* name;
  int64_t block;   // elements per block
  size_t bytes;    // bytes per block
};

constexpr TypeSize kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4},       {GgmlType::kF16, "F16", 1, 2},       {GgmlType::kQ4_0, "Q4_0", 32, 18},
    {GgmlType::kQ4_1, "Q4_1", 32, 20},   {GgmlType::kQ5_0, "Q5_0", 32, 22},   {GgmlType::kQ5_1, "Q5_1", 32, 24},
    {GgmlType::kQ8_0, "Q8_0", 32, 34},   {GgmlType::kQ8_1, "Q8_1", 32, 36},   {GgmlType::kQ2_K, "Q2_K", 256, 84},
    {GgmlType::kQ3_K, "Q3_K", 256, 110}, {GgmlType::kQ4_K, "Q4_K", 256, 144}, {GgmlType::kQ5_K, "Q5_K", 256, 176},
    {GgmlType::kQ6_K, "Q6_K", 256, 210}, {GgmlType::kQ8_K, "Q8_K", 256, 292}, {GgmlType::kBF16, "BF16", 1, 2},
};

const TypeSize* type_size(uint32_t t) {
  for (const auto& s : kTypes)
    if (static_cast<uint32_t>(s.type) == t) return &s;
  return nullptr;
}

// A bounds-checked reader over the header.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n) : p_(p), left_(n) {}
  size_t used(const uint8_t* base) const { return static_cast<size_t>(p_ - base); }
  size_t left() const { return left_; }

  template <typename T>
  Status read(T& v, const char* what) {
    if (left_ < sizeof(T)) return truncated(what);
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    left_ -= sizeof(T);
    return core::ok_status();
  }

  Status string(std::string& s, const char* what) {
    uint64_t n = 0;
    TESSERA_RETURN_IF_ERROR(read(n, what));
    if (n > left_) return core::invalid_argument(std::string("GGUF: ") + what + " of " + std::to_string(n) +
                                                 " bytes runs past the end of the file");
    s.assign(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
    p_ += n;
    left_ -= static_cast<size_t>(n);
    return core::ok_status();
  }

 private:
  static Status truncated(const char* what) {
    return core::invalid_argument(std::string("GGUF: the file ends inside ") + what);
  }
  const uint8_t* p_;
  size_t left_;
};

size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
    case GgufValueType::kU16: case GgufValueType::kI16: return 2;
    case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
    case GgufValueType::kString: return 8;  // at least its length
    case GgufValueType::kArray: return 12;  // at least its type and count
  }
  return 0;
}

Status read_scalar(Cursor& c, GgufValueType t, json& out) {
  switch (t) {
    case GgufValueType::kU8: { uint8_t v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kI8: { int8_t v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kU16: { uint16_t v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kI16: { int16_t v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kU32: { uint32_t v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kI32: { int32_t v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kU64: { uint64_t v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kI64: { int64_t v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kF32: { float v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kF64: { double v; TESSERA_RETURN_IF_ERROR(c.read(v, "a value")); out = v; return core::ok_status(); }
    case GgufValueType::kBool: {
      uint8_t v;
      TESSERA_RETURN_IF_ERROR(c.read(v, "a value"));
      if (v > 1) return core::invalid_argument("GGUF: a boolean holds " + std::to_string(v));
      out = v == 1;
      return core::ok_status();
    }
    case GgufValueType::kString: {
      std::string s;
      TESSERA_RETURN_IF_ERROR(c.string(s, "a string value"));
      // Strings go into JSON, which must be valid UTF-8 to be dumped later.
      out = std::move(s);
      return core::ok_status();
    }
    case GgufValueType::kArray: break;
  }
  return core::invalid_argument("GGUF: value type " + std::to_string(static_cast<uint32_t>(t)) + " is not a scalar");
}

Status read_value(Cursor& c, uint32_t type, json& out) {
  if (type > static_cast<uint32_t>(GgufValueType::kF64))
    return core::invalid_argument("GGUF: unknown value type " + std::to_string(type));
  const auto t = static_cast<GgufValueType>(type);
  if (t != GgufValueType::kArray) return read_scalar(c, t, out);
  uint32_t et = 0;
  uint64_t n = 0;
  TESSERA_RETURN_IF_ERROR(c.read(et, "an array's type"));
  TESSERA_RETURN_IF_ERROR(c.read(n, "an array's length"));
  if (et > static_cast<uint32_t>(GgufValueType::kF64)) return core::invalid_argument("GGUF: unknown array element type " + std::to_string(et));
  if (static_cast<GgufValueType>(et) == GgufValueType::kArray)
    return core::invalid_argument("GGUF: arrays of arrays are not supported");
  // Every element takes at least this many bytes: a count the file cannot hold is refused before any allocation.
  if (n > c.left() / scalar_size(static_cast<GgufValueType>(et)))
    return core::invalid_argument("GGUF: an array of " + std::to_string(n) + " elements runs past the end of the file");
  out = json::array();
  for (uint64_t i = 0; i < n; ++i) {
    json v;
    TESSERA_RETURN_IF_ERROR(read_scalar(c, static_cast<GgufValueType>(et), v));
    out.push_back(std::move(v));
  }
  return core::ok_status();
}

}  // namespace

const char* ggml_type_name(GgmlType t) {
  const TypeSize* s = type_size(static_cast<uint32_t>(t));
  return s == nullptr ? "?" : s->name;
}

Result<size_t> ggml_nbytes(GgmlType t, int64_t n) {
  const TypeSize* s = type_size(static_cast<uint32_t>(t));
  if (s == nullptr) return core::invalid_argument("unknown ggml type " + std::to_string(static_cast<uint32_t>(t)));
  if (n < 0 || n % s->block != 0)
    return core::invalid_argument(std::to_string(n) + " elements are not whole " + s->name + " blocks of " + std::to_string(s->block));
  return static_cast<size_t>(n / s->block) * s->bytes;
}

int64_t GgufTensor::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
  return r;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(core::MappedFile map, core::map_file(path));
  GgufFile f;
  f.path_ = path;
  f.keep_ = map.data;
  f.map_size_ = map.size;
  if (auto st = f.parse(static_cast<const uint8_t*>(map.data.get()), map.size); !st.ok()) return st.with_context("'" + path + "'");
  return f;
}

Result<GgufFile> GgufFile::from_bytes(std::shared_ptr<const std::string> bytes, const std::string& name) {
  GgufFile f;
  f.path_ = name;
  const auto* base = reinterpret_cast<const uint8_t*>(bytes->data());
  const size_t size = bytes->size();
  f.keep_ = std::shared_ptr<const void>(bytes, bytes->data());
  TESSERA_RETURN_IF_ERROR(f.parse(base, size));
  return f;
}

Status GgufFile::parse(const uint8_t* base, size_t size) {
  Cursor c(base, size);
  uint32_t magic = 0;
  TESSERA_RETURN_IF_ERROR(c.read(magic, "the magic"));
  if (magic != kMagic) return core::invalid_argument("not a GGUF file (no 'GGUF' magic)");
  TESSERA_RETURN_IF_ERROR(c.read(version_, "the version"));
  if (version_ != 2 && version_ != 3)
    return core::invalid_argument("GGUF version " + std::to_string(version_) + " (this reader takes 2 and 3, little-endian)");
  uint64_t n_tensors = 0, n_keys = 0;
  TESSERA_RETURN_IF_ERROR(c.read(n_tensors, "the tensor count"));
  TESSERA_RETURN_IF_ERROR(c.read(n_keys, "the key count"));
  if (n_tensors > kMaxTensors || n_tensors > c.left() / 24)
    return core::invalid_argument("GGUF: a tensor count of " + std::to_string(n_tensors) + " that the file cannot hold");
  if (n_keys > kMaxKeys || n_keys > c.left() / 12)
    return core::invalid_argument("GGUF: a key count of " + std::to_string(n_keys) + " that the file cannot hold");
  for (uint64_t i = 0; i < n_keys; ++i) {
    std::string key;
    TESSERA_RETURN_IF_ERROR(c.string(key, "a key"));
    if (meta_.contains(key)) return core::invalid_argument("GGUF: the key '" + key + "' appears twice");
    uint32_t type = 0;
    TESSERA_RETURN_IF_ERROR(c.read(type, "a value's type"));
    json v;
    if (auto st = read_value(c, type, v); !st.ok()) return st.with_context("key '" + key + "'");
    meta_[key] = std::move(v);
  }
  uint32_t alignment = kDefaultAlignment;
  if (meta_.contains("general.alignment")) {
    const json& a = meta_["general.alignment"];
    if (!a.is_number_unsigned() || a.get<uint64_t>() == 0 || a.get<uint64_t>() > (1u << 20) ||
        (a.get<uint64_t>() & (a.get<uint64_t>() - 1)) != 0)
      return core::invalid_argument("GGUF: general.alignment must be a power of two up to 1 MiB");
    alignment = a.get<uint32_t>();
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    TESSERA_RETURN_IF_ERROR(c.string(t.name, "a tensor name"));
    if (index_.count(t.name)) return core::invalid_argument("GGUF: the tensor '" + t.name + "' appears twice");
    uint32_t dims = 0;
    TESSERA_RETURN_IF_ERROR(c.read(dims, "a tensor's rank"));
    if (dims < 1 || dims > kMaxDims)
      return core::invalid_argument("GGUF: tensor '" + t.name + "' has " + std::to_string(dims) + " dimensions (1 to 4)");
    int64_t count = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      uint64_t ne = 0;
      TESSERA_RETURN_IF_ERROR(c.read(ne, "a tensor's dimensions"));
      if (ne < 1 || ne > static_cast<uint64_t>(kMaxElements) || count > kMaxElements / static_cast<int64_t>(ne))
        return core::invalid_argument("GGUF: tensor '" + t.name + "' has an absurd dimension (" + std::to_string(ne) + ")");
      count *= static_cast<int64_t>(ne);
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    uint32_t type = 0;
    TESSERA_RETURN_IF_ERROR(c.read(type, "a tensor's type"));
    const TypeSize* ts = type_size(type);
    if (ts == nullptr) return core::invalid_argument("GGUF: tensor '" + t.name + "' has unknown ggml type " + std::to_string(type));
    t.type = ts->type;
    if (t.ne[0] % ts->block != 0)
      return core::invalid_argument("GGUF: tensor '" + t.name + "' rows of " + std::to_string(t.ne[0]) + " are not whole " +
                                    ts->name + " blocks");
    t.nbytes = static_cast<size_t>(count / ts->block) * ts->bytes;
    TESSERA_RETURN_IF_ERROR(c.read(t.offset, "a tensor's offset"));
    if (t.offset % alignment != 0)
      return core::invalid_argument("GGUF: tensor '" + t.name + "' data is not aligned to " + std::to_string(alignment));
    index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  const size_t header = c.used(base);
  const size_t data_start = (header + alignment - 1) / alignment * alignment;
  if (n_tensors > 0 && data_start > size) return core::invalid_argument("GGUF: the file ends before its tensor data");
  const size_t data_size = data_start <= size ? size - data_start : 0;
  std::vector<std::pair<uint64_t, size_t>> spans;
  for (GgufTensor& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      return core::invalid_argument("GGUF: tensor '" + t.name + "' (" + std::to_string(t.nbytes) + " bytes at " +
                                    std::to_string(t.offset) + ") lies outside the file's data");
    t.data = base + data_start + t.offset;
    spans.push_back({t.offset, t.nbytes});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i - 1].first + spans[i - 1].second > spans[i].first) return core::invalid_argument("GGUF: tensor data overlap");
  return core::ok_status();
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<core::Tensor> GgufFile::get_f32(const std::string& name) const {
  const GgufTensor* t = tensor(name);
  if (t == nullptr) return core::not_found("tensor '" + name + "' not in '" + path_ + "'");
  const int64_t cols = t->row_length(), rows = t->rows();
  core::Tensor out = core::Tensor::zeros_f32(t->ne.size() == 1 ? core::Shape{cols} : core::Shape{rows, cols});
  float* dst = out.f32();
  const int64_t n = rows * cols;
  switch (t->type) {
    case GgmlType::kF32: std::memcpy(dst, t->data, static_cast<size_t>(n) * 4); break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t->data + 2 * i, 2);
        dst[i] = t->type == GgmlType::kF16 ? core::f16_to_f32(h) : core::bf16_to_f32(h);
      }
      break;
    default: {
      const auto qt = kernel_type(t->type);
      if (!qt)
        return core::unimplemented("tensor '" + name + "' is " + ggml_type_name(t->type) +
                                   "; Tessera reads F32, F16, BF16, Q8_0, Q4_0, Q4_K and Q6_K tensors");
      // parse() checked that rows are whole blocks and the bytes are in the file.
      const size_t row = kernels::row_bytes(*qt, cols);
      for (int64_t r = 0; r < rows; ++r) kernels::dequantize_row_ref(*qt, t->data + r * row, cols, dst + r * cols);
      break;
    }
  }
  return out;
}

std::optional<kernels::WeightType> kernel_type(GgmlType t) {
  switch (t) {
    case GgmlType::kQ8_0: return kernels::WeightType::kQ8_0;
    case GgmlType::kQ4_0: return kernels::WeightType::kQ4_0;
    case GgmlType::kQ4_K: return kernels::WeightType::kQ4_K;
    case GgmlType::kQ6_K: return kernels::WeightType::kQ6_K;
    default: return std::nullopt;
  }
}

GgmlType ggml_type_of(kernels::WeightType t) {
  switch (t) {
    case kernels::WeightType::kQ8_0: return GgmlType::kQ8_0;
    case kernels::WeightType::kQ4_0: return GgmlType::kQ4_0;
    case kernels::WeightType::kQ4_K: return GgmlType::kQ4_K;
    case kernels::WeightType::kQ6_K: return GgmlType::kQ6_K;
    case kernels::WeightType::kF32: break;
  }
  return GgmlType::kF32;
}

void GgufFile::release(const std::string& name) const {
  const GgufTensor* t = tensor(name);
  if (t != nullptr && map_size_ > 0) core::drop_pages(t->data, t->nbytes);
}

// ---------------------------------------------------------------- writer

namespace {

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string& s, const std::string& v) {
  put_u64(s, v.size());
  s += v;
}

}  // namespace

void GgufWriter::add_string(const std::string& key, const std::string& v) {
  put_str(kv_, key);
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kString));
  put_str(kv_, v);
  ++kv_count_;
}

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  put_str(kv_, key);
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kU32));
  put_u32(kv_, v);
  ++kv_count_;
}

void GgufWriter::add_i32(const std::string& key, int32_t v) {
  put_str(kv_, key);
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kI32));
  kv_.append(reinterpret_cast<const char*>(&v), 4);
  ++kv_count_;
}

void GgufWriter::add_f32(const std::string& key, float v) {
  put_str(kv_, key);
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kF32));
  kv_.append(reinterpret_cast<const char*>(&v), 4);
  ++kv_count_;
}

void GgufWriter::add_bool(const std::string& key, bool v) {
  put_str(kv_, key);
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kBool));
  kv_.push_back(v ? 1 : 0);
  ++kv_count_;
}

void GgufWriter::add_strings(const std::string& key, const std::vector<std::string>& v) {
  put_str(kv_, key);
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kArray));
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kString));
  put_u64(kv_, v.size());
  for (const auto& s : v) put_str(kv_, s);
  ++kv_count_;
}

void GgufWriter::add_i32s(const std::string& key, const std::vector<int32_t>& v) {
  put_str(kv_, key);
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kArray));
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kI32));
  put_u64(kv_, v.size());
  kv_.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  ++kv_count_;
}

void GgufWriter::add_f32s(const std::string& key, const std::vector<float>& v) {
  put_str(kv_, key);
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kArray));
  put_u32(kv_, static_cast<uint32_t>(GgufValueType::kF32));
  put_u64(kv_, v.size());
  kv_.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  ++kv_count_;
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, std::string bytes) {
  tensors_.push_back({name, type, std::move(ne), std::move(bytes)});
}

std::string GgufWriter::serialize() const {
  std::string out;
  put_u32(out, kMagic);
  put_u32(out, 3);
  put_u64(out, tensors_.size());
  put_u64(out, kv_count_);
  out += kv_;
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_str(out, t.name);
    put_u32(out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put_u64(out, static_cast<uint64_t>(d));
    put_u32(out, static_cast<uint32_t>(t.type));
    put_u64(out, offset);
    offset += (t.bytes.size() + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment;
  }
  out.resize((out.size() + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment, '\0');
  for (const auto& t : tensors_) {
    out += t.bytes;
    out.resize((out.size() + kDefaultAlignment - 1) / kDefaultAlignment * kDefaultAlignment, '\0');
  }
  return out;
}

Status GgufWriter::write(const std::string& path) const { return core::write_file(path, serialize()); }

}  // namespace tessera::model
