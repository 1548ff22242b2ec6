// Compression of the prefilled system turn with a fairkv policy, layer by layer, on the cache in place:
// fairkv::cpu::plan on a view of the layer's keys (plus the system turn's post-RoPE queries for the attention
// scorers), then fairkv::cpu::compact of K and V, then the per-head lengths shortened to the plan's counts.
//
// The CLI's runtime choices (policy name, selector, fair / whitelist) become one compile-time fairkv::policy
// here and nowhere else.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fairkv/fairkv.hpp"
#include "kv_cache.hpp"
#include "plan_layer.hpp"
#include "thread_pool.hpp"

namespace llama {

struct compress_request {
  std::string policy = "none";         // none, or a scorer of fairkv's registry but external (scorer_choices)
  double ratio = 0.0;                  // fraction evicted, in [0, 1)
  int window = 64;                     // snapkv observation window
  std::string selector = "per_head";   // per_head | union_heads (or the older "union") | head_adaptive
  bool fair = false;                   // fair allocation over `segments`
  std::string fair_mode = "proportional";  // proportional (fairkv) | paper (the paper's two-span presses)
  int sinks = -1;                      // attention sinks kept under fair, [0, max_sinks]; -1: the mode's default (4, paper 0)
  int boundary = 0;                    // first/last `boundary` tokens of every segment kept under fair
  std::string segmentation;            // --segments: "" (markers when the prompt has them, else lines), or
                                       // markers | lines | paragraphs | sentences (auto_segments.hpp)
  std::vector<fairkv::segment> segments;  // token ranges in the system turn (used for allocation when fair)
  std::vector<int32_t> whitelist;         // system-turn token indices always kept
  // Score SnapKV / TOVA / H2O by recomputing attention from the captured queries even where the prefill's own
  // statistics would do (the reference path: both must agree; tests/llama/test_prefill_stats.cpp).
  bool recompute_attention = false;
};

struct compress_result {
  // kept[l][h][i]: 1 if system token i is kept in (layer l, KV head h); what the JSON statistics are made of.
  std::vector<std::vector<std::vector<uint8_t>>> kept;
  int window_used = 0;  // snapkv's window after clamping to the system turn
  int sinks = 0;        // attention sinks the allocator protects (0 without --fair)
};

inline constexpr int max_sinks = 1024;
inline constexpr int max_boundary = 1024;

// The sinks a fair configuration keeps: --sinks, else the mode's default (the paper keeps none of its own).
inline int sinks_of(const compress_request& r) {
  if (!r.fair) return 0;
  return r.sinks >= 0 ? r.sinks : (r.fair_mode == "paper" ? 0 : 4);
}

// --policy and --selector take fairkv's own names: fairkv::parse decides what is valid and lists the names in its
// message, so the runner keeps no second list. "none" (no compression) and the --fair-mode names are the runner's.
// Each returns the error without the option's name, empty when the name is valid.

// The scorer a --policy names (alias or name), nullptr for "none" or an unknown name.
inline const fairkv::registry::scorer_info* scorer_of(std::string_view policy) {
  return policy == "none" ? nullptr : fairkv::registry::lookup(fairkv::registry::builtin_scorers, policy);
}

// The names of a registry table joined by `sep`, less the entries `skip` rejects: what --help offers.
template <class Table, class Skip>
std::string choices(const Table& table, std::string_view sep, Skip skip) {
  std::string out;
  for (const auto& e : table) {
    if (skip(e)) continue;
    if (!out.empty()) out += sep;
    out += e.name;
  }
  return out;
}
// The registry's scorers the runner offers: all but 'external', which plans with scores its caller computed (the
// runner scores with fairkv's own scorers).
inline std::string scorer_choices(std::string_view sep) {
  return choices(fairkv::registry::builtin_scorers, sep,
                 [](const auto& e) { return e.source == fairkv::score_source::external; });
}
inline std::string selector_choices(std::string_view sep) {
  return choices(fairkv::registry::builtin_selectors, sep, [](const auto&) { return false; });
}

inline std::string policy_name_error(std::string_view name) {
  fairkv::scorer_kind kind{};
  if (name == "none") return {};
  const fairkv::result r = fairkv::parse(name, kind);
  if (!r) return std::string(r.message()) + ", or 'none' to compress nothing";
  if (fairkv::registry::info(kind)->source == fairkv::score_source::external)
    return "'" + std::string(name) + "' takes scores computed outside fairkv, which the runner does not have (" +
           scorer_choices(", ") + ", or 'none')";
  return {};
}
inline std::string selector_name_error(std::string_view name) {
  fairkv::selection_kind kind{};
  const fairkv::result r = fairkv::parse(name, kind);
  return r ? std::string() : std::string(r.message());
}
inline std::string fair_mode_name_error(std::string_view name) {
  if (name == "proportional" || name == "paper") return {};
  return "unknown fair mode '" + std::string(name) + "' (proportional, paper)";
}

// The request's names, checked as the CLI checks them (the message starts with the option).
inline void check_names(const compress_request& r) {
  if (std::string e = policy_name_error(r.policy); !e.empty()) throw std::runtime_error("--policy: " + e);
  if (std::string e = selector_name_error(r.selector); !e.empty()) throw std::runtime_error("--selector: " + e);
  if (std::string e = fair_mode_name_error(r.fair_mode); !e.empty()) throw std::runtime_error("--fair-mode: " + e);
}

// Attention scorers need the system turn's post-RoPE queries; key and position scorers (knorm, streaming_llm) do
// not, so the prefill need not keep [n_layers][n_heads][n_sys][head_dim] queries for them.
inline bool policy_needs_queries(std::string_view policy) {
  const fairkv::registry::scorer_info* s = scorer_of(policy);
  return s && fairkv::is_attention_source(s->source);
}

// Which attention statistic a configuration scores with, all accumulated by the prefill's own softmax except
// `queries`: plain H2O reads the column sums; fair (segment-local) H2O the sums of each query's row renormalised
// to its own scoring region (fairkv::scoring_regions); SnapKV and TOVA the last attention rows. Fair SnapKV and
// TOVA recompute from the queries (the window rows' renormalisation covers only runs whose window rows they
// contain), and so does paper mode (its H2O drops the later span's votes for the earlier one, which no sum
// separates; its other statistics are slices of the full softmax, computed in score_paper).
enum class attention_input { none, queries, column_sums, local_column_sums, last_rows };

inline attention_input attention_input_of(const compress_request& r) {
  const fairkv::registry::scorer_info* s = scorer_of(r.policy);
  if (!s || !fairkv::is_attention_source(s->source)) return attention_input::none;
  const bool h2o = s->source == fairkv::score_source::observed_attention;
  if (r.recompute_attention) return attention_input::queries;
  if (r.fair) return h2o && r.fair_mode != "paper" ? attention_input::local_column_sums : attention_input::queries;
  return h2o ? attention_input::column_sums : attention_input::last_rows;
}

// SnapKV's window after clamping to a system turn of n_sys tokens (kvpress requires more tokens than the window).
inline int window_used_of(const compress_request& r, int n_sys) { return std::max(1, std::min(r.window, n_sys - 1)); }

// The attention rows a configuration reads from the prefill: SnapKV's window, TOVA's last row.
inline int last_rows_needed(const compress_request& r, int n_sys) {
  if (attention_input_of(r) != attention_input::last_rows) return 0;
  return scorer_of(r.policy)->source == fairkv::score_source::window_attention ? window_used_of(r, n_sys) : 1;
}

// The CLI's names as a fairkv::policy_spec; fairkv::dispatch instantiates the policy it names.
inline fairkv::policy_spec policy_spec_of(const compress_request& r, int window) {
  fairkv::policy_spec spec;
  if (const fairkv::result e = fairkv::parse(r.policy, spec.scorer); !e) throw std::runtime_error(e.message());
  if (const fairkv::result e = fairkv::parse(r.selector, spec.selector); !e) throw std::runtime_error(e.message());
  const bool wl = !r.whitelist.empty();
  if (r.fair && r.fair_mode == "paper")
    spec.allocator = fairkv::allocator_kind::fair_paper;  // takes a whitelist too
  else
    spec.allocator = r.fair ? (wl ? fairkv::allocator_kind::fair_with_whitelist : fairkv::allocator_kind::fair)
                            : (wl ? fairkv::allocator_kind::whitelist : fairkv::allocator_kind::uniform);
  spec.sinks = spec.paper_sinks = sinks_of(r);
  spec.boundary = r.boundary;
  spec.window = window;
  return spec;
}

// The regions fairkv scores the n_sys system tokens in for this configuration (fairkv::scoring_regions): what a
// prefill accumulates local column sums over (capture_options::local_regions).
inline std::vector<fairkv::segment> scoring_regions_of(const compress_request& r, int n_sys) {
  std::vector<fairkv::segment> out(fairkv::max_scoring_regions(r.segments.size()));
  std::size_t n = 0;
  const fairkv::result e = fairkv::dispatch(policy_spec_of(r, window_used_of(r, n_sys)), [&](const auto& pol) {
    return fairkv::scoring_regions(pol, std::span<const fairkv::segment>(r.segments), n_sys, out, n);
  });
  if (!e) throw std::runtime_error(e.message());
  out.resize(n);
  return out;
}

inline bool same_regions(std::span<const fairkv::segment> a, std::span<const fairkv::segment> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const fairkv::segment& x, const fairkv::segment& y) {
    return x.begin == y.begin && x.end == y.end;
  });
}

