// Recoverable failures as values: Status and Result<T>. Only cli/ and the
// worker loop turn them into exit codes or replies.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace tessera::core {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kIoError,
  kParseError,
  kOutOfRange,
  kUnimplemented,
  kTimeout,
  kNetwork,
  kUnauthenticated,
  kResourceExhausted,
  kInternal,
  // No device can do it now (all dropped, or failing): try again later.
  kUnavailable,
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code>: <message>" on one line.
  std::string to_string() const;
  // Adds context in front: "loading model: <message>".
  Status with_context(const std::string& context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status ok_status() { return {}; }
inline Status invalid_argument(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
inline Status io_error(std::string m) { return {ErrorCode::kIoError, std::move(m)}; }
inline Status parse_error(std::string m) { return {ErrorCode::kParseError, std::move(m)}; }
inline Status out_of_range(std::string m) { return {ErrorCode::kOutOfRange, std::move(m)}; }
inline Status unimplemented(std::string m) { return {ErrorCode::kUnimplemented, std::move(m)}; }
inline Status timeout_error(std::string m) { return {ErrorCode::kTimeout, std::move(m)}; }
inline Status network_error(std::string m) { return {ErrorCode::kNetwork, std::move(m)}; }
inline Status unauthenticated(std::string m) { return {ErrorCode::kUnauthenticated, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {ErrorCode::kResourceExhausted, std::move(m)}; }
inline Status internal_error(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }
inline Status unavailable(std::string m) { return {ErrorCode::kUnavailable, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(ErrorCode::kInternal, "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->checked(); }
  T& operator*() & { return checked(); }
  T value_or(T fallback) const& { return ok() ? std::get<T>(v_) : std::move(fallback); }

 private:
  T& checked();
  std::variant<T, Status> v_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& msg);

template <typename T>
T& Result<T>::checked() {
  if (!ok()) check_failed(__FILE__, __LINE__, "Result::value() on error", std::get<Status>(v_).to_string());
  return std::get<T>(v_);
}

}  // namespace tessera::core

#define TESSERA_CONCAT_INNER(a, b) a##b
#define TESSERA_CONCAT(a, b) TESSERA_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` fails.
#define TESSERA_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::tessera::core::Status tessera_st_ = (expr);      \
    if (!tessera_st_.ok()) return tessera_st_;         \
  } while (0)

#define TESSERA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// `TESSERA_ASSIGN_OR_RETURN(auto x, make_x());`
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL(TESSERA_CONCAT(tessera_res_, __LINE__), lhs, expr)
