// A multi-turn conversation under a fixed token budget (issue 14, `fairkv-llama chat`): one sequence whose KV
// cache holds at most `budget` tokens per KV head, compressed with a fairkv policy whenever the next turn would
// not fit, with original positions kept (sequence::n_past counts every token ever fed, so RoPE'd keys stay where
// they were and new tokens continue the positions).
//
// The rule (docs/llama-runner.md, "chat"): a turn needs room for R = its user tokens + --max-new-tokens + the
// closing "<|im_end|>\n" tokens. Before the user turn is fed, if len + R > budget every (layer, KV head) is
// compressed to keep_target::of_tokens(budget - R), so the whole turn (answer and closing tokens included) then
// fits without a second compaction. A turn with R > budget, or a system turn longer than the budget, is refused
// with the numbers (no chunked compression during prefill).
//
// Segments: the system turn's segments (markers or automatic segmentation), then each user turn and each
// assistant turn its own segment. Per-head selection keeps different tokens in every KV head, so every
// (layer, KV head) plans on a head-sliced view of the cache with its own segment list and whitelist, remapped
// through its own plan row after each compaction (fairkv::remap_segments / remap_whitelist with head 0 of the
// one-head plan). union_heads plans whole layers (its heads keep the same tokens, so the lists stay equal);
// head_adaptive is refused: its ragged lengths would need a per-head keep target.
//
// Attention statistics: plain H2O reads column sums accumulated online by every feed (prefill chunks and
// single-token decode steps alike) over the queries fed since the last compaction, cleared after each one
// (kv_layer::run_colsum). SnapKV, TOVA and fair H2O recompute attention from the post-RoPE queries of every cached
// token, kept beside the cache ([n_layers][n_heads][capacity][head_dim]) and compacted through the same plan:
// SnapKV's window is the last w queries fed, TOVA's the last one (both always cached: the scorers keep their own
// window), and fair H2O needs each segment's own queries, which column sums over the whole cache cannot give.
//
// Memory: the cache (and the queries and positions beside it) grows by doubling as the conversation needs rows, up
// to the budget, instead of allocating the budget up front; a budget whose full-size cache exceeds the memory the
// machine has available at start is refused with both numbers, as is one beyond the model's training context
// (llama.context_length) unless --allow-long-context. Positions keep growing with the conversation (compaction
// keeps them), so a turn that would take them past the training context is refused like an over-budget turn
// (nothing changes; every later turn is refused too, and the message says to start a new conversation), or, with
// --allow-long-context, runs with one warning.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "chat.hpp"
#include "chat_segments.hpp"
#include "compress.hpp"
#include "console.hpp"
#include "forward.hpp"
#include "host_memory.hpp"
#include "system_prompt.hpp"
#include "tokenizer.hpp"

