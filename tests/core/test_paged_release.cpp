// release_pages: the compacted page table and the freed pages an engine applies after a paged compaction. A
// hand-worked batch, a compaction end to end with the table updated in place, and refusals that write nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "fairkv/paged_release.hpp"
#include "test_util.hpp"

using namespace fairkv;

namespace {

struct outputs {
  std::vector<std::int32_t> indptr, indices, last, freed_indptr, freed;
  outputs(std::int64_t batch, std::int64_t nnz)
      : indptr(static_cast<std::size_t>(batch + 1), -7),
        indices(static_cast<std::size_t>(nnz), -7),
        last(static_cast<std::size_t>(batch), -7),
        freed_indptr(static_cast<std::size_t>(batch + 1), -7),
        freed(static_cast<std::size_t>(nnz), -7) {}
  paged_release release() { return {indptr.data(), indices.data(), last.data(), freed_indptr.data(), freed.data()}; }
  [[nodiscard]] bool untouched() const {
    const auto all = [](const std::vector<std::int32_t>& v) {
      return std::all_of(v.begin(), v.end(), [](std::int32_t x) { return x == -7; });
    };
    return all(indptr) && all(indices) && all(last) && all(freed_indptr) && all(freed);
  }
};

}  // namespace

TEST_CASE("release_pages: a hand-worked batch (ragged heads, a sequence emptied, tail pages first)") {
  // page_size 4; sequence 0: 11 tokens on pages 7, 2, 9; sequence 1: 4 tokens on page 5; sequence 2: 9 tokens on
  // pages 1, 8, 3.
  const std::int64_t P = 4, H = 2, D = 2, pages = 10;
  std::vector<float> k(static_cast<std::size_t>(pages * P * H * D)), v(k.size());
  const std::vector<std::int32_t> indptr{0, 3, 4, 7}, indices{7, 2, 9, 5, 1, 8, 3}, last{3, 4, 1};
  const auto view = make_paged_view(page_layout::nhd, k.data(), v.data(), pages, P, H, D, 3, indptr.data(),
                                    indices.data(), last.data());
  // Kept per (sequence, head): 2 and 1 (longest 2: one page, 2 slots), none, 8 and 8 (two full pages).
  const std::vector<std::int32_t> counts{2, 1, 0, 0, 8, 8}, lengths{11, 4, 9};
  const const_keep_plan_view plan{nullptr, counts.data(), lengths.data(), 3, H, 11, nullptr};
  outputs out(3, 7);
  REQUIRE(release_pages(plan, view, out.release()).ok());
  CHECK(out.indptr == std::vector<std::int32_t>{0, 1, 1, 3});
  CHECK(std::vector<std::int32_t>(out.indices.begin(), out.indices.begin() + 3) == std::vector<std::int32_t>{7, 1, 8});
  CHECK(out.indices[3] == -7);  // past the compacted table: not written
  CHECK(out.last == std::vector<std::int32_t>{2, 0, 4});
  CHECK(out.freed_indptr == std::vector<std::int32_t>{0, 2, 3, 4});
  CHECK(std::vector<std::int32_t>(out.freed.begin(), out.freed.begin() + 4) == std::vector<std::int32_t>{9, 2, 5, 3});

  // The compacted table without its indices (an engine that truncates its own block table).
  outputs no_indices(3, 7);
  paged_release r = no_indices.release();
  r.indices = nullptr;
  REQUIRE(release_pages(plan, view, r).ok());
  CHECK(no_indices.indptr == out.indptr);
  CHECK(no_indices.freed == out.freed);
  CHECK(std::all_of(no_indices.indices.begin(), no_indices.indices.end(), [](std::int32_t x) { return x == -7; }));
}

