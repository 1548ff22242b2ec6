// The emulator's cooperative groups: only what fairkv's kernels use. A coalesced group is the calling thread
// alone: under independent thread scheduling that is one of the groups hardware may form, so code that is correct
// for every partition is exercised (warp aggregation itself is not).
#pragma once
#include "fairkv_emu.hpp"

namespace cooperative_groups {

class coalesced_group {
 public:
  [[nodiscard]] unsigned long long size() const noexcept { return 1; }
  [[nodiscard]] unsigned long long thread_rank() const noexcept { return 0; }
};

[[nodiscard]] inline coalesced_group coalesced_threads() noexcept { return {}; }

template <class Label>
[[nodiscard]] coalesced_group labeled_partition(const coalesced_group&, Label) noexcept {
  return {};
}

}  // namespace cooperative_groups