namespace llama {

// A turn that cannot fit the budget however much history is evicted. Thrown before anything of the session
// changes (cache, turn count), so an interactive chat reports it and reads the next line.
struct turn_too_long : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What a chat asks for besides the model: the compression (compress.policy, selector, window, fair, sinks,
// boundary, segmentation; compress.ratio must stay 0: the budget is the target) and the budget.
struct chat_request {
  compress_request compress;
  std::vector<std::string> whitelist;  // phrases of the system prompt
  int budget = 0;                      // tokens per KV head kept at most (the cache's capacity)
  int max_new_tokens = 128;
  // Under fair: priorities per segment (fairkv::allocators::prioritized). Each system segment keeps at least
  // system_floor of its tokens; a turn (user or assistant) `age` turns old weighs turn_decay^age against the
  // system's 1. The defaults (0, 1) are plain fair eviction.
  float system_floor = 0.0f;
  float turn_decay = 1.0f;
  // A budget beyond the model's training context, and turns whose positions go past it, run with a warning
  // instead of being refused.
  bool allow_long_context = false;
  // Tokens per head allocated at start (0: the system turn, at least 256); the cache doubles from there up to the
  // budget. Tests set it to force growth.
  int initial_capacity = 0;
  bool prioritized() const noexcept { return compress.fair && (system_floor != 0.0f || turn_decay != 1.0f); }
};

// Checks that need no model (the CLI calls it before loading one); throws naming the option.
inline void check_chat_request(const chat_request& r) {
  check_names(r.compress);
  if (r.budget < 1) throw std::runtime_error("--budget: " + std::to_string(r.budget) + " must be at least 1 token");
  if (r.compress.ratio != 0.0)
    throw std::runtime_error("--ratio: chat keeps a token budget (--budget); a ratio together with a budget is refused");
  if (r.compress.policy == "none")
    throw std::runtime_error("--policy: 'none' cannot keep a budget; chat needs an eviction policy");
  if (r.compress.selector == "head_adaptive")
    throw std::runtime_error("--selector: head_adaptive is refused in chat: its ragged per-head lengths would need a "
                             "per-head keep target (per_head or union_heads)");
  if (!(r.system_floor >= 0.0f && r.system_floor <= 1.0f))
    throw std::runtime_error("--system-floor: must be in [0, 1]");
  if (!(r.turn_decay >= 0.0f && r.turn_decay <= 1.0f)) throw std::runtime_error("--turn-decay: must be in [0, 1]");
  if (!r.compress.fair && (r.system_floor != 0.0f || r.turn_decay != 1.0f))
    throw std::runtime_error("--system-floor and --turn-decay set priorities of fair eviction: add --fair");
  if (r.compress.fair && r.compress.fair_mode != "proportional")
    throw std::runtime_error("--fair-mode: chat supports the proportional mode only");
  if (r.max_new_tokens < 0) throw std::runtime_error("--max-new-tokens: must be >= 0");
  const int sinks = sinks_of(r.compress);
  if (r.compress.fair && r.budget <= sinks)
    throw std::runtime_error("--budget: " + std::to_string(r.budget) + " is not larger than the " +
                             std::to_string(sinks) + " attention sinks kept under --fair");
}

// Resident set size in bytes (/proc/self/statm), 0 where unavailable.
inline int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long size = 0, resident = 0;
  const int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return n == 2 ? int64_t(resident) * int64_t(::sysconf(_SC_PAGESIZE)) : 0;
}

// Peak resident set size in bytes (VmHWM of /proc/self/status), 0 where unavailable.
inline int64_t peak_resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  std::fclose(f);
  return int64_t(kb) * 1024;
}

struct chat_turn_report {
  int index = 0;                 // 1-based
  std::string name;              // the script's "name", if any
  std::string user, answer;
  int user_tokens = 0;           // the user turn with its template (and the assistant header)
  int answer_tokens = 0;         // generated tokens (the stop token not counted)
  bool compressed = false;       // a compaction ran before this turn
  double compress_ms = 0;
  int compress_target = 0;       // tokens per head kept by that compaction
  int cache_before = 0;          // max over layers and heads, before the compaction
  std::vector<int> cache_min, cache_max;  // [n_layers] tokens over the KV heads, after the turn
  std::vector<double> system_kept;        // [system segments] mean over layers x heads of kept / original
  double system_cached = 0;               // mean over layers x heads of the system turn's tokens still cached
  int shifts = 0, discarded = 0;          // llama.cpp's context shift: shifts during the turn, tokens they dropped
  int64_t state_bytes = 0;                // llama.cpp: the sequence state a compaction read (0: none, or own cache)
  double round_trip_ms = 0;               // llama.cpp: of compress_ms, the state's parse + plan/compact + write
  double prefill_ms = 0, decode_ms = 0;
  double decode_tps = 0;         // generated tokens per second of decoding
  int64_t rss_bytes = 0;
  int n_past = 0;                // tokens ever fed (the next position)
  int capacity = 0;              // tokens per head the cache holds room for now (grows up to the budget)
  std::string warning;           // e.g. positions past the training context under --allow-long-context
};