namespace detail {

// What every layer's compression shares: the policy and, for fair H2O, the regions its local sums cover.
struct compress_setup {
  fairkv::policy_spec spec;
  std::vector<fairkv::segment> regions;
};

inline compress_setup start_compress(compress_result& out, const kv_cache& cache, int n_sys,
                                     const compress_request& req) {
  const int n_layers = cache.n_layers(), n_kv = cache.n_kv_heads();
  out.kept.assign(size_t(n_layers), std::vector<std::vector<uint8_t>>(size_t(n_kv), std::vector<uint8_t>(size_t(n_sys), 1)));
  if (req.policy == "none") return {};
  // kvpress requires more tokens than the window; clamp so short system prompts still compress.
  out.window_used = window_used_of(req, n_sys);
  out.sinks = sinks_of(req);
  return {policy_spec_of(req, out.window_used), attention_input_of(req) == attention_input::local_column_sums
                                                    ? scoring_regions_of(req, n_sys)
                                                    : std::vector<fairkv::segment>{}};
}

// Layer l: plan, record what each KV head keeps in kept[g], compact, shorten the heads, drop the captures.
inline void compress_layer(kv_cache& cache, int l, int n_sys, const compress_request& req, const compress_setup& setup,
                           const pool_executor& ex, std::vector<std::vector<uint8_t>>& kept) {
  const int n_kv = cache.n_kv_heads(), hd = cache.head_dim();
  const fairkv::policy_spec& spec = setup.spec;
  const std::vector<fairkv::segment>& regions = setup.regions;
  kv_layer& cl = cache.layer(l);
  for (int g = 0; g < n_kv; ++g)
    if (cl.len[size_t(g)] != n_sys)
      throw std::runtime_error("compress_system_turn: layer " + std::to_string(l) + " head " + std::to_string(g) +
                               " holds " + std::to_string(cl.len[size_t(g)]) + " tokens, expected the " +
                               std::to_string(n_sys) + " of the system turn");
  const size_t nh = size_t(cache.n_heads()), n = size_t(n_sys);
  const bool have_q = cl.sys_q.size() == nh * n * size_t(hd);
  attention_input src = attention_input_of(req);
  // A prefill that kept only queries (an older caller, or one that asked for them) still serves every policy.
  if (src == attention_input::column_sums && cl.sys_colsum.size() != nh * n && have_q) src = attention_input::queries;
  const int rows_needed = last_rows_needed(req, n_sys);
  const bool have_rows = cl.sys_rows_n >= rows_needed && cl.sys_rows.size() == nh * size_t(cl.sys_rows_n) * n;
  if (src == attention_input::last_rows && !have_rows && have_q) src = attention_input::queries;
  // Local sums serve only the regions they were accumulated over (another configuration's segments may differ).
  const bool have_local = cl.sys_local_colsum.size() == nh * n && same_regions(cl.sys_local_regions, regions);
  if (src == attention_input::local_column_sums && !have_local && have_q) src = attention_input::queries;

  fairkv::kv_view<float> keys = cache.k_view(l, n_sys), values = cache.v_view(l, n_sys);
  auto inputs = fairkv::keys_only(keys);
  switch (src) {
    case attention_input::none: break;
    case attention_input::queries:
      if (!have_q) throw std::runtime_error("compress_system_turn: the system turn's queries were not captured");
      // [1, n_heads, n_sys, head_dim]
      inputs.queries = fairkv::make_contiguous_view<const float>(cl.sys_q.data(), 1, cache.n_heads(), n_sys, hd);
      break;
    case attention_input::column_sums:
      if (cl.sys_colsum.size() != nh * n)
        throw std::runtime_error("compress_system_turn: the system turn's attention column sums were not captured");
      inputs.attention_column_sums = cl.sys_colsum.data();  // [1, n_heads, n_sys]
      inputs.attention_q_heads = cache.n_heads();
      break;
    case attention_input::local_column_sums:
      if (!have_local)
        throw std::runtime_error("compress_system_turn: the system turn's local attention column sums over these "
                                 "segments were not captured");
      inputs.attention_local_column_sums = cl.sys_local_colsum.data();  // [1, n_heads, n_sys]
      inputs.attention_q_heads = cache.n_heads();
      break;
    case attention_input::last_rows:
      if (!have_rows)
        throw std::runtime_error("compress_system_turn: the system turn's last " + std::to_string(rows_needed) +
                                 " attention rows were not captured");
      // [1, n_heads, sys_rows_n, n_sys]: every captured row; the scorer reads the last ones it needs.
      inputs.attention = cl.sys_rows.data();
      inputs.attention_rows = cl.sys_rows_n;
      inputs.attention_ld = n_sys;
      inputs.attention_q_heads = cache.n_heads();
      break;
  }
  fairkv::keep_plan plan;
  const fairkv::result res = plan_layer(spec, inputs, req.segments, req.whitelist, req.ratio, plan, ex);
  if (!res.ok()) throw std::runtime_error("fairkv plan (layer " + std::to_string(l) + "): " + res.message());
  for (int g = 0; g < n_kv; ++g) {
    std::vector<uint8_t>& k = kept[size_t(g)];
    std::fill(k.begin(), k.end(), uint8_t{0});
    for (int32_t i : plan.kept(0, g)) k[size_t(i)] = 1;
  }
  if (const fairkv::result c = fairkv::cpu::compact(ex, plan.view(), keys, values); !c.ok())
    throw std::runtime_error("fairkv compact (layer " + std::to_string(l) + "): " + c.message());
  for (int g = 0; g < n_kv; ++g) cl.len[size_t(g)] = plan.count(0, g);
  kv_cache::drop_captures(cl);  // only needed for scoring
}

}  // namespace detail

