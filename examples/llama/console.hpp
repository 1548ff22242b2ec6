// What the runner tells the user while it runs: progress lines and warnings on stderr, and the clock they use.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace llama {

class progress {
 public:
  explicit progress(bool quiet) : quiet_(quiet), tty_(::isatty(2) != 0) {}
  // A line updated in place on a terminal; on a pipe only the final line of each phase.
  void update(const char* phase, int done, int total, double seconds, bool final) const {
    if (quiet_ || (!tty_ && !final)) return;
    const double rate = seconds > 0 ? done / seconds : 0.0;
    if (total > 0)
      std::fprintf(stderr, "%s[%s] %d/%d tokens, %.1f tok/s%s", tty_ ? "\r" : "", phase, done, total, rate,
                   final ? "\n" : "");
    else
      std::fprintf(stderr, "%s[%s] %d tokens, %.1f tok/s%s", tty_ ? "\r" : "", phase, done, rate, final ? "\n" : "");
    std::fflush(stderr);
  }

 private:
  bool quiet_, tty_;
};

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

namespace detail {

// Warnings are printed as they arise (even with --quiet) and kept for the report's "warnings".
inline void warn(std::vector<std::string>& sink, std::string message) {
  std::fprintf(stderr, "warning: %s\n", message.c_str());
  sink.push_back(std::move(message));
}

}  // namespace detail
}  // namespace llama