// Bytes a chat keeps per budget token at full size: K and V, the position of every row, and the queries (SnapKV,
// TOVA, fair H2O) or running column sums (plain H2O) beside them.
inline int64_t chat_bytes_per_token(const hparams& hp, bool queries, bool column_sums) {
  const int64_t per_layer = 2 * int64_t(hp.n_kv_heads) * hp.head_dim * int64_t(sizeof(float)) +
                            int64_t(hp.n_kv_heads) * int64_t(sizeof(int32_t)) +
                            (queries ? int64_t(hp.n_heads) * hp.head_dim * int64_t(sizeof(float)) : 0) +
                            (column_sums ? int64_t(hp.n_heads) * int64_t(sizeof(float)) : 0);
  return per_layer * hp.n_layers;
}

// Refuses a budget whose full-size cache exceeds `available` bytes (0: unknown, nothing refused).
inline void check_chat_memory(int budget, int64_t bytes_per_token, int64_t available) {
  const int64_t need = int64_t(budget) * bytes_per_token;
  if (available <= 0 || need <= available) return;
  auto gib = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(int64_t{1} << 30));
    return std::string(buf);
  };
  throw std::runtime_error("--budget " + std::to_string(budget) + " needs " + gib(need) + " of cache at full size (" +
                           std::to_string(bytes_per_token) + " bytes per token for this model and policy), but " +
                           gib(available) + " are available: lower --budget to at most " +
                           std::to_string(available / bytes_per_token));
}

class chat_session {
 public:
  // Prefills the system turn. Throws with a clear message if it cannot run under the budget.
  chat_session(engine& eng, const tokenizer& tok, chat_request req, const std::string& system)
      : eng_(eng), tok_(tok), req_(std::move(req)), stops_(tok) {
    check_chat_request(req_);
    const hparams& hp = eng_.hp();
    group_ = hp.n_heads / hp.n_kv_heads;
    // Plain H2O scores with column sums accumulated online since the last compaction; fair H2O (segment-local
    // attention, which column sums over the whole cache cannot give) and SnapKV / TOVA recompute from the
    // cached tokens' queries.
    online_h2o_ = attention_input_of(req_.compress) == attention_input::column_sums;
    needs_queries_ = policy_needs_queries(req_.compress.policy) && !online_h2o_;
    close_ = tok_.encode(std::string(chat::im_end) + "\n", /*parse_special=*/true);

    const int n_ctx = hp.n_ctx_train;
    if (n_ctx > 0 && req_.budget > n_ctx) {
      const std::string msg = "--budget " + std::to_string(req_.budget) + " is larger than the model's training "
                              "context of " + std::to_string(n_ctx) + " tokens (llama.context_length)";
      if (!req_.allow_long_context)
        throw std::runtime_error(msg + ": its attention would span positions the model never saw; lower --budget or "
                                 "pass --allow-long-context");
      warnings_.push_back(msg + " (allowed by --allow-long-context)");
    }
    check_chat_memory(req_.budget, chat_bytes_per_token(hp, needs_queries_, online_h2o_), available_memory_bytes());

    sys_ = prepare_chat_system(tok_, system, req_.compress, req_.whitelist, warnings_);
    const int n_sys = system_tokens();
    check_positions(n_sys, "the system turn");
    if (n_sys > req_.budget)
      throw std::runtime_error("the system turn has " + std::to_string(n_sys) + " tokens, more than --budget " +
                               std::to_string(req_.budget) + " (chat does not compress during a prefill: raise "
                               "--budget or shorten the system prompt)");
    const std::vector<int32_t>& wl = sys_.whitelist;
    const int sinks = sinks_of(req_.compress);
    if (!wl.empty() && req_.budget <= int(wl.size()) + sinks)
      throw std::runtime_error("--budget: " + std::to_string(req_.budget) + " is not larger than the " +
                               std::to_string(sinks) + " sinks + " + std::to_string(wl.size()) +
                               " whitelisted tokens that every compaction must keep");
    req_.compress.whitelist = wl;  // policy_spec_of picks the whitelist allocator from it

    const int first = req_.initial_capacity > 0 ? req_.initial_capacity : 256;
    seq_ = eng_.make_sequence(std::min(req_.budget, std::max(first, n_sys)));
    heads_.assign(size_t(hp.n_layers) * size_t(hp.n_kv_heads), head_state(sys_));
    for (head_state& h : heads_) h.positions.assign(size_t(seq_.cache.capacity()), -1);
    if (needs_queries_)
      queries_.assign(size_t(hp.n_layers),
                      std::vector<float>(size_t(hp.n_heads) * size_t(seq_.cache.capacity()) * size_t(hp.head_dim)));
    feed(sys_.turn.tokens.ids);
  }

