// Instruction segments found from the text's own structure, for system prompts without [[seg:NAME]] markers
// (issue 14): lines, paragraphs (blocks between blank lines), or sentences (which also end at every line break,
// so every list item is one). The unit the paper's fair eviction protects is an instruction; in system prompts
// an instruction is usually one sentence or one list item, seldom more than a paragraph.
//
// Segments are byte ranges that partition the text from its first non-blank byte: line breaks between two
// segments belong to the earlier one (as in the pitfalls harness's gold segments), the spaces between two
// sentences of a line to the later one (tokenizers glue them to the next word).
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace llama {

struct text_segment {
  std::string name;
  size_t begin = 0, end = 0;  // bytes of the cleaned system text
};

enum class segmentation { markers, lines, paragraphs, sentences };

inline segmentation parse_segmentation(std::string_view name) {
  if (name == "markers") return segmentation::markers;
  if (name == "lines") return segmentation::lines;
  if (name == "paragraphs") return segmentation::paragraphs;
  if (name == "sentences") return segmentation::sentences;
  throw std::runtime_error("--segments: unknown mode '" + std::string(name) +
                           "' (markers, lines, paragraphs, sentences)");
}

namespace detail {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

// Whether a list item starts at `i` (the first non-blank byte of a line): "-", "*", "+" or "•" followed by a
// space, or a number or single letter followed by "." or ")" and a space ("1. ", "a) ").
inline bool list_item_at(std::string_view t, size_t i) {
  auto space_at = [&](size_t j) { return j < t.size() && (t[j] == ' ' || t[j] == '\t'); };
  if (i >= t.size()) return false;
  if ((t[i] == '-' || t[i] == '*' || t[i] == '+') && space_at(i + 1)) return true;
  if (t.compare(i, 3, "\xE2\x80\xA2") == 0 && space_at(i + 3)) return true;  // U+2022 bullet
  size_t j = i;
  while (j < t.size() && std::isdigit(static_cast<unsigned char>(t[j])) && j - i < 3) ++j;
  if (j == i && std::isalpha(static_cast<unsigned char>(t[i]))) j = i + 1;
  return j > i && j < t.size() && (t[j] == '.' || t[j] == ')') && space_at(j + 1);
}

// Whether the '.' at `dot` ends an abbreviation or an initial rather than a sentence ("e.g.", "Dr.", "J.").
inline bool abbreviation_before(std::string_view t, size_t dot) {
  size_t w = dot;
  while (w > 0 && std::isalpha(static_cast<unsigned char>(t[w - 1]))) --w;
  const std::string_view word = t.substr(w, dot - w);
  if (word.size() == 1) return true;  // an initial, or the "e" of "e.g." (the "g" is a single letter too)
  static constexpr std::array<std::string_view, 12> known{"Mr", "Mrs", "Ms", "Dr", "Prof", "St", "vs", "etc",
                                                          "Inc", "Ltd", "No", "approx"};
  return std::find(known.begin(), known.end(), word) != known.end();
}

// Byte offsets where a sentence ends (one past its closing punctuation and quotes), for `sentences`.
inline bool sentence_ends_at(std::string_view t, size_t i, size_t& end) {
  const char c = t[i];
  if (c != '.' && c != '!' && c != '?') return false;
  if (c == '.' && abbreviation_before(t, i)) return false;
  size_t j = i + 1;
  while (j < t.size() && (t[j] == '.' || t[j] == '!' || t[j] == '?')) ++j;  // "?!", "..."
  while (j < t.size() && (t[j] == '"' || t[j] == '\'' || t[j] == ')' || t[j] == ']')) ++j;
  if (j < t.size() && !is_space(t[j])) return false;  // "3.5", "example.com", "a.b"
  end = j;
  return true;
}

}  // namespace detail

// The text's segments in `mode` (not markers: those are parse_system_segments'). Names: "line1", ... for lines
// (the runner's historical default, whose segments stop before the line break), "p1", ... and "s1", ....
inline std::vector<text_segment> split_text(std::string_view t, segmentation mode) {
  std::vector<text_segment> out;
  if (mode == segmentation::markers) throw std::logic_error("split_text: markers are parsed, not split");
  if (mode == segmentation::lines) {
    size_t line_start = 0;
    int n = 0;
    while (line_start <= t.size()) {
      size_t nl = t.find('\n', line_start);
      if (nl == std::string_view::npos) nl = t.size();
      const std::string_view line = t.substr(line_start, nl - line_start);
      if (line.find_first_not_of(" \t\r") != std::string_view::npos)
        out.push_back({"line" + std::to_string(++n), line_start, nl});
      line_start = nl + 1;
    }
    return out;
  }
  // Where each segment starts: after the line break that ends the previous one (line breaks stay with the
  // earlier segment), or right after a sentence's punctuation, so that the space before the next sentence goes
  // with it: tokenizers glue that space to the next word (" You"), and a segment starting inside a token would
  // lose it to the earlier segment.
  std::vector<size_t> starts;
  bool want_start = true;             // the next non-space byte begins a segment
  size_t start_at = std::string_view::npos;  // where that segment begins (npos: at the byte itself)
  bool line_start = true;             // only blanks since the last line break
  int newlines = 0;                   // line breaks since the last non-space byte
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '\n') {
      ++newlines;
      line_start = true;
      if (mode == segmentation::sentences || newlines >= 2) {
        want_start = true;
        start_at = i + 1;
      }
      continue;
    }
    if (detail::is_space(c)) continue;
    if (want_start) starts.push_back(start_at == std::string_view::npos || starts.empty() ? i : start_at);
    want_start = false;
    newlines = 0;
    // A list item's marker ("1.", "a)", "-") is not a sentence of its own: skip it.
    if (std::exchange(line_start, false) && mode == segmentation::sentences && detail::list_item_at(t, i)) {
      while (i + 1 < t.size() && !detail::is_space(t[i + 1])) ++i;
      continue;
    }
    size_t end = 0;
    if (mode == segmentation::sentences && detail::sentence_ends_at(t, i, end)) {
      want_start = true;
      start_at = end;
      i = end - 1;
    }
  }
  const char* prefix = mode == segmentation::paragraphs ? "p" : "s";
  for (size_t k = 0; k < starts.size(); ++k)
    out.push_back({prefix + std::to_string(k + 1), starts[k], k + 1 < starts.size() ? starts[k + 1] : t.size()});
  return out;
}

}  // namespace llama
