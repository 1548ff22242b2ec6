// CUB-style temp storage: one carving routine serves the size query (base == nullptr) and the run, so the two
// can never disagree. Every buffer starts on a 256-byte boundary (what cudaMalloc guarantees for the base).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fairkv::cuda::detail {

class workspace_carver {
 public:
  explicit workspace_carver(void* base) noexcept : base_(static_cast<std::byte*>(base)) {}

  template <class T>
  void carve(T*& out, std::size_t count) noexcept {
    constexpr std::size_t align = 256;
    bytes_ = (bytes_ + align - 1) / align * align;
    out = base_ != nullptr && count > 0 ? reinterpret_cast<T*>(base_ + bytes_) : nullptr;
    bytes_ += count * sizeof(T);
  }
  // Slack so that a caller's base that is not 256-byte aligned still fits (the run aligns it).
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_ + 256; }

 private:
  std::byte* base_;
  std::size_t bytes_ = 0;
};

[[nodiscard]] inline void* align_base(void* p) noexcept {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  return reinterpret_cast<void*>((u + 255u) / 256u * 256u);
}

}  // namespace fairkv::cuda::detail
