// Two-phase workspace in CUB's shape for every backend: one carving routine serves the size query (base ==
// nullptr) and the run, so the two can never disagree. Every buffer starts on an `Align`-byte boundary: 64 on
// the CPU (a cache line), 256 for CUDA (what cudaMalloc guarantees, and the widest vector access).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fairkv::detail {

template <std::size_t Align>
class workspace_carver {
  static_assert(Align > 0 && (Align & (Align - 1)) == 0, "fairkv: the workspace alignment must be a power of two");

 public:
  static constexpr std::size_t alignment = Align;

  // base: the caller's buffer already passed through align_base(), or nullptr for the size query.
  explicit workspace_carver(void* base) noexcept : base_(static_cast<std::byte*>(base)) {}

  // out = the next `count` elements (nullptr when sizing or when count is 0).
  template <class T>
  void carve(T*& out, std::size_t count) noexcept {
    bytes_ = (bytes_ + Align - 1) / Align * Align;
    out = base_ != nullptr && count > 0 ? reinterpret_cast<T*>(base_ + bytes_) : nullptr;
    bytes_ += count * sizeof(T);
  }
  // What the caller must provide: the carved bytes plus slack, so that a base that is not aligned still fits.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_ + Align; }

  // The first aligned address at or after p (the run's base; bytes() reserved the room).
  [[nodiscard]] static void* align_base(void* p) noexcept {
    const auto u = reinterpret_cast<std::uintptr_t>(p);
    return reinterpret_cast<void*>((u + (Align - 1)) / Align * Align);
  }

 private:
  std::byte* base_;
  std::size_t bytes_ = 0;
};

}  // namespace fairkv::detail