  const std::vector<segment_info>& system_segments() const noexcept { return sys_.measured; }
  const std::vector<std::string>& warnings() const noexcept { return warnings_; }
  int system_tokens() const noexcept { return int(sys_.turn.tokens.ids.size()); }
  const sequence& seq() const noexcept { return seq_; }
  int closing_tokens() const noexcept { return int(close_.size()); }
  // The current segments (allocation list) and whitelist of (layer l, KV head g), in cache indices.
  const std::vector<fairkv::segment>& segments(int l, int g) const { return head(l, g).alloc; }
  const std::vector<fairkv::segment>& measured_segments(int l, int g) const { return head(l, g).measured; }
  const std::vector<int32_t>& whitelist(int l, int g) const { return head(l, g).whitelist; }
  // The original (absolute) token ranges of segments(l, g), entry for entry.
  const std::vector<fairkv::segment>& original_segments(int l, int g) const { return head(l, g).alloc_orig; }
  // Absolute position (RoPE position, = index in the whole conversation) of cache row j of (layer l, KV head g).
  int32_t position(int l, int g, int j) const { return head(l, g).positions.at(size_t(j)); }
  int budget() const noexcept { return req_.budget; }

  // One turn: make room, feed the user turn, decode greedily, feed the answer's closing tokens.
  chat_turn_report turn(const std::string& user, const std::string& name = {}) {
    chat_turn_report r;
    r.index = turns_ + 1;
    r.name = name;
    r.user = user;
    const chat::encoded_turn u = chat::encode_user_turn(tok_, user);
    r.user_tokens = int(u.tokens.ids.size());
    const int room = r.user_tokens + req_.max_new_tokens + closing_tokens();
    if (room > req_.budget)
      throw turn_too_long(turn_room_message(r.index, room, r.user_tokens, req_.max_new_tokens, closing_tokens(),
                                            req_.budget));
    r.warning = check_positions(seq_.n_past + room, "turn " + std::to_string(r.index));
    ++turns_;
    r.cache_before = max_len();
    if (r.cache_before + room > req_.budget) {
      const auto t0 = std::chrono::steady_clock::now();
      r.compress_target = req_.budget - room;
      compress_to(r.compress_target, r.index);
      r.compressed = true;
      r.compress_ms = ms_since(t0);
    }

    const int user_begin = max_len();
    turn_starts_.push_back(seq_.n_past);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits = feed(u.tokens.ids);
    r.prefill_ms = ms_since(t0);
    add_segment(user_begin, max_len());

    const int answer_begin = max_len();
    std::vector<int32_t> answer;
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < req_.max_new_tokens; ++i) {
      const int32_t next = argmax(logits);
      if (stops_.contains(next)) break;
      answer.push_back(next);
      logits = feed(std::span<const int32_t>(&answer.back(), 1));
    }
    r.decode_ms = ms_since(t0);
    feed(close_);
    add_segment(answer_begin, max_len());
    r.answer_tokens = int(answer.size());
    r.answer = tok_.decode(answer);
    r.decode_tps = r.decode_ms > 0 ? 1000.0 * r.answer_tokens / r.decode_ms : 0.0;