TEST_CASE(
    "release_pages after a paged compaction: the table updated in place holds the kept tokens, freed + kept = before") {
  std::mt19937 rng(31);
  for (int round = 0; round < 20; ++round) {
    const std::int64_t H = 1 + static_cast<std::int64_t>(rng() % 3), D = 4,
                       P = 1 + static_cast<std::int64_t>(rng() % 6);
    const std::int64_t B = 1 + static_cast<std::int64_t>(rng() % 4);
    std::vector<std::int32_t> indptr{0}, last;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t L = 1 + static_cast<std::int64_t>(rng() % 40), np = (L + P - 1) / P;
      indptr.push_back(static_cast<std::int32_t>(indptr.back() + np));
      last.push_back(static_cast<std::int32_t>(L - (np - 1) * P));
    }
    const std::int64_t nnz = indptr.back(), pages = nnz + 5;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<std::int32_t> indices(ids.begin(), ids.begin() + nnz);
    auto kpool = fairkv_test::random_floats(static_cast<std::size_t>(pages * P * H * D), rng());
    auto vpool = fairkv_test::random_floats(kpool.size(), rng());
    const auto k0 = kpool;
    const std::vector<std::int32_t> indptr0 = indptr, indices0 = indices;
    const auto view = make_paged_view(page_layout::hnd, kpool.data(), vpool.data(), pages, P, H, D, B, indptr.data(),
                                      indices.data(), last.data());
    const auto before = make_paged_view(page_layout::hnd, const_cast<float*>(k0.data()), vpool.data(), pages, P, H, D,
                                        B, indptr0.data(), indices0.data(), last.data());
    std::vector<std::int64_t> lengths;
    for (std::int64_t b = 0; b < B; ++b) lengths.push_back(view.tokens_of(b));
    // head_adaptive: ragged per-head counts, so the longest head decides the pages.
    keep_plan plan;
    const double ratio = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    paged_side<const float> keys{
        kpool.data(),  pages,          B,          H, D, P, view.stride_page, view.stride_slot, view.stride_head, 1,
        indptr.data(), indices.data(), last.data()};
    REQUIRE(cpu::plan(policy<scorers::knorm, selectors::head_adaptive, allocators::uniform>{{}, {0.1f}, {}},
                      layer_inputs<paged_side<const float>>{keys}, {}, {}, ratio, plan)
                .ok());
    // What each (sequence, head) keeps, read before the compaction moves it.
    std::vector<std::vector<float>> expected;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (const std::int32_t t : plan.kept(b, h)) {
          const float* row = before.keys().row(b, h, t);
          expected.emplace_back(row, row + D);
        }
    REQUIRE(cpu::compact(plan.view(), view).ok());
    std::vector<std::int32_t> freed_indptr(static_cast<std::size_t>(B + 1)), freed(static_cast<std::size_t>(nnz));
    // In place: the view's own indptr, indices and last_page_len become the compacted table.
    REQUIRE(release_pages(plan.view(), view,
                          paged_release{indptr.data(), indices.data(), last.data(), freed_indptr.data(), freed.data()})
                .ok());
    std::size_t e = 0;
    for (std::int64_t b = 0; b < B; ++b) {
      std::int64_t longest = 0;
      for (std::int64_t h = 0; h < H; ++h) longest = std::max<std::int64_t>(longest, plan.count(b, h));
      CAPTURE(round);
      CAPTURE(b);
      CHECK(view.tokens_of(b) == longest);  // the updated table holds exactly the longest head's tokens
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t j = 0; j < plan.count(b, h); ++j, ++e) {
          const float* row = view.keys().row(b, h, j);
          REQUIRE(std::vector<float>(row, row + D) == expected[e]);
        }
      // Kept and freed pages are the sequence's old pages, each once; freed ones tail first.
      std::vector<std::int32_t> kept(indices.begin() + indptr[b], indices.begin() + indptr[b + 1]);
      std::vector<std::int32_t> gone(freed.begin() + freed_indptr[b], freed.begin() + freed_indptr[b + 1]);
      std::vector<std::int32_t> old(indices0.begin() + indptr0[b], indices0.begin() + indptr0[b + 1]);
      CHECK(std::equal(kept.begin(), kept.end(), old.begin()));
      CHECK(std::equal(gone.begin(), gone.end(), old.rbegin()));
      CHECK(kept.size() + gone.size() == old.size());
    }
  }
}

TEST_CASE("release_pages refuses, writing nothing: plan of another shape or length, bad counts, overlapping outputs") {
  const std::int64_t P = 4, H = 1, D = 2, pages = 4;
  std::vector<float> k(static_cast<std::size_t>(pages * P * H * D)), v(k.size());
  const std::vector<std::int32_t> indptr{0, 2, 3}, indices{3, 0, 1}, last{2, 4};
  const auto view = make_paged_view(page_layout::nhd, k.data(), v.data(), pages, P, H, D, 2, indptr.data(),
                                    indices.data(), last.data());
  const std::vector<std::int32_t> counts{3, 2}, lengths{6, 4};
  const const_keep_plan_view plan{nullptr, counts.data(), lengths.data(), 2, H, 6, nullptr};
  {
    outputs out(2, 3);
    REQUIRE(release_pages(plan, view, out.release()).ok());
    CHECK(out.freed_indptr == std::vector<std::int32_t>{0, 1, 1});
  }
  const auto refused = [&](const const_keep_plan_view& p, const char* needle) {
    outputs out(2, 3);
    const result r = release_pages(p, view, out.release());
    INFO(std::string(r.message()));
    CHECK_FALSE(r.ok());
    CHECK(std::string(r.message()).find(needle) != std::string::npos);
    CHECK(out.untouched());
  };
  const_keep_plan_view wrong = plan;
  wrong.batch = 1;
  refused(wrong, "batch 1");
  const std::vector<std::int32_t> stale_lengths{7, 4}, big_counts{7, 2};
  wrong = plan;
  wrong.lengths = stale_lengths.data();
  refused(wrong, "made for 7 tokens");
  wrong = plan;
  wrong.counts = big_counts.data();
  refused(wrong, "outside [0, 6]");
  wrong = plan;
  wrong.counts = nullptr;
  refused(wrong, "non-null");

  outputs out(2, 3);
  paged_release r = out.release();
  r.freed = out.indices.data() + 1;  // into the compacted table
  const result overlap = release_pages(plan, view, r);
  CHECK(overlap.code() == status::invalid_argument);
  CHECK(std::string(overlap.message()).find("indices and freed overlap") != std::string::npos);
  CHECK(out.untouched());
}
