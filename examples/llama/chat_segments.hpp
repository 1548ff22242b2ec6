// A budgeted chat's segment bookkeeping, whatever engine holds the cache (fairkv-llama's own, or llama.cpp's through
// its sequence state): the system turn's segments and whitelist, and for every (layer, KV head) its own lists in
// cache rows, carried through each compaction by that head's row of the plan. Per-head selection keeps different
// tokens in every head, so after the first compaction each head's lists are its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat.hpp"
#include "compress.hpp"
#include "system_prompt.hpp"

namespace llama {

// The system turn of a chat and what fair eviction and the reports read from it.
struct chat_system {
  chat::encoded_turn turn;
  std::vector<segment_info> measured;  // what the reports measure: the [[seg:]] markers, else the allocation ones
  std::vector<segment_info> alloc;  // what fair eviction allocates over (--segments; default markers, else sentences)
  std::vector<int32_t> whitelist;   // token indices of the whitelisted phrases
};

// Tok: the runner's tokenizer or llama.cpp's (chat::encode_turn's requirement). Throws on a malformed prompt.
template <class Tok>
chat_system prepare_chat_system(const Tok& tok, const std::string& system, const compress_request& compress,
                                const std::vector<std::string>& whitelist, std::vector<std::string>& warnings) {
  chat_system s;
  const parsed_system ps = parse_system_segments(system);
  s.turn = chat::encode_system_turn(tok, ps.text);
  const segmentation mode = compress.segmentation.empty()
                                ? (ps.marked ? segmentation::markers : segmentation::sentences)
                                : parse_segmentation(compress.segmentation);
  const std::vector<segment_info> marked =
      map_segments(ps, s.turn.text, s.turn.tokens.offsets, s.turn.content.begin, warnings);
  s.alloc = marked;
  if (mode != segmentation::markers || !ps.marked) {
    const parsed_system split{ps.text, split_text(ps.text, mode), false};
    s.alloc = map_segments(split, s.turn.text, s.turn.tokens.offsets, s.turn.content.begin, warnings);
  }
  s.measured = ps.marked ? marked : s.alloc;
  s.whitelist = whitelist_tokens(whitelist, ps, s.turn, warnings);
  return s;
}

// The lists of one (layer, KV head), in its cache rows.
struct head_lists {
  std::vector<fairkv::segment> measured;    // the system segments the report measures; {0, 0} once evicted
  std::vector<fairkv::segment> alloc;       // what fair eviction allocates over (evicted ones removed)
  std::vector<fairkv::segment> alloc_orig;  // alloc's original ranges (absolute positions), entry for entry
  std::vector<int32_t> whitelist;

  explicit head_lists(const chat_system& sys) : whitelist(sys.whitelist) {
    for (const segment_info& s : sys.measured) measured.push_back({s.begin, s.end});
    for (const segment_info& s : sys.alloc) alloc.push_back({s.begin, s.end});
    alloc_orig = alloc;
  }

  // A user or assistant turn: cache rows [begin, end), first absolute position p0.
  void add_turn(int begin, int end, int32_t p0) {
    if (end <= begin) return;
    alloc.push_back({begin, end});
    alloc_orig.push_back({p0, p0 + (end - begin)});
  }

  // Carries the lists through `row` of a compaction's plan (sequence 0). Segments go one by one, so each keeps its
  // identity: a measured one evicted entirely stays as an empty range, an allocation one is removed with its
  // original range. Throws naming the turn and layer on a plan that does not fit the lists.
  void remap(const fairkv::const_keep_plan_view& plan, int row, int turn, int layer) {
    auto fail = [&](const fairkv::result& r) {
      throw std::runtime_error("turn " + std::to_string(turn) + ", layer " + std::to_string(layer) +
                               ": remap: " + r.message());
    };
    auto one = [&](fairkv::segment s) {
      std::vector<fairkv::segment> out;
      fairkv::remap_counts counts;
      if (const fairkv::result r =
              fairkv::remap_segments(plan, 0, std::span<const fairkv::segment>(&s, 1), out, counts, row);
          !r.ok())
        fail(r);
      return out.empty() ? fairkv::segment{0, 0} : out.front();
    };
    for (fairkv::segment& s : measured)
      if (s.end > s.begin) s = one(s);
    size_t w = 0;
    for (size_t i = 0; i < alloc.size(); ++i) {
      const fairkv::segment m = one(alloc[i]);
      if (m.end <= m.begin) continue;
      alloc[w] = m;
      alloc_orig[w++] = alloc_orig[i];
    }
    alloc.resize(w);
    alloc_orig.resize(w);
    fairkv::remap_counts counts;
    if (const fairkv::result r = fairkv::remap_whitelist(plan, 0, whitelist, whitelist, counts, row); !r.ok()) fail(r);
  }
};

// The prioritized allocator's weight and floor of each allocation segment of `h`: a system segment (it starts
// before system_tokens) weighs 1 and keeps system_floor of its *original* tokens (the allocator's floor is a
// fraction of the segment as it is now, so it is rescaled); a turn weighs turn_decay^age, age counted in turns back
// from the last one, turn t starting at absolute position turn_starts[t].
inline std::vector<fairkv::segment_priority> chat_priorities(const head_lists& h, int system_tokens,
                                                             const std::vector<int32_t>& turn_starts,
                                                             float system_floor, float turn_decay) {
  std::vector<fairkv::segment_priority> out;
  out.reserve(h.alloc_orig.size());
  for (size_t i = 0; i < h.alloc_orig.size(); ++i) {
    const fairkv::segment& s = h.alloc_orig[i];
    if (s.begin < system_tokens) {
      const double floor = double(system_floor) * double(s.size()) / double(h.alloc[i].size());
      out.push_back({1.0f, float(std::min(1.0, floor))});
      continue;
    }
    const auto t = std::upper_bound(turn_starts.begin(), turn_starts.end(), s.begin) - turn_starts.begin() - 1;
    const int age = int(turn_starts.size()) - 1 - int(t);
    out.push_back({float(std::pow(double(turn_decay), double(age))), 0.0f});
  }
  return out;
}

// Kept fraction of every measured system segment: mean over the heads (head_lists, or types derived from it) of its
// remapped tokens / original tokens.
template <class Heads>
std::vector<double> system_kept(const Heads& heads, const std::vector<segment_info>& measured) {
  std::vector<double> out(measured.size(), 0.0);
  for (const head_lists& h : heads)
    for (size_t i = 0; i < out.size(); ++i)
      out[i] += double(h.measured[i].end - h.measured[i].begin) / double(measured[i].tokens());
  for (double& v : out) v /= double(heads.size());
  return out;
}

// The refusal of a turn that cannot fit the budget however much history is evicted (`room`: its user tokens +
// max_new + closing tokens).
inline std::string turn_room_message(int index, int room, int user_tokens, int max_new, int closing, int budget) {
  return "turn " + std::to_string(index) + " needs " + std::to_string(room) + " tokens (user turn " +
         std::to_string(user_tokens) + " + --max-new-tokens " + std::to_string(max_new) + " + " +
         std::to_string(closing) + " closing tokens), more than --budget " + std::to_string(budget) +
         ": refused (chat does not compress during a prefill)";
}

// The refusal of a compaction whose target cannot hold the tokens every compaction keeps.
inline std::string forced_target_message(int turn, int target, int budget, int forced) {
  return "turn " + std::to_string(turn) + ": the compaction may keep " + std::to_string(target) +
         " tokens per head (--budget " + std::to_string(budget) + " minus this turn's room), not more than the " +
         std::to_string(forced) + " sinks and whitelisted tokens it must keep";
}

}  // namespace llama
