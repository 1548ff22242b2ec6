// The CPU backend's scores against the plain reference (cpu/reference/scores.hpp): every attention scorer, on the
// block (GEMM) path and the row path, whole sequences and segment-local regions, grouped queries, float / half /
// bfloat16 and strided keys. The reference itself is first checked on a case worked by hand.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fairkv/cpu/reference/scores.hpp"
#include "fairkv/fairkv.hpp"

using namespace fairkv;

namespace {

// The fast path's scores of region [rb, re) of sequence b: scores[h * L + t].
template <class S, class KS, class Q>
std::vector<float> fast_region(const S& scorer, const layer_inputs<KS, Q>& in, std::int64_t b, std::int64_t rb,
                               std::int64_t re) {
  const std::int64_t L = in.keys.tokens_of(b);
  std::vector<float> scores(static_cast<std::size_t>(in.keys.heads * L), 0.f);
  std::vector<float> tmp(static_cast<std::size_t>(cpu::detail::scratch_floats<S>(re - rb)));
  const result r = cpu::detail::score_region(scorer, in, b, L, rb, re, scores.data(), L, tmp.data());
  REQUIRE_MESSAGE(r.ok(), r.message());
  return scores;
}

std::vector<double> reference_region(const auto& scorer, const auto& in, std::int64_t b, std::int64_t rb,
                                     std::int64_t re) {
  std::vector<double> out;
  const result r = cpu::reference::score_region(scorer, in, b, rb, re, out);
  REQUIRE_MESSAGE(r.ok(), r.message());
  return out;
}

// Scored keys agree within float rounding of the region's largest score; the keys the reference keeps first
// (+inf) are, in the fast path, above every scored key of every head.
template <class S, class KS, class Q>
void check_region(const S& scorer, const layer_inputs<KS, Q>& in, std::int64_t b, std::int64_t rb, std::int64_t re,
                  const std::string& what) {
  const std::int64_t heads = in.keys.heads, L = in.keys.tokens_of(b), n = re - rb;
  const std::vector<float> fast = fast_region(scorer, in, b, rb, re);
  const std::vector<double> ref = reference_region(scorer, in, b, rb, re);
  double top = 0.0, fast_top = -INFINITY;
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = rb; t < re; ++t)
      if (std::isfinite(ref[static_cast<std::size_t>(h * n + t - rb)])) {
        top = std::max(top, std::abs(ref[static_cast<std::size_t>(h * n + t - rb)]));
        fast_top = std::max(fast_top, static_cast<double>(fast[static_cast<std::size_t>(h * L + t)]));
      }
  const double tol = 2e-5 * top + 1e-7;
  int mismatches = 0;
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = rb; t < re; ++t) {
      const double r = ref[static_cast<std::size_t>(h * n + t - rb)];
      const double f = fast[static_cast<std::size_t>(h * L + t)];
      const bool ok = std::isinf(r) ? f > fast_top : std::abs(f - r) <= tol;
      if (!ok && ++mismatches <= 3)
        FAIL_CHECK(what, ": head ", h, " token ", t, " of [", rb, ", ", re, "): fast ", f, ", reference ", r,
                   " (tolerance ", tol, ")");
    }
  CHECK_MESSAGE(mismatches == 0, what);
}

std::vector<float> random_values(std::mt19937& rng, std::size_t n, float spread) {
  std::normal_distribution<float> normal(0.f, spread);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

}  // namespace

