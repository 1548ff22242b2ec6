// The GEMM attention path (cpu/detail/attention_gemm.hpp) against the row-at-a-time path on the same numbers:
// the row path is taken for keys whose head_dim is not contiguous, so the same cache laid out [head_dim][tokens]
// scores through it. Whole sequences and segment-local regions; windows, GQA groups and their products (the rows
// of one pass: a group's windows together) on both sides of gemm_rows, so passes start inside a head's window;
// regions on both sides of gemm_chunk; every attention scorer that reads queries. Each case runs once per tile the
// CPU can run (the compile flags' tile and the AVX2 / AVX-512 tiles dispatched at run time, cpu_isa.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "test_util.hpp"

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wignored-attributes"  // packet types as template arguments
#endif

// The tile over one-float packets, what a compiler without vector extensions runs (simd_portable.hpp): held below
// against the compile flags' tile.
namespace fairkv::cpu::detail::tile_scalar {
using namespace portable;
using full = float;
inline constexpr int registers = 16;
inline constexpr bool fused_madd = false;
#define FAIRKV_TILE_INLINE inline
#include "fairkv/cpu/detail/attention_tile.inc"
#undef FAIRKV_TILE_INLINE
}  // namespace fairkv::cpu::detail::tile_scalar

namespace {

using namespace fairkv;

struct shape {
  std::int64_t heads, group, head_dim, tokens;
};

// The same keys, [1, heads, tokens, head_dim] (rows contiguous: GEMM path) and [1, heads, head_dim, tokens]
// (stride_dim = tokens: row path).
struct two_layouts {
  std::vector<float> rows, cols;
  kv_view<const float> gemm_view, row_view;
  two_layouts(const shape& s, std::uint32_t seed) {
    rows = fairkv_test::random_floats(static_cast<std::size_t>(s.heads * s.tokens * s.head_dim), seed, -2.f, 2.f);
    cols.resize(rows.size());
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t t = 0; t < s.tokens; ++t)
        for (std::int64_t i = 0; i < s.head_dim; ++i)
          cols[static_cast<std::size_t>((h * s.head_dim + i) * s.tokens + t)] =
              rows[static_cast<std::size_t>((h * s.tokens + t) * s.head_dim + i)];
    gemm_view = make_contiguous_view(rows.data(), 1, s.heads, s.tokens, s.head_dim).as_const();
    row_view = kv_view<const float>{cols.data(), 1, s.heads, s.tokens, s.head_dim,
                                    s.heads * s.head_dim * s.tokens, s.head_dim * s.tokens, 1, s.tokens};
  }
};

template <class S>
void check_paths_agree(const S& scorer, const shape& s, std::int64_t q_tokens, std::int64_t rb, std::int64_t re,
                       std::uint32_t seed) {
  two_layouts k(s, seed);
  std::vector<float> q = fairkv_test::random_floats(
      static_cast<std::size_t>(s.heads * s.group * q_tokens * s.head_dim), seed + 1, -2.f, 2.f);
  const auto queries = make_contiguous_view(q.data(), 1, s.heads * s.group, q_tokens, s.head_dim).as_const();
  layer_inputs<kv_view<const float>> gemm_in{k.gemm_view}, row_in{k.row_view};
  gemm_in.queries = row_in.queries = queries;
  REQUIRE(cpu::detail::gemm_attention(gemm_in));
  REQUIRE_FALSE(cpu::detail::gemm_attention(row_in));

  const std::int64_t L = s.tokens, ld = L;
  const auto scratch = static_cast<std::size_t>(cpu::detail::scratch_floats<S>(re - rb));
  std::vector<float> a(static_cast<std::size_t>(s.heads * ld), -7.f), b = a, tmp_a(scratch), tmp_b(scratch);
  REQUIRE(cpu::detail::score_region(scorer, gemm_in, 0, L, rb, re, a.data(), ld, tmp_a.data()).ok());
  REQUIRE(cpu::detail::score_region(scorer, row_in, 0, L, rb, re, b.data(), ld, tmp_b.data()).ok());
  for (std::int64_t h = 0; h < s.heads; ++h)
    for (std::int64_t t = 0; t < L; ++t) {
      const float x = a[static_cast<std::size_t>(h * ld + t)], y = b[static_cast<std::size_t>(h * ld + t)];
      INFO(S::name << " heads " << s.heads << " group " << s.group << " d " << s.head_dim << " L " << L << " region ["
                   << rb << ", " << re << ") head " << h << " token " << t << ": gemm " << x << " row " << y);
      if (t < rb || t >= re) {
        REQUIRE(x == -7.f);  // outside the region nothing is written
        REQUIRE(y == -7.f);
      } else {
        REQUIRE(std::abs(x - y) <= 1e-5f * std::max(1.f, std::abs(y)));
      }
    }
}

