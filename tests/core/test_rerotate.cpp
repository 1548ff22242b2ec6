// Re-rotation: a kept key rotated for its old position, re-rotated, equals RoPE applied at its new slot.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {
void rope(float* x, std::int64_t d, double pos, rope_style style, double theta) {
  for (std::int64_t i = 0; i < d / 2; ++i) {
    const double a = pos * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
    const std::int64_t i0 = style == rope_style::half ? i : 2 * i, i1 = style == rope_style::half ? i + d / 2 : 2 * i + 1;
    const double x0 = x[i0], x1 = x[i1];
    x[i0] = static_cast<float>(x0 * std::cos(a) - x1 * std::sin(a));
    x[i1] = static_cast<float>(x1 * std::cos(a) + x0 * std::sin(a));
  }
}
}  // namespace

TEST_CASE("rerotate_keys: RoPE at the new position, both rotation conventions") {
  for (const rope_style style : {rope_style::half, rope_style::interleaved}) {
    const std::int64_t H = 2, L = 40, D = 16;
    const auto raw = fairkv_test::random_floats(H * L * D, 17);
    std::vector<float> k = raw;
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < L; ++t) rope(&k[(h * L + t) * D], D, static_cast<double>(t), style, 10000.0);
    std::vector<float> v(k.size(), 0.f);
    auto kv = make_contiguous_view(k.data(), 1, H, L, D);
    keep_plan plan;
    REQUIRE(cpu::plan(policy<scorers::streaming_llm<>, selectors::per_head, allocators::uniform>{}, keys_only(kv), {}, {},
                      0.5, plan).ok());
    REQUIRE(cpu::compact(plan.view(), kv, make_contiguous_view(v.data(), 1, H, L, D)).ok());
    REQUIRE(cpu::rerotate_keys(plan.view(), kv, rope_params{10000.f, 0, style}).ok());
    float worst = 0.f;
    for (std::int64_t h = 0; h < H; ++h) {
      const auto kept = plan.kept(0, h);
      for (std::size_t j = 0; j < kept.size(); ++j) {
        std::vector<float> expect(raw.begin() + (h * L + kept[j]) * D, raw.begin() + (h * L + kept[j] + 1) * D);
        rope(expect.data(), D, static_cast<double>(j), style, 10000.0);
        for (std::int64_t d = 0; d < D; ++d)
          worst = std::max(worst, std::abs(k[(h * L + static_cast<std::int64_t>(j)) * D + d] - expect[d]));
      }
    }
    CHECK(worst < 2e-5f);
  }
}

TEST_CASE("rerotate_keys rejects an odd rotary dimension and leaves the keys untouched") {
  std::vector<float> k(2 * 8, 1.f);
  const auto before = k;
  keep_plan plan;
  auto kv = make_contiguous_view(k.data(), 1, 1, 2, 8);
  REQUIRE(cpu::plan(policy<scorers::knorm, selectors::per_head, allocators::uniform>{}, keys_only(kv), {}, {}, 0.5, plan).ok());
  const result r = cpu::rerotate_keys(plan.view(), kv, rope_params{10000.f, 3, rope_style::half});
  CHECK(r.code() == status::invalid_argument);
  CHECK(std::string(r.message()).find("rotary_dim") != std::string::npos);
  CHECK(k == before);
}