    const hparams& hp = eng_.hp();
    for (int l = 0; l < hp.n_layers; ++l) {
      const auto& len = seq_.cache.layer(l).len;
      r.cache_min.push_back(*std::min_element(len.begin(), len.end()));
      r.cache_max.push_back(*std::max_element(len.begin(), len.end()));
    }
    r.system_kept = system_kept();
    r.system_cached = system_cached();
    r.rss_bytes = resident_bytes();
    r.n_past = seq_.n_past;
    r.capacity = seq_.cache.capacity();
    return r;
  }

  // Kept fraction of every system segment: mean over (layer, KV head) of its remapped tokens / original tokens.
  std::vector<double> system_kept() const {
    return llama::system_kept(heads_, sys_.measured);
  }

  // Mean over (layer, KV head) of the system turn's tokens still cached.
  double system_cached() const {
    double sum = 0;
    for (int l = 0; l < seq_.cache.n_layers(); ++l)
      for (int g = 0; g < eng_.hp().n_kv_heads; ++g) {
        const head_state& h = head(l, g);
        const int len = seq_.cache.layer(l).len[size_t(g)];
        sum += double(std::count_if(h.positions.begin(), h.positions.begin() + len,
                                    [&](int32_t p) { return p >= 0 && p < system_tokens(); }));
      }
    return sum / double(heads_.size());
  }

  // Tokens cached in the longest head of any layer.
  int max_len() const {
    int m = 0;
    for (int l = 0; l < seq_.cache.n_layers(); ++l) m = std::max(m, seq_.cache.max_len(l));
    return m;
  }

 private:
  struct head_state : head_lists {
    using head_lists::head_lists;
    std::vector<int32_t> positions;  // [capacity] absolute position of each cache row (for checks, reports)
  };
  head_state& head(int l, int g) { return heads_.at(size_t(l) * size_t(eng_.hp().n_kv_heads) + size_t(g)); }
  const head_state& head(int l, int g) const {
    return heads_.at(size_t(l) * size_t(eng_.hp().n_kv_heads) + size_t(g));
  }

  static int32_t argmax(const std::vector<float>& logits) {
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }

  // Feeds tokens (every head holds the same count: per_head and union keep equal counts), keeping their post-RoPE
  // queries beside the cache when the policy scores with attention.
  std::vector<float> feed(std::span<const int32_t> ids) {
    const int at = max_len(), pos = seq_.n_past;
    reserve(at + int(ids.size()));
    for (head_state& h : heads_)
      for (size_t t = 0; t < ids.size(); ++t) h.positions.at(size_t(at) + t) = pos + int32_t(t);
    capture_options capture{needs_queries_};
    capture.running_column_sums = online_h2o_;
    std::vector<float> logits = eng_.feed(seq_, ids, false, capture);
    if (needs_queries_) {
      const hparams& hp = eng_.hp();
      const size_t n = ids.size(), hd = size_t(hp.head_dim), cap = size_t(seq_.cache.capacity());
      for (int l = 0; l < hp.n_layers; ++l) {
        kv_layer& cl = seq_.cache.layer(l);
        for (size_t h = 0; h < size_t(hp.n_heads); ++h)
          std::copy_n(cl.sys_q.data() + h * n * hd, n * hd, queries_[size_t(l)].data() + (h * cap + size_t(at)) * hd);
        kv_cache::drop_captures(cl);
      }
    }
    return logits;
  }

  // Room for `rows` tokens per head: the cache, the positions and the queries beside it double (up to the
  // budget, which every caller has checked `rows` against). The cache grows first and leaves itself as it was if
  // that fails; positions and queries follow.
  void reserve(int rows) {
    const int cap = seq_.cache.capacity();
    if (rows <= cap) return;
    const int next = int(std::min<int64_t>(req_.budget, std::max<int64_t>(rows, 2 * int64_t(cap))));
    if (rows > next) throw std::logic_error("chat: " + std::to_string(rows) + " rows exceed the budget");
    std::vector<std::vector<float>> queries;
    queries.reserve(queries_.size());
    for (const std::vector<float>& q : queries_)
      queries.push_back(relayout(q, eng_.hp().n_heads, cap, next, eng_.hp().head_dim));
    for (head_state& h : heads_) h.positions.reserve(size_t(next));
    seq_.cache.grow(next);  // nothing throws after this
    queries_.swap(queries);
    for (head_state& h : heads_) h.positions.resize(size_t(next), -1);
  }

  // Refuses (or, under --allow-long-context, warns about) positions up to `end` past the training context.
  // Returns the warning, if any. Called before anything of the session changes.
  std::string check_positions(int end, const std::string& what) {
    const int n_ctx = eng_.hp().n_ctx_train;
    if (n_ctx <= 0 || end <= n_ctx) return {};
    const std::string msg = what + " would take positions to " + std::to_string(end) + ", past the model's training "
                            "context of " + std::to_string(n_ctx) + " (llama.context_length; compaction keeps "
                            "positions, so they grow with the conversation)";
    if (!req_.allow_long_context)
      throw turn_too_long(msg + ": refused; start a new conversation, or pass --allow-long-context to go on");
    if (long_context_warned_) return {};
    long_context_warned_ = true;
    return msg + " (allowed by --allow-long-context: quality degrades past it)";
  }

  // A new segment [begin, end) of every head (a user or assistant turn).
  void add_segment(int begin, int end) {
    if (end <= begin) return;
    const int32_t p0 = heads_.front().positions[size_t(begin)];  // every head holds the same rows here
    for (head_state& h : heads_) h.add_turn(begin, end, p0);
  }

  // Compresses every (layer, KV head) to `target` tokens and remaps its segments and whitelist.
  void compress_to(int target, int turn) {
    const hparams& hp = eng_.hp();
    const int sinks = sinks_of(req_.compress);
    const int forced = int(sys_.whitelist.size()) + (req_.compress.fair ? sinks : 0);
    if (target <= forced) throw std::runtime_error(forced_target_message(turn, target, req_.budget, forced));
    const bool union_heads = req_.compress.selector != "per_head";
    const int slice = union_heads ? hp.n_kv_heads : 1;  // KV heads planned together
    for (int l = 0; l < hp.n_layers; ++l)
      for (int g0 = 0; g0 < hp.n_kv_heads; g0 += slice) plan_and_compact(l, g0, slice, target, turn);
  }

  void plan_and_compact(int l, int g0, int nkv, int target, int turn) {
    const hparams& hp = eng_.hp();
    const int hd = hp.head_dim, cap = seq_.cache.capacity();
    kv_layer& cl = seq_.cache.layer(l);
    const int L = cl.len[size_t(g0)];
    for (int g = g0; g < g0 + nkv; ++g)
      if (cl.len[size_t(g)] != L) throw std::logic_error("chat: heads planned together hold different lengths");
    head_state& hs = head(l, g0);
    // Head-sliced views: {batch 1, nkv heads from g0, L tokens, hd}, rows `cap` apart.
    fairkv::kv_view<float> keys = fairkv::make_capacity_view(seq_.cache.k_row(l, g0, 0), 1, nkv, L, cap, hd);
    fairkv::kv_view<float> values = fairkv::make_capacity_view(seq_.cache.v_row(l, g0, 0), 1, nkv, L, cap, hd);
    auto inputs = fairkv::keys_only(keys);
    float* q = needs_queries_ ? queries_[size_t(l)].data() + size_t(g0) * size_t(group_) * size_t(cap) * size_t(hd)
                              : nullptr;
    if (q != nullptr)  // [1, nkv * group q-heads, L, hd], rows `cap` apart
      inputs.queries = fairkv::make_capacity_view<const float>(q, 1, nkv * group_, L, cap, hd);
    float* colsum = online_h2o_ ? cl.run_colsum.data() + size_t(g0) * size_t(group_) * size_t(cap) : nullptr;
    if (colsum != nullptr) {  // [1, nkv * group q-heads, L], rows `cap` apart
      inputs.attention_column_sums = colsum;
      inputs.attention_ld = cap;
      inputs.attention_q_heads = nkv * group_;
    }
    fairkv::policy_spec spec = policy_spec_of(req_.compress, window_used_of(req_.compress, L));
    std::vector<fairkv::segment_priority> priorities;
    if (req_.prioritized()) {
      priorities = chat_priorities(hs, system_tokens(), turn_starts_, req_.system_floor, req_.turn_decay);
      spec.allocator = fairkv::allocator_kind::prioritized;  // takes the whitelist too
      spec.priorities = priorities;
    }
    const std::vector<fairkv::segment> no_segments;
    const std::vector<fairkv::segment>& segs = req_.compress.fair ? hs.alloc : no_segments;
    fairkv::keep_plan plan;
    const fairkv::result res =
        plan_layer(spec, inputs, segs, hs.whitelist, fairkv::keep_target::of_tokens(target), plan);
    if (!res.ok())
      throw std::runtime_error("turn " + std::to_string(turn) + ", layer " + std::to_string(l) + ": fairkv plan: " +
                               res.message());
    if (const fairkv::result c = fairkv::cpu::compact(plan.view(), keys, values); !c.ok())
      throw std::runtime_error("turn " + std::to_string(turn) + ", layer " + std::to_string(l) +
                               ": fairkv compact: " + c.message());
    if (colsum != nullptr)  // H2O online: the sums restart with the queries fed after this compaction
      std::fill_n(colsum, size_t(nkv) * size_t(group_) * size_t(cap), 0.0f);
    for (int j = 0; j < nkv; ++j) {
      const int g = g0 + j;
      const std::vector<int32_t> kept = plan.kept(0, j);
      cl.len[size_t(g)] = int32_t(kept.size());
      if (q != nullptr)  // the group's queries follow their tokens (ascending moves, in place)
        for (int qh = 0; qh < group_; ++qh) {
          float* base = queries_[size_t(l)].data() + (size_t(g) * group_ + size_t(qh)) * size_t(cap) * size_t(hd);
          for (size_t i = 0; i < kept.size(); ++i)
            if (kept[i] != int32_t(i)) std::copy_n(base + size_t(kept[i]) * hd, hd, base + i * size_t(hd));
        }
      head_state& h = head(l, g);
      for (size_t i = 0; i < kept.size(); ++i) h.positions[i] = h.positions[size_t(kept[i])];
      h.remap(plan.view(), j, turn, l);
    }
  }

  engine& eng_;
  const tokenizer& tok_;
  chat_request req_;
  chat::stop_tokens stops_;
  int group_ = 1;
  bool needs_queries_ = false;
  bool online_h2o_ = false;  // plain H2O: kv_layer::run_colsum accumulated by every feed
  std::vector<int32_t> close_;  // "<|im_end|>\n"
  chat_system sys_;
  std::vector<std::string> warnings_;
  sequence seq_;
  std::vector<head_state> heads_;         // [n_layers * n_kv_heads]
  std::vector<std::vector<float>> queries_;  // [n_layers][n_heads, capacity, head_dim] post-RoPE queries of the cache
  int turns_ = 0;
  bool long_context_warned_ = false;
  std::vector<int32_t> turn_starts_;  // absolute position of every turn's first user token
};

}  // namespace llama
