// The system prompt's segments and whitelisted phrases, from bytes of its text to token indices of the system
// turn: [[seg:NAME]] markers (else one segment per line) become token ranges, --whitelist phrases become the
// tokens fairkv must keep. Anything that cannot be mapped cleanly is a warning naming the marker or phrase.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "auto_segments.hpp"
#include "chat.hpp"
#include "console.hpp"
#include "json.hpp"
#include "tokenizer.hpp"

namespace llama {

struct parsed_system {
  std::string text;  // markers removed
  std::vector<text_segment> segments;
  bool marked = false;  // segments come from [[seg:NAME]] markers (else from lines)
};

// Explicit markers `[[seg:NAME]]` start a named segment that runs to the next marker (or the end); text before
// the first marker belongs to no segment. Names are non-empty and distinct. Without markers every non-empty line
// is a segment ("line1", ...).
inline parsed_system parse_system_segments(std::string_view system) {
  static constexpr std::string_view open = "[[seg:", close = "]]";
  parsed_system out;
  size_t i = 0;
  bool any_marker = false;
  while (i < system.size()) {
    const size_t m = system.find(open, i);
    if (m == std::string_view::npos) {
      out.text.append(system.substr(i));
      break;
    }
    const size_t c = system.find(close, m + open.size());
    if (c == std::string_view::npos) throw std::runtime_error("system prompt: unterminated [[seg: marker");
    out.text.append(system.substr(i, m - i));
    if (!out.segments.empty()) out.segments.back().end = out.text.size();
    any_marker = true;
    std::string name(system.substr(m + open.size(), c - m - open.size()));
    if (name.empty()) throw std::runtime_error("system prompt: a [[seg:]] marker without a name");
    for (const text_segment& prev : out.segments)
      if (prev.name == name) throw std::runtime_error("system prompt: two segments are named '" + name + "'");
    out.segments.push_back({std::move(name), out.text.size(), 0});
    i = c + close.size();
  }
  if (any_marker) {
    out.segments.back().end = out.text.size();
    out.marked = true;
    return out;
  }
  out.segments = split_text(out.text, segmentation::lines);
  return out;
}

// A segment of the system turn and, once a configuration compressed it, what its cache kept of it.
struct segment_info {
  std::string name;
  int begin = 0, end = 0;  // token indices in the system turn
  std::string text;        // the segment's text (markers removed)
  double kept = 0;         // kept tokens, mean over layers and heads
  double kept_fraction = 1;
  int tokens() const { return end - begin; }
};

// Token ranges of the segments: `offsets` are the byte ranges of the system turn's tokens in `turn_text`, where
// the system text starts at byte `content_begin`. A token that straddles a boundary goes to the earlier segment,
// and a segment left without a token of its own is dropped; either is reported in `warnings` with the segment's
// marker and the token, never silently.
inline std::vector<segment_info> map_segments(const parsed_system& ps, std::string_view turn_text,
                                              std::span<const byte_range> offsets, size_t content_begin,
                                              std::vector<std::string>& warnings) {
  std::vector<segment_info> out;
  int prev_end = 0;
  for (const text_segment& s : ps.segments) {
    const size_t begin = content_begin + s.begin;
    auto [first, last] = tokens_overlapping(offsets, begin, content_begin + s.end);
    const int b = std::max(int(first), prev_end), e = int(last);
    const std::string label = ps.marked ? "[[seg:" + s.name + "]]" : "segment '" + s.name + "'";
    std::string note;
    if (first < offsets.size() && offsets[first].begin < begin && begin < offsets[first].end) {
      const byte_range t = offsets[first];
      note = label + " starts inside token " + std::to_string(first) + " " +
             json::quote(turn_text.substr(t.begin, t.end - t.begin)) + ", which " +
             (int(first) < prev_end ? "stays with segment '" + out.back().name + "'" : "is counted in '" + s.name + "'");
      note += e <= b ? "; '" + s.name + "' has no other token and is dropped"
                     : "; '" + s.name + "' starts at token " + std::to_string(b);
    } else if (e <= b) {
      note = label + " is empty (no token) and is dropped";
    }
    if (!note.empty()) warnings.push_back(note);
    if (e <= b) continue;
    segment_info si;
    si.name = s.name;
    si.begin = b;
    si.end = e;
    si.text = ps.text.substr(s.begin, s.end - s.begin);
    out.push_back(si);
    prev_end = e;
  }
  return out;
}

// Token indices of every occurrence of each phrase, sorted and unique.
inline std::vector<int32_t> whitelist_tokens(const std::vector<std::string>& phrases, const parsed_system& ps,
                                             const chat::encoded_turn& sys, std::vector<std::string>& warnings) {
  std::vector<int32_t> out;
  const size_t off = sys.content.begin;
  for (const std::string& phrase : phrases) {
    int found = 0;
    for (size_t p = ps.text.find(phrase); p != std::string::npos; p = ps.text.find(phrase, p + 1)) {
      auto [first, last] = tokens_overlapping(sys.tokens.offsets, off + p, off + p + phrase.size());
      for (size_t t = first; t < last; ++t) out.push_back(int32_t(t));
      ++found;
    }
    if (found == 0) detail::warn(warnings, "whitelist phrase " + json::quote(phrase) + " does not occur in the system prompt");
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace llama
