#include "comm/keys.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <zmq.h>

#include "core/io.h"
#include "core/json.h"

namespace tessera::comm {

namespace {
constexpr const char* kFormat = "tessera-cluster-key";
}

core::Result<ClusterKey> generate_cluster_key() {
  char pub[41] = {}, sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0) {
    return core::internal_error(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()) +
                                " (libzmq built without CURVE?)");
  }
  ClusterKey key{pub, sec};
  std::memset(sec, 0, sizeof(sec));
  return key;
}

core::Status validate_cluster_key(const ClusterKey& key) {
  if (key.public_z85.size() != 40 || key.secret_z85.size() != 40) {
    return core::invalid_argument("cluster key: keys must be 40 Z85 characters");
  }
  // libzmq reads the keys as C strings: an embedded NUL would shorten them.
  if (key.public_z85.find('\0') != std::string::npos || key.secret_z85.find('\0') != std::string::npos)
    return core::invalid_argument("cluster key: not valid Z85");
  uint8_t bin[32];
  if (zmq_z85_decode(bin, key.public_z85.c_str()) == nullptr ||
      zmq_z85_decode(bin, key.secret_z85.c_str()) == nullptr) {
    return core::invalid_argument("cluster key: not valid Z85");
  }
  char derived[41] = {};
  if (zmq_curve_public(derived, key.secret_z85.c_str()) != 0) {
    return core::invalid_argument("cluster key: cannot derive the public key");
  }
  if (key.public_z85 != derived) return core::invalid_argument("cluster key: public key does not match secret key");
  return core::ok_status();
}

core::Status write_key_file(const std::string& path, const ClusterKey& key, bool overwrite) {
  TESSERA_RETURN_IF_ERROR(validate_cluster_key(key));
  nlohmann::json j = {{"format", kFormat}, {"version", 1}, {"curve_public", key.public_z85},
                      {"curve_secret", key.secret_z85}};
  const std::string text = j.dump(2) + "\n";
  // Created 0600 from the start: the secret must never be world-readable.
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  const int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) return core::io_error("cannot create key file '" + path + "': " + std::strerror(errno));
  if (core::Status st = core::write_all(fd, text); !st.ok()) {
    ::close(fd);
    return core::io_error("cannot write key file '" + path + "': " + st.message());
  }
  if (::close(fd) != 0) return core::io_error("cannot close key file '" + path + "'");
  return core::ok_status();
}

core::Result<ClusterKey> read_key_file(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, core::read_file(path));
  return parse_key_file(text, path);
}

core::Result<ClusterKey> parse_key_file(const std::string& text, const std::string& path) {
  const std::string what = "key file '" + path + "'";
  auto j = core::parse_json(text, what);
  // Any member of the wrong type is "not a key file", never an exception.
  auto format = j.ok() ? core::json_field_string(*j, "format", std::string()) : core::Result<std::string>(j.status());
  if (!j.ok() || !j->is_object() || !format.ok() || *format != kFormat)
    return core::parse_error(what + ": not a tessera cluster key file");
  auto pub = core::json_field_string(*j, "curve_public");
  auto sec = core::json_field_string(*j, "curve_secret");
  if (!pub.ok() || !sec.ok()) return core::parse_error(what + ": missing curve_public/curve_secret");
  ClusterKey key{*pub, *sec};
  core::Status st = validate_cluster_key(key);
  if (!st.ok()) return st.with_context(path);
  return key;
}

}  // namespace tessera::comm
