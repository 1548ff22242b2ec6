// One error channel for the whole library: a status code plus a fixed-size message naming the argument.
// `result` is trivially copyable and allocation-free so the same type crosses host/device boundaries and
// can be returned from noexcept functions.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace fairkv {

enum class status : int {
  success = 0,
  invalid_argument,        // a scalar argument outside its domain (ratio, lambda, alpha, ...)
  invalid_shape,           // extents/strides that do not describe a valid tensor, mismatched heads or GQA groups
  null_pointer,            // a required pointer is null
  out_of_range,            // a segment or whitelist position outside the cache
  overlapping_segments,    // two segments share a token
  budget_exceeded,         // the whitelist needs more tokens than the keep budget
  missing_input,           // the scorer needs an input (queries, attention) that was not provided
  empty_cache,             // nothing to compress
  insufficient_workspace,  // the caller's workspace is smaller than the size query returned
  invalid_plan,            // a keep plan that does not fit the view it is applied to
  not_supported,           // a valid request this backend does not implement
  device_error,            // an error reported by the CUDA runtime (see from_cuda)
  internal_error,
  out_of_memory,           // a host allocation the library makes itself failed (the convenience overloads)
  // New codes go last, so the numeric values engines may have logged or stored keep their meaning.
};

[[nodiscard]] constexpr std::string_view to_string(status s) noexcept {
  switch (s) {
    case status::success: return "success";
    case status::invalid_argument: return "invalid argument";
    case status::invalid_shape: return "invalid shape";
    case status::null_pointer: return "null pointer";
    case status::out_of_range: return "out of range";
    case status::overlapping_segments: return "overlapping segments";
    case status::budget_exceeded: return "budget exceeded";
    case status::missing_input: return "missing input";
    case status::empty_cache: return "empty cache";
    case status::insufficient_workspace: return "insufficient workspace";
    case status::invalid_plan: return "invalid plan";
    case status::not_supported: return "not supported";
    case status::device_error: return "device error";
    case status::internal_error: return "internal error";
    case status::out_of_memory: return "out of memory";
  }
  return "unknown status";
}

class [[nodiscard]] result {
 public:
  constexpr result() noexcept = default;
  constexpr result(status code) noexcept : code_(code) {}  // NOLINT: implicit from a bare code is the point

  // printf-style message; truncated (never overflowing) at the fixed capacity.
  [[gnu::format(printf, 2, 3)]] static result error(status code, const char* fmt, ...) noexcept {
    result r(code);
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(r.message_, sizeof(r.message_), fmt, args);
    va_end(args);
    return r;
  }

  [[nodiscard]] constexpr bool ok() const noexcept { return code_ == status::success; }
  [[nodiscard]] constexpr explicit operator bool() const noexcept { return ok(); }
  [[nodiscard]] constexpr status code() const noexcept { return code_; }
  // The message names the argument at fault; falls back to the code's name.
  [[nodiscard]] const char* message() const noexcept {
    return message_[0] != '\0' ? message_ : to_string(code_).data();
  }

 private:
  status code_ = status::success;
  char message_[224] = {};
};

}  // namespace fairkv

// Early return of a failed result, the library's only control-flow macro.
#define FAIRKV_TRY(expr)                      \
  do {                                        \
    ::fairkv::result fairkv_try_r_ = (expr);  \
    if (!fairkv_try_r_.ok()) return fairkv_try_r_; \
  } while (0)