// Unpins the attention tile when the scope ends, also when a failed REQUIRE leaves it by an exception.
struct unpin_tile_at_exit {
  unpin_tile_at_exit() = default;
  unpin_tile_at_exit(const unpin_tile_at_exit&) = delete;
  unpin_tile_at_exit& operator=(const unpin_tile_at_exit&) = delete;
  ~unpin_tile_at_exit() { cpu::detail::pinned_isa.store(-1); }
};

// f() once per attention tile this CPU runs, each pinned in turn; the ones it cannot run are reported, not run.
template <class F>
void for_each_tile(F&& f) {
  using cpu::detail::cpu_isa;
  const unpin_tile_at_exit restore;
  for (const cpu_isa isa : {cpu_isa::compiled, cpu_isa::avx2, cpu_isa::avx512}) {
    cpu::detail::pinned_isa.store(static_cast<int>(isa));
    const cpu_isa runs = cpu::detail::active_isa();
    if (isa != cpu_isa::compiled && runs != isa) {
      // (std::string: doctest prints a const char* as its address)
      MESSAGE("tile " << std::string(cpu::detail::isa_name(isa)) << " not run: this build or CPU gives tile "
                      << std::string(cpu::detail::isa_name(runs)));
      continue;
    }
    INFO("tile " << std::string(cpu::detail::isa_name(runs)));
    f();
  }
}

const shape shapes[] = {{1, 1, 1, 3},     {2, 4, 64, 200}, {1, 20, 32, 150},
                        {3, 2, 256, 300}, {2, 17, 8, 129}, {1, 70, 16, 160}};

}  // namespace

TEST_CASE("attention GEMM path: SnapKV equals the row path (windows and group x window below and above gemm_rows)") {
  for_each_tile([&] {
    std::uint32_t seed = 100;
    for (const shape& s : shapes)
      for (const std::int32_t w : {1, 5, 16, 40, 70}) {
        scorers::snapkv<64, 5> sc{};
        sc.window = w;
        const std::int64_t L = s.tokens;
        check_paths_agree(sc, s, std::min<std::int64_t>(L, w), 0, L, ++seed);
        // A segment-local region: its window is its own last queries, which needs every query given.
        if (L > 20) check_paths_agree(sc, s, L, L / 5, L - L / 4, ++seed);
      }
  });
}

TEST_CASE("attention GEMM path: every number of rows in a pass, 1 to gemm_rows + 1") {
  for_each_tile([&] {
    // A pass pads its rows to whole packets (4, 8 or 16 lanes, the narrowest packet that holds few rows) and runs
    // them in register tiles of up to 4 packets: each count exercises another padding and tile split. Lengths are not
    // multiples of the tiles' key counts or of the chunks, and the windows' causal tails cross tiles and chunks.
    std::uint32_t seed = 500;
    for (std::int32_t w = 1; w <= static_cast<std::int32_t>(cpu::detail::gemm_rows) + 1; ++w) {
      scorers::snapkv<64, 5> sc{};
      sc.window = w;
      const shape s{1, 1, 24, 101 + w};
      check_paths_agree(sc, s, w, 0, s.tokens, ++seed);
    }
  });
}

// exp_nonpositive of every tile's packets on W floats at a time, through wrappers compiled for each tile's ISA
// (a dispatched tile's are called only where the CPU runs it).
using packet_fn = void (*)(const float*, float*);

namespace tile = cpu::detail::tile;
namespace portable_checks {
namespace tile_ns = cpu::detail::tile;
namespace simd = cpu::detail::portable;
#include "tile_checks.inc"
}  // namespace portable_checks

// The dispatched tiles' checks, each compiled in its own tile's target region (tile_checks.inc).
#if defined(FAIRKV_TILE_AVX2)
FAIRKV_TARGET_PUSH(FAIRKV_TARGET_AVX2)
namespace avx2_checks {
namespace tile_ns = cpu::detail::tile_avx2;
namespace simd = cpu::detail::x86;
#include "tile_checks.inc"
}  // namespace avx2_checks
FAIRKV_TARGET_POP
#endif
#if defined(FAIRKV_TILE_AVX512)
FAIRKV_TARGET_PUSH(FAIRKV_TARGET_AVX512)
namespace avx512_checks {
namespace tile_ns = cpu::detail::tile_avx512;
namespace simd = cpu::detail::x86;
#include "tile_checks.inc"
}  // namespace avx512_checks
FAIRKV_TARGET_POP
#endif

