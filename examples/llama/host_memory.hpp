// The memory this process can still take, for refusing a cache that can never fit before it is allocated: the
// smaller of the kernel's estimate of available memory (/proc/meminfo MemAvailable: free plus reclaimable) and,
// inside a container, what its cgroup (v2 memory.max, v1 limit_in_bytes) leaves. 0 where none can be read.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

namespace llama {

namespace detail {
// A file holding one unsigned number ("max" or anything else: none).
inline std::int64_t read_number(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return 0;
  try {
    return static_cast<std::int64_t>(std::stoull(s));
  } catch (...) {
    return 0;  // beyond 64 bits: no limit worth the name
  }
}
}  // namespace detail

inline std::int64_t available_memory_bytes() {
  std::int64_t avail = 0;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    long long kb = 0;
    while (std::fscanf(f, "%63s %lld kB\n", key, &kb) == 2)
      if (std::string(key) == "MemAvailable:") {
        avail = static_cast<std::int64_t>(kb) * 1024;
        break;
      }
    std::fclose(f);
  }
  if (avail == 0) {
    const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) avail = static_cast<std::int64_t>(pages) * page;
  }
  // cgroup v2, then v1: the limit less what the group already uses.
  std::int64_t limit = detail::read_number("/sys/fs/cgroup/memory.max"),
               used = detail::read_number("/sys/fs/cgroup/memory.current");
  if (limit == 0) {
    limit = detail::read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    used = detail::read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (limit > 0 && limit < (std::int64_t{1} << 60)) {
    const std::int64_t left = limit > used ? limit - used : 0;
    if (avail == 0 || left < avail) avail = left;
  }
  return avail;
}

}  // namespace llama
