// The frame header every rank decodes before it uses any byte of a frame,
// and the routing id that names the sender. Decoded headers must encode
// back to the same bytes.
#include <cstring>

#include "comm/wire.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::comm;
  static const int once = tessera::fuzz::quiet();
  (void)once;
  (void)rank_from_routing_id(data, size < 16 ? size : 16);
  if (size < 4) return 0;
  // The first bytes vary what the receiver enforces; the rest is the header.
  FrameLimits limits;
  limits.world = 1 + data[0] % 64;
  limits.self_rank = data[1] % limits.world;
  limits.group = group_hash("fuzz");
  limits.max_bytes = data[2] & 1 ? (1ull << 30) : 4096;
  const DecodeResult d = decode_header(data + 4, size - 4, limits);
  if (!d.ok) return 0;
  const FrameHeader& h = d.header;
  if (h.src >= limits.world || h.src == limits.self_rank || h.tag >= kMaxTag || h.nbytes > limits.max_bytes)
    __builtin_trap();
  const HeaderBytes again = encode_header(h);
  if (std::memcmp(again.data(), data + 4, kHeaderSize) != 0) __builtin_trap();
  return 0;
}