TEST_CASE("reference scores: SnapKV worked by hand") {
  // 1 head, head_dim 1, 4 tokens, window 2, kernel 1: keys [1, 0, 0, 0], both window queries ln 2.
  //   position 2 attends keys 0..2 with weights (2, 1, 1) / 4, position 3 keys 0..3 with (2, 1, 1, 1) / 5;
  //   the window mean of keys 0 and 1: (1/2 + 2/5) / 2 = 0.45 and (1/4 + 1/5) / 2 = 0.225.
  // Kernel 3 pools over the scored keys only, zero-padded, divisor 3: (0.45 + 0.225) / 3 for both.
  std::vector<float> k = {1, 0, 0, 0};
  std::vector<float> q = {std::log(2.f), std::log(2.f)};
  const auto in = with_queries(make_contiguous_view(k.data(), 1, 1, 4, 1), make_contiguous_view(q.data(), 1, 1, 2, 1));
  const std::vector<double> s1 = reference_region(scorers::snapkv<2, 1>{}, in, 0, 0, 4);
  CHECK(s1[0] == doctest::Approx(0.45).epsilon(1e-6));
  CHECK(s1[1] == doctest::Approx(0.225).epsilon(1e-6));
  CHECK(std::isinf(s1[2]));
  CHECK(std::isinf(s1[3]));
  const std::vector<double> s3 = reference_region(scorers::snapkv<2, 3>{}, in, 0, 0, 4);
  CHECK(s3[0] == doctest::Approx(0.675 / 3).epsilon(1e-6));
  CHECK(s3[1] == doctest::Approx(0.675 / 3).epsilon(1e-6));
  // TOVA: the last query (position 3) over keys 0..3: (2, 1, 1) / 5 for the scored keys 0..2.
  std::vector<float> q_all = {0.f, 0.f, 0.f, std::log(2.f)};
  const auto in_all =
      with_queries(make_contiguous_view(k.data(), 1, 1, 4, 1), make_contiguous_view(q_all.data(), 1, 1, 4, 1));
  const std::vector<double> tova = reference_region(scorers::tova{}, in_all, 0, 0, 4);
  CHECK(tova[0] == doctest::Approx(0.4).epsilon(1e-6));
  CHECK(tova[1] == doctest::Approx(0.2).epsilon(1e-6));
  CHECK(std::isinf(tova[3]));
  // H2O: queries 0..2 have q = 0 (uniform rows), query 3 has (2, 1, 1, 1) / 5. Key 0 is seen by all four:
  // (1 + 1/2 + 1/3 + 2/5) / 4; key 3 by query 3 only: 1/5.
  const std::vector<double> h2o = reference_region(scorers::h2o{}, in_all, 0, 0, 4);
  CHECK(h2o[0] == doctest::Approx((1.0 + 0.5 + 1.0 / 3 + 0.4) / 4).epsilon(1e-6));
  CHECK(h2o[3] == doctest::Approx(0.2).epsilon(1e-6));
  // A region [1, 4) renormalises to its own keys: TOVA's last query over keys 1..3 is uniform.
  const std::vector<double> local = reference_region(scorers::tova{}, in_all, 0, 1, 4);
  CHECK(local[0] == doctest::Approx(1.0 / 3).epsilon(1e-6));
}

TEST_CASE("reference scores: the fast attention paths agree, whole sequences and regions, every key type") {
  std::mt19937 rng(2026);
  int regions = 0;
  for (const std::int64_t heads : {1, 2})
    for (const std::int64_t group : {1, 2, 4})
      for (const std::int64_t L : {1, 2, 5, 17, 70, 203}) {
        const std::int64_t d = L % 2 ? 16 : 8, qheads = heads * group;
        const auto kf = random_values(rng, static_cast<std::size_t>(heads * L * d), 1.f);
        const auto qf = random_values(rng, static_cast<std::size_t>(qheads * L * d), 2.5f);
        std::vector<half_t> kh(kf.size());
        std::vector<bfloat16_t> kb(kf.size());
        for (std::size_t i = 0; i < kf.size(); ++i) {
          kh[i] = from_float<half_t>(kf[i]);
          kb[i] = from_float<bfloat16_t>(kf[i]);
        }
        // Keys token-major, every other element, with a gap ([tokens][heads * 2d + 3], stride 2 along the head
        // dimension): float keys the block path does not take, so the row path runs.
        const std::int64_t row = heads * 2 * d + 3;
        std::vector<float> ks(static_cast<std::size_t>(L * row), 0.f);
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t t = 0; t < L; ++t)
            for (std::int64_t i = 0; i < d; ++i) ks[t * row + h * 2 * d + 2 * i] = kf[(h * L + t) * d + i];
        const kv_view<const float> strided{ks.data(), 1, heads, L, d, L * row, 2 * d, row, 2};
        const auto qv = make_contiguous_view(qf.data(), 1, qheads, L, d);
        const auto in_f = with_queries(make_contiguous_view(kf.data(), 1, heads, L, d), qv);
        const auto in_h = with_queries(make_contiguous_view(kh.data(), 1, heads, L, d), qv);
        const auto in_b = with_queries(make_contiguous_view(kb.data(), 1, heads, L, d), qv);
        layer_inputs<kv_view<const float>> in_s{strided};
        in_s.queries = qv.as_const();
        // The whole sequence and a region in the middle (segment-local scoring's renormalised softmax).
        std::uniform_int_distribution<std::int64_t> pick(0, L - 1);
        const std::int64_t a = pick(rng), c = pick(rng);
        const std::int64_t rb = std::min(a, c), re = std::max(a, c) + 1;
        for (const auto& [b0, e0] : {std::pair<std::int64_t, std::int64_t>{0, L}, {rb, re}}) {
          const std::string where = "heads " + std::to_string(heads) + " group " + std::to_string(group) + " L " +
                                    std::to_string(L);
          for (const std::int32_t window : {1, 3, 8, 64})
            for (const std::int32_t kernel : {1, 3, 5, 31}) {
              scorers::snapkv<> s{};
              s.window = window;
              s.kernel = kernel;
              check_region(s, in_f, 0, b0, e0, "snapkv f32 " + where);
            }
          scorers::snapkv<> s{};
          s.window = 4;
          check_region(s, in_h, 0, b0, e0, "snapkv f16 " + where);
          check_region(s, in_b, 0, b0, e0, "snapkv bf16 " + where);
          check_region(s, in_s, 0, b0, e0, "snapkv strided " + where);
          check_region(scorers::tova{}, in_f, 0, b0, e0, "tova " + where);
          check_region(scorers::h2o{}, in_f, 0, b0, e0, "h2o " + where);
          check_region(scorers::tova{}, in_s, 0, b0, e0, "tova strided " + where);
          check_region(scorers::h2o{}, in_s, 0, b0, e0, "h2o strided " + where);
          check_region(scorers::tova{}, in_h, 0, b0, e0, "tova f16 " + where);
          check_region(scorers::h2o{}, in_b, 0, b0, e0, "h2o bf16 " + where);
          ++regions;
        }
      }
  CHECK(regions == 2 * 2 * 3 * 6);
}

