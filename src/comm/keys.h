// The cluster key: one CURVE keypair shared by every rank of a cluster. Each
// rank uses it as its server key and as its client key, and each server
// accepts only clients presenting that public key (see docs/comm.md), so a
// process without the file's secret key can neither connect nor be connected
// to.
#pragma once

#include <string>

#include "core/status.h"

namespace tessera::comm {

struct ClusterKey {
  std::string public_z85;  // 40 characters
  std::string secret_z85;  // 40 characters
};

core::Result<ClusterKey> generate_cluster_key();
// Checks both keys are well-formed Z85 and that the public key belongs to
// the secret key.
core::Status validate_cluster_key(const ClusterKey& key);

// JSON {"format": "tessera-cluster-key", "version": 1, "curve_public": ..,
// "curve_secret": ..}, written with mode 0600 (fails if the file exists
// unless `overwrite`).
core::Status write_key_file(const std::string& path, const ClusterKey& key, bool overwrite = false);
core::Result<ClusterKey> read_key_file(const std::string& path);
// The same from the file's text; `path` labels errors.
core::Result<ClusterKey> parse_key_file(const std::string& text, const std::string& path);

}  // namespace tessera::comm