void check_exp_nonpositive(std::int64_t W, packet_fn exp_packet) {
  float in[16], out[16];
  double worst = 0;
  for (double x0 = -87.0; x0 <= 0.0; x0 += 1.37e-4) {
    for (std::int64_t i = 0; i < W; ++i)
      in[i] = static_cast<float>(std::min(0.0, x0 + 3.1e-5 * static_cast<double>(i)));
    exp_packet(in, out);
    for (std::int64_t i = 0; i < W; ++i) {
      const double e = std::exp(static_cast<double>(in[i]));
      worst = std::max(worst, std::abs(static_cast<double>(out[i]) - e) / e);
    }
  }
  INFO("lanes " << W);
  CHECK(worst < 5e-7);  // 1.2e-7 measured: within a few ulps of the correctly rounded value
  for (std::int64_t i = 0; i < W; ++i)
    in[i] = i % 3 == 0 ? std::numeric_limits<float>::quiet_NaN() : i % 3 == 1 ? -200.f : 0.f;
  exp_packet(in, out);
  for (std::int64_t i = 0; i < W; ++i) {
    if (i % 3 == 0) CHECK(std::isnan(out[i]));  // a NaN logit stays NaN, as with std::exp
    if (i % 3 == 1) CHECK(out[i] <= 1.7e-38f);   // clamped at e^-87, under anything a row's sum can hold
    if (i % 3 == 2) CHECK(out[i] == 1.f);
  }
}

TEST_CASE("attention GEMM path: the softmax's exponential against std::exp on [-87, 0]") {
  check_exp_nonpositive(tile::lanes<tile::full>, portable_checks::exp_packet<tile::full>);
  check_exp_nonpositive(tile::lanes<tile::half>, portable_checks::exp_packet<tile::half>);
  check_exp_nonpositive(tile::lanes<tile::quarter>, portable_checks::exp_packet<tile::quarter>);
#if defined(FAIRKV_TILE_AVX2)
  if (cpu::detail::detected_isa() >= cpu::detail::cpu_isa::avx2) {
    check_exp_nonpositive(4, avx2_checks::exp_packet<__m128>);
    check_exp_nonpositive(8, avx2_checks::exp_packet<__m256>);
  } else {
    MESSAGE("AVX2 exponential not run: the CPU has no AVX2 + FMA");
  }
#endif
#if defined(FAIRKV_TILE_AVX512)
  if (cpu::detail::detected_isa() >= cpu::detail::cpu_isa::avx512) {
    check_exp_nonpositive(16, avx512_checks::exp_packet<__m512>);
    check_exp_nonpositive(8, avx512_checks::exp_packet<__m256>);
    check_exp_nonpositive(4, avx512_checks::exp_packet<__m128>);
  } else {
    MESSAGE("AVX-512 exponential not run: the CPU has no AVX-512F");
  }
#endif
}

#if defined(FAIRKV_TILE_AVX2) || defined(FAIRKV_TILE_AVX512)
TEST_CASE("attention GEMM path: the compile flags' tile's packet transposes") {
  CHECK(portable_checks::transpose_exact<tile::full, tile::lanes<tile::full>>());
  CHECK(portable_checks::transpose_exact<tile::half, tile::lanes<tile::half>>());
  CHECK(portable_checks::transpose_exact<tile::quarter, tile::lanes<tile::quarter>>());
  CHECK(portable_checks::transpose_exact<float, 1>());
}

