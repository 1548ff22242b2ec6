// `fairkv-llamacpp chat`: a multi-turn conversation in the unmodified llama.cpp whose KV cache holds at most
// `budget` tokens, kept there by one of two rules (docs/llamacpp.md, "chat"):
//
// fairkv (the default): the rule of fairkv-llama chat (examples/llama/chat_session.hpp). A turn needs room for
// R = its user tokens + --max-new-tokens + the closing "<|im_end|>\n"; before it is fed, if cells + R > budget, the
// sequence is compressed in place to budget - R cells through the library's adapter
// (fairkv::llamacpp::compress_sequence_per_head), every (layer, KV head) planned with its own segments and whitelist
// (the system segments, then every user and assistant turn), carried over by its row of the plan (under union_heads
// a layer's heads share theirs; layers always differ). The kept cells keep the last positions, so new tokens continue
// the conversation's positions. Attention scorers (SnapKV, TOVA, H2O and their fair forms) recompute attention from the
// post-RoPE queries of every cached token, captured from llama.cpp's graph on every feed
// (prefill_capture::start_queries) and compacted with their tokens; H2O therefore scores with the attention of the
// cached queries, not of every query ever fed.
//
// context shift (--context-shift): llama.cpp's own rule, as its completion tool applies it: before a batch of
// `pending` tokens is fed, if cells + pending >= budget, the first n_keep cells stay and the older half of the rest
// is discarded (llama_memory_seq_rm, then llama_memory_seq_add moves the later positions down).
//
// A turn that cannot fit, or whose compaction fairkv refuses, changes nothing: turn_too_long says why and the
// conversation goes on with the next turn.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chat_segments.hpp"
#include "chat_session.hpp"  // examples/llama: chat_request, check_chat_request, chat_turn_report, turn_too_long
#include "compress_state.hpp"
#include "engine.hpp"
#include "fairkv/llamacpp/sequence.hpp"
#include "session.hpp"  // ms_between
#include "utf8.hpp"