namespace {

// The paper's two-span statistics of the CPU (cpu/score_paper.hpp) against the reference: scored tokens within float
// rounding of the sequence's largest reference score; a token the reference keeps first (+inf) at or above every
// scored token of its span and head (the paper pads with the span's maximum, the first pad token equal to it).
template <class S, class KS, class Q>
void check_paper(const S& scorer, const layer_inputs<KS, Q>& in, const fairkv::detail::paper_spans& sp,
                 const std::string& what) {
  const std::int64_t heads = in.keys.heads, L = in.keys.tokens_of(0), split = sp.split;
  std::vector<float> fast(static_cast<std::size_t>(heads * L), -7.f);
  std::vector<float> tmp(static_cast<std::size_t>(std::max<std::int64_t>(3 * L, cpu::detail::scratch_floats<S>(L))));
  const result r = cpu::detail::score_paper(scorer, in, 0, L, sp, fast.data(), L, tmp.data());
  REQUIRE_MESSAGE(r.ok(), r.message());
  std::vector<double> ref;
  const result rr = cpu::reference::score_paper(scorer, in, 0, sp, ref);
  REQUIRE_MESSAGE(rr.ok(), rr.message());
  double top = 0.0;
  for (const double x : ref)
    if (std::isfinite(x)) top = std::max(top, std::abs(x));
  const double tol = 2e-5 * top + 1e-7;
  int mismatches = 0;
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t t = 0; t < L; ++t) {
      const std::int64_t k0 = t < split ? 0 : split, k1 = t < split ? split : L;
      double span_max = -INFINITY;
      for (std::int64_t u = k0; u < k1; ++u)
        if (std::isfinite(ref[static_cast<std::size_t>(h * L + u)]))
          span_max = std::max(span_max, static_cast<double>(fast[static_cast<std::size_t>(h * L + u)]));
      const double x = ref[static_cast<std::size_t>(h * L + t)], f = fast[static_cast<std::size_t>(h * L + t)];
      const bool ok = std::isinf(x) ? f >= span_max : std::abs(f - x) <= tol;
      if (!ok && ++mismatches <= 3)
        FAIL_CHECK(what, ": head ", h, " token ", t, ": fast ", f, ", reference ", x, " (tolerance ", tol, ")");
    }
  CHECK_MESSAGE(mismatches == 0, what);
}

}  // namespace

