// What one fairkv.plan() call asks for, after the Python arguments are checked and turned into library views:
// the single place where the module's translation units meet (each instantiates the policies for one key type).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "fairkv/budget.hpp"
#include "fairkv/dispatch.hpp"
#include "fairkv/dtype.hpp"
#include "fairkv/keep_plan.hpp"
#include "fairkv/segments.hpp"
#include "fairkv/status.hpp"
#include "fairkv/views/kv_view.hpp"
#include "fairkv/views/score_view.hpp"

namespace fairkv::python {

// Python's numeric element types, as the library spells them.
enum class element : std::uint8_t { f32, f16, bf16 };

// Keys and queries as typeless strided views: the element type is `keys_type` (queries share it).
struct raw_view {
  const void* data = nullptr;
  std::int64_t shape[4] = {0, 0, 0, 0};
  std::int64_t strides[4] = {0, 0, 0, 0};  // in elements
};

struct plan_request {
  policy_spec spec{};
  element keys_type = element::f32;
  raw_view keys{};     // data == nullptr: no keys (external scores only)
  raw_view queries{};  // data == nullptr: none
  score_view scores{};
  float scale = 0.0f;
  std::vector<segment> segments;
  std::vector<std::int32_t> whitelist;
  std::vector<segment_priority> priorities;  // prioritized: one per segment; spec.priorities points here
  keep_target target{};  // a ratio or a token budget
};

template <class T>
[[nodiscard]] kv_view<const T> typed(const raw_view& v) noexcept {
  return {static_cast<const T*>(v.data), v.shape[0],   v.shape[1],   v.shape[2],  v.shape[3],
          v.strides[0],                  v.strides[1], v.strides[2], v.strides[3]};
}

// One instantiation per key type (plan_f32.cpp, plan_f16.cpp, plan_bf16.cpp) and one for external scores.
template <class T>
[[nodiscard]] result plan_keys(const plan_request& r, keep_plan& out) noexcept;
[[nodiscard]] result plan_scores(const plan_request& r, keep_plan& out) noexcept;

}  // namespace fairkv::python