namespace llamacpp {

// llama.cpp's context shift before `pending` tokens are fed to a sequence of `cells` contiguous positions from 0, in
// a context of n_ctx cells (its completion tool): nothing while cells + pending < n_ctx, else the n_keep first cells
// stay and n_discard = (cells - n_keep) / 2 after them go.
struct context_shift {
  int n_keep = 0;
  int n_discard = 0;  // 0: no shift
};
[[nodiscard]] inline context_shift context_shift_for(int cells, int pending, int n_ctx, int n_keep) {
  if (cells + pending < n_ctx) return {n_keep, 0};
  return {n_keep, std::max(0, cells - n_keep) / 2};
}

struct chat_options {
  llama::chat_request req;  // budget, policy, fair, floors, whitelist, max_new_tokens
  bool context_shift = false;
  int n_keep = 0;              // --context-shift: cells kept at the start; -1: the whole system turn
  bool keep_original = false;  // hold the original state during each round trip (twice the memory at the peak)
  context_options context{.n_ctx = 0};
};

// Checks that need no model; throws naming the option.
inline void check_chat_options(const chat_options& o) {
  if (!o.context_shift) return llama::check_chat_request(o.req);
  if (o.req.budget < 1) throw std::runtime_error("--budget: must be at least 1 token");
  if (o.n_keep < -1) throw std::runtime_error("--keep: " + std::to_string(o.n_keep) + " (a count of tokens, or -1)");
}

class chat_session {
 public:
  // Prefills the system turn. Throws with a clear message if it cannot run under the budget.
  chat_session(engine& eng, chat_options o, const std::string& system) : eng_(eng), opt_(std::move(o)) {
    check_chat_options(opt_);
    llama::chat_request& req = opt_.req;
    const int n_ctx = eng_.n_ctx_train();
    if (n_ctx > 0 && req.budget > n_ctx) {
      const std::string msg = "--budget " + std::to_string(req.budget) +
                              " is larger than the model's training "
                              "context of " +
                              std::to_string(n_ctx) + " tokens";
      if (!req.allow_long_context) throw std::runtime_error(msg + ": lower --budget or pass --allow-long-context");
      warnings_.push_back(msg + " (allowed by --allow-long-context)");
    }
    if (req.budget > eng_.slot_cells())
      throw std::logic_error("chat: a context of " + std::to_string(eng_.slot_cells()) + " cells for --budget " +
                             std::to_string(req.budget));
    if (opt_.context_shift && !eng_.can_shift())
      throw std::runtime_error("--context-shift: llama.cpp cannot shift this model's cache");
    sys_ = llama::prepare_chat_system(eng_, system, req.compress, req.whitelist, warnings_);
    const int n_sys = system_tokens();
    if (n_sys > req.budget)
      throw std::runtime_error("the system turn has " + std::to_string(n_sys) + " tokens, more than --budget " +
                               std::to_string(req.budget) +
                               " (chat does not compress during a prefill: raise "
                               "--budget or shorten the system prompt)");
    if (opt_.context_shift) {
      n_keep_ = opt_.n_keep < 0 ? n_sys : std::min(opt_.n_keep, n_sys);
      if (n_keep_ + 4 > req.budget)
        throw std::runtime_error("--keep: " + std::to_string(n_keep_) + " kept tokens leave no room under --budget " +
                                 std::to_string(req.budget));
    } else {
      const int sinks = llama::sinks_of(req.compress);
      if (!sys_.whitelist.empty() && req.budget <= int(sys_.whitelist.size()) + sinks)
        throw std::runtime_error("--budget: " + std::to_string(req.budget) + " is not larger than the " +
                                 std::to_string(sinks) + " sinks + " + std::to_string(sys_.whitelist.size()) +
                                 " whitelisted tokens that every compaction must keep");
      req.compress.whitelist = sys_.whitelist;  // policy_spec_of picks the whitelist allocator from it
      needs_queries_ = llama::attention_input_of(req.compress) != llama::attention_input::none;
    }
    close_ = eng_.encode(std::string(llama::chat::im_end) + "\n");
    heads_.assign(std::size_t(eng_.n_layer()) * std::size_t(eng_.n_head_kv()), head_state(sys_));
    queries_.assign(std::size_t(eng_.n_layer()), {});
    seq_ = eng_.acquire();
    feed(sys_.turn.tokens.ids);
  }

  const std::vector<llama::segment_info>& system_segments() const noexcept { return sys_.measured; }
  const std::vector<std::string>& warnings() const noexcept { return warnings_; }
  int system_tokens() const noexcept { return int(sys_.turn.tokens.ids.size()); }
  int closing_tokens() const noexcept { return int(close_.size()); }
  int cells() const noexcept { return cells_; }
  int n_keep() const noexcept { return n_keep_; }
  const slot& seq() const noexcept { return seq_; }
  // (layer l, KV head g)'s lists in its cells (fairkv's rule; the context shift keeps none), and the conversation
  // index of each of its cells.
  const llama::head_lists& lists(int l, int g) const { return head(l, g); }
  const std::vector<std::int32_t>& origins(int l, int g) const { return head(l, g).origin; }

