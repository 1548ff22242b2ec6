// Hand-worked cases for every shipped scorer (values computed on paper; see the comments).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "fairkv/fairkv.hpp"

using namespace fairkv;

namespace {
std::vector<float> scores_of(auto scorer, const layer_inputs<kv_view<const float>>& in) {
  std::vector<float> out(static_cast<std::size_t>(in.keys.batch * in.keys.heads * in.keys.tokens));
  const result r = cpu::score(scorer, in, out.data(), in.keys.tokens);
  REQUIRE_MESSAGE(r.ok(), r.message());
  return out;
}
}  // namespace

TEST_CASE("knorm: score is minus the L2 norm of each key") {
  std::vector<float> k = {3, 4, 0, 0, 1, 0};  // [1 head, 3 tokens, 2 dims]
  const auto s = scores_of(scorers::knorm{}, keys_only(make_contiguous_view(k.data(), 1, 1, 3, 2)));
  CHECK(s[0] == doctest::Approx(-5.0));
  CHECK(s[1] == 0.0f);
  CHECK(s[2] == doctest::Approx(-1.0));
  // Strided rows (llama.cpp style [tokens][heads * dim] with 2 heads) score the same as contiguous ones.
  std::vector<float> rows = {3, 4, 9, 9, 0, 0, 9, 9, 1, 0, 9, 9};
  kv_view<float> strided{rows.data(), 1, 2, 3, 2, 12, 2, 4, 1};
  const auto s2 = scores_of(scorers::knorm{}, keys_only(strided));
  CHECK(s2[0] == s[0]);
  CHECK(s2[1] == s[1]);
  CHECK(s2[2] == s[2]);
  CHECK(s2[3] == doctest::Approx(-std::sqrt(162.0)));
}

TEST_CASE("streaming_llm: sinks first, then recency") {
  std::vector<float> k(10, 0.f);
  const auto s = scores_of(scorers::streaming_llm<>{}, keys_only(make_contiguous_view(k.data(), 1, 1, 10, 1)));
  for (int t = 0; t < 4; ++t) CHECK(std::isinf(s[t]));
  for (int t = 5; t < 10; ++t) CHECK(s[t] > s[t - 1]);
  // Under a uniform budget the kept set is kvpress's: 4 sinks + the most recent n_keep - 4.
  policy<scorers::streaming_llm<>, selectors::per_head, allocators::uniform> p{};
  keep_plan plan;
  REQUIRE(cpu::plan(p, keys_only(make_contiguous_view(k.data(), 1, 1, 10, 1)), {}, {}, 0.5, plan).ok());
  CHECK(plan.kept(0, 0) == std::vector<int>{0, 1, 2, 3, 9});
}

TEST_CASE("snapkv: window attention, mean over the window, avg-pool with zero padding, window padded max+1") {
  // 1 head, head_dim 1, 4 tokens, window 2. Keys [1, 0, 0, 0], both window queries q = ln 2 (scale 1/sqrt(1)):
  //   position 2 attends keys 0..2 with weights (2, 1, 1) / 4   -> [1/2, 1/4, 1/4]
  //   position 3 attends keys 0..3 with weights (2, 1, 1, 1) / 5 -> [2/5, 1/5, 1/5, 1/5]
  // Mean over the window for the scored keys 0, 1: 0.45 and 0.225.
  std::vector<float> k = {1, 0, 0, 0};
  std::vector<float> q = {std::log(2.f), std::log(2.f)};  // [1 head, 2 window positions, 1 dim]
  const auto in = with_queries(make_contiguous_view(k.data(), 1, 1, 4, 1), make_contiguous_view(q.data(), 1, 1, 2, 1));
  const auto s1 = scores_of(scorers::snapkv<2, 1>{}, in);  // kernel 1: no smoothing
  CHECK(s1[0] == doctest::Approx(0.45));
  CHECK(s1[1] == doctest::Approx(0.225));
  CHECK(s1[2] == doctest::Approx(1.45));  // max + 1
  CHECK(s1[3] == doctest::Approx(1.45));
  // kernel 5, padding 2, divisor 5: both scored keys see (0.45 + 0.225) / 5.
  const auto s5 = scores_of(scorers::snapkv<2, 5>{}, in);
  CHECK(s5[0] == doctest::Approx(0.135));
  CHECK(s5[1] == doctest::Approx(0.135));
  CHECK(s5[2] == doctest::Approx(1.135));
  // The runtime window overrides the template default.
  scorers::snapkv<64, 1> runtime{};
  runtime.window = 2;
  CHECK(scores_of(runtime, in) == s1);
}

