// SPDX-License-Identifier: Apache-2.0
/// Status codes and errors. Ops and kernels return `Status`; loaders return `Result<T>`; models, the
/// server and the CLI turn failures into exceptions (`Error`) or HTTP errors at their boundary.
/// A message always names what is wrong (file, tensor, field, byte offset) so a user can act on it.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tessera {

enum class StatusCode {
  kSuccess = 0,
  kInvalidArgument,   // a caller passed something out of contract (shape, dtype, range)
  kNotSupported,      // valid, but no implementation accepts it (arch, dtype combination)
  kMalformedInput,    // a file or request is corrupt or inconsistent
  kNotFound,          // a file, tensor or key is missing
  kIoError,           // the operating system refused (open, mmap, read, write)
  kOutOfMemory,
  kCudaError,
  kInternal,          // a broken invariant inside Tessera
};

constexpr std::string_view to_string(StatusCode c) {
  switch (c) {
    case StatusCode::kSuccess: return "success";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotSupported: return "not supported";
    case StatusCode::kMalformedInput: return "malformed input";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kOutOfMemory: return "out of memory";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

/// A code plus a human-readable message; success carries no message and costs no allocation.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kSuccess; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  std::string const& message() const { return message_; }
  /// "<code>: <message>", for logs and error replies.
  std::string to_string() const {
    return ok() ? std::string("success") : std::string(tessera::to_string(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::kSuccess;
  std::string message_;
};

inline Status invalid_argument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
inline Status not_supported(std::string msg) { return {StatusCode::kNotSupported, std::move(msg)}; }
inline Status malformed(std::string msg) { return {StatusCode::kMalformedInput, std::move(msg)}; }
inline Status not_found(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
inline Status io_error(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }

/// Exception form of a failed Status, thrown only above the op layer (models, server, CLI).
class Error : public std::runtime_error {
 public:
  explicit Error(Status s) : std::runtime_error(s.to_string()), status_(std::move(s)) {}
  Error(StatusCode code, std::string msg) : Error(Status(code, std::move(msg))) {}
  Status const& status() const { return status_; }

 private:
  Status status_;
};

/// Throws `Error` if `s` failed; the boundary helper for models and tools.
inline void throw_if_error(Status const& s) {
  if (!s.ok()) throw Error(s);
}

/// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                      // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {                // NOLINT(implicit)
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from a success Status");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  T const& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  T const* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  T const& operator*() const& { return value(); }
  /// The value, or throws `Error` with the status.
  T value_or_throw() && {
    if (!ok()) throw Error(std::get<Status>(v_));
    return std::get<T>(std::move(v_));
  }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tessera

/// Returns `invalid_argument` with file:line when `cond` is false (host code only).
#define TESSERA_CHECK(cond, msg)                                                                 \
  do {                                                                                           \
    if (!(cond))                                                                                 \
      return ::tessera::Status(::tessera::StatusCode::kInvalidArgument,                          \
                               std::string(msg) + " (" + __FILE__ + ":" + std::to_string(__LINE__) + ")"); \
  } while (0)

/// Propagates a failed Status (or Result's status) to the caller.
#define TESSERA_TRY(expr)                            \
  do {                                               \
    ::tessera::Status tessera_try_s_ = (expr);       \
    if (!tessera_try_s_.ok()) return tessera_try_s_; \
  } while (0)