  // One turn: make room, feed the user turn, decode greedily, feed the answer's closing tokens.
  llama::chat_turn_report turn(const std::string& user, const std::string& name = {}) {
    using clock = std::chrono::steady_clock;
    const llama::chat_request& req = opt_.req;
    llama::chat_turn_report r;
    r.index = turns_ + 1;
    r.name = name;
    r.user = user;
    const llama::chat::encoded_turn u = llama::chat::encode_user_turn(eng_, user);
    r.user_tokens = int(u.tokens.ids.size());
    const int room = r.user_tokens + req.max_new_tokens + closing_tokens();
    if (room > req.budget)
      throw llama::turn_too_long(
          llama::turn_room_message(r.index, room, r.user_tokens, req.max_new_tokens, closing_tokens(), req.budget));
    r.cache_before = cells_;
    if (opt_.context_shift) {
      const context_shift s = context_shift_for(cells_, r.user_tokens, req.budget, n_keep_);
      if (cells_ - s.n_discard + r.user_tokens >= req.budget)
        throw llama::turn_too_long("turn " + std::to_string(r.index) + ": " + std::to_string(r.user_tokens) +
                                   " user tokens do not fit --budget " + std::to_string(req.budget) +
                                   " after a context shift keeping " + std::to_string(n_keep_));
      ++turns_;
      shift(s, r);
    } else {
      r.warning = check_positions(r.index, room);
      if (cells_ + room > req.budget) {
        const auto t0 = clock::now();
        r.compress_target = req.budget - room;
        compress_to(r.compress_target, r.index, r);  // throws turn_too_long before anything changed
        r.compressed = true;
        r.compress_ms = ms_between(t0, clock::now());
      }
      ++turns_;
    }

    const int user_begin = cells_;
    turn_starts_.push_back(fed_);
    auto t0 = clock::now();
    std::vector<float> logits = feed(u.tokens.ids);
    r.prefill_ms = ms_between(t0, clock::now());
    add_turn(user_begin);

    const int answer_begin = cells_;
    std::vector<std::int32_t> answer;
    t0 = clock::now();
    for (int i = 0; i < req.max_new_tokens; ++i) {
      const std::int32_t next = engine::argmax(logits);
      if (eng_.stops().contains(next)) break;
      answer.push_back(next);
      if (!make_room(1, r)) break;
      logits = feed(std::span<const std::int32_t>(&answer.back(), 1));
    }
    r.decode_ms = ms_between(t0, clock::now());
    if (make_room(closing_tokens(), r)) feed(close_);
    add_turn(answer_begin);
    r.answer_tokens = int(answer.size());
    r.answer = llama::unicode::to_valid_utf8(eng_.detokenize(answer));
    r.decode_tps = r.decode_ms > 0 ? 1000.0 * r.answer_tokens / r.decode_ms : 0.0;
    r.cache_min.assign(std::size_t(eng_.n_layer()), cells_);
    r.cache_max = r.cache_min;
    r.system_kept = system_kept();
    r.system_cached = system_cached();
    r.rss_bytes = llama::resident_bytes();
    r.n_past = fed_;
    r.capacity = eng_.slot_cells();
    return r;
  }

  // Kept fraction of every measured system segment: mean over the heads of its tokens still cached (under fairkv,
  // what the heads' remapped segments say; tests compare the two).
  std::vector<double> system_kept() const {
    std::vector<double> out(sys_.measured.size(), 0.0);
    for (const head_state& h : heads_)
      for (std::size_t i = 0; i < out.size(); ++i) {
        const llama::segment_info& s = sys_.measured[i];
        out[i] += double(std::count_if(h.origin.begin(), h.origin.end(),
                                       [&](std::int32_t t) { return t >= s.begin && t < s.end; })) /
                  double(s.tokens());
      }
    for (double& v : out) v /= double(heads_.size());
    return out;
  }

  // Mean over the heads of the system turn's tokens still cached.
  double system_cached() const {
    double sum = 0;
    for (const head_state& h : heads_)
      sum +=
          double(std::count_if(h.origin.begin(), h.origin.end(), [&](std::int32_t t) { return t < system_tokens(); }));
    return sum / double(heads_.size());
  }

 private:
  struct head_state : llama::head_lists {
    using head_lists::head_lists;
    std::vector<std::int32_t> origin;  // [cells] the conversation index (tokens fed before it) of each cell
  };
  head_state& head(int l, int g) { return heads_.at(std::size_t(l) * std::size_t(eng_.n_head_kv()) + std::size_t(g)); }
  const head_state& head(int l, int g) const {
    return heads_.at(std::size_t(l) * std::size_t(eng_.n_head_kv()) + std::size_t(g));
  }

  // fairkv's mode: positions reach the next one + the turn's room (compaction keeps them; the context shift keeps
  // them under the budget). Past the training context: refused, or one warning under --allow-long-context.
  std::string check_positions(int index, int room) {
    const int n_ctx = eng_.n_ctx_train();
    const int end = int(seq_.next_pos()) + room;
    if (n_ctx <= 0 || end <= n_ctx) return {};
    const std::string msg = "turn " + std::to_string(index) + " may take positions to " + std::to_string(end) +
                            ", past the model's training context of " + std::to_string(n_ctx);
    if (!opt_.req.allow_long_context)
      throw llama::turn_too_long(msg + ": refused; start a new conversation, or pass --allow-long-context to go on");
    if (long_context_warned_) return {};
    long_context_warned_ = true;
    return msg + " (allowed by --allow-long-context: quality degrades past it)";
  }

