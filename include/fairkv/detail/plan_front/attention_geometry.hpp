// Attention-region geometry, shared by the CPU scorer (cpu/score.hpp) and the CUDA front end: which keys of a
// scoring region [begin, end) get an attention score and which query rows the score needs. The rest of the
// region (SnapKV's window, TOVA's anchor) is padded to be kept first.
#pragma once

#include <algorithm>
#include <cstdint>

#include "fairkv/scorer.hpp"

namespace fairkv::detail {

struct region_geometry {
  std::int64_t scored = 0;     // keys [begin, begin + scored) are scored from attention
  std::int64_t rows = 0;       // the query rows [row_begin, row_begin + rows) the scores need
  std::int64_t row_begin = 0;
};

// `window`: SnapKV's window for this region, min(scorer.window, n - 1) normally (a one-token region is its own
// window and scores nothing) or fair_paper's share of the split window (paper_window_split; a span without one
// scores all its keys as 0). `column_sums`: H2O reads accumulated column sums and needs no rows.
template <class S>
[[nodiscard]] constexpr region_geometry attention_geometry(std::int64_t begin, std::int64_t end, std::int64_t window,
                                                           bool paper, bool column_sums) noexcept {
  const std::int64_t n = end - begin;
  if constexpr (S::source == score_source::window_attention) {
    return {window == 0 && !paper ? 0 : n - window, window, end - window};
  } else if constexpr (S::source == score_source::last_attention) {
    return {n - 1, 1, end - 1};
  } else {
    return {n, column_sums ? 0 : n, begin};
  }
}

// SnapKV's window of a region of n tokens outside fair_paper: at least one key stays scored.
template <class S>
[[nodiscard]] constexpr std::int64_t region_window(const S& scorer, std::int64_t n) noexcept {
  if constexpr (S::source == score_source::window_attention)
    return std::min<std::int64_t>(scorer.window, n - 1);
  else
    return 0;
}

}  // namespace fairkv::detail