TEST_CASE("snapkv pooling: any kernel, from 1 to far beyond the sequence, is avg_pool1d by its definition") {
  // The sliding pooling against the sum written out per token (in double), on attention that mixes magnitudes
  // from 1e-30 to 1: a running sum that subtracted would lose the tiny values next to the large ones.
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> exponent(-30.0, 0.0);
  for (const std::int64_t m : {1, 2, 7, 64, 1000}) {
    std::vector<float> acc0(static_cast<std::size_t>(m));
    for (auto& x : acc0) x = static_cast<float>(std::pow(10.0, exponent(rng)));
    for (const std::int32_t kernel : {1, 3, 5, 7, 63, 65, 999, 1001, 2001, 16385}) {
      const std::int64_t w = 16;
      std::vector<float> acc = acc0, pooled(acc.size()), out(acc.size(), 0.f);
      cpu::detail::add_pooled_window_mean(acc.data(), m, w, kernel, pooled.data(), out.data());
      double worst = 0.0;
      for (std::int64_t t = 0; t < m; ++t) {
        double sum = 0.0;
        for (std::int64_t j = std::max<std::int64_t>(0, t - kernel / 2); j <= std::min(m - 1, t + kernel / 2); ++j)
          sum += static_cast<double>(acc0[static_cast<std::size_t>(j)] / static_cast<float>(w));
        const double want = sum / kernel;
        worst = std::max(worst, std::abs(out[static_cast<std::size_t>(t)] - want) / want);
      }
      INFO("tokens " << m << " kernel " << kernel << " worst relative error " << worst);
      CHECK(worst <= 4e-7);  // a few float roundings: suffix, prefix, their sum, the division
    }
  }
}

TEST_CASE("tova: last query's attention, mean over ALL query heads, same for every KV head") {
  // 1 KV head, 2 query heads (GQA 2), head_dim 1, 3 tokens, keys [1, 0, 0], last query q = (ln 2, 0):
  //   head 0: weights (2, 1, 1) / 4 -> [1/2, 1/4, 1/4];  head 1: uniform [1/3, 1/3, 1/3]
  //   mean: key 0 -> 5/12, key 1 -> 7/24; the last token gets max + 1.
  std::vector<float> k = {1, 0, 0};
  std::vector<float> q = {std::log(2.f), 0.f};  // [2 heads, 1 position, 1 dim]
  const auto in = with_queries(make_contiguous_view(k.data(), 1, 1, 3, 1), make_contiguous_view(q.data(), 1, 2, 1, 1));
  const auto s = scores_of(scorers::tova{}, in);
  CHECK(s[0] == doctest::Approx(5.0 / 12));
  CHECK(s[1] == doctest::Approx(7.0 / 24));
  CHECK(s[2] == doctest::Approx(5.0 / 12 + 1));
}

TEST_CASE("h2o: column sums of causal attention divided by the number of queries that see each key") {
  // 1 head, head_dim 1, keys [1, 0, 0], every query q = ln 2:
  //   pos 0: [1];  pos 1: [2/3, 1/3];  pos 2: [1/2, 1/4, 1/4]
  //   sums [13/6, 7/12, 1/4] / [3, 2, 1] = [13/18, 7/24, 1/4]
  std::vector<float> k = {1, 0, 0};
  std::vector<float> q(3, std::log(2.f));
  const auto in = with_queries(make_contiguous_view(k.data(), 1, 1, 3, 1), make_contiguous_view(q.data(), 1, 1, 3, 1));
  const auto s = scores_of(scorers::h2o{}, in);
  CHECK(s[0] == doctest::Approx(13.0 / 18));
  CHECK(s[1] == doctest::Approx(7.0 / 24));
  CHECK(s[2] == doctest::Approx(0.25));
  // The engine's accumulated column sums give the same scores.
  std::vector<float> sums = {13.f / 6, 7.f / 12, 0.25f};
  layer_inputs<kv_view<const float>> from_engine{make_contiguous_view(k.data(), 1, 1, 3, 1).as_const()};
  from_engine.attention_column_sums = sums.data();
  from_engine.attention_q_heads = 1;
  const auto s2 = scores_of(scorers::h2o{}, from_engine);
  for (int t = 0; t < 3; ++t) CHECK(s2[t] == doctest::Approx(s[t]));
}

TEST_CASE("half and bfloat16 keys score like their float values") {
  std::vector<float> kf = {0.5f, -1.25f, 2.0f, 0.75f, 3.0f, -0.5f};
  std::vector<half_t> kh;
  std::vector<bfloat16_t> kb;
  for (float x : kf) {
    kh.push_back(from_float<half_t>(x));
    kb.push_back(from_float<bfloat16_t>(x));
  }
  const auto sf = scores_of(scorers::knorm{}, keys_only(make_contiguous_view(kf.data(), 1, 1, 3, 2)));
  std::vector<float> sh(3), sb(3);
  REQUIRE(cpu::score(scorers::knorm{}, keys_only(make_contiguous_view(kh.data(), 1, 1, 3, 2)), sh.data(), 3).ok());
  REQUIRE(cpu::score(scorers::knorm{}, keys_only(make_contiguous_view(kb.data(), 1, 1, 3, 2)), sb.data(), 3).ok());
  CHECK(sh == sf);  // these values are exact in both formats
  CHECK(sb == sf);
}