  // Feeds tokens after the last cell, keeping their queries where the policy scores with attention.
  std::vector<float> feed(std::span<const std::int32_t> ids) {
    if (needs_queries_) eng_.capture().start_queries();
    std::vector<float> logits = eng_.feed(seq_, ids);
    if (needs_queries_) {
      const std::size_t row = std::size_t(eng_.n_head()) * std::size_t(eng_.head_dim());
      for (int l = 0; l < eng_.n_layer(); ++l) {
        const std::vector<float> q = eng_.capture().take_queries(l);
        if (q.size() != ids.size() * row)
          throw std::runtime_error("chat: llama.cpp's graph gave " + std::to_string(q.size() / row) +
                                   " query rows of "
                                   "layer " +
                                   std::to_string(l) + " for " + std::to_string(ids.size()) + " tokens");
        queries_[std::size_t(l)].insert(queries_[std::size_t(l)].end(), q.begin(), q.end());
      }
    }
    for (head_state& h : heads_)
      for (std::size_t t = 0; t < ids.size(); ++t) h.origin.push_back(fed_ + std::int32_t(t));
    cells_ += int(ids.size());
    fed_ += std::int32_t(ids.size());
    return logits;
  }

  // The cells [begin, cells_) just fed, a turn of every head's lists (fairkv's rule: the context shift allocates
  // nothing, and its shifts would leave the ranges behind).
  void add_turn(int begin) {
    if (opt_.context_shift || begin >= cells_) return;
    const std::int32_t p0 = heads_.front().origin[std::size_t(begin)];  // every head holds the same cells here
    for (head_state& h : heads_) h.add_turn(begin, cells_, p0);
  }

  // Room for `pending` more tokens inside a turn: the context shift where it is on (llama.cpp shifts before every
  // batch); false if none is left (the answer then ends early, with a warning).
  bool make_room(int pending, llama::chat_turn_report& r) {
    if (cells_ + pending <= opt_.req.budget && !opt_.context_shift) return true;
    if (!opt_.context_shift) return false;
    const context_shift s = context_shift_for(cells_, pending, opt_.req.budget, n_keep_);
    if (cells_ - s.n_discard + pending >= opt_.req.budget) {
      r.warning += (r.warning.empty() ? "" : "; ") + std::string("the context shift found no room: answer cut");
      return false;
    }
    shift(s, r);
    return true;
  }

  void shift(const context_shift& s, llama::chat_turn_report& r) {
    if (s.n_discard == 0) return;
    eng_.shift(seq_, s.n_keep, s.n_discard);
    for (head_state& h : heads_) {
      const auto first = h.origin.begin() + s.n_keep;
      h.origin.erase(first, first + s.n_discard);
    }
    cells_ -= s.n_discard;
    r.discarded += s.n_discard;
    ++r.shifts;
  }

