// Tokens the segment-aware allocators keep whatever their scores: the attention sinks and, on request, the
// boundaries of every segment. Both are charged to the budget of the group they sit in, like whitelisted tokens.
//
// - Sinks: the first `n_sink` tokens of the sequence. Evicting them is the failure StreamingLLM was built to
//   avoid (the model parks attention mass there); fair eviction with segment-local scoring loses token 0 without them
//   because the chat-template tokens before the first segment form a tiny group whose local scores do not favour
//   it. Sinks are kept as far as the budget allows: after the whitelist and the boundary tokens, at most n_keep
//   tokens are ever forced, so a budget smaller than n_sink keeps the first n_keep - forced sinks.
// - Boundaries ("Protection Is (Nearly) All You Need", arXiv 2605.18053): the first and last `boundary` tokens of
//   every caller segment (the whole segment when it is shorter than 2 * boundary). Opt-in, and a hard request like
//   the whitelist: more protected tokens than the budget is status::budget_exceeded, never a silent truncation.
#pragma once

#include <cstdint>

namespace fairkv::allocators {

struct protection {
  std::int32_t n_sink = 4;    // leading tokens kept (kvpress's StreamingLLM default); 0 disables
  std::int32_t boundary = 0;  // tokens kept at each end of every segment; 0 disables
};

}  // namespace fairkv::allocators
