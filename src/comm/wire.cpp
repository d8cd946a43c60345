#include "comm/wire.h"

#include <bit>
#include <cstring>

namespace tessera::comm {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; add byte swapping for big-endian hosts");

namespace {

// Field offsets inside the fixed header.
constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffKind = 5, kOffOp = 6, kOffDType = 7;
constexpr size_t kOffSrc = 8, kOffWorld = 12, kOffGroup = 16, kOffTag = 24, kOffNdim = 28;
constexpr size_t kOffBytes = 32, kOffDims = 40;

template <typename T>
void put(uint8_t* base, size_t off, T v) {
  std::memcpy(base + off, &v, sizeof(T));
}
template <typename T>
T get(const uint8_t* base, size_t off) {
  T v;
  std::memcpy(&v, base + off, sizeof(T));
  return v;
}

DecodeResult reject(RejectReason r) {
  DecodeResult out;
  out.reason = r;
  return out;
}

}  // namespace

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kP2P: return "p2p";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kGather: return "gather";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kCount: break;
  }
  return "?";
}

const char* reject_reason_name(RejectReason r) {
  switch (r) {
    case RejectReason::kFrameCount: return "frame_count";
    case RejectReason::kHeaderSize: return "header_size";
    case RejectReason::kMagic: return "magic";
    case RejectReason::kVersion: return "version";
    case RejectReason::kKind: return "kind";
    case RejectReason::kOp: return "op";
    case RejectReason::kRank: return "rank";
    case RejectReason::kWorld: return "world";
    case RejectReason::kGroup: return "group";
    case RejectReason::kTag: return "tag";
    case RejectReason::kDType: return "dtype";
    case RejectReason::kShape: return "shape";
    case RejectReason::kSize: return "size";
    case RejectReason::kPayload: return "payload";
    case RejectReason::kUnexpected: return "unexpected";
    case RejectReason::kCount: break;
  }
  return "?";
}

HeaderBytes encode_header(const FrameHeader& h) {
  TESSERA_CHECK(h.shape.size() <= kMaxDims);
  HeaderBytes out{};
  uint8_t* b = out.data();
  put<uint32_t>(b, kOffMagic, kWireMagic);
  put<uint8_t>(b, kOffVersion, kWireVersion);
  put<uint8_t>(b, kOffKind, static_cast<uint8_t>(h.kind));
  put<uint8_t>(b, kOffOp, static_cast<uint8_t>(h.op));
  put<uint8_t>(b, kOffDType, static_cast<uint8_t>(h.dtype));
  put<uint32_t>(b, kOffSrc, h.src);
  put<uint32_t>(b, kOffWorld, h.world);
  put<uint64_t>(b, kOffGroup, h.group);
  put<uint32_t>(b, kOffTag, h.tag);
  put<uint32_t>(b, kOffNdim, static_cast<uint32_t>(h.shape.size()));
  put<uint64_t>(b, kOffBytes, h.nbytes);
  for (size_t i = 0; i < h.shape.size(); ++i) put<int64_t>(b, kOffDims + 8 * i, h.shape[i]);
  return out;
}

DecodeResult decode_header(const void* data, size_t size, const FrameLimits& limits) {
  if (data == nullptr || size != kHeaderSize) return reject(RejectReason::kHeaderSize);
  const auto* b = static_cast<const uint8_t*>(data);
  if (get<uint32_t>(b, kOffMagic) != kWireMagic) return reject(RejectReason::kMagic);
  if (get<uint8_t>(b, kOffVersion) != kWireVersion) return reject(RejectReason::kVersion);

  const uint8_t kind = get<uint8_t>(b, kOffKind);
  if (kind < 1 || kind > 3) return reject(RejectReason::kKind);
  const uint8_t op = get<uint8_t>(b, kOffOp);
  if (op >= static_cast<uint8_t>(OpKind::kCount)) return reject(RejectReason::kOp);

  const uint32_t world = get<uint32_t>(b, kOffWorld);
  if (world != limits.world) return reject(RejectReason::kWorld);
  const uint32_t src = get<uint32_t>(b, kOffSrc);
  if (src >= limits.world || src == limits.self_rank) return reject(RejectReason::kRank);
  if (get<uint64_t>(b, kOffGroup) != limits.group) return reject(RejectReason::kGroup);
  const uint32_t tag = get<uint32_t>(b, kOffTag);
  if (tag >= kMaxTag) return reject(RejectReason::kTag);

  const uint8_t dtype = get<uint8_t>(b, kOffDType);
  if (!core::valid_dtype_code(dtype)) return reject(RejectReason::kDType);

  const uint32_t ndim = get<uint32_t>(b, kOffNdim);
  if (ndim > kMaxDims) return reject(RejectReason::kShape);
  core::Shape shape(ndim);
  // Count elements with an explicit bound so that a hostile shape can
  // neither overflow nor make us allocate: every element is at least one
  // byte, so more than max_bytes elements can never be valid.
  uint64_t numel = 1;
  bool zero = false;
  for (uint32_t i = 0; i < kMaxDims; ++i) {
    const int64_t d = get<int64_t>(b, kOffDims + 8 * i);
    if (i >= ndim) {
      if (d != 0) return reject(RejectReason::kShape);
      continue;
    }
    if (d < 0) return reject(RejectReason::kShape);
    shape[i] = d;
    if (d == 0) zero = true;
    if (!zero) {
      const uint64_t ud = static_cast<uint64_t>(d);
      if (ud > limits.max_bytes || numel > limits.max_bytes / ud) return reject(RejectReason::kSize);
      numel *= ud;
    }
  }
  if (zero) numel = 0;

  const uint64_t nbytes = get<uint64_t>(b, kOffBytes);
  const auto ftype = static_cast<FrameKind>(kind);
  if (ftype != FrameKind::kData) {
    // Control frames carry no tensor.
    if (ndim != 0 || nbytes != 0) return reject(RejectReason::kSize);
  } else {
    const uint64_t esize = core::dtype_size(static_cast<core::DType>(dtype));
    if (numel > limits.max_bytes / esize) return reject(RejectReason::kSize);
    if (nbytes != numel * esize || nbytes > limits.max_bytes) return reject(RejectReason::kSize);
  }

  DecodeResult out;
  out.ok = true;
  FrameHeader& h = out.header;
  h.kind = ftype;
  h.op = static_cast<OpKind>(op);
  h.dtype = static_cast<core::DType>(dtype);
  h.src = src;
  h.world = world;
  h.group = get<uint64_t>(b, kOffGroup);
  h.tag = tag;
  h.shape = std::move(shape);
  h.nbytes = nbytes;
  return out;
}

std::string routing_id_for(int rank) { return "tsr" + std::to_string(rank); }

int rank_from_routing_id(const void* data, size_t size) {
  const auto* c = static_cast<const char*>(data);
  if (data == nullptr || size < 4 || size > 13 || std::memcmp(c, "tsr", 3) != 0) return -1;
  // Only routing_id_for's spelling: "tsr01" is another ROUTER peer than
  // "tsr1", and must not speak as rank 1 beside it.
  if (c[3] == '0' && size > 4) return -1;
  int64_t v = 0;
  for (size_t i = 3; i < size; ++i) {
    if (c[i] < '0' || c[i] > '9') return -1;
    v = v * 10 + (c[i] - '0');
  }
  return v > (1 << 20) ? -1 : static_cast<int>(v);
}

uint64_t group_hash(const std::string& group_id) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : group_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace tessera::comm