TEST_CASE("attention GEMM path: the one-float tile equals the compile flags' tile") {
  // Every row count of a pass up to gemm_rows, windows whose causal tails cross tiles and chunks, a region that
  // starts inside the keys.
  namespace cd = cpu::detail;
  std::uint32_t seed = 900;
  for (const shape& s : {shape{2, 4, 64, 203}, shape{1, 16, 40, 97}, shape{1, 1, 8, 5}})
    for (const std::int64_t window : {1, 7, 16}) {
      for (const std::int64_t rb : {std::int64_t{0}, s.tokens / 3}) {
        const two_layouts k(s, ++seed);
        const std::int64_t w = std::min(window, s.tokens - rb);
        const std::vector<float> q = fairkv_test::random_floats(
            static_cast<std::size_t>(s.heads * s.group * w * s.head_dim), seed + 7, -2.f, 2.f);
        const std::int64_t n = s.tokens - rb, chunks = (n + cd::gemm_chunk - 1) / cd::gemm_chunk;
        std::vector<float> scratch(static_cast<std::size_t>(cd::gemm_rows * n + cd::gemm_rows * cd::gemm_max_head_dim +
                                                            cd::gemm_rows + 2 * cd::gemm_rows * chunks));
        for (std::int64_t h = 0; h < s.heads; ++h) {
          const cd::query_rows qr{
              q.data() + h * s.group * w * s.head_dim, w * s.head_dim, s.head_dim, s.group, w, s.tokens - w, 1};
          const std::int64_t rows = std::min(cd::gemm_rows, s.group * w);
          std::vector<float> vec(static_cast<std::size_t>(n), 0.f), one(vec);
          cd::tile::add_block(k.gemm_view, 0, h, qr, 0, rows, rb, 0.125f, vec.data(), n, scratch.data());
          cd::tile_scalar::add_block(k.gemm_view, 0, h, qr, 0, rows, rb, 0.125f, one.data(), n, scratch.data());
          double mass = 0;
          for (std::int64_t t = 0; t < n; ++t) {
            INFO("heads " << s.heads << " group " << s.group << " d " << s.head_dim << " L " << s.tokens << " window "
                          << w << " rb " << rb << " head " << h << " token " << t);
            const float x = vec[static_cast<std::size_t>(t)], y = one[static_cast<std::size_t>(t)];
            REQUIRE(std::abs(x - y) <= 1e-5f * std::max(1.f, std::abs(y)));
            mass += y;
          }
          CHECK(mass == doctest::Approx(static_cast<double>(rows)).epsilon(1e-5));  // each row's softmax sums to 1
        }
      }
    }
}

TEST_CASE("attention GEMM path: the dispatched tiles' packet transposes") {
  const cpu::detail::cpu_isa cpu = cpu::detail::detected_isa();
#if defined(FAIRKV_TILE_AVX2)
  if (cpu >= cpu::detail::cpu_isa::avx2) {
    CHECK(avx2_checks::transpose_exact<__m128, 4>());
    CHECK(avx2_checks::transpose_exact<__m256, 8>());
  } else {
    MESSAGE("AVX2 transposes not run: the CPU has no AVX2 + FMA");
  }
#endif
#if defined(FAIRKV_TILE_AVX512)
  if (cpu >= cpu::detail::cpu_isa::avx512) {
    CHECK(avx512_checks::transpose_exact<__m512, 16>());
    CHECK(avx512_checks::transpose_exact<__m256, 8>());
    CHECK(avx512_checks::transpose_exact<__m128, 4>());
  } else {
    MESSAGE("AVX-512 transposes not run: the CPU has no AVX-512F");
  }
#endif
}
#endif

TEST_CASE("attention GEMM path: FAIRKV_CPU_ISA's values, and the kernel a pin or cap leaves running") {
  using cpu::detail::cpu_isa, cpu::detail::parse_isa_cap;
  CHECK(parse_isa_cap(nullptr) == cpu_isa::avx512);  // unset: no cap
  CHECK(parse_isa_cap("") == cpu_isa::avx512);
  CHECK(parse_isa_cap("avx512") == cpu_isa::avx512);
  CHECK(parse_isa_cap("AVX512") == cpu_isa::avx512);
  CHECK(parse_isa_cap("avx2") == cpu_isa::avx2);
  CHECK(parse_isa_cap("Avx2") == cpu_isa::avx2);
  CHECK(parse_isa_cap("none") == cpu_isa::compiled);
  // Anything else caps at the flags' kernel: a typo never widens what runs.
  for (const char* typo : {"avx", "avx-512", "avx512f", "avx2 ", "avx22", "sse2", "yes", "1"})
    CHECK_MESSAGE(parse_isa_cap(typo) == cpu_isa::compiled, typo);

  // Unpinned, the process's own FAIRKV_CPU_ISA caps what runs (ctest runs this case under several values).
  const cpu_isa detected = cpu::detail::detected_isa();
  const char* env = std::getenv("FAIRKV_CPU_ISA");  // NOLINT(concurrency-mt-unsafe): no thread sets it
  INFO("FAIRKV_CPU_ISA=" << (env != nullptr ? env : "(unset)"));
  CHECK(cpu::detail::active_isa() ==
        std::max(std::min(parse_isa_cap(env), detected), cpu::detail::compiled_isa));
  CHECK(cpu::attention_kernel_isa() == cpu::detail::isa_name(cpu::detail::active_isa()));

  // The public name follows a pin, within what the CPU and the flags give.
  const unpin_tile_at_exit restore;
  for (const cpu_isa pin : {cpu_isa::compiled, cpu_isa::avx2, cpu_isa::avx512}) {
    cpu::detail::pinned_isa.store(static_cast<int>(pin));
    const cpu_isa runs = cpu::detail::active_isa();
    CHECK(runs >= cpu::detail::compiled_isa);
    CHECK(runs <= std::max(std::min(pin, detected), cpu::detail::compiled_isa));
    CHECK(cpu::attention_kernel_isa() == cpu::detail::isa_name(runs));
  }
#if defined(FAIRKV_ISA_DISPATCH)
  cpu::detail::pinned_isa.store(static_cast<int>(cpu_isa::avx512));
  if (detected == cpu_isa::avx512) CHECK(cpu::attention_kernel_isa() == "avx512");
  cpu::detail::pinned_isa.store(static_cast<int>(cpu_isa::avx2));
  if (detected >= cpu_isa::avx2 && cpu::detail::compiled_isa <= cpu_isa::avx2)
    CHECK(cpu::attention_kernel_isa() == "avx2");
#endif
}

