// The terminal's cluster file (TOML) and the cluster key file (JSON). The
// first byte picks which; the rest is the file.
#include "comm/keys.h"
#include "fuzz_util.h"
#include "runtime/cluster_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int once = tessera::fuzz::quiet();
  (void)once;
  if (size == 0) return 0;
  const std::string rest = tessera::fuzz::text(data + 1, size - 1);
  if (data[0] & 1) {
    auto k = tessera::comm::parse_key_file(rest, "fuzz");
    if (k.ok() && !tessera::comm::validate_cluster_key(*k).ok()) __builtin_trap();
  } else {
    auto c = tessera::runtime::parse_cluster_file(rest, "fuzz");
    if (c.ok()) {
      if (c->workers.empty() || c->workers.size() > 63) __builtin_trap();
      if (c->memory.size() != c->workers.size() + 1) __builtin_trap();  // a budget slot per device
      for (const auto& w : c->workers) (void)tessera::runtime::next_port_endpoint(w);
    }
  }
  return 0;
}