TEST_CASE("reference scores: the paper's two-span statistics (fair_paper) agree with the CPU's") {
  std::mt19937 rng(77);
  int cases = 0;
  for (const std::int64_t group : {1, 2})
    for (const std::int64_t L : {3, 9, 40, 131}) {
      const std::int64_t heads = 2, d = 8, qheads = heads * group;
      const auto kf = random_values(rng, static_cast<std::size_t>(heads * L * d), 1.f);
      const auto qf = random_values(rng, static_cast<std::size_t>(qheads * L * d), 2.5f);
      const auto in = with_queries(make_contiguous_view(kf.data(), 1, heads, L, d),
                                   make_contiguous_view(qf.data(), 1, qheads, L, d));
      for (int trial = 0; trial < 3; ++trial) {
        std::uniform_int_distribution<std::int64_t> pick_split(1, L - 1);
        fairkv::detail::paper_spans sp;
        sp.split = pick_split(rng);
        sp.earlier_begin = std::uniform_int_distribution<std::int64_t>(0, sp.split - 1)(rng);
        sp.later_end = std::uniform_int_distribution<std::int64_t>(sp.split + 1, L)(rng);
        const std::string where = "group " + std::to_string(group) + " L " + std::to_string(L) + " spans [" +
                                  std::to_string(sp.earlier_begin) + ", " + std::to_string(sp.split) + ") [" +
                                  std::to_string(sp.split) + ", " + std::to_string(sp.later_end) + ")";
        for (const std::int32_t window : {1, 4, 16, 64})
          for (const std::int32_t kernel : {1, 3, 7}) {
            scorers::snapkv<> s{};
            s.window = window;
            s.kernel = kernel;
            check_paper(s, in, sp, "snapkv w" + std::to_string(window) + " k" + std::to_string(kernel) + " " + where);
          }
        check_paper(scorers::tova{}, in, sp, "tova " + where);
        check_paper(scorers::h2o{}, in, sp, "h2o " + where);
        for (const std::int32_t sinks : {0, 2, 4}) {
          scorers::streaming_llm<> s{};
          s.n_sink = sinks;
          check_paper(s, in, sp, "streaming_llm sinks " + std::to_string(sinks) + " " + where);
        }
        check_paper(scorers::knorm{}, in, sp, "knorm " + where);
        ++cases;
      }
    }
  CHECK(cases == 2 * 4 * 3);
}

TEST_CASE("reference scores: key, position and external scorers are the scorer's own values") {
  std::mt19937 rng(3);
  const auto kf = random_values(rng, 2 * 9 * 4, 1.f);
  const auto sc = random_values(rng, 2 * 9, 1.f);
  const auto keys = make_contiguous_view(kf.data(), 1, 2, 9, 4);
  for (const auto& [rb, re] : {std::pair<std::int64_t, std::int64_t>{0, 9}, {3, 7}}) {
    const std::vector<double> kn = reference_region(scorers::knorm{}, keys_only(keys), 0, rb, re);
    const std::vector<float> kn_fast = fast_region(scorers::knorm{}, keys_only(keys), 0, rb, re);
    const std::vector<double> st = reference_region(scorers::streaming_llm<>{}, keys_only(keys), 0, rb, re);
    const std::vector<float> st_fast = fast_region(scorers::streaming_llm<>{}, keys_only(keys), 0, rb, re);
    const auto ext_in = with_scores(keys, make_contiguous_scores(sc.data(), 1, 2, 9));
    const std::vector<double> ex = reference_region(scorers::external{}, ext_in, 0, rb, re);
    const std::vector<float> ex_fast = fast_region(scorers::external{}, ext_in, 0, rb, re);
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t t = rb; t < re; ++t) {
        const auto i = static_cast<std::size_t>(h * (re - rb) + t - rb), j = static_cast<std::size_t>(h * 9 + t);
        CHECK(kn[i] == doctest::Approx(kn_fast[j]).epsilon(1e-6));
        CHECK(st[i] == st_fast[j]);
        CHECK(ex[i] == ex_fast[j]);
      }
  }
}

TEST_CASE("reference scores: refusals name what is missing") {
  std::vector<float> k(8, 1.f), q(4, 1.f);
  const auto keys = make_contiguous_view(k.data(), 1, 1, 8, 1);
  std::vector<double> out;
  CHECK(cpu::reference::score_region(scorers::h2o{}, keys_only(keys), 0, 0, 8, out).code() == status::missing_input);
  // Queries of the last 4 positions: H2O over the whole sequence needs the query at 0.
  const auto in = with_queries(keys, make_contiguous_view(q.data(), 1, 1, 4, 1));
  CHECK(cpu::reference::score_region(scorers::h2o{}, in, 0, 0, 8, out).code() == status::missing_input);
  CHECK(cpu::reference::score_region(scorers::h2o{}, in, 0, 4, 8, out).ok());
  CHECK(cpu::reference::score_region(scorers::tova{}, in, 0, 0, 9, out).code() == status::invalid_argument);
  CHECK(cpu::reference::score_region(scorers::tova{}, in, 1, 0, 8, out).code() == status::invalid_argument);
  CHECK(cpu::reference::score_region(scorers::tova{}, in, -1, 0, 8, out).code() == status::invalid_argument);
}