// Applies the requested policy to every layer of the cache, whose heads all hold the n_sys system-turn tokens
// and, for attention scorers, whose layers carry what the prefill captured (attention_input_of). Throws with
// fairkv's message on invalid input; fairkv validates before writing, so a failure leaves that layer as it was
// (earlier layers are compressed: the caller discards the cache).
inline compress_result compress_system_turn(kv_cache& cache, int n_sys, const compress_request& req,
                                            const pool_executor& ex = {}) {
  compress_result out;
  const detail::compress_setup setup = detail::start_compress(out, cache, n_sys, req);
  if (req.policy == "none") return out;
  for (int l = 0; l < cache.n_layers(); ++l) detail::compress_layer(cache, l, n_sys, req, setup, ex, out.kept[size_t(l)]);
  return out;
}

// The same on the runner's pool, whole layers per thread: one fork-join for the cache, each layer planned
// serially, so the result is the serial one bit for bit. (Planning with the pool as fairkv's executor splits the
// KV heads of each layer instead: three fork-joins per layer, for scoring, selection and compaction, and on a
// shared machine a join waits ~1 ms for a descheduled worker; docs/benchmarks.md measures both.) On error the
// lowest failing layer's exception is rethrown, as the serial loop would throw it; other layers may have been
// compressed.
inline compress_result compress_layers_on(thread_pool& pool, kv_cache& cache, int n_sys, const compress_request& req) {
  compress_result out;
  const detail::compress_setup setup = detail::start_compress(out, cache, n_sys, req);
  if (req.policy == "none") return out;
  std::vector<std::exception_ptr> errors(size_t(cache.n_layers()));
  pool.parallel_for(cache.n_layers(), [&](int64_t begin, int64_t end) {
    for (int64_t l = begin; l < end; ++l) {
      try {
        detail::compress_layer(cache, int(l), n_sys, req, setup, pool_executor{}, out.kept[size_t(l)]);
      } catch (...) {
        errors[size_t(l)] = std::current_exception();
      }
    }
  });
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

}  // namespace llama
