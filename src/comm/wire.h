// The frame format every rank speaks, and the validation that runs on every
// frame before any of its contents is used. A message is one header frame
// (fixed size) followed, for data, by one payload frame holding the raw bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace tessera::comm {

inline constexpr uint32_t kWireMagic = 0x41525354;  // "TSRA" little-endian
inline constexpr uint8_t kWireVersion = 1;
inline constexpr size_t kMaxDims = 8;
inline constexpr size_t kHeaderSize = 40 + 8 * kMaxDims;
// User and collective tags live in [0, kMaxTag).
inline constexpr uint32_t kMaxTag = 1u << 30;

enum class FrameKind : uint8_t { kData = 1, kHello = 2, kBye = 3 };

// Which mailbox a message belongs to; also the accounting bucket. Each
// collective kind has its own mailboxes so that a user's p2p tag never
// collides with a collective's.
enum class OpKind : uint8_t {
  kP2P = 0,
  kBroadcast,
  kGather,
  kAllgather,
  kReduceScatter,
  kAllreduce,
  kBarrier,
  kCount,
};
inline constexpr int kOpKindCount = static_cast<int>(OpKind::kCount);
const char* op_name(OpKind op);

struct FrameHeader {
  FrameKind kind = FrameKind::kData;
  OpKind op = OpKind::kP2P;
  core::DType dtype = core::DType::kU8;
  uint32_t src = 0;
  uint32_t world = 0;
  uint64_t group = 0;
  uint32_t tag = 0;
  core::Shape shape;
  uint64_t nbytes = 0;
};

// What a receiver knows and enforces.
struct FrameLimits {
  uint32_t self_rank = 0;
  uint32_t world = 1;
  uint64_t group = 0;
  uint64_t max_bytes = 1ull << 30;
};

// Why a frame was thrown away; each reason has its own counter.
enum class RejectReason : uint8_t {
  kFrameCount = 0,  // not [routing id][header] or [routing id][header][payload]
  kHeaderSize,
  kMagic,
  kVersion,
  kKind,
  kOp,
  kRank,       // src >= world, src == self, or routing id disagrees with src
  kWorld,
  kGroup,
  kTag,
  kDType,
  kShape,      // too many dims, negative or unused-but-set dims
  kSize,       // byte count disagrees with shape, or over the limit
  kPayload,    // payload frame size disagrees with the header
  kUnexpected, // valid frame at the wrong time (e.g. data after the peer said bye)
  kCount,
};
inline constexpr int kRejectReasonCount = static_cast<int>(RejectReason::kCount);
const char* reject_reason_name(RejectReason r);

using HeaderBytes = std::array<uint8_t, kHeaderSize>;

HeaderBytes encode_header(const FrameHeader& h);

// Decoded header, or the reason it is invalid. Checks everything that can
// be checked without the payload.
struct DecodeResult {
  bool ok = false;
  RejectReason reason = RejectReason::kHeaderSize;
  FrameHeader header;
};
DecodeResult decode_header(const void* data, size_t size, const FrameLimits& limits);

// Routing id a rank's sending socket announces, and its inverse (-1 when the
// id is not of that form).
std::string routing_id_for(int rank);
int rank_from_routing_id(const void* data, size_t size);

// FNV-1a of the group name; carried in every header so that stray traffic
// from another group (an old run on a reused port) is rejected.
uint64_t group_hash(const std::string& group_id);

}  // namespace tessera::comm