  // Compresses the sequence to `target` cells; every head's lists, origins and queries follow their cells.
  void compress_to(int target, int turn, llama::chat_turn_report& r) {
    const llama::chat_request& req = opt_.req;
    const int forced = int(sys_.whitelist.size()) + llama::sinks_of(req.compress);
    if (target <= forced) throw llama::turn_too_long(llama::forced_target_message(turn, target, req.budget, forced));
    fairkv::policy_spec spec = llama::policy_spec_of(req.compress, req.compress.window);
    if (req.prioritized()) spec.allocator = fairkv::allocator_kind::prioritized;  // takes the whitelist too
    priorities_.assign(heads_.size(), {});
    if (req.prioritized())
      for (std::size_t i = 0; i < heads_.size(); ++i)
        priorities_[i] =
            llama::chat_priorities(heads_[i], system_tokens(), turn_starts_, req.system_floor, req.turn_decay);
    const int n_head = eng_.n_head();
    const std::size_t row = std::size_t(n_head) * std::size_t(eng_.head_dim());
    auto statistics_of = [&](int l, std::int64_t n, fairkv::llamacpp::attention_statistics& out) -> std::string {
      if (!needs_queries_) return "";
      const std::vector<float>& q = queries_[std::size_t(l)];
      if (q.size() != std::size_t(n) * row)
        return "layer " + std::to_string(l) + " holds queries of " + std::to_string(q.size() / row) + " cells, not " +
               std::to_string(n);
      out = fairkv::llamacpp::query_rows{q, n_head};
      return "";
    };
    auto head_request_of = [&](int l, int h) {
      const std::size_t i = std::size_t(l) * std::size_t(eng_.n_head_kv()) + std::size_t(h);
      const head_state& hs = heads_[i];
      return fairkv::llamacpp::head_request{
          req.compress.fair ? std::span<const fairkv::segment>(hs.alloc) : std::span<const fairkv::segment>(),
          hs.whitelist, priorities_[i]};
    };
    fairkv::llamacpp::request lib{spec, {}, {}, fairkv::keep_target::of_tokens(target)};
    lib.keep_original = opt_.keep_original;
    const fairkv::llamacpp::compression c = fairkv::llamacpp::compress_sequence_per_head(
        eng_.ctx(), seq_.id(), eng_.state_shape(), lib, head_request_of, statistics_of, compiled_planner{});
    if (!c.error.empty()) {
      if (eng_.cells(seq_) != cells_)
        throw std::runtime_error("turn " + std::to_string(turn) + ": " + c.error +
                                 ": the conversation's cache is lost");
      throw llama::turn_too_long("turn " + std::to_string(turn) + ": the compaction was refused (" + c.error +
                                 "); nothing changed");
    }
    r.state_bytes = std::int64_t(c.state_bytes_before);
    r.round_trip_ms = c.parse_ms + c.plan_ms + c.write_ms;
    const int kvh = eng_.n_head_kv(), group = n_head / kvh, hd = eng_.head_dim();
    for (int l = 0; l < eng_.n_layer(); ++l) {
      for (int g = 0; g < kvh; ++g) {
        head_state& h = head(l, g);
        const std::vector<std::int32_t>& kept = c.kept[std::size_t(l)][std::size_t(g)];
        for (std::size_t i = 0; i < kept.size(); ++i) h.origin[i] = h.origin[std::size_t(kept[i])];
        h.origin.resize(kept.size());
        h.remap(c.head_plan(l, g), 0, turn, l);
      }
      if (!needs_queries_) continue;
      // [cells][n_head][hd]: query head qh's rows follow its KV head's kept cells (ascending, so in place).
      std::vector<float>& q = queries_[std::size_t(l)];
      for (int qh = 0; qh < n_head; ++qh) {
        const std::vector<std::int32_t>& kept = c.kept[std::size_t(l)][std::size_t(qh / group)];
        for (std::size_t i = 0; i < kept.size(); ++i)
          std::copy_n(q.data() + std::size_t(kept[i]) * row + std::size_t(qh) * std::size_t(hd), hd,
                      q.data() + i * row + std::size_t(qh) * std::size_t(hd));
      }
      q.resize(std::size_t(c.cells_after) * row);
    }
    cells_ = int(c.cells_after);
  }

  engine& eng_;
  chat_options opt_;
  llama::chat_system sys_;
  std::vector<std::string> warnings_;
  std::vector<std::int32_t> close_;  // "<|im_end|>\n"
  slot seq_;
  std::vector<head_state> heads_;                                  // [n_layers * n_kv_heads]
  std::vector<std::vector<float>> queries_;                        // [n_layers][cells][n_head][head_dim]
  std::vector<std::vector<fairkv::segment_priority>> priorities_;  // per head, during a compaction
  std::vector<std::int32_t> turn_starts_;                          // conversation index of every turn's first token
  bool needs_queries_ = false;
  bool long_context_warned_ = false;
  int n_keep_ = 0;
  int cells_ = 0;
  std::int32_t fed_ = 0;  // tokens ever fed
  int turns_ = 0;
};

}  // namespace llamacpp
