// The keep plan: for every (batch, KV head) row, the kept token indices in ascending order and their count.
// Ascending order is what makes compaction stable and in place (row j moves from indices[j] >= j to j).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "fairkv/status.hpp"

namespace fairkv {

// Whether a plan has been applied. Compaction moves rows in place, so a plan applied a second time would move
// already-compacted rows again (slot j would receive slot indices[j] of the compacted row) and silently corrupt the
// cache: a plan is spent by the compaction it describes. Host memory, owned by keep_plan; a view without one
// (nullptr, e.g. a plan an engine wrote into its own buffers) is not tracked.
struct plan_state {
  bool applied = false;
};

// Non-owning, caller-allocated (the shape a GPU plan writes into). Index is std::int32_t for a plan being written
// (keep_plan_view, what the planners take) and const std::int32_t for one that is only read (const_keep_plan_view,
// what compaction and validation take); a writable view converts to a read-only one, never the other way.
template <class Index>
struct basic_keep_plan_view {
  static_assert(std::is_same_v<std::remove_const_t<Index>, std::int32_t>,
                "basic_keep_plan_view<Index>: Index is std::int32_t or const std::int32_t");
  Index* indices = nullptr;  // [batch * heads, capacity]; row r = b * heads + h, first counts[r] valid
  Index* counts = nullptr;   // [batch * heads]
  Index* lengths = nullptr;  // [batch] sequence length the plan was made for
  std::int64_t batch = 0;
  std::int64_t heads = 0;
  std::int64_t capacity = 0;  // >= every lengths[b]
  plan_state* state = nullptr;  // optional: compaction refuses a plan already applied, and marks it applied

  [[nodiscard]] constexpr std::int64_t rows() const noexcept { return batch * heads; }
  [[nodiscard]] constexpr Index* row(std::int64_t b, std::int64_t h) const noexcept {
    return indices + (b * heads + h) * capacity;
  }
  [[nodiscard]] constexpr std::int32_t count(std::int64_t b, std::int64_t h) const noexcept {
    return counts[b * heads + h];
  }
  [[nodiscard]] constexpr basic_keep_plan_view<const std::int32_t> as_const() const noexcept {
    return {indices, counts, lengths, batch, heads, capacity, state};
  }
  // Implicit so a plan just written can be handed to compaction as it is. A template whose target names I, so nvcc
  // (#554) does not see the const view converting to itself.
  template <class I = Index>
    requires(!std::is_const_v<I>)
  constexpr operator basic_keep_plan_view<const I>() const noexcept {  // NOLINT(google-explicit-constructor)
    return as_const();
  }
};

using keep_plan_view = basic_keep_plan_view<std::int32_t>;
using const_keep_plan_view = basic_keep_plan_view<const std::int32_t>;

// Owning host plan (the CPU oracle's convenience type).
class keep_plan {
 public:
  keep_plan() = default;
  void resize(std::int64_t batch, std::int64_t heads, std::int64_t capacity) {
    batch_ = batch;
    heads_ = heads;
    capacity_ = capacity;
    indices_.assign(static_cast<std::size_t>(batch * heads * capacity), 0);
    counts_.assign(static_cast<std::size_t>(batch * heads), 0);
    lengths_.assign(static_cast<std::size_t>(batch), 0);
    state_ = {};
  }
  // Views of an owning plan carry its state, so a second compaction with it is refused (status::invalid_plan).
  // Planning into it again (resize) makes it fresh; to apply one selection to several copies of a cache, copy the
  // plan before compacting (a copy of a spent plan is spent).
  [[nodiscard]] keep_plan_view view() noexcept {
    return {indices_.data(), counts_.data(), lengths_.data(), batch_, heads_, capacity_, &state_};
  }
  [[nodiscard]] const_keep_plan_view view() const noexcept {
    return {indices_.data(), counts_.data(), lengths_.data(), batch_, heads_, capacity_, &state_};
  }
  [[nodiscard]] std::int64_t batch() const noexcept { return batch_; }
  [[nodiscard]] std::int64_t heads() const noexcept { return heads_; }
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int32_t count(std::int64_t b, std::int64_t h) const noexcept {
    return counts_[static_cast<std::size_t>(b * heads_ + h)];
  }
  [[nodiscard]] std::int32_t length(std::int64_t b) const noexcept { return lengths_[static_cast<std::size_t>(b)]; }
  [[nodiscard]] bool applied() const noexcept { return state_.applied; }
  // Kept indices of one row, ascending.
  [[nodiscard]] std::vector<std::int32_t> kept(std::int64_t b, std::int64_t h) const {
    const auto* first = indices_.data() + (b * heads_ + h) * capacity_;
    return {first, first + count(b, h)};
  }

 private:
  std::vector<std::int32_t> indices_;  // [batch * heads, capacity]
  std::vector<std::int32_t> counts_;   // [batch * heads]
  std::vector<std::int32_t> lengths_;  // [batch]
  std::int64_t batch_ = 0, heads_ = 0, capacity_ = 0;
  // Mutable: a record of use, not part of the plan's value (a const plan can still be applied once).
  mutable plan_state state_{};
};

// Checks what compaction relies on before it writes anything: counts within the row's length, indices strictly
// ascending and inside [0, length).
[[nodiscard]] inline result validate(const_keep_plan_view p, const char* name) noexcept {
  if (p.indices == nullptr || p.counts == nullptr || p.lengths == nullptr)
    return result::error(status::null_pointer, "%s: indices, counts and lengths must be non-null", name);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t len = p.lengths[b];
    if (len < 0 || len > p.capacity)
      return result::error(status::invalid_plan, "%s.lengths[%lld] = %lld is outside [0, capacity %lld]", name,
                           static_cast<long long>(b), static_cast<long long>(len),
                           static_cast<long long>(p.capacity));
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const std::int64_t n = p.count(b, h);
      if (n < 0 || n > len)
        return result::error(status::invalid_plan, "%s: count of (batch %lld, head %lld) = %lld exceeds length %lld",
                             name, static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(n),
                             static_cast<long long>(len));
      const std::int32_t* r = p.row(b, h);
      for (std::int64_t j = 0; j < n; ++j)
        if (r[j] < 0 || r[j] >= len || (j > 0 && r[j] <= r[j - 1]))
          return result::error(status::invalid_plan,
                               "%s: indices of (batch %lld, head %lld) are not strictly ascending in [0, %lld) at %lld",
                               name, static_cast<long long>(b), static_cast<long long>(h),
                               static_cast<long long>(len), static_cast<long long>(j));
    }
  }
  return {};
}

}  // namespace fairkv
