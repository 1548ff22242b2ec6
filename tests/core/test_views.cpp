#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "fairkv/fairkv.hpp"

using namespace fairkv;

TEST_CASE("kv_view validation accepts HF, llama.cpp-row and transposed layouts and rejects aliasing") {
  std::vector<float> buf(2 * 3 * 5 * 4);
  CHECK(validate(make_contiguous_view(buf.data(), 2, 3, 5, 4), "v").ok());
  CHECK(validate(kv_view<float>{buf.data(), 1, 3, 5, 4, 60, 4, 12, 1}, "v").ok());   // rows [L][H * D]
  CHECK(validate(kv_view<float>{buf.data(), 1, 3, 5, 4, 60, 20, 1, 5}, "v").ok());   // transposed V [H][D][L]
  const result r = validate(kv_view<float>{buf.data(), 1, 3, 5, 4, 60, 4, 4, 1}, "v");  // heads alias tokens
  CHECK(r.code() == status::invalid_shape);
  CHECK(validate(kv_view<float>{buf.data(), 2, 3, 5, 4, 10, 20, 4, 1}, "v").code() == status::invalid_shape);  // batch
  CHECK(validate(kv_view<float>{buf.data(), 1, 0, 5, 4, 60, 20, 4, 1}, "v").code() == status::invalid_shape);
}

TEST_CASE("paged view: lengths from indptr / last_page_len, and page-table validation") {
  std::vector<float> k(8 * 4 * 2 * 3), v(k.size());
  const std::vector<std::int32_t> indptr{0, 2, 3}, indices{5, 1, 7}, last{3, 4};
  const auto p = make_paged_view(page_layout::nhd, k.data(), v.data(), 8, 4, 2, 3, 2, indptr.data(), indices.data(),
                                 last.data());
  CHECK(validate(p, "p").ok());
  CHECK(p.tokens_of(0) == 7);
  CHECK(p.tokens_of(1) == 4);
  // Token 5 of sequence 0 is slot 1 of page 1, head 1: NHD offset (1 * 4 + 1) * 2 * 3 + 1 * 3.
  CHECK(p.keys().row(0, 1, 5) - k.data() == (1 * 4 + 1) * 6 + 3);
  const auto hnd = make_paged_view(page_layout::hnd, k.data(), v.data(), 8, 4, 2, 3, 2, indptr.data(), indices.data(),
                                   last.data());
  CHECK(hnd.keys().row(0, 1, 5) - k.data() == 1 * 24 + 1 * 12 + 1 * 3);
  const std::vector<std::int32_t> dup{5, 1, 5};
  auto bad = p;
  bad.indices = dup.data();
  CHECK(validate(bad, "p").code() == status::invalid_shape);
  const std::vector<std::int32_t> out_of_pool{5, 1, 8};
  bad.indices = out_of_pool.data();
  const result r = validate(bad, "p");
  CHECK(r.code() == status::out_of_range);
  CHECK(std::string(r.message()).find("p.indices[2]") != std::string::npos);
  const std::vector<std::int32_t> bad_last{0, 4};
  bad = p;
  bad.last_page_len = bad_last.data();
  CHECK(validate(bad, "p").code() == status::invalid_shape);
}