TEST_CASE("attention GEMM path: TOVA equals the row path (groups below and above gemm_rows)") {
  for_each_tile([&] {
    std::uint32_t seed = 200;
    for (const shape& s : shapes) {
      const std::int64_t L = s.tokens;
      check_paths_agree(scorers::tova{}, s, 1, 0, L, ++seed);
      if (L > 20) check_paths_agree(scorers::tova{}, s, L, L / 3, L - 7, ++seed);
    }
  });
}

TEST_CASE("attention GEMM path: TOVA's heads scored in any order give the serial scores bit for bit") {
  // The planner's parallel tasks run score_region_head for their heads in any order, then finish_region sums the
  // heads' rows on the caller: the scores must be score_region's (serial), float for float.
  std::uint32_t seed = 250;
  for (const shape& s : shapes) {
    if (s.heads < 2) continue;
    two_layouts k(s, ++seed);
    const std::int64_t L = s.tokens, ld = L + 3;
    std::vector<float> q = fairkv_test::random_floats(static_cast<std::size_t>(s.heads * s.group * L * s.head_dim),
                                                      ++seed, -2.f, 2.f);
    layer_inputs<kv_view<const float>> in{k.gemm_view};
    in.queries = make_contiguous_view(q.data(), 1, s.heads * s.group, L, s.head_dim).as_const();
    REQUIRE(cpu::detail::gemm_attention(in));
    for (const auto& region : {std::pair<std::int64_t, std::int64_t>{0, L}, {L / 3, L - 7}}) {
      const std::int64_t rb = region.first, re = region.second;
      const auto scratch = static_cast<std::size_t>(cpu::detail::scratch_floats<scorers::tova>(re - rb));
      std::vector<float> serial(static_cast<std::size_t>(s.heads * ld), -7.f), tasks = serial, tmp(scratch);
      REQUIRE(cpu::detail::score_region(scorers::tova{}, in, 0, L, rb, re, serial.data(), ld, tmp.data()).ok());
      for (std::int64_t h = s.heads - 1; h >= 0; --h) {
        std::vector<float> own(scratch, 5.f);  // each task's scratch, not cleared
        REQUIRE(cpu::detail::score_region_head(scorers::tova{}, in, 0, L, rb, re, h, tasks.data(), ld, own.data()).ok());
      }
      REQUIRE(cpu::detail::finish_region(scorers::tova{}, in, 0, L, rb, re, tasks.data(), ld, tmp.data()).ok());
      INFO("heads " << s.heads << " group " << s.group << " d " << s.head_dim << " L " << L << " region [" << rb << ", "
                    << re << ")");
      CHECK(std::memcmp(serial.data(), tasks.data(), serial.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("attention GEMM path: H2O from queries equals the row path") {
  for_each_tile([&] {
    std::uint32_t seed = 300;
    for (const shape& s : shapes) {
      const std::int64_t L = s.tokens;
      check_paths_agree(scorers::h2o{}, s, L, 0, L, ++seed);
      if (L > 20) check_paths_agree(scorers::h2o{}, s, L, L / 2, L, ++seed);
    }
  });
}

TEST_CASE("attention GEMM path: plans through cpu::plan use the larger scratch, serial and parallel alike") {
  // The workspace query sizes the GEMM scratch; a plan over a region longer than gemm_chunk, whose group's window
  // rows (4 x 33) take more than one pass of gemm_rows, completes and keeps the window.
  const shape s{2, 4, 64, 400};
  two_layouts k(s, 7);
  std::vector<float> q = fairkv_test::random_floats(static_cast<std::size_t>(s.heads * s.group * 400 * 64), 8);
  layer_inputs<kv_view<const float>> in{k.gemm_view};
  in.queries = make_contiguous_view(q.data(), 1, s.heads * s.group, 400, 64).as_const();
  scorers::snapkv<64, 5> sc{};
  sc.window = 33;
  policy<scorers::snapkv<64, 5>, selectors::per_head, allocators::fair> pol{sc, {}, {}};
  const std::vector<segment> segs = {{0, 100}, {100, 250}};
  keep_plan plan;
  REQUIRE(cpu::plan(pol, in, segs, {}, 0.5, plan).ok());
  for (std::int64_t h = 0; h < s.heads; ++h) {
    const std::vector<int> kept = plan.kept(0, h);
    CHECK(static_cast<std::int64_t>(kept.size()) == 200);
    for (int t = 400 - 33; t < 400; ++t) CHECK(std::find(kept.begin(), kept.end(), t) != kept.end());
  }
}

TEST_CASE("attention GEMM path: half and bfloat16 keys keep the row path and score like their float values") {
  // Float keys of the same (exactly representable) values take the GEMM path; half / bfloat16 keys and queries
  // cannot, and must still compile and agree.
  const shape s{2, 3, 16, 150};
  std::vector<float> kf = fairkv_test::random_floats(static_cast<std::size_t>(s.heads * s.tokens * s.head_dim), 9);
  for (float& x : kf) x = to_float(from_float<bfloat16_t>(x));  // exact in half and bfloat16 alike
  std::vector<half_t> kh;
  std::vector<bfloat16_t> kb;
  for (const float x : kf) {
    kh.push_back(from_float<half_t>(x));
    kb.push_back(from_float<bfloat16_t>(x));
  }
  std::vector<float> q = fairkv_test::random_floats(static_cast<std::size_t>(s.heads * s.group * s.tokens * 16), 10);
  for (float& x : q) x = to_float(from_float<bfloat16_t>(x));
  std::vector<half_t> qh;
  for (const float x : q) qh.push_back(from_float<half_t>(x));
  const auto qv = make_contiguous_view(q.data(), 1, s.heads * s.group, s.tokens, s.head_dim);
  const auto score_all = [&](const auto& in) {
    std::vector<float> out;
    for (int which = 0; which < 3; ++which) {
      std::vector<float> sc(static_cast<std::size_t>(s.heads * s.tokens));
      const fairkv::result r = which == 0   ? cpu::score(scorers::snapkv<20, 5>{}, in, sc.data(), s.tokens)
                               : which == 1 ? cpu::score(scorers::tova{}, in, sc.data(), s.tokens)
                                            : cpu::score(scorers::h2o{}, in, sc.data(), s.tokens);
      REQUIRE(r.ok());
      out.insert(out.end(), sc.begin(), sc.end());
    }
    return out;
  };
  const auto want = score_all(with_queries(make_contiguous_view(kf.data(), 1, s.heads, s.tokens, s.head_dim), qv));
  const auto half_keys = score_all(with_queries(make_contiguous_view(kh.data(), 1, s.heads, s.tokens, s.head_dim), qv));
  const auto bf_keys = score_all(with_queries(make_contiguous_view(kb.data(), 1, s.heads, s.tokens, s.head_dim), qv));
  const auto half_both = score_all(with_queries(make_contiguous_view(kh.data(), 1, s.heads, s.tokens, s.head_dim),
                                                make_contiguous_view(qh.data(), 1, s.heads * s.group, s.tokens,
                                                                     s.head_dim)));
  REQUIRE(want.size() == half_keys.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("score " << i);
    CHECK(std::abs(half_keys[i] - want[i]) <= 1e-5f * std::max(1.f, std::abs(want[i])));
    CHECK(std::abs(bf_keys[i] - want[i]) <= 1e-5f * std::max(1.f, std::abs(want[i])));
    CHECK(std::abs(half_both[i] - want[i]) <= 1e-5f * std::max(1.f, std::abs(want[i])));
  }
}
