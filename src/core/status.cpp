#include "core/status.h"

#include <cstdio>
#include <cstdlib>

namespace tessera::core {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kIoError: return "i/o error";
    case ErrorCode::kParseError: return "parse error";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kUnimplemented: return "unimplemented";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kNetwork: return "network error";
    case ErrorCode::kUnauthenticated: return "unauthenticated";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kUnavailable: return "unavailable";
  }
  return "unknown error";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string out = error_code_name(code_);
  out += ": ";
  // Keep errors on one line whatever the message carried.
  for (char c : message_) out += (c == '\n' || c == '\r') ? ' ' : c;
  return out;
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return {code_, context + ": " + message_};
}

void check_failed(const char* file, int line, const char* expr, const std::string& msg) {
  std::fprintf(stderr, "TESSERA_CHECK failed at %s:%d: %s %s\n", file, line, expr, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace tessera::core
